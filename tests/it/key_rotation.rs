//! Issue 18 point 9, keys that rotate, against a real `toolgate serve` and
//! a real HTTP server on loopback publishing the key set the test rotates:
//! `[identity] jwks_url` (and OIDC discovery from the issuer) is fetched
//! at start, again on its `max-age` (bounded) and on an unknown `kid`
//! (rate limited); the last good set stays on fetch errors; a key removed
//! from the set stops verifying without a restart; and the issuer is
//! required whenever tokens are verified.
//!
//! On main at ab769e4 these fail: `[identity] jwks_url`, `discovery` and
//! the refresh bounds do not exist (the sidecar refuses the config), and a
//! key set without an issuer is served.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use tonic_types::StatusExt as _;

use toolgate::grpc::pb;
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;

use crate::sidecar::{Sidecar, toolgate};
use crate::support::{approver_claims, fixture, signed, signed_with};

/// What the test's identity provider publishes, and how often it was asked.
struct Published {
    keys: Vec<serde_json::Value>,
    status: StatusCode,
    cache_control: &'static str,
    fetches: usize,
    /// The discovery document's `issuer` (its own address when empty).
    issuer: String,
}

type Idp = Arc<Mutex<Published>>;

async fn jwks(State(idp): State<Idp>) -> Response {
    let mut p = idp.lock().unwrap();
    p.fetches += 1;
    let body = serde_json::json!({ "keys": p.keys }).to_string();
    let mut response = (p.status, body).into_response();
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(p.cache_control),
    );
    response
}

async fn discovery(State(idp): State<(Idp, String)>) -> Response {
    let (idp, base) = idp;
    let issuer = {
        let p = idp.lock().unwrap();
        if p.issuer.is_empty() {
            base.clone()
        } else {
            p.issuer.clone()
        }
    };
    let body = serde_json::json!({
        "issuer": issuer,
        "jwks_uri": format!("{base}/jwks"),
    })
    .to_string();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Serves the key set at `/jwks` and a discovery document on a free
/// loopback port; the server ends with the test's runtime.
async fn identity_provider(keys: Vec<serde_json::Value>) -> (Idp, String) {
    let idp = Arc::new(Mutex::new(Published {
        keys,
        status: StatusCode::OK,
        cache_control: "max-age=3600",
        fetches: 0,
        issuer: String::new(),
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/jwks", axum::routing::get(jwks))
        .with_state(Arc::clone(&idp))
        .merge(
            axum::Router::new()
                .route(
                    "/.well-known/openid-configuration",
                    axum::routing::get(discovery),
                )
                .with_state((Arc::clone(&idp), base.clone())),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (idp, base)
}

/// The fixture's `ec-1` public key, as the provider publishes it.
fn fixture_ec_key() -> serde_json::Value {
    let set: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("keys/jwks.json")).unwrap()).unwrap();
    set["keys"][1].clone()
}

/// A fresh P-256 key: its public JWK (with `kid`) and its signing key.
fn new_key(kid: &str) -> (serde_json::Value, jsonwebtoken::EncodingKey) {
    let pair = rcgen::KeyPair::generate().unwrap();
    let raw = pair.public_key_raw();
    assert_eq!(raw.len(), 65, "an uncompressed P-256 point");
    let jwk = serde_json::json!({
        "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
        "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
        "y": URL_SAFE_NO_PAD.encode(&raw[33..65]),
    });
    let signing = jsonwebtoken::EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
    (jwk, signing)
}

/// An approver token of dana (acme's support admin) signed by `key` as `kid`.
fn token_by(kid: &str, key: &jsonwebtoken::EncodingKey) -> String {
    let claims = approver_claims("dana", "acme", &["support_admin"], 300);
    signed_with(jsonwebtoken::Algorithm::ES256, Some(kid), &claims, key)
}

/// The fixture's `ec-1` token of dana.
fn fixture_token() -> String {
    let claims = approver_claims("dana", "acme", &["support_admin"], 300);
    signed(jsonwebtoken::Algorithm::ES256, Some("ec-1"), &claims)
}

/// `ListApprovals` with `token`: `Ok(())`, or the refusal's reason.
async fn list(sidecar: &Sidecar, token: &str) -> Result<(), String> {
    match ApprovalServiceClient::new(sidecar.channel().await)
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: token.into(),
            ..Default::default()
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
            Err(status
                .get_details_error_info()
                .and_then(|i| i.metadata.get("reason").cloned())
                .unwrap_or_default())
        }
    }
}

fn fetches(idp: &Idp) -> usize {
    idp.lock().unwrap().fetches
}

fn write_config(dir: &Path, body: &str) {
    std::fs::write(dir.join("toolgate.toml"), body).unwrap();
}

const MIN_REFRESH_SECONDS: u64 = 3;

/// The whole rotation, in order: a key published after start verifies on
/// its first token (the unknown kid asks for a fetch and the call waits for
/// it); a flood of made-up kids asks the provider at most once per minimum
/// interval; a key removed from the set stops verifying, no restart; and
/// while the provider fails, the last good set stays in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_set_is_followed_without_a_restart() {
    let (idp, base) = identity_provider(vec![fixture_ec_key()]).await;
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &format!(
            "issuer = \"https://idp.test\"\naudience = \"toolgate\"\n[identity]\n\
             jwks_url = \"{base}/jwks\"\njwks_refresh_min_seconds = {MIN_REFRESH_SECONDS}\n\
             jwks_refresh_max_seconds = 3600\n"
        ),
    );
    let sidecar = Sidecar::start(dir.path(), &[]);
    assert_eq!(fetches(&idp), 1, "fetched once at start");
    assert_eq!(list(&sidecar, &fixture_token()).await, Ok(()));

    // A flood of unknown kids (a key the provider never published).
    let (_, stranger) = new_key("unused");
    let flood_started = Instant::now();
    for n in 0..30 {
        let forged = token_by(&format!("ghost-{n}"), &stranger);
        assert_eq!(list(&sidecar, &forged).await, Err("unknown_key".to_owned()));
    }
    let elapsed = flood_started.elapsed().as_secs();
    let asked = fetches(&idp) - 1;
    assert!(
        asked >= 1 && u64::try_from(asked).unwrap() <= 1 + elapsed / MIN_REFRESH_SECONDS,
        "30 unknown kids in {elapsed} s made {asked} fetches"
    );

    // The provider publishes a new key (and shortens the cache life); past
    // the minimum interval, its first token verifies.
    let (next_jwk, next_key) = new_key("ec-2");
    {
        let mut p = idp.lock().unwrap();
        p.keys = vec![fixture_ec_key(), next_jwk.clone()];
        p.cache_control = "public, max-age=1";
    }
    tokio::time::sleep(
        Duration::from_secs(MIN_REFRESH_SECONDS + 1).saturating_sub(flood_started.elapsed()),
    )
    .await;
    let before = fetches(&idp);
    assert_eq!(list(&sidecar, &token_by("ec-2", &next_key)).await, Ok(()));
    assert_eq!(fetches(&idp), before + 1, "the unknown kid fetched the set");

    // The old key is removed from the set: within the refresh interval
    // (max-age 1 s, raised to the 3 s minimum) it stops verifying.
    idp.lock().unwrap().keys = vec![next_jwk];
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match list(&sidecar, &fixture_token()).await {
            Err(reason) => {
                assert_eq!(reason, "unknown_key");
                break;
            }
            Ok(()) => {
                assert!(Instant::now() < deadline, "the removed key still verifies");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(list(&sidecar, &token_by("ec-2", &next_key)).await, Ok(()));

    // The provider fails: two failed fetches later, the last good set
    // still verifies.
    let failing_from = {
        let mut p = idp.lock().unwrap();
        p.status = StatusCode::INTERNAL_SERVER_ERROR;
        p.fetches
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while fetches(&idp) < failing_from + 2 {
        assert!(Instant::now() < deadline, "the set was not fetched again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(list(&sidecar, &token_by("ec-2", &next_key)).await, Ok(()));
    assert_eq!(
        list(&sidecar, &fixture_token()).await,
        Err("unknown_key".to_owned())
    );
}

/// OIDC discovery: the key set's URL comes from the issuer's
/// `/.well-known/openid-configuration`, whose `issuer` must be the
/// configured one exactly; a document naming another issuer stops the
/// start with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_set_is_found_by_oidc_discovery_from_the_issuer() {
    let (key, signing) = new_key("disc-1");
    let (idp, base) = identity_provider(vec![key]).await;
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &format!("issuer = \"{base}\"\naudience = \"toolgate\"\n[identity]\ndiscovery = true\n"),
    );
    let sidecar = Sidecar::start(dir.path(), &[]);
    let mut claims = approver_claims("dana", "acme", &["support_admin"], 300);
    claims["iss"] = serde_json::json!(base);
    let token = signed_with(
        jsonwebtoken::Algorithm::ES256,
        Some("disc-1"),
        &claims,
        &signing,
    );
    assert_eq!(list(&sidecar, &token).await, Ok(()));
    // A token of another issuer signed by the same key is not accepted.
    claims["iss"] = serde_json::json!("https://idp.test");
    let other = signed_with(
        jsonwebtoken::Algorithm::ES256,
        Some("disc-1"),
        &claims,
        &signing,
    );
    assert_eq!(list(&sidecar, &other).await, Err("wrong_issuer".to_owned()));
    drop(sidecar);

    idp.lock().unwrap().issuer = "https://evil.test".into();
    let stderr = refused_start(dir.path());
    assert!(
        stderr.contains("names another issuer than the configured one"),
        "{stderr}"
    );
}

/// Runs `toolgate serve` in `dir` (its `toolgate.toml`) and expects it to
/// refuse to start within 20 s; its stderr.
fn refused_start(dir: &Path) -> String {
    let mut command = toolgate();
    command
        .arg("serve")
        .arg("--policies")
        .arg(crate::support::example_policies())
        .args(["--listen", "127.0.0.1:0"])
        .arg("--store")
        .arg(format!("sqlite://{}", dir.join("toolgate.db").display()))
        .current_dir(dir);
    crate::sidecar::refused_start(command, Duration::from_secs(20))
}

/// The issuer is required whenever tokens are verified: a key set shared
/// by every application of the provider, without `iss`, would take any of
/// their tokens. Refused at start, naming the key; and a key set that
/// cannot be fetched at start stops the start too (fail closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_without_issuer_or_reachable_key_set_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &format!(
            "jwks_file = {:?}\naudience = \"toolgate\"\n",
            fixture("keys/jwks.json")
        ),
    );
    let stderr = refused_start(dir.path());
    assert!(
        stderr.contains("invalid `issuer`: is required whenever identity tokens are verified"),
        "{stderr}"
    );

    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/jwks", closed.local_addr().unwrap());
    drop(closed);
    write_config(
        dir.path(),
        &format!("issuer = \"https://idp.test\"\n[identity]\njwks_url = \"{url}\"\n"),
    );
    let stderr = refused_start(dir.path());
    assert!(
        stderr.contains("loading the identity provider's key set: fetching"),
        "{stderr}"
    );
    // Plain http to a host that is not loopback is never fetched.
    write_config(
        dir.path(),
        "issuer = \"https://idp.test\"\n[identity]\njwks_url = \"http://idp.test/jwks\"\n",
    );
    let stderr = refused_start(dir.path());
    assert!(stderr.contains("is not an https:// URL"), "{stderr}");
}
