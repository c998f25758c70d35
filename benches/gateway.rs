//! The gateway door's cost (issue 14): the same decision asked through the
//! AuthZEN door (`POST /access/v1/evaluation`, JSON over HTTP/1.1
//! keep-alive, one connection per concurrent client as an HTTP/1.1 PEP
//! holds them) and through `Authorize` (gRPC over h2, one connection), side
//! by side in one run against one real `toolgate serve` on SQLite,
//! alternating over rounds, at 1 and 16 concurrent requests; and through
//! Envoy's ext_authz `Check` (gRPC over h2, one connection, as Envoy's
//! cluster holds it) with the same call as an MCP `tools/call` body and
//! bob's bearer token (issue 15).
//!
//! The doors decide the refund example for bob (support agent, acme)
//! with the resource read from the entity store (`entities_json` empty on
//! `Authorize`; a gateway sends none), so they differ by the door alone.
//! Every answer must be an allow.
//!
//! Run: `cargo bench --bench gateway` (options after `--`: `--rounds N`,
//! `--seconds S` per side and round). Prints a table and writes
//! `target/perf/gateway.json`.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tonic::transport::Endpoint;
use toolgate::grpc::pb;

use common::{Summary, medians, summarize};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CONCURRENCY: [usize; 2] = [1, 16];
const ORDER: &str = r#"[{"uid":{"type":"Order","id":"ord_1001"},"parents":[{"type":"Tenant","id":"acme"}],
 "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"alice"}},
 "status":"delivered","total_cents":50000}}]"#;

struct Options {
    rounds: usize,
    seconds: f64,
}

impl Options {
    fn parse() -> Result<Self, BoxError> {
        let mut o = Self {
            rounds: 5,
            seconds: 2.0,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("`{a}` needs a value"));
            match a.as_str() {
                "--rounds" => o.rounds = value()?.parse()?,
                "--seconds" => o.seconds = value()?.parse()?,
                // `cargo bench` passes `--bench`; filters are not used here.
                _ => {}
            }
        }
        if o.rounds == 0 || o.seconds <= 0.0 {
            return Err("rounds and seconds must be positive".into());
        }
        Ok(o)
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The refund example as AuthZEN: toolgate's profile (DESIGN §11.1).
fn evaluation() -> Vec<u8> {
    json!({
        "subject": {"type": "identity", "id": "bob", "properties": {
            "tenant": "acme", "roles": ["support_agent"], "scopes": ["orders:read", "orders:refund"]}},
        "action": {"name": "tools/call"},
        "resource": {"type": "tool", "id": "refund_order", "properties": {"arguments": {
            "order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}}},
        "context": {"agent": "support-bot", "session": "s-42", "request_id": "refund-ord_1001-1"}
    })
    .to_string()
    .into_bytes()
}

fn authorize_request() -> pb::AuthorizeRequest {
    pb::AuthorizeRequest {
        tool: "refund_order".into(),
        arguments: br#"{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}"#
            .to_vec(),
        auth: Some(pb::AuthContext {
            subject_id: "bob".into(),
            tenant_id: "acme".into(),
            scopes: vec!["orders:read".into(), "orders:refund".into()],
            roles: vec!["support_agent".into()],
            agent_id: "support-bot".into(),
            session_id: "s-42".into(),
            identity_token: String::new(),
        }),
        request_id: "refund-ord_1001-1".into(),
        ..Default::default()
    }
}

/// `concurrency` clients, each on its own keep-alive HTTP/1.1 connection,
/// post the evaluation back to back for `seconds`.
async fn authzen(addr: SocketAddr, concurrency: usize, seconds: f64) -> Result<Summary, BoxError> {
    let body = Bytes::from(evaluation());
    let mut senders = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        senders.push(sender);
    }
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut workers = Vec::with_capacity(concurrency);
    for mut sender in senders {
        let body = body.clone();
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(16_384);
            while Instant::now() < until {
                let request = http::Request::post("/access/v1/evaluation")
                    .header(http::header::HOST, format!("127.0.0.1:{}", addr.port()))
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(body.clone()))?;
                let t = Instant::now();
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                let status = response.status();
                let bytes = response.into_body().collect().await?.to_bytes();
                samples.push(t.elapsed());
                let answer: Value = serde_json::from_slice(&bytes)?;
                if status != http::StatusCode::OK || answer.get("decision") != Some(&json!(true)) {
                    return Err::<_, BoxError>(format!("not allowed: {status} {answer}").into());
                }
            }
            Ok(samples)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await??);
    }
    Ok(summarize(all, start.elapsed()))
}

/// `concurrency` clients send `Authorize` back to back for `seconds` over
/// one h2 connection.
/// bob's bearer token, signed with the test key the sidecar's JWKS holds.
fn bob_token() -> Result<String, BoxError> {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures/keys");
    let key = jsonwebtoken::EncodingKey::from_ec_pem(&std::fs::read(fixtures.join("ec.pem"))?)?;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("ec-1".into());
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        + 3600;
    let claims = json!({"sub": "bob", "tenant": "acme", "roles": ["support_agent"],
        "scope": "orders:read orders:refund", "iss": "https://idp.test", "aud": "toolgate", "exp": exp});
    Ok(jsonwebtoken::encode(&header, &claims, &key)?)
}

/// The refund example as Envoy's ext_authz filter sends it: a `tools/call`
/// body as `raw_body`, the headers in lower case.
fn check_request(token: &str) -> envoy_types::ext_authz::v3::pb::CheckRequest {
    use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, attribute_context};
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "refund_order",
        "arguments": {"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}}})
    .to_string()
    .into_bytes();
    let headers = [
        (":method", "POST".to_owned()),
        (":path", "/mcp".to_owned()),
        ("content-type", "application/json".to_owned()),
        ("content-length", body.len().to_string()),
        ("authorization", format!("Bearer {token}")),
        ("mcp-session-id", "s-42".to_owned()),
        ("idempotency-key", "refund-ord_1001-1".to_owned()),
    ];
    envoy_types::ext_authz::v3::pb::CheckRequest {
        attributes: Some(AttributeContext {
            request: Some(attribute_context::Request {
                http: Some(attribute_context::HttpRequest {
                    method: "POST".into(),
                    path: "/mcp".into(),
                    headers: headers
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                    size: i64::try_from(body.len()).unwrap_or(i64::MAX),
                    raw_body: body,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// `concurrency` clients send `Check` back to back for `seconds` over one
/// h2 connection.
async fn check(
    addr: SocketAddr,
    concurrency: usize,
    seconds: f64,
    token: &str,
) -> Result<Summary, BoxError> {
    use envoy_types::ext_authz::v3::pb::HttpResponse;
    use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let mut client = AuthorizationClient::new(channel.clone());
        let request = check_request(token);
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(16_384);
            while Instant::now() < until {
                let t = Instant::now();
                let r = client.check(request.clone()).await?.into_inner();
                samples.push(t.elapsed());
                if !matches!(r.http_response, Some(HttpResponse::OkResponse(_))) {
                    return Err::<_, BoxError>(format!("not allowed: {r:?}").into());
                }
            }
            Ok(samples)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await??);
    }
    Ok(summarize(all, start.elapsed()))
}

async fn authorize(
    addr: SocketAddr,
    concurrency: usize,
    seconds: f64,
) -> Result<Summary, BoxError> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let mut client =
            pb::authorization_service_client::AuthorizationServiceClient::new(channel.clone());
        workers.push(tokio::spawn(async move {
            let request = authorize_request();
            let mut samples = Vec::with_capacity(16_384);
            while Instant::now() < until {
                let t = Instant::now();
                let r = client.authorize(request.clone()).await?.into_inner();
                samples.push(t.elapsed());
                if r.decision != i32::from(pb::Decision::Allow) {
                    return Err::<_, BoxError>(format!("not allowed: {r:?}").into());
                }
            }
            Ok(samples)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await??);
    }
    Ok(summarize(all, start.elapsed()))
}

fn main() -> Result<(), BoxError> {
    let options = Options::parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let jwks = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures/keys/jwks.json");
    let jwks = jwks.to_str().ok_or("a non-UTF-8 path")?;
    let (_sidecar, addr) = common::start_sidecar_with(
        &format!("sqlite://{}", dir.path().join("toolgate.db").display()),
        &[
            "--jwks-file",
            jwks,
            "--issuer",
            "https://idp.test",
            "--audience",
            "toolgate",
        ],
    )?;
    let token = bob_token()?;
    let rows = runtime.block_on(async {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        pb::entity_service_client::EntityServiceClient::new(channel)
            .upsert_entities(pb::UpsertEntitiesRequest {
                tenant_id: "acme".into(),
                entities_json: ORDER.into(),
            })
            .await?;
        // Warm both doors.
        authzen(addr, 1, 0.3).await?;
        authorize(addr, 1, 0.3).await?;
        check(addr, 1, 0.3, &token).await?;
        let mut rows = Vec::new();
        for concurrency in CONCURRENCY {
            let (mut http, mut grpc, mut envoy) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..options.rounds {
                http.push(authzen(addr, concurrency, options.seconds).await?);
                grpc.push(authorize(addr, concurrency, options.seconds).await?);
                envoy.push(check(addr, concurrency, options.seconds, &token).await?);
            }
            rows.push((concurrency, medians(&http), medians(&grpc), medians(&envoy)));
        }
        Ok::<_, BoxError>(rows)
    })?;
    println!("| concurrent | door | rps | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    let mut report = Vec::new();
    for (concurrency, http, grpc, envoy) in &rows {
        for (door, s) in [
            ("AuthZEN HTTP/1.1", http),
            ("Authorize gRPC", grpc),
            ("ext_authz Check gRPC", envoy),
        ] {
            println!(
                "| {concurrency} | {door} | {:.0} | {:.1} | {:.1} |",
                s.rps, s.p50_us, s.p99_us
            );
        }
        report.push(json!({
            "concurrency": concurrency,
            "authzen_http1": {"rps": round1(http.rps), "p50_us": round1(http.p50_us), "p99_us": round1(http.p99_us)},
            "authorize_grpc": {"rps": round1(grpc.rps), "p50_us": round1(grpc.p50_us), "p99_us": round1(grpc.p99_us)},
            "ext_authz_check_grpc": {"rps": round1(envoy.rps), "p50_us": round1(envoy.p50_us), "p99_us": round1(envoy.p99_us)},
            "authzen_over_authorize_rps": round1(http.rps / grpc.rps.max(1e-9) * 100.0) / 100.0,
            "check_over_authorize_rps": round1(envoy.rps / grpc.rps.max(1e-9) * 100.0) / 100.0,
        }));
    }
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/perf/gateway.json");
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let report = json!({"rounds": options.rounds, "seconds": options.seconds, "rows": report});
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    println!("\nwritten: {}", out.display());
    Ok(())
}
