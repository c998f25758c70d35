//! `TestServer`: the real sidecar on `127.0.0.1:0`, stopped through a oneshot.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tonic::transport::Channel;

use toolgate::audit::AuditSink;
use toolgate::clock::SystemClock;
use toolgate::config::{Config, Overrides};
use toolgate::decision::AuthorizerConfig;
use toolgate::grpc::pb;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::ledger::LedgerConfig;
use toolgate::policy::{PolicyReloader, ReloadTriggers};
use toolgate::server;
use toolgate::store::scratch::{self, ScratchSchema};

/// The example deployment shipped in `policies/`.
pub fn example_policies() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies")
}

/// A copy of the example policies in a temporary folder, to edit or break.
pub fn copy_of_examples() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("policies");
    copy_dir(&example_policies(), &dst);
    (dir, dst)
}

/// A copy of the example deployment whose daily refund budget is `limit`
/// cents: for tests that refund more than the example's 500.00 a day with
/// one agent and are not about budgets (the budget still counts them).
pub fn examples_with_refund_budget(limit: i64) -> (tempfile::TempDir, PathBuf) {
    let (dir, policies) = copy_of_examples();
    std::fs::write(
        policies.join("budgets/refunds_daily.json"),
        format!(
            r#"{{"name": "refunds_daily", "tools": ["refund_order"], "per": ["agent"],
                "windowSeconds": 86400, "measure": {{"pointer": "/amount_cents"}}, "limit": {limit}}}"#
        ),
    )
    .unwrap();
    (dir, policies)
}

/// Large enough for any test's refunds.
pub const GENEROUS: i64 = 1_000_000_000_000;

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), to).unwrap();
        }
    }
}

/// A fixture folder under `tests/it/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/fixtures")
        .join(name)
}

/// Which store a test server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh SQLite file.
    Sqlite,
    /// A fresh schema of the PostgreSQL test server
    /// (`TOOLGATE_TEST_POSTGRES`, default `postgres://postgres@127.0.0.1:5432/test`).
    Postgres,
}

/// Whether the PostgreSQL test server answers (a schema can be created).
/// When it does not, the test fails, naming it; only where skips are
/// allowed is this `false` (the skip recorded): `prerequisites::skip_or_fail`.
pub async fn postgres_or_skip() -> bool {
    match ScratchSchema::create(&scratch::test_url()).await {
        Ok(_probe) => true,
        Err(e) => {
            crate::prerequisites::postgres_unreachable(&e);
            false
        }
    }
}

/// A fresh PostgreSQL schema. When no server answers, the test fails,
/// naming it; only where skips are allowed is this `None` (the skip
/// recorded).
pub async fn scratch_schema() -> Option<ScratchSchema> {
    match ScratchSchema::create(&scratch::test_url()).await {
        Ok(schema) => Some(schema),
        Err(e) => {
            crate::prerequisites::postgres_unreachable(&e);
            None
        }
    }
}

/// Runs the async fn `$check(backend: Backend)` as two tests,
/// `$check::sqlite` and `$check::postgres`: the same behaviour proven on
/// both stores.
macro_rules! both_backends {
    ($($check:ident),* $(,)?) => {
        $(
            mod $check {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$check(crate::support::Backend::Sqlite).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    if crate::support::postgres_or_skip().await {
                        super::$check(crate::support::Backend::Postgres).await;
                    }
                }
            }
        )*
    };
}
pub(crate) use both_backends;

pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics: Arc<toolgate::metrics::Metrics>,
    pub audit: Arc<toolgate::audit::Audit>,
    /// The server's SQLite file, for tests that inspect or reopen it
    /// (unused on PostgreSQL).
    pub db_path: PathBuf,
    /// The server's PostgreSQL schema, dropped with the server.
    _schema: Option<ScratchSchema>,
    /// The server's live policy set and its reloads.
    pub policies: Arc<PolicyReloader>,
    /// The server's decision pipeline, as its doors call it: for doors
    /// this test binary drives without their transport (`Door::Gateway`).
    pub authorizer: Arc<toolgate::decision::ToolCallAuthorizer>,
    /// The server's ledger desk: what mints execution tickets.
    pub ledger_desk: Arc<toolgate::ledger::desk::LedgerDesk>,
    metrics_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// The configuration every test server starts from: the example policies,
/// a fresh SQLite file in `dir`, `127.0.0.1:0` for the API and the metrics,
/// the test key set, no reloads, the audit log discarded (tests that read
/// it name a file), and the sweeps and the store probe every 200 ms.
pub fn test_config(dir: &Path) -> Config {
    let mut config = Config::with_defaults(Overrides {
        policies: Some(example_policies()),
        listen: Some("127.0.0.1:0".into()),
        store: Some(format!("sqlite://{}", dir.join("toolgate.db").display())),
        jwks_file: Some(fixture("keys/jwks.json")),
        issuer: Some("https://idp.test".into()),
        audience: Some("toolgate".into()),
        metrics_listen: Some("127.0.0.1:0".into()),
    })
    .unwrap();
    config.verifier.leeway_seconds = 5;
    config.reload = ReloadTriggers::NONE;
    config.audit.sink = AuditSink::Discard;
    config.ledger = test_ledger_config();
    config.approval_expiry_interval = Duration::from_millis(200);
    config.store_settings.health_interval = Duration::from_millis(200);
    config
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(&example_policies(), AuthorizerConfig::default()).await
    }

    /// The example deployment on `backend`.
    pub async fn start_on(backend: Backend) -> Self {
        Self::configured(backend, Arc::new(SystemClock), |_| {}).await
    }

    pub async fn start_with(policies: &Path, authorizer: AuthorizerConfig) -> Self {
        Self::configured(Backend::Sqlite, Arc::new(SystemClock), |c| {
            c.policies = policies.to_path_buf();
            c.authorizer = authorizer;
        })
        .await
    }

    /// A server on `policies` that watches the folder and reloads it after
    /// changes have been quiet for 50 ms (no SIGHUP: that would be the
    /// whole test process's).
    pub async fn start_reloading(policies: &Path) -> Self {
        Self::configured(Backend::Sqlite, Arc::new(SystemClock), |c| {
            c.policies = policies.to_path_buf();
            c.reload = ReloadTriggers {
                watch: Some(Duration::from_millis(50)),
                sighup: false,
            };
        })
        .await
    }

    /// A server on an injected clock, for expiry without sleeps.
    pub async fn start_with_clock(clock: toolgate::clock::ManualClock) -> Self {
        Self::start_with_clock_on(Backend::Sqlite, clock).await
    }

    /// A server on `backend` and an injected clock.
    pub async fn start_with_clock_on(
        backend: Backend,
        clock: toolgate::clock::ManualClock,
    ) -> Self {
        Self::configured(backend, Arc::new(clock), |_| {}).await
    }

    /// A server on `backend`, an injected clock and these ledger settings.
    pub async fn start_with_ledger_on(
        backend: Backend,
        clock: toolgate::clock::ManualClock,
        ledger: LedgerConfig,
    ) -> Self {
        Self::configured(backend, Arc::new(clock), |c| c.ledger = ledger).await
    }

    /// A server on SQLite whose [`test_config`] `edit` changes (listeners,
    /// grants, TLS, audit, limits, identity).
    pub async fn start_setup(edit: impl FnOnce(&mut Config)) -> Self {
        Self::configured(Backend::Sqlite, Arc::new(SystemClock), edit).await
    }

    /// The sidecar of [`test_config`] as `edit` leaves it, on `backend` and
    /// `clock`, built and served by `toolgate::server` exactly as `toolgate
    /// serve` builds and serves it.
    pub async fn configured(
        backend: Backend,
        clock: Arc<dyn toolgate::clock::Clock>,
        edit: impl FnOnce(&mut Config),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db_path = dir.path().join("toolgate.db");
        let mut config = test_config(dir.path());
        let schema = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => {
                let schema = ScratchSchema::create(&scratch::test_url()).await.unwrap();
                config.store = schema.url().to_owned();
                Some(schema)
            }
        };
        edit(&mut config);
        let services = server::build(&config, clock)
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        let listeners = server::Listeners::bind(&config).await.unwrap();
        let addr = listeners
            .api_addr()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let metrics_addr = listeners.metrics_addr().expect("the test metrics listener");
        let (metrics, audit, policies, authorizer) = (
            Arc::clone(&services.metrics),
            Arc::clone(&services.audit),
            Arc::clone(&services.policies),
            Arc::clone(&services.authorizer),
        );
        let ledger_desk = Arc::clone(&services.ledger);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server::serve(services, listeners, &config, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self {
            addr,
            metrics,
            audit,
            db_path,
            _schema: schema,
            policies,
            authorizer,
            ledger_desk,
            metrics_addr,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    pub async fn channel(&self) -> Channel {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(5));
        // The listener is bound before `start` returns, so this connects at once.
        endpoint.connect().await.unwrap()
    }

    pub async fn client(&self) -> AuthorizationServiceClient<Channel> {
        AuthorizationServiceClient::new(self.channel().await)
    }

    /// The server's own metrics endpoint (`metrics_listen`).
    pub fn metrics_endpoint(&self) -> MetricsEndpoint {
        MetricsEndpoint {
            addr: self.metrics_addr,
        }
    }

    pub async fn ledger(&self) -> LedgerServiceClient<Channel> {
        LedgerServiceClient::new(self.channel().await)
    }

    /// The execution ticket an ALLOW decision of this call would carry,
    /// minted by the server's own ledger desk (its key, its clock): for
    /// tests that begin keys of their own making rather than Authorize's.
    pub async fn ticket(&self, auth: &pb::AuthContext, key: &str, sha: &str, tool: &str) -> String {
        self.ledger_desk
            .ticket(&ticket_claims(auth, key, sha, tool))
            .await
            .unwrap()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A test server's metrics endpoint; it stops with the server.
pub struct MetricsEndpoint {
    pub addr: SocketAddr,
}

impl MetricsEndpoint {
    pub async fn scrape(&self) -> String {
        scrape(self.addr).await
    }
}

/// The ledger's defaults, with retention collected often (every 100 ms) so
/// that retention tests on an injected clock wait little.
pub fn test_ledger_config() -> LedgerConfig {
    LedgerConfig {
        collect_interval: Duration::from_millis(100),
        ..LedgerConfig::default()
    }
}

/// What a ticket for `auth`'s call of `tool` under `key` and `sha` binds.
pub fn ticket_claims<'a>(
    auth: &'a pb::AuthContext,
    key: &'a str,
    sha: &'a str,
    tool: &'a str,
) -> toolgate::ledger::TicketClaims<'a> {
    toolgate::ledger::TicketClaims {
        tenant_id: &auth.tenant_id,
        subject_id: &auth.subject_id,
        idempotency_key: key,
        arguments_sha256: sha,
        tool,
    }
}

/// The ticket keys a `toolgate serve` on the store `url` signs with,
/// read from the database the way a replica reads them: for sidecar tests
/// that begin keys of their own making ([`ticket_with`]).
pub async fn store_ticket_keys(url: &str) -> toolgate::ledger::TicketKeys {
    let store = toolgate::store::open(url, toolgate::store::StoreSettings::default())
        .await
        .unwrap();
    let candidate = toolgate::ledger::TicketKey::generate(1).unwrap();
    toolgate::ledger::TicketKeys::new(store.ticket_keys(candidate).await.unwrap()).unwrap()
}

/// The execution ticket an ALLOW decision of this call would carry, under
/// `keys`, valid for ten minutes of the system clock.
pub fn ticket_with(
    keys: &toolgate::ledger::TicketKeys,
    auth: &pb::AuthContext,
    key: &str,
    sha: &str,
    tool: &str,
) -> String {
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    keys.issue(&ticket_claims(auth, key, sha, tool), now + 600_000)
}

/// A real ES256 identity token for an approver, valid for five minutes.
pub fn token(subject: &str, tenant: &str, roles: &[&str]) -> String {
    token_valid_for(subject, tenant, roles, 300)
}

/// `toolgate serve`'s flags for the test key set that signs [`token`]'s
/// tokens (`tests/it/fixtures/keys/jwks.json`, issuer and audience).
pub fn identity_args() -> Vec<std::ffi::OsString> {
    vec![
        "--jwks-file".into(),
        fixture("keys/jwks.json").into(),
        "--issuer".into(),
        "https://idp.test".into(),
        "--audience".into(),
        "toolgate".into(),
    ]
}

/// A real ES256 identity token valid for `seconds` from the system clock.
pub fn token_valid_for(subject: &str, tenant: &str, roles: &[&str], seconds: u64) -> String {
    let claims = approver_claims(subject, tenant, roles, seconds);
    signed(jsonwebtoken::Algorithm::ES256, Some("ec-1"), &claims)
}

/// Seconds since the epoch on the system clock.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The claims of an approver's token that the test verifier accepts.
pub fn approver_claims(
    subject: &str,
    tenant: &str,
    roles: &[&str],
    seconds: u64,
) -> serde_json::Value {
    serde_json::json!({"sub": subject, "tenant": tenant, "roles": roles, "scope": "approvals",
        "iss": "https://idp.test", "aud": "toolgate", "exp": unix_now() + seconds})
}

/// `claims` signed with the test key of `alg` (`tests/it/fixtures/keys/`),
/// naming `kid` in the header.
pub fn signed(
    alg: jsonwebtoken::Algorithm,
    kid: Option<&str>,
    claims: &serde_json::Value,
) -> String {
    use jsonwebtoken::{Algorithm, EncodingKey};
    let read = |f: &str| std::fs::read(fixture("keys").join(f)).unwrap();
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&read("rsa.pem")).unwrap(),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&read("ec.pem")).unwrap(),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&read("ed25519.pem")).unwrap(),
        Algorithm::HS256 => EncodingKey::from_secret(&read("hs256.secret")).unwrap(),
        other => panic!("no test key for {other:?}"),
    };
    signed_with(alg, kid, claims, &key)
}

/// `claims` signed with `key`, whatever key set it belongs to.
pub fn signed_with(
    alg: jsonwebtoken::Algorithm,
    kid: Option<&str>,
    claims: &serde_json::Value,
    key: &jsonwebtoken::EncodingKey,
) -> String {
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

/// An auth context for a user of a tenant.
pub fn auth(subject: &str, tenant: &str, roles: &[&str], scopes: &[&str]) -> pb::AuthContext {
    pb::AuthContext {
        subject_id: subject.into(),
        tenant_id: tenant.into(),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        roles: roles.iter().map(|s| (*s).to_owned()).collect(),
        agent_id: "support-bot".into(),
        session_id: "sess-1".into(),
        identity_token: String::new(),
    }
}

/// The support agent of tenant `acme` with every scope the example uses.
pub fn agent_bob() -> pb::AuthContext {
    auth(
        "bob",
        "acme",
        &["support_agent"],
        &[
            "orders:read",
            "orders:refund",
            "customers:write",
            "email:send",
            "docs:read",
        ],
    )
}

/// The trusted entities an executor would load for the example: orders and
/// customers of two tenants.
pub fn entities() -> String {
    serde_json::json!([
        {"uid": {"type": "Order", "id": "ord_1001"}, "parents": [{"type": "Tenant", "id": "acme"}],
         "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}}, "owner": {"__entity": {"type": "User", "id": "alice"}},
                   "status": "delivered", "total_cents": 50000}},
        {"uid": {"type": "Order", "id": "ord_2001"}, "parents": [{"type": "Tenant", "id": "globex"}],
         "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "globex"}}, "owner": {"__entity": {"type": "User", "id": "gina"}},
                   "status": "delivered", "total_cents": 50000}},
        {"uid": {"type": "Customer", "id": "cus_alice"}, "parents": [{"type": "Tenant", "id": "acme"}],
         "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}}, "user": {"__entity": {"type": "User", "id": "alice"}},
                   "email_verified": true}},
        {"uid": {"type": "Customer", "id": "cus_carol"}, "parents": [{"type": "Tenant", "id": "acme"}],
         "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}}, "user": {"__entity": {"type": "User", "id": "carol"}},
                   "email_verified": false}}
    ])
    .to_string()
}

/// A request for `tool` with raw argument text, by bob, with the example entities.
pub fn request(tool: &str, arguments: &str) -> pb::AuthorizeRequest {
    pb::AuthorizeRequest {
        tool: tool.into(),
        arguments: arguments.as_bytes().to_vec(),
        auth: Some(agent_bob()),
        call_id: "call-1".into(),
        request_id: "req-1".into(),
        entities_json: entities(),
        ..Default::default()
    }
}

/// The details of an envelope as JSON.
pub fn details(r: &pb::AuthorizeResponse) -> serde_json::Value {
    serde_json::from_str(&r.error.as_ref().expect("an envelope").details_json).unwrap()
}

/// The envelope code of a response ("" for none).
pub fn code(r: &pb::AuthorizeResponse) -> &str {
    r.error.as_ref().map_or("", |e| e.code.as_str())
}

/// The field of an `INVALID_ARGUMENT` status's `BadRequest` violation.
pub fn bad_request_field(status: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let details = status.get_error_details();
    let bad = details.bad_request().expect("BadRequest details");
    bad.field_violations.first().unwrap().field.clone()
}

/// `GET /metrics` over HTTP/1.1 on a plain socket.
pub async fn scrape(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut body))
        .await
        .unwrap()
        .unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("application/openmetrics-text"), "{body}");
    body
}

/// The value of one exact series line, 0 when absent.
pub fn series(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .map_or(0, |v| v.trim().parse().unwrap())
}
