//! The execution ledger's throughput per store: BeginExecution +
//! CompleteExecution pairs per second against the real `toolgate serve`
//! binary over gRPC on loopback, on a fresh SQLite file and on a fresh
//! PostgreSQL schema, at 1 and 32 concurrent clients (each on its own
//! connection, each pair a new idempotency key: ACQUIRED, then SUCCEEDED
//! with a result checked against the tool's output schema).
//!
//! Run: `cargo bench --bench ledger_store` (options after `--`:
//! `--seconds S` measured per case, default 5; `--postgres URL`, default
//! `TOOLGATE_TEST_POSTGRES` or `postgres://postgres@127.0.0.1:5432/test`,
//! where a throwaway schema is created and dropped). Without a reachable
//! PostgreSQL the PostgreSQL rows say so and the SQLite rows still run.

#![allow(
    clippy::indexing_slicing,
    reason = "only serde_json::Value is indexed here, which yields Null and never panics"
)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tonic::transport::{Channel, Endpoint};

use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::{self, BeginOutcome, CompletionStatus, ExecutionState};
use toolgate::ledger::{TicketClaims, TicketKey, TicketKeys};
use toolgate::store::scratch;

use common::{FreshStore, Summary, summarize};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const RESULT: &str = r#"{"refund_id":"re_1","amount_cents":2500}"#;
const CONCURRENCY: [usize; 2] = [1, 32];

fn hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn auth() -> pb::AuthContext {
    pb::AuthContext {
        subject_id: "bob".into(),
        tenant_id: "acme".into(),
        scopes: vec!["orders:refund".into()],
        roles: vec!["support_agent".into()],
        agent_id: "bench".into(),
        session_id: "bench".into(),
        identity_token: String::new(),
    }
}

/// The ticket keys of the store at `url`, as the sidecar signs with them.
async fn ticket_keys(url: &str) -> Result<TicketKeys, BoxError> {
    let store = toolgate::store::open(url, toolgate::store::StoreSettings::default()).await?;
    let keys = store.ticket_keys(TicketKey::generate(1)?).await?;
    TicketKeys::new(keys).ok_or_else(|| "no ticket key".into())
}

/// One Begin + Complete on a new key, with the ticket an ALLOW would carry
/// (minted before the clock starts: Authorize's work, not the ledger's);
/// the pair's latency.
async fn pair(
    client: &mut LedgerServiceClient<Channel>,
    key: &str,
    keys: &TicketKeys,
) -> Result<Duration, BoxError> {
    let (auth, sha) = (auth(), hex(key));
    let claims = TicketClaims {
        tenant_id: &auth.tenant_id,
        subject_id: &auth.subject_id,
        idempotency_key: key,
        arguments_sha256: &sha,
        tool: "refund_order",
    };
    let execution_ticket = keys.issue(&claims, i64::MAX);
    let started = Instant::now();
    let begun = client
        .begin_execution(pb::BeginExecutionRequest {
            auth: Some(auth.clone()),
            idempotency_key: key.into(),
            arguments_sha256: sha.clone(),
            tool: "refund_order".into(),
            lease_ms: 60_000,
            execution_ticket,
        })
        .await?
        .into_inner();
    if begun.outcome() != BeginOutcome::Acquired {
        return Err(format!("begin: {:?} {:?}", begun.outcome(), begun.error).into());
    }
    let done = client
        .complete_execution(pb::CompleteExecutionRequest {
            auth: Some(auth),
            idempotency_key: key.into(),
            fencing_token: begun.fencing_token,
            status: CompletionStatus::Succeeded.into(),
            result_json: RESULT.into(),
            error: None,
        })
        .await?
        .into_inner();
    if done.state() != ExecutionState::Succeeded {
        return Err(format!("complete: {:?} {:?}", done.state(), done.error).into());
    }
    Ok(started.elapsed())
}

/// `clients` concurrent clients, each on its own connection, for `seconds`.
async fn measure(
    addr: SocketAddr,
    clients: usize,
    seconds: f64,
    label: &str,
    keys: &Arc<TicketKeys>,
) -> Result<Summary, BoxError> {
    let mut connections = Vec::with_capacity(clients);
    for _ in 0..clients {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        connections.push(LedgerServiceClient::new(channel));
    }
    let run = Arc::new(uuid::Uuid::new_v4().simple().to_string());
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(c, mut client)| {
            let (run, label, keys) = (Arc::clone(&run), label.to_owned(), Arc::clone(keys));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while Instant::now() < until {
                    let key = format!("refund_order:{label}-{run}-{c}-{n}");
                    latencies.push(pair(&mut client, &key, &keys).await?);
                    n += 1;
                }
                Ok::<_, BoxError>(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(summarize(all, started.elapsed()))
}

fn main() -> Result<(), BoxError> {
    let mut seconds = 5.0;
    let mut postgres = scratch::test_url();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().ok_or("--seconds needs a value")?.parse()?,
            "--postgres" => postgres = args.next().ok_or("--postgres needs a URL")?,
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        println!("cargo bench --bench ledger_store -- --seconds {seconds}");
        println!(
            "{} cores; each pair: BeginExecution (ACQUIRED) + CompleteExecution (SUCCEEDED), a new key each",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!();
        println!("| store | clients | pairs/s | p50 | p99 |");
        println!("|---|---:|---:|---:|---:|");
        let mut stores = vec![FreshStore::sqlite()?];
        match FreshStore::postgres(&postgres).await {
            Ok(schema) => stores.push(schema),
            Err(e) => println!("| postgres | - | not measured: {e} | | |"),
        }
        for store in &stores {
            let (name, url) = (store.name(), store.url());
            let (_sidecar, addr) = common::start_sidecar(url)?;
            let keys = Arc::new(ticket_keys(url).await?);
            // Warm up: connections, the pool, prepared statements.
            measure(addr, 4, 1.0, &format!("{name}-warm"), &keys).await?;
            for clients in CONCURRENCY {
                let m = measure(addr, clients, seconds, &format!("{name}-{clients}"), &keys).await?;
                println!(
                    "| {name} | {clients} | {:.0} | {:.2} ms | {:.2} ms |",
                    m.rps,
                    m.p50_us / 1e3,
                    m.p99_us / 1e3
                );
            }
        }
        Ok(())
    })
}
