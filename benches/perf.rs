//! The performance suite (`docs/performance.md`): toolgate beside the floors
//! that bound it and the peer it competes with, measured in one run on one
//! machine.
//!
//! 1. In process: raw `cedar_policy::Authorizer::is_authorized` over the
//!    example policy set with a request and entities built in advance,
//!    against toolgate's whole decision for the refund example (raw bytes →
//!    decode → schema → canonical form and hashes → entities → Cedar).
//! 2. Served, one client for all three sides (`perf/drive.rs`), at the
//!    levels `C:K` (C calls over K connections) 1:1, 16:4, 16:16 and 64:4,
//!    the sides alternating round after round: a plain tonic echo service
//!    answering toolgate's own `Authorize` response (the transport floor),
//!    the real `toolgate serve` binary over gRPC, and the peer,
//!    permitio/cedar-agent over HTTP/1.1 keep-alive (`perf/peer.rs`,
//!    installed by the suite itself). For each: requests/s, p50, p99, and
//!    the server's and the client's CPU per request over the window.
//! 3. `Authorize` with `begin_execution` followed by `CompleteExecution`,
//!    on SQLite at 1:1 and 16:16, and on PostgreSQL at 32:16 when
//!    `TOOLGATE_TEST_POSTGRES` names a server.
//! 4. The sidecar's resident memory after the served load.
//! 5. Overload: a sidecar with `[limits] max_calls_in_flight` set, at 16:16
//!    and at 256:16, alternating: the answered calls' p99 and the refusals
//!    by status.
//!
//! Results go to one JSON file (`"schema": "toolgate-perf/2"`, default
//! `target/perf/perf.json`) and a table on stdout, with each of issue 19's
//! targets met or missed.
//!
//! Run: `cargo bench --bench perf` (options after `--`: `--rounds N`,
//! `--seconds S` per side, level and round, `--iterations N` per
//! in-process side and round, `--out PATH`, `--overload-limit N`,
//! `--overload-backoff-ms N`; `--in-process-only`, `--ledger-only` and
//! `--overload-only` for profilers).

#![allow(
    clippy::indexing_slicing,
    reason = "only serde_json::Value is indexed here, which yields Null and never panics"
)]

mod common;
#[path = "perf/drive.rs"]
mod drive;
#[path = "perf/peer.rs"]
mod peer;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use tonic::transport::Channel;

use toolgate::access::TenantScope;
use toolgate::decision::{AuthorizeInput, Decision};
use toolgate::grpc::pb;
use toolgate::identity::Caller;
use toolgate::policy::PolicyEngine;

use common::{ChildGuard, FreshStore, Summary, example_policies, medians, summarize};
use drive::{Expect, Level, Sample, Side, Transport};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ARGUMENTS: &[u8] =
    br#"{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}"#;
const ENTITIES: &str = r#"[{"uid":{"type":"Order","id":"ord_1001"},"parents":[{"type":"Tenant","id":"acme"}],
 "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"alice"}},
 "status":"delivered","total_cents":50000}}]"#;
/// The environment variable that turns this binary into the echo server.
const ECHO_ROLE: &str = "TOOLGATE_PERF_ECHO_RESPONSE";
/// The served levels, every side at each.
const LEVELS: [Level; 4] = [
    Level::new(1, 1),
    Level::new(16, 4),
    Level::new(16, 16),
    Level::new(64, 4),
];
/// Connections opened to each side (the most any level uses).
const CONNECTIONS: usize = 16;
/// `Authorize(begin_execution)` + `CompleteExecution`, per store.
const LEDGER_SQLITE: [Level; 2] = [Level::new(1, 1), Level::new(16, 16)];
const LEDGER_POSTGRES: [Level; 1] = [Level::new(32, 16)];
/// The overload comparison: the reference level and the overload.
const OVERLOAD_BASE: Level = Level::new(16, 16);
const OVERLOAD: Level = Level::new(256, 16);
/// The names of the served sides, in the JSON and the table.
const SIDES: [&str; 3] = ["echo", "toolgate", "peer"];

struct Options {
    rounds: usize,
    seconds: f64,
    iterations: usize,
    out: PathBuf,
    /// `[limits] max_calls_in_flight` of the overload sidecar.
    overload_limit: usize,
    /// How long a refused worker waits before its next call.
    overload_backoff: Duration,
    /// Only the in-process comparison (for profilers), no JSON file.
    in_process_only: bool,
    /// Only the overload comparison (for profilers), no JSON file.
    overload_only: bool,
    /// Only the ledger pairs on SQLite at 16:16 (for profilers), no JSON file.
    ledger_only: bool,
}

impl Options {
    fn parse() -> Result<Self, BoxError> {
        let mut o = Self {
            rounds: 5,
            seconds: 2.0,
            iterations: 4000,
            out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/perf/perf.json"),
            overload_limit: 32,
            overload_backoff: Duration::from_millis(10),
            in_process_only: false,
            overload_only: false,
            ledger_only: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("`{a}` needs a value"));
            match a.as_str() {
                "--rounds" => o.rounds = value()?.parse()?,
                "--seconds" => o.seconds = value()?.parse()?,
                "--iterations" => o.iterations = value()?.parse()?,
                "--out" => o.out = PathBuf::from(value()?),
                "--overload-limit" => o.overload_limit = value()?.parse()?,
                "--overload-backoff-ms" => {
                    o.overload_backoff = Duration::from_millis(value()?.parse()?);
                }
                "--in-process-only" => o.in_process_only = true,
                "--overload-only" => o.overload_only = true,
                "--ledger-only" => o.ledger_only = true,
                // `cargo bench` passes `--bench`; filters are not used here.
                _ => {}
            }
        }
        if o.rounds == 0 || o.iterations == 0 || o.overload_limit == 0 || o.seconds <= 0.0 {
            return Err(
                "rounds, iterations, seconds and the overload limit must be positive".into(),
            );
        }
        Ok(o)
    }
}

fn main() -> Result<(), BoxError> {
    if let Ok(hex_response) = std::env::var(ECHO_ROLE) {
        return echo_server(&hex_response);
    }
    let options = Options::parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if options.overload_only {
        let dir = tempfile::tempdir()?;
        let row = runtime.block_on(overload_rounds(&options, dir.path(), &authorize_request()))?;
        println!(
            "overload (max_calls_in_flight {}): answered p99 {:.0} µs at {}, {:.0} µs at {} \
             ({:.2}×); {} answered at {:.0}/s; refusals {:?}, p99 {:.0} µs; {} timeouts",
            options.overload_limit,
            row.over.p99_us,
            OVERLOAD.name(),
            row.base.p99_us,
            OVERLOAD_BASE.name(),
            row.over.p99_us / row.base.p99_us.max(1.0),
            row.answered,
            row.over.rps,
            row.refusals,
            row.refusal_p99_us,
            row.timeouts,
        );
        return Ok(());
    }
    if options.ledger_only {
        let level = Level::new(16, 16);
        let row = runtime.block_on(async {
            let store = FreshStore::sqlite()?;
            let (sidecar, addr) = common::start_sidecar(store.url())?;
            let channels = drive::grpc_channels(addr, CONNECTIONS).await?;
            ledger_rounds(&options, &channels, ("sqlite", sidecar.0.id()), level).await
        })?;
        println!(
            "ledger pairs, sqlite, {}: {:.0}/s, p50 {:.0} µs, p99 {:.0} µs, CPU per pair: sidecar {:.0} µs, client {:.0} µs",
            level.name(),
            row.pairs.rps,
            row.pairs.p50_us,
            row.pairs.p99_us,
            row.server_cpu_us,
            row.client_cpu_us
        );
        return Ok(());
    }
    let reloader = common::load_policies(&example_policies())?;
    let raw = RawCedar::build(&reloader.live().load_full())?;
    let in_process = runtime.block_on(in_process(&options, reloader, &raw))?;
    if options.in_process_only {
        println!(
            "raw Cedar p50 {:.1} µs, toolgate decision p50 {:.1} µs ({} policies)",
            in_process.raw.p50_us, in_process.toolgate.p50_us, in_process.policies
        );
        return Ok(());
    }
    // First, so that a failed install stops the suite before any load.
    let installed = peer::install()?;
    let served = runtime.block_on(served(&options, &raw, &installed))?;
    let report = report(&options, &in_process, &served, &installed)?;
    if let Some(dir) = options.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&options.out, serde_json::to_string_pretty(&report)?)?;
    print_table(&report);
    println!("\nwritten: {}", options.out.display());
    Ok(())
}

// ---------------------------------------------------------------- statistics

fn side_json(s: Summary) -> Value {
    json!({"p50_us": round2(s.p50_us), "p99_us": round2(s.p99_us), "rps": round2(s.rps)})
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

// ---------------------------------------------------------------- in process

struct InProcess {
    raw: Summary,
    toolgate: Summary,
    policies: usize,
}

fn bob() -> Caller {
    Caller {
        subject_id: "bob".into(),
        tenant_id: "acme".into(),
        scopes: vec!["orders:read".into(), "orders:refund".into()],
        roles: vec!["support_agent".into()],
        agent_id: "support-bot".into(),
        session_id: "s-42".into(),
    }
}

/// The example deployment's static entities (`policies/entities.json`).
fn static_entities() -> Result<Vec<Value>, BoxError> {
    Ok(serde_json::from_str(&std::fs::read_to_string(
        example_policies().join("entities.json"),
    )?)?)
}

/// What the call brings: the executor's order and the caller as the
/// principal entity toolgate derives from the auth context.
fn request_entities() -> Result<Vec<Value>, BoxError> {
    let mut entities: Vec<Value> = serde_json::from_str(ENTITIES)?;
    entities.push(json!({"uid": {"type": "User", "id": "bob"},
        "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}}, "roles": ["support_agent"]},
        "parents": [{"type": "Tenant", "id": "acme"}]}));
    Ok(entities)
}

/// The Cedar context toolgate builds for the call.
fn call_context() -> Value {
    json!({"scopes": ["orders:read", "orders:refund"], "risk": "financial", "approved": false,
           "agent": "support-bot", "session": "s-42",
           "input": {"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}})
}

const PRINCIPAL: &str = r#"User::"bob""#;
const ACTION: &str = r#"Action::"refund_order""#;
const RESOURCE: &str = r#"Order::"ord_1001""#;

/// A naive Cedar sidecar's work per request, everything else built in
/// advance: the example policies, the combined schema, entities and request.
struct RawCedar {
    authorizer: cedar_policy::Authorizer,
    policies: cedar_policy::PolicySet,
    entities: cedar_policy::Entities,
    request: cedar_policy::Request,
}

impl RawCedar {
    fn build(engine: &PolicyEngine) -> Result<Self, BoxError> {
        use cedar_policy::{Context, Entities, EntityUid, PolicySet, Request, Schema};
        let (schema, _) = Schema::from_cedarschema_str(engine.schema_text())?;
        let mut text = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(example_policies())?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "cedar"))
            .collect();
        files.sort();
        for f in files {
            text.push_str(&std::fs::read_to_string(f)?);
            text.push('\n');
        }
        let policies = PolicySet::from_str(&text)?;
        let mut entities = static_entities()?;
        entities.extend(request_entities()?);
        let entities = Entities::from_json_value(Value::Array(entities), Some(&schema))?;
        let action = EntityUid::from_str(ACTION)?;
        let context = Context::from_json_value(call_context(), Some((&schema, &action)))?;
        let request = Request::new(
            EntityUid::from_str(PRINCIPAL)?,
            action,
            EntityUid::from_str(RESOURCE)?,
            context,
            Some(&schema),
        )?;
        let raw = Self {
            authorizer: cedar_policy::Authorizer::new(),
            policies,
            entities,
            request,
        };
        if raw.decide() != cedar_policy::Decision::Allow {
            return Err("the raw floor must allow the refund example".into());
        }
        Ok(raw)
    }

    fn decide(&self) -> cedar_policy::Decision {
        self.authorizer
            .is_authorized(&self.request, &self.policies, &self.entities)
            .decision()
    }

    /// The ids of the policies that determine the allow, sorted: what the
    /// peer must answer too.
    fn reasons(&self) -> Vec<String> {
        let response = self
            .authorizer
            .is_authorized(&self.request, &self.policies, &self.entities);
        let mut reasons: Vec<String> = response
            .diagnostics()
            .reason()
            .map(ToString::to_string)
            .collect();
        reasons.sort();
        reasons
    }
}

async fn in_process(
    o: &Options,
    reloader: std::sync::Arc<toolgate::policy::PolicyReloader>,
    raw: &RawCedar,
) -> Result<InProcess, BoxError> {
    let policies = reloader.live().load_full().policy_count();
    let authorizer = common::in_process(reloader).await?.authorizer;
    let input = AuthorizeInput {
        tool: "refund_order".into(),
        arguments: ARGUMENTS.to_vec(),
        caller: Some(bob()),
        call_id: "call_7".into(),
        request_id: "refund-ord_1001-1".into(),
        entities_json: ENTITIES.into(),
        tenants: TenantScope::Any,
        ..AuthorizeInput::default()
    };
    // Warm both up.
    for _ in 0..o.iterations {
        std::hint::black_box(raw.decide());
        let out = authorizer.authorize(&input).await?;
        if out.decision != Decision::Allow {
            return Err(format!("the refund example must be allowed: {out:?}").into());
        }
    }
    let (mut raw_rounds, mut tg_rounds) = (Vec::new(), Vec::new());
    for _ in 0..o.rounds {
        let mut samples = Vec::with_capacity(o.iterations);
        let start = Instant::now();
        for _ in 0..o.iterations {
            let t = Instant::now();
            std::hint::black_box(raw.decide());
            samples.push(t.elapsed());
        }
        raw_rounds.push(summarize(samples, start.elapsed()));

        let mut samples = Vec::with_capacity(o.iterations);
        let start = Instant::now();
        for _ in 0..o.iterations {
            let t = Instant::now();
            let out = authorizer.authorize(std::hint::black_box(&input)).await;
            samples.push(t.elapsed());
            std::hint::black_box(out)?;
        }
        tg_rounds.push(summarize(samples, start.elapsed()));
    }
    Ok(InProcess {
        raw: medians(&raw_rounds),
        toolgate: medians(&tg_rounds),
        policies,
    })
}

// ---------------------------------------------------------------- served

/// Starts this binary as the echo server, answering `response` to every
/// `Authorize`.
fn start_echo(response: &pb::AuthorizeResponse) -> Result<(ChildGuard, SocketAddr), BoxError> {
    let bytes = prost::Message::encode_to_vec(response);
    let mut child = Command::new(std::env::current_exe()?)
        .env(ECHO_ROLE, hex::encode(bytes))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    Ok((guard, line.trim().parse()?))
}

/// The echo server: a plain tonic service, on the same runtime shape as
/// `toolgate serve`, until its parent closes stdin.
fn echo_server(hex_response: &str) -> Result<(), BoxError> {
    use pb::authorization_service_server::{AuthorizationService, AuthorizationServiceServer};
    use tonic::{Request, Response, Status};

    struct Echo(pb::AuthorizeResponse);

    #[tonic::async_trait]
    impl AuthorizationService for Echo {
        async fn authorize(
            &self,
            request: Request<pb::AuthorizeRequest>,
        ) -> Result<Response<pb::AuthorizeResponse>, Status> {
            std::hint::black_box(request.into_inner());
            Ok(Response::new(self.0.clone()))
        }
        async fn batch_authorize(
            &self,
            _: Request<pb::BatchAuthorizeRequest>,
        ) -> Result<Response<pb::BatchAuthorizeResponse>, Status> {
            Err(Status::unimplemented("echo"))
        }
        async fn validate_result(
            &self,
            _: Request<pb::ValidateResultRequest>,
        ) -> Result<Response<pb::ValidateResultResponse>, Status> {
            Err(Status::unimplemented("echo"))
        }
        async fn list_tools(
            &self,
            _: Request<pb::ListToolsRequest>,
        ) -> Result<Response<pb::ListToolsResponse>, Status> {
            Err(Status::unimplemented("echo"))
        }
    }

    let response: pb::AuthorizeResponse =
        prost::Message::decode(hex::decode(hex_response)?.as_slice())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("{}", listener.local_addr()?);
        let stop = async {
            // The parent closing stdin (or dying) stops the server.
            let _ = tokio::task::spawn_blocking(|| {
                let mut sink = String::new();
                let _ = std::io::stdin().read_line(&mut sink);
            })
            .await;
        };
        tonic::transport::Server::builder()
            .add_service(AuthorizationServiceServer::new(Echo(response)))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                stop,
            )
            .await?;
        Ok(())
    })
}

fn authorize_request() -> pb::AuthorizeRequest {
    pb::AuthorizeRequest {
        tool: "refund_order".into(),
        arguments: ARGUMENTS.to_vec(),
        auth: Some(pb::AuthContext {
            subject_id: "bob".into(),
            tenant_id: "acme".into(),
            scopes: vec!["orders:read".into(), "orders:refund".into()],
            roles: vec!["support_agent".into()],
            agent_id: "support-bot".into(),
            session_id: "s-42".into(),
            identity_token: String::new(),
        }),
        call_id: "call_7".into(),
        request_id: "refund-ord_1001-1".into(),
        entities_json: ENTITIES.into(),
        ..Default::default()
    }
}

/// Runs `concurrency` workers over `channels` (worker `i` on connection
/// `i mod channels`) until `seconds` pass; each worker returns its samples.
async fn fan_out<W, F>(
    channels: &[Channel],
    concurrency: usize,
    seconds: f64,
    worker: W,
) -> Result<Summary, BoxError>
where
    W: Fn(usize, Channel, Instant) -> F,
    F: Future<Output = Result<Vec<Duration>, BoxError>> + Send + 'static,
{
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut workers = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let channel = channels
            .get(i % channels.len().max(1))
            .cloned()
            .ok_or("no channel")?;
        workers.push(tokio::spawn(worker(i, channel, until)));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await??);
    }
    Ok(summarize(all, start.elapsed()))
}

/// `concurrency` workers each run, back to back for `seconds`, a new
/// operation: `Authorize` with `begin_execution` (which must be ALLOW and
/// ACQUIRED), then `CompleteExecution` SUCCEEDED with a valid result. One
/// sample is the pair.
async fn ledger_load(
    channels: &[Channel],
    concurrency: usize,
    seconds: f64,
    round: usize,
) -> Result<Summary, BoxError> {
    fan_out(
        channels,
        concurrency,
        seconds,
        |i, channel, until| async move {
            let mut authz =
                pb::authorization_service_client::AuthorizationServiceClient::new(channel.clone());
            let mut ledger = pb::ledger_service_client::LedgerServiceClient::new(channel);
            let mut samples = Vec::with_capacity(4096);
            let mut n = 0_u64;
            while Instant::now() < until {
                n += 1;
                let mut request = authorize_request();
                request.request_id = format!("perf-c{concurrency}-r{round}-w{i}-{n}");
                request.begin_execution = true;
                let t = Instant::now();
                let r = authz.authorize(request.clone()).await?.into_inner();
                let acquired = r
                    .execution
                    .as_ref()
                    .filter(|e| e.outcome == i32::from(pb::BeginOutcome::Acquired));
                let Some(execution) = acquired else {
                    return Err::<_, BoxError>(format!("not acquired: {r:?}").into());
                };
                let done = ledger
                    .complete_execution(pb::CompleteExecutionRequest {
                        auth: request.auth.clone(),
                        idempotency_key: r.idempotency_key.clone(),
                        fencing_token: execution.fencing_token,
                        status: pb::CompletionStatus::Succeeded.into(),
                        result_json: r#"{"refund_id":"re_1","amount_cents":2500}"#.into(),
                        error: None,
                    })
                    .await?
                    .into_inner();
                samples.push(t.elapsed());
                if done.state != i32::from(pb::ExecutionState::Succeeded) {
                    return Err(format!("not stored: {done:?}").into());
                }
            }
            Ok(samples)
        },
    )
    .await
}

/// One level's medians, per side in [`SIDES`] order.
struct LevelRow {
    level: Level,
    sides: Vec<Sample>,
}

/// One ledger load's medians.
struct LedgerRow {
    store: &'static str,
    level: Level,
    pairs: Summary,
    /// The sidecar's CPU per pair, µs (the database server's is not counted).
    server_cpu_us: f64,
    /// This client's CPU per pair, µs.
    client_cpu_us: f64,
}

/// The overload comparison's figures, over all rounds.
struct OverloadRow {
    /// Medians of the reference level (on the same limited sidecar).
    base: Summary,
    /// Medians of the answered calls at the overload.
    over: Summary,
    answered: usize,
    /// Refusals at the overload, by status.
    refusals: std::collections::BTreeMap<String, u64>,
    /// Refusals at the reference level (none expected), by status.
    base_refusals: std::collections::BTreeMap<String, u64>,
    refusal_p99_us: f64,
    /// Timeouts at either level.
    timeouts: u64,
}

struct Served {
    levels: Vec<LevelRow>,
    memory: drive::Memory,
    ledger: Vec<LedgerRow>,
    /// Why PostgreSQL was not measured, if it was not.
    postgres_skipped: Option<String>,
    overload: OverloadRow,
    peer_policies: usize,
    peer_entities: usize,
}

/// Starts the three sides, runs every level, the ledger and the overload,
/// and stops them.
async fn served(
    o: &Options,
    raw: &RawCedar,
    installed: &peer::Installed,
) -> Result<Served, BoxError> {
    let dir = tempfile::tempdir()?;
    let request = authorize_request();

    let store = FreshStore::sqlite()?;
    let (toolgate, toolgate_addr) = common::start_sidecar(store.url())?;
    let toolgate_channels = drive::grpc_channels(toolgate_addr, CONNECTIONS).await?;
    // The echo answers exactly what toolgate answers, byte for byte.
    let real = pb::authorization_service_client::AuthorizationServiceClient::new(
        toolgate_channels.first().cloned().ok_or("no channel")?,
    )
    .authorize(request.clone())
    .await?
    .into_inner();
    if real.decision != i32::from(pb::Decision::Allow) {
        return Err(format!("toolgate must allow the refund example: {real:?}").into());
    }
    let (echo, echo_addr) = start_echo(&real)?;
    let echo_channels = drive::grpc_channels(echo_addr, CONNECTIONS).await?;

    let running = peer::start(&installed.binary, dir.path()).await?;
    let policies = peer::policies_for_peer(&raw.policies)?;
    let entities = Value::Array(static_entities()?);
    peer::feed(running.addr, &policies, &entities).await?;
    let additional = request_entities()?;
    let body = json!({"principal": PRINCIPAL, "action": ACTION, "resource": RESOURCE,
                      "context": call_context(), "additional_entities": additional});
    let peer_connections = drive::http_connections(running.addr, CONNECTIONS).await?;

    let sides = [
        Side {
            name: "echo",
            pid: echo.0.id(),
            transport: Transport::Grpc {
                channels: echo_channels,
                request: Box::new(request.clone()),
                expect: std::sync::Arc::new(Expect::Exactly(Box::new(real))),
            },
        },
        Side {
            name: "toolgate",
            pid: toolgate.0.id(),
            transport: Transport::Grpc {
                channels: toolgate_channels.clone(),
                request: Box::new(request.clone()),
                expect: std::sync::Arc::new(Expect::Allow),
            },
        },
        Side {
            name: "peer",
            pid: running.guard.0.id(),
            transport: Transport::Http {
                connections: peer_connections,
                path: "/v1/is_authorized",
                body: Bytes::from(serde_json::to_vec(&body)?),
                reasons: std::sync::Arc::new(raw.reasons()),
            },
        },
    ];

    let mut levels = Vec::new();
    for level in LEVELS {
        println!("served, {}: warming up", level.name());
        for side in &sides {
            drive::measure(side, level, o.seconds / 4.0).await?;
        }
        let mut per_side: Vec<Vec<Sample>> = sides.iter().map(|_| Vec::new()).collect();
        for round in 0..o.rounds {
            // Each round starts with the next side, so that no side is
            // always measured right after the same one.
            for k in 0..sides.len() {
                let j = (round + k) % sides.len();
                if let (Some(side), Some(into)) = (sides.get(j), per_side.get_mut(j)) {
                    into.push(drive::measure(side, level, o.seconds).await?);
                }
            }
        }
        levels.push(LevelRow {
            level,
            sides: per_side.iter().map(|s| drive::medians(s)).collect(),
        });
    }
    let memory = drive::memory_of(toolgate.0.id())?;
    drop(sides);
    drop(running);
    drop(echo);

    let mut ledger = Vec::new();
    for level in LEDGER_SQLITE {
        println!("ledger, sqlite, {}", level.name());
        ledger
            .push(ledger_rounds(o, &toolgate_channels, ("sqlite", toolgate.0.id()), level).await?);
    }
    drop(toolgate);
    drop(store);
    let postgres_skipped = match std::env::var(toolgate::store::scratch::TEST_URL_VAR) {
        Ok(url) => {
            let store = FreshStore::postgres(&url).await.map_err(|e| {
                format!(
                    "{} is set but its server refuses: {e}",
                    toolgate::store::scratch::TEST_URL_VAR
                )
            })?;
            let (sidecar, addr) = common::start_sidecar(store.url())?;
            let channels = drive::grpc_channels(addr, CONNECTIONS).await?;
            for level in LEDGER_POSTGRES {
                println!("ledger, postgres, {}", level.name());
                let side = ("postgres", sidecar.0.id());
                ledger.push(ledger_rounds(o, &channels, side, level).await?);
            }
            None
        }
        Err(_) => Some(format!(
            "{} is not set",
            toolgate::store::scratch::TEST_URL_VAR
        )),
    };

    println!(
        "overload, {} against {}",
        OVERLOAD.name(),
        OVERLOAD_BASE.name()
    );
    let overload = overload_rounds(o, dir.path(), &request).await?;
    Ok(Served {
        levels,
        memory,
        ledger,
        postgres_skipped,
        overload,
        peer_policies: policies.as_array().map_or(0, Vec::len),
        peer_entities: entities.as_array().map_or(0, Vec::len) + additional.len(),
    })
}

/// The ledger pairs at `level`, after a warm-up, medians over the rounds,
/// with the CPU the sidecar (process `pid`) spent per pair.
async fn ledger_rounds(
    o: &Options,
    channels: &[Channel],
    (store, pid): (&'static str, u32),
    level: Level,
) -> Result<LedgerRow, BoxError> {
    let ch = channels.get(..level.connections).ok_or("channels")?;
    ledger_load(ch, level.calls, o.seconds / 4.0, 0).await?;
    let (mut rounds, mut server_cpu, mut client_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let me = std::process::id();
    for round in 1..=o.rounds {
        let (server0, client0) = (drive::cpu_time(pid)?, drive::cpu_time(me)?);
        let start = Instant::now();
        let pairs = ledger_load(ch, level.calls, o.seconds, round).await?;
        let elapsed = start.elapsed();
        let (server1, client1) = (drive::cpu_time(pid)?, drive::cpu_time(me)?);
        let count = (pairs.rps * elapsed.as_secs_f64()).max(1.0);
        let per = |d: Duration| d.as_secs_f64() * 1e6 / count;
        server_cpu.push(per(server1.saturating_sub(server0)));
        client_cpu.push(per(client1.saturating_sub(client0)));
        rounds.push(pairs);
    }
    Ok(LedgerRow {
        store,
        level,
        pairs: medians(&rounds),
        server_cpu_us: common::median(server_cpu),
        client_cpu_us: common::median(client_cpu),
    })
}

/// A sidecar whose `[limits] max_calls_in_flight` is the overload limit
/// (the documented key, `docs/configuration.md`), at the reference level
/// and at the overload, alternating.
async fn overload_rounds(
    o: &Options,
    dir: &std::path::Path,
    request: &pb::AuthorizeRequest,
) -> Result<OverloadRow, BoxError> {
    let config = dir.join("overload.toml");
    std::fs::write(
        &config,
        format!("[limits]\nmax_calls_in_flight = {}\n", o.overload_limit),
    )?;
    let store = FreshStore::sqlite()?;
    let config_path = config
        .to_str()
        .ok_or("a temporary path that is not UTF-8")?;
    let (sidecar, addr) = common::start_sidecar_with(store.url(), &["--config", config_path])?;
    let channels = drive::grpc_channels(addr, CONNECTIONS).await?;
    let backoff = o.overload_backoff;
    drive::overload(&channels, request, OVERLOAD_BASE, o.seconds / 4.0, backoff).await?;
    drive::overload(&channels, request, OVERLOAD, o.seconds / 4.0, backoff).await?;
    let (mut base, mut over) = (Vec::new(), Vec::new());
    let mut row = OverloadRow {
        base: Summary::default(),
        over: Summary::default(),
        answered: 0,
        refusals: std::collections::BTreeMap::new(),
        base_refusals: std::collections::BTreeMap::new(),
        refusal_p99_us: 0.0,
        timeouts: 0,
    };
    let mut refusal_p99s = Vec::new();
    for _ in 0..o.rounds {
        let b = drive::overload(&channels, request, OVERLOAD_BASE, o.seconds, backoff).await?;
        let v = drive::overload(&channels, request, OVERLOAD, o.seconds, backoff).await?;
        row.timeouts += b.timeouts + v.timeouts;
        for (code, n) in b.refusals {
            *row.base_refusals.entry(code).or_default() += n;
        }
        for (code, n) in v.refusals {
            *row.refusals.entry(code).or_default() += n;
        }
        row.answered += v.answered_count;
        refusal_p99s.push(v.refusal_p99_us);
        base.push(b.answered);
        over.push(v.answered);
    }
    drop(sidecar);
    row.base = medians(&base);
    row.over = medians(&over);
    row.refusal_p99_us = common::median(refusal_p99s);
    Ok(row)
}

// ---------------------------------------------------------------- the report

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "cpu_model": model,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
    })
}

/// A target: `value` against `limit`, `at_most` (≤) or at least (≥).
fn target(name: &str, value: f64, limit: f64, at_most: bool) -> Value {
    let met = if at_most {
        value <= limit
    } else {
        value >= limit
    };
    json!({"name": name, "value": round2(value), "limit": limit,
           "comparison": if at_most { "<=" } else { ">=" }, "met": met})
}

/// A target this run could not measure, and why.
fn unmeasured(name: &str, limit: f64, at_most: bool, why: &str) -> Value {
    json!({"name": name, "value": null, "limit": limit,
           "comparison": if at_most { "<=" } else { ">=" }, "met": null,
           "not_measured": why})
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::INFINITY }
}

fn sample_json(s: &Sample) -> Value {
    json!({"rps": round2(s.latency.rps), "p50_us": round2(s.latency.p50_us),
           "p99_us": round2(s.latency.p99_us), "server_cpu_us": round2(s.server_cpu_us),
           "client_cpu_us": round2(s.client_cpu_us), "requests": s.requests})
}

/// The per-level comparisons: toolgate against echo and against the peer.
fn level_ratios(row: &LevelRow) -> Option<Value> {
    let [echo, toolgate, peer] = row.sides.as_slice() else {
        return None;
    };
    Some(json!({
        "toolgate_server_cpu_vs_echo": round2(ratio(toolgate.server_cpu_us, echo.server_cpu_us)),
        "toolgate_server_cpu_vs_peer": round2(ratio(toolgate.server_cpu_us, peer.server_cpu_us)),
        "toolgate_rps_vs_peer": round2(ratio(toolgate.latency.rps, peer.latency.rps)),
        "toolgate_rps_vs_echo": round2(ratio(toolgate.latency.rps, echo.latency.rps)),
    }))
}

fn report(
    o: &Options,
    p: &InProcess,
    served: &Served,
    installed: &peer::Installed,
) -> Result<Value, BoxError> {
    let mut ratios = serde_json::Map::new();
    let mut targets = Vec::new();
    let in_process_ratio = ratio(p.toolgate.p50_us, p.raw.p50_us);
    ratios.insert(
        "in_process_p50_vs_raw_cedar".into(),
        json!(round2(in_process_ratio)),
    );
    targets.push(target(
        "in_process_p50_vs_raw_cedar",
        in_process_ratio,
        1.5,
        true,
    ));

    let mut levels = Vec::new();
    for row in &served.levels {
        let name = row.level.name();
        let per_level = level_ratios(row).ok_or("a level without its three sides")?;
        let want: &[(&str, f64, bool)] = match name.as_str() {
            "16:4" => &[("toolgate_server_cpu_vs_echo", 2.5, true)],
            "16:16" => &[
                ("toolgate_rps_vs_peer", 1.5, false),
                ("toolgate_server_cpu_vs_peer", 0.5, true),
            ],
            "64:4" => &[
                ("toolgate_server_cpu_vs_echo", 2.5, true),
                ("toolgate_rps_vs_peer", 1.5, false),
                ("toolgate_server_cpu_vs_peer", 0.5, true),
            ],
            _ => &[],
        };
        for &(what, limit, at_most) in want {
            let value = per_level[what].as_f64().unwrap_or(f64::INFINITY);
            let key = format!("{what}_{name}");
            ratios.insert(key.clone(), json!(value));
            targets.push(target(&key, value, limit, at_most));
        }
        let mut entry = serde_json::Map::new();
        entry.insert("level".into(), json!(name));
        entry.insert("calls".into(), json!(row.level.calls));
        entry.insert("connections".into(), json!(row.level.connections));
        for (side, sample) in SIDES.iter().zip(&row.sides) {
            entry.insert((*side).into(), sample_json(sample));
        }
        entry.insert("ratios".into(), per_level);
        levels.push(Value::Object(entry));
    }

    #[allow(clippy::cast_precision_loss, reason = "kilobytes")]
    let peak_mib = served.memory.hwm_kb as f64 / 1024.0;
    targets.push(target("sidecar_peak_rss_mib", peak_mib, 25.0, true));

    let ledger: Vec<Value> = served
        .ledger
        .iter()
        .map(|r| {
            json!({"store": r.store, "level": r.level.name(), "pairs": side_json(r.pairs),
                     "server_cpu_us_per_pair": round2(r.server_cpu_us),
                     "client_cpu_us_per_pair": round2(r.client_cpu_us)})
        })
        .collect();
    for (store, level) in [("sqlite", "16:16"), ("postgres", "32:16")] {
        let name = format!("ledger_pairs_per_s_{store}_{level}");
        let measured = served
            .ledger
            .iter()
            .find(|r| r.store == store && r.level.name() == level);
        match (measured, &served.postgres_skipped) {
            (Some(r), _) => targets.push(target(&name, r.pairs.rps, 5000.0, false)),
            (None, Some(why)) => targets.push(unmeasured(&name, 5000.0, false, why)),
            (None, None) => return Err(format!("no ledger figure for {store}").into()),
        }
    }

    let ov = &served.overload;
    let retryable = |code: &str| matches!(code, "ResourceExhausted" | "Unavailable");
    let non_retryable: u64 = ov
        .refusals
        .iter()
        .chain(&ov.base_refusals)
        .filter(|(code, _)| !retryable(code))
        .map(|(_, n)| n)
        .sum();
    let p99_ratio = ratio(ov.over.p99_us, ov.base.p99_us);
    ratios.insert("overload_p99_vs_base".into(), json!(round2(p99_ratio)));
    targets.push(target(
        &format!(
            "overload_p99_{}_vs_{}",
            OVERLOAD.name(),
            OVERLOAD_BASE.name()
        ),
        p99_ratio,
        3.0,
        true,
    ));
    #[allow(clippy::cast_precision_loss, reason = "a count of calls")]
    let (timeouts, non_retryable_f) = (ov.timeouts as f64, non_retryable as f64);
    targets.push(target("overload_timeouts", timeouts, 0.0, true));
    targets.push(target(
        "overload_non_retryable_refusals",
        non_retryable_f,
        0.0,
        true,
    ));

    Ok(json!({
        "schema": "toolgate-perf/2",
        "machine": machine(),
        "settings": {
            "rounds": o.rounds, "seconds_per_side": o.seconds, "iterations_per_side": o.iterations,
            "levels": LEVELS.iter().map(|l| l.name()).collect::<Vec<_>>(),
            "cpu": "utime + stime of the whole process from /proc/<pid>/stat over the measured window, per answered request",
            "clock_ticks_per_second": drive::clock_ticks_per_second()?,
            "overload_limit": o.overload_limit,
            "overload_backoff_ms": u64::try_from(o.overload_backoff.as_millis())?,
        },
        "peer": {
            "name": "permitio/cedar-agent",
            "crate": peer::CRATE,
            "version": installed.version,
            "binary": installed.binary.display().to_string(),
            "installed_this_run": installed.installed_now,
            "transport": "HTTP/1.1 keep-alive, JSON",
            "log_level": "error",
            "policies": served.peer_policies,
            "entities": served.peer_entities,
            "policy_translation": "`is T` scope constraints dropped, annotations removed (Cedar 2.4)",
        },
        "in_process": {
            "policies": p.policies,
            "raw_cedar": side_json(p.raw),
            "toolgate": side_json(p.toolgate),
            "p50_ratio": round2(in_process_ratio),
        },
        "levels": levels,
        "ledger": ledger,
        "ledger_postgres_not_measured": served.postgres_skipped,
        "overload": {
            "limit": o.overload_limit,
            "base": {"level": OVERLOAD_BASE.name(), "answered": side_json(ov.base),
                     "refusals": ov.base_refusals},
            "overload": {"level": OVERLOAD.name(), "answered": side_json(ov.over),
                         "answered_calls": ov.answered, "refusals": ov.refusals,
                         "refusal_p99_us": round2(ov.refusal_p99_us)},
            "timeouts": ov.timeouts,
            "p99_ratio": round2(p99_ratio),
        },
        "memory": {"rss_kb": served.memory.rss_kb, "peak_rss_kb": served.memory.hwm_kb,
                   "rss_anon_kb": served.memory.anon_kb, "rss_file_kb": served.memory.file_kb},
        "ratios": ratios,
        "targets": targets,
    }))
}

fn print_table(r: &Value) {
    let f = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
    };
    let ip = &r["in_process"];
    println!(
        "in process ({} policies)        p50 µs    p99 µs",
        ip["policies"]
    );
    for (name, side) in [
        ("raw Cedar is_authorized", "raw_cedar"),
        ("toolgate decision", "toolgate"),
    ] {
        println!(
            "  {name:<28} {:>8} {:>9}",
            f(&ip[side]["p50_us"]),
            f(&ip[side]["p99_us"])
        );
    }
    println!("  ratio p50: {}", f(&ip["p50_ratio"]));
    println!(
        "\nserved on loopback ({} {})",
        r["peer"]["name"].as_str().unwrap_or_default(),
        r["peer"]["version"].as_str().unwrap_or_default()
    );
    println!(
        "  {:<6} {:<9} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "C:K", "side", "req/s", "p50 µs", "p99 µs", "server µs", "client µs"
    );
    for row in r["levels"].as_array().into_iter().flatten() {
        for side in SIDES {
            let s = &row[side];
            println!(
                "  {:<6} {side:<9} {:>9} {:>9} {:>9} {:>11} {:>11}",
                row["level"].as_str().unwrap_or_default(),
                f(&s["rps"]),
                f(&s["p50_us"]),
                f(&s["p99_us"]),
                f(&s["server_cpu_us"]),
                f(&s["client_cpu_us"])
            );
        }
        let q = &row["ratios"];
        println!(
            "  {:<16} toolgate/echo server CPU {}, toolgate/peer server CPU {}, rps {}",
            "",
            f(&q["toolgate_server_cpu_vs_echo"]),
            f(&q["toolgate_server_cpu_vs_peer"]),
            f(&q["toolgate_rps_vs_peer"])
        );
    }
    println!(
        "\nAuthorize(begin_execution) + CompleteExecution   pairs/s    p50 µs    p99 µs  CPU µs/pair: sidecar, client"
    );
    for row in r["ledger"].as_array().into_iter().flatten() {
        println!(
            "  {:<9} {:<6} {:>35} {:>9} {:>9} {:>14} {:>8}",
            row["store"].as_str().unwrap_or_default(),
            row["level"].as_str().unwrap_or_default(),
            f(&row["pairs"]["rps"]),
            f(&row["pairs"]["p50_us"]),
            f(&row["pairs"]["p99_us"]),
            f(&row["server_cpu_us_per_pair"]),
            f(&row["client_cpu_us_per_pair"])
        );
    }
    if let Some(why) = r["ledger_postgres_not_measured"].as_str() {
        println!("  postgres not measured: {why}");
    }
    let ov = &r["overload"];
    println!(
        "\noverload (max_calls_in_flight {}): p99 of answered calls {} µs at {}, {} µs at {}",
        ov["limit"],
        f(&ov["base"]["answered"]["p99_us"]),
        ov["base"]["level"].as_str().unwrap_or_default(),
        f(&ov["overload"]["answered"]["p99_us"]),
        ov["overload"]["level"].as_str().unwrap_or_default()
    );
    println!(
        "  answered {} calls ({} req/s); refusals {}; refusal p99 {} µs; timeouts {}",
        ov["overload"]["answered_calls"],
        f(&ov["overload"]["answered"]["rps"]),
        ov["overload"]["refusals"],
        f(&ov["overload"]["refusal_p99_us"]),
        ov["timeouts"]
    );
    println!(
        "\nsidecar memory: rss {} kB (anonymous {} kB, mapped files {} kB), peak {} kB",
        r["memory"]["rss_kb"],
        r["memory"]["rss_anon_kb"],
        r["memory"]["rss_file_kb"],
        r["memory"]["peak_rss_kb"]
    );
    println!("\ntargets:");
    for t in r["targets"].as_array().into_iter().flatten() {
        let verdict = match t["met"].as_bool() {
            Some(true) => "met".to_owned(),
            Some(false) => "MISSED".to_owned(),
            None => format!(
                "not measured: {}",
                t["not_measured"].as_str().unwrap_or_default()
            ),
        };
        println!(
            "  {:<40} {:>8} {} {:<6} {verdict}",
            t["name"].as_str().unwrap_or_default(),
            f(&t["value"]),
            t["comparison"].as_str().unwrap_or_default(),
            t["limit"],
        );
    }
}
