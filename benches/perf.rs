//! The performance suite (`docs/performance.md`): toolgate against the floors
//! that bound it, measured in one run on one machine.
//!
//! 1. In process: raw `cedar_policy::Authorizer::is_authorized` over the
//!    example policy set with a request and entities built in advance,
//!    against toolgate's whole decision for the refund example (raw bytes →
//!    decode → schema → canonical form and hashes → entities → Cedar).
//! 2. Over gRPC on loopback, with the same client: a plain tonic echo
//!    service answering a real `Authorize` response of the same size (the
//!    transport floor) against the real `toolgate serve` binary, at 1, 16 and
//!    64 concurrent requests.
//! 3. `Authorize` with `begin_execution` followed by `CompleteExecution`
//!    on SQLite, at 1 and 16 concurrent operations (pairs/s, p50, p99).
//! 4. The resident memory of that sidecar under the load.
//!
//! Each comparison alternates its two sides over several rounds and reports
//! medians and the ratio. Results go to one JSON file (default
//! `target/perf/perf.json`) and a table on stdout.
//!
//! Run: `cargo bench --bench perf` (options after `--`: `--rounds N`,
//! `--seconds S` per gRPC side and round, `--iterations N` per in-process
//! side and round, `--out PATH`; `--in-process-only` for profilers).

#![allow(
    clippy::indexing_slicing,
    reason = "only serde_json::Value is indexed here, which yields Null and never panics"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint};

use toolgate::access::TenantScope;
use toolgate::decision::{AuthorizeInput, Decision};
use toolgate::grpc::pb;
use toolgate::identity::Caller;
use toolgate::policy::PolicyEngine;

use common::{ChildGuard, Summary, example_policies, medians, summarize};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ARGUMENTS: &[u8] =
    br#"{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}"#;
const ENTITIES: &str = r#"[{"uid":{"type":"Order","id":"ord_1001"},"parents":[{"type":"Tenant","id":"acme"}],
 "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"alice"}},
 "status":"delivered","total_cents":50000}}]"#;
/// The environment variable that turns this binary into the echo server.
const ECHO_ROLE: &str = "TOOLGATE_PERF_ECHO_RESPONSE";
const CONCURRENCY: [usize; 3] = [1, 16, 64];

struct Options {
    rounds: usize,
    seconds: f64,
    iterations: usize,
    out: PathBuf,
    /// Only the in-process comparison (for profilers), no JSON file.
    in_process_only: bool,
}

impl Options {
    fn parse() -> Result<Self, BoxError> {
        let mut o = Self {
            rounds: 5,
            seconds: 2.0,
            iterations: 4000,
            out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/perf/perf.json"),
            in_process_only: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("`{a}` needs a value"));
            match a.as_str() {
                "--rounds" => o.rounds = value()?.parse()?,
                "--seconds" => o.seconds = value()?.parse()?,
                "--iterations" => o.iterations = value()?.parse()?,
                "--out" => o.out = PathBuf::from(value()?),
                "--in-process-only" => o.in_process_only = true,
                // `cargo bench` passes `--bench`; filters are not used here.
                _ => {}
            }
        }
        if o.rounds == 0 || o.iterations == 0 || o.seconds <= 0.0 {
            return Err("rounds, iterations and seconds must be positive".into());
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
    let in_process = runtime.block_on(in_process(&options))?;
    if options.in_process_only {
        println!(
            "raw Cedar p50 {:.1} µs, toolgate decision p50 {:.1} µs ({} policies)",
            in_process.raw.p50_us, in_process.toolgate.p50_us, in_process.policies
        );
        return Ok(());
    }
    let (grpc, ledger, memory) = runtime.block_on(over_grpc(&options))?;
    let report = report(&options, in_process, grpc, &ledger, memory);
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
        let mut entities: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(
            example_policies().join("entities.json"),
        )?)?;
        entities.extend(serde_json::from_str::<Vec<Value>>(ENTITIES)?);
        entities.push(json!({"uid": {"type": "User", "id": "bob"},
            "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}}, "roles": ["support_agent"]},
            "parents": [{"type": "Tenant", "id": "acme"}]}));
        let entities = Entities::from_json_value(Value::Array(entities), Some(&schema))?;
        let action = EntityUid::from_str(r#"Action::"refund_order""#)?;
        let context = Context::from_json_value(
            json!({"scopes": ["orders:read", "orders:refund"], "risk": "financial", "approved": false,
                   "agent": "support-bot", "session": "s-42",
                   "input": {"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}}),
            Some((&schema, &action)),
        )?;
        let request = Request::new(
            EntityUid::from_str(r#"User::"bob""#)?,
            action,
            EntityUid::from_str(r#"Order::"ord_1001""#)?,
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
}

async fn in_process(o: &Options) -> Result<InProcess, BoxError> {
    let reloader = common::load_policies(&example_policies())?;
    let engine = reloader.live().load_full();
    let raw = RawCedar::build(&engine)?;
    let policies = engine.policy_count();
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

// ---------------------------------------------------------------- over gRPC

/// A child process, killed when dropped.
/// Starts the real sidecar on a fresh SQLite file and returns it with its address.
fn start_toolgate(dir: &Path) -> Result<(ChildGuard, SocketAddr), BoxError> {
    common::start_sidecar(&format!("sqlite://{}", dir.join("toolgate.db").display()))
}

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

async fn connect(addr: SocketAddr, n: usize) -> Result<Vec<Channel>, BoxError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            Endpoint::from_shared(format!("http://{addr}"))?
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .connect()
                .await?,
        );
    }
    Ok(out)
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

/// `concurrency` workers send `Authorize` back to back for `seconds`, over
/// at most 8 connections; every answer must be ALLOW.
async fn load(channels: &[Channel], concurrency: usize, seconds: f64) -> Result<Summary, BoxError> {
    fan_out(
        channels,
        concurrency,
        seconds,
        |_, channel, until| async move {
            let mut client =
                pb::authorization_service_client::AuthorizationServiceClient::new(channel);
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
        },
    )
    .await
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

struct GrpcRow {
    concurrency: usize,
    echo: Summary,
    toolgate: Summary,
}

struct Memory {
    rss_kb: u64,
    hwm_kb: u64,
}

fn memory_of(pid: u32) -> Result<Memory, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Ok(Memory {
        rss_kb: field("VmRSS:"),
        hwm_kb: field("VmHWM:"),
    })
}

/// `Authorize` + `begin_execution`, then `CompleteExecution`, on SQLite.
const LEDGER_CONCURRENCY: [usize; 2] = [1, 16];

async fn over_grpc(o: &Options) -> Result<(Vec<GrpcRow>, Vec<(usize, Summary)>, Memory), BoxError> {
    let dir = tempfile::tempdir()?;
    let (toolgate, toolgate_addr) = start_toolgate(dir.path())?;
    let tg_channels = connect(toolgate_addr, 8).await?;
    // The echo answers exactly what toolgate answers, byte for byte in size.
    let real = pb::authorization_service_client::AuthorizationServiceClient::new(
        tg_channels.first().cloned().ok_or("no channel")?,
    )
    .authorize(authorize_request())
    .await?
    .into_inner();
    let (_echo, echo_addr) = start_echo(&real)?;
    let echo_channels = connect(echo_addr, 8).await?;

    let mut rows = Vec::new();
    for &c in &CONCURRENCY {
        let n = c.min(8);
        let (echo_ch, tg_ch) = (
            echo_channels.get(..n).ok_or("channels")?,
            tg_channels.get(..n).ok_or("channels")?,
        );
        // Warm-up, then alternate the sides round by round.
        load(echo_ch, c, o.seconds / 4.0).await?;
        load(tg_ch, c, o.seconds / 4.0).await?;
        let (mut echo, mut tg) = (Vec::new(), Vec::new());
        for _ in 0..o.rounds {
            echo.push(load(echo_ch, c, o.seconds).await?);
            tg.push(load(tg_ch, c, o.seconds).await?);
        }
        rows.push(GrpcRow {
            concurrency: c,
            echo: medians(&echo),
            toolgate: medians(&tg),
        });
    }
    let memory = memory_of(toolgate.0.id())?;
    let mut ledger = Vec::new();
    for &c in &LEDGER_CONCURRENCY {
        let ch = tg_channels.get(..c.min(8)).ok_or("channels")?;
        ledger_load(ch, c, o.seconds / 4.0, 0).await?;
        let mut rounds = Vec::new();
        for round in 1..=o.rounds {
            rounds.push(ledger_load(ch, c, o.seconds, round).await?);
        }
        ledger.push((c, medians(&rounds)));
    }
    drop(toolgate);
    Ok((rows, ledger, memory))
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

fn target(name: &str, value: f64, limit: f64, at_most: bool) -> Value {
    let met = if at_most {
        value <= limit
    } else {
        value >= limit
    };
    json!({"name": name, "value": round2(value), "limit": limit,
           "comparison": if at_most { "<=" } else { ">=" }, "met": met})
}

fn report(
    o: &Options,
    p: InProcess,
    grpc: Vec<GrpcRow>,
    ledger: &[(usize, Summary)],
    memory: Memory,
) -> Value {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    let mut targets = vec![target(
        "in_process_p50_vs_raw_cedar",
        ratio(p.toolgate.p50_us, p.raw.p50_us),
        1.0,
        true,
    )];
    let mut rows = Vec::new();
    for r in &grpc {
        let rps_ratio = ratio(r.toolgate.rps, r.echo.rps);
        let p99_ratio = ratio(r.toolgate.p99_us, r.echo.p99_us);
        let p50_delta = r.toolgate.p50_us - r.echo.p50_us;
        if r.concurrency == 1 {
            targets.push(target("grpc_c1_p50_minus_echo_us", p50_delta, 30.0, true));
        } else {
            let c = r.concurrency;
            targets.push(target(
                &format!("grpc_c{c}_rps_vs_echo"),
                rps_ratio,
                0.7,
                false,
            ));
            targets.push(target(
                &format!("grpc_c{c}_p99_vs_echo"),
                p99_ratio,
                2.0,
                true,
            ));
        }
        rows.push(json!({
            "concurrency": r.concurrency,
            "echo": side_json(r.echo),
            "toolgate": side_json(r.toolgate),
            "rps_ratio": round2(rps_ratio),
            "p99_ratio": round2(p99_ratio),
            "p50_delta_us": round2(p50_delta),
        }));
    }
    #[allow(clippy::cast_precision_loss, reason = "kilobytes")]
    let rss_mb = memory.hwm_kb as f64 / 1024.0;
    targets.push(target("sidecar_peak_rss_mb", rss_mb, 25.0, true));
    json!({
        "schema": "toolgate-perf/1",
        "machine": machine(),
        "settings": {"rounds": o.rounds, "seconds_per_side": o.seconds, "iterations_per_side": o.iterations},
        "in_process": {
            "policies": p.policies,
            "raw_cedar": side_json(p.raw),
            "toolgate": side_json(p.toolgate),
            "p50_ratio": round2(ratio(p.toolgate.p50_us, p.raw.p50_us)),
        },
        "grpc": rows,
        "ledger_sqlite": ledger.iter().map(|(c, s)| json!({
            "concurrency": c, "pairs": side_json(*s),
        })).collect::<Vec<_>>(),
        "memory": {"rss_kb": memory.rss_kb, "peak_rss_kb": memory.hwm_kb},
        "targets": targets,
    })
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
    println!("\ngRPC on loopback     side        req/s    p50 µs    p99 µs");
    for row in r["grpc"].as_array().into_iter().flatten() {
        for side in ["echo", "toolgate"] {
            println!(
                "  concurrency {:<6} {side:<9} {:>9} {:>9} {:>9}",
                row["concurrency"],
                f(&row[side]["rps"]),
                f(&row[side]["p50_us"]),
                f(&row[side]["p99_us"])
            );
        }
        println!(
            "  {:<27} rps ratio {}  p99 ratio {}  p50 delta {} µs",
            "",
            f(&row["rps_ratio"]),
            f(&row["p99_ratio"]),
            f(&row["p50_delta_us"])
        );
    }
    println!("\nAuthorize(begin_execution) + CompleteExecution on SQLite");
    for row in r["ledger_sqlite"].as_array().into_iter().flatten() {
        println!(
            "  concurrency {:<6} pairs/s {:>9} {:>9} {:>9}",
            row["concurrency"],
            f(&row["pairs"]["rps"]),
            f(&row["pairs"]["p50_us"]),
            f(&row["pairs"]["p99_us"])
        );
    }
    println!(
        "\nsidecar memory: rss {} kB, peak {} kB",
        r["memory"]["rss_kb"], r["memory"]["peak_rss_kb"]
    );
    println!("\ntargets:");
    for t in r["targets"].as_array().into_iter().flatten() {
        println!(
            "  {:<32} {:>8} {} {:<6} {}",
            t["name"].as_str().unwrap_or_default(),
            f(&t["value"]),
            t["comparison"].as_str().unwrap_or_default(),
            t["limit"],
            if t["met"].as_bool() == Some(true) {
                "met"
            } else {
                "MISSED"
            }
        );
    }
}
