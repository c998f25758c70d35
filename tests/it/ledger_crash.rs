//! The real `toolgate serve` killed with SIGKILL while executors are mid-flight,
//! then restarted on the same SQLite file: every completion the sidecar
//! acknowledged is still there with its result, and every operation that
//! was acquired but not acknowledged as complete answers RECONCILE_REQUIRED
//! once its lease has passed (or COMPLETED, if its completion committed just
//! before the kill). None is lost; none is handed to a second executor.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::{self, BeginOutcome, CompletionStatus, ExecutionState};

use crate::sidecar::Sidecar;
use toolgate::ledger::TicketKeys;

use crate::support::{agent_bob, store_ticket_keys, ticket_with};

/// Short, so that the test waits for expiry in seconds; every wait for it is
/// a bounded poll, never a fixed sleep.
const LEASE_MS: u32 = 1_500;
const HELD: usize = 6;
const BUSY_EXECUTORS: usize = 4;

fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn key(name: &str) -> String {
    format!("refund_order:{}", sha(name))
}

fn result(name: &str) -> String {
    format!(r#"{{"refund_id":"re_{name}","amount_cents":100}}"#)
}

/// A Begin of `name`'s operation, with the ticket its ALLOW would carry.
fn begin_request(name: &str, keys: &TicketKeys) -> pb::BeginExecutionRequest {
    let (key, sha) = (key(name), sha(&format!("args {name}")));
    pb::BeginExecutionRequest {
        auth: Some(agent_bob()),
        execution_ticket: ticket_with(keys, &agent_bob(), &key, &sha, "refund_order"),
        idempotency_key: key,
        arguments_sha256: sha,
        tool: "refund_order".into(),
        lease_ms: LEASE_MS,
    }
}

fn complete_request(name: &str, token: u64) -> pb::CompleteExecutionRequest {
    pb::CompleteExecutionRequest {
        auth: Some(agent_bob()),
        idempotency_key: key(name),
        fencing_token: token,
        status: CompletionStatus::Succeeded.into(),
        result_json: result(name),
        error: None,
    }
}

/// What the executors were told before the kill, per operation name.
#[derive(Debug, Default)]
struct Acknowledged {
    /// ACQUIRED, with its token.
    acquired: BTreeMap<String, u64>,
    /// SUCCEEDED acknowledged by CompleteExecution.
    completed: Vec<String>,
}

/// An executor that begins and completes new operations until the sidecar
/// stops answering, recording every acknowledgement.
async fn busy_executor(
    channel: Channel,
    id: usize,
    log: Arc<Mutex<Acknowledged>>,
    keys: Arc<TicketKeys>,
) {
    let mut ledger = LedgerServiceClient::new(channel);
    for n in 0..10_000 {
        let name = format!("busy-{id}-{n}");
        let Ok(r) = ledger.begin_execution(begin_request(&name, &keys)).await else {
            return;
        };
        let r = r.into_inner();
        assert_eq!(r.outcome(), BeginOutcome::Acquired, "{name}");
        log.lock()
            .unwrap()
            .acquired
            .insert(name.clone(), r.fencing_token);
        let Ok(done) = ledger
            .complete_execution(complete_request(&name, r.fencing_token))
            .await
        else {
            return;
        };
        assert_eq!(done.into_inner().state(), ExecutionState::Succeeded);
        log.lock().unwrap().completed.push(name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_mid_flight_survive_kill_9_and_none_runs_twice() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(dir.path(), &[]);
    let url = format!("sqlite://{}", dir.path().join("toolgate.db").display());
    let keys = Arc::new(store_ticket_keys(&url).await);
    let log = Arc::new(Mutex::new(Acknowledged::default()));

    // Executors that acquired and are still running their tool when the
    // sidecar dies: they never get to complete.
    let mut ledger = LedgerServiceClient::new(sidecar.channel().await);
    let held: Vec<String> = (0..HELD).map(|i| format!("held-{i}")).collect();
    for name in &held {
        let r = ledger
            .begin_execution(begin_request(name, &keys))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.outcome(), BeginOutcome::Acquired);
        log.lock()
            .unwrap()
            .acquired
            .insert(name.clone(), r.fencing_token);
    }
    // Executors busy beginning and completing, each on its own connection.
    let mut tasks = Vec::new();
    for id in 0..BUSY_EXECUTORS {
        let channel = sidecar.channel().await;
        tasks.push(tokio::spawn(busy_executor(
            channel,
            id,
            Arc::clone(&log),
            Arc::clone(&keys),
        )));
    }
    let started = Instant::now();
    while log.lock().unwrap().completed.len() < 40 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the executors made no progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sidecar.kill();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
    }
    let log = std::mem::take(&mut *log.lock().unwrap());
    let in_flight: Vec<&String> = log
        .acquired
        .keys()
        .filter(|name| !log.completed.contains(name))
        .collect();
    assert!(in_flight.len() >= HELD, "{in_flight:?}");

    let sidecar = Sidecar::start(dir.path(), &[]);
    let mut ledger = LedgerServiceClient::new(sidecar.channel().await);
    // Every acknowledged completion survived, with its result.
    for name in &log.completed {
        let r = ledger
            .begin_execution(begin_request(name, &keys))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (r.outcome(), r.state()),
            (BeginOutcome::Completed, ExecutionState::Succeeded),
            "{name}"
        );
        assert_eq!(r.result_json, result(name));
    }
    // Every acquisition survived too: until its lease passes it is in
    // progress, after that it needs reconciling; it is never acquired again.
    let started = Instant::now();
    let mut settled: BTreeMap<&String, BeginOutcome> = BTreeMap::new();
    while settled.len() < in_flight.len() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "leases never passed: {settled:?}"
        );
        for name in in_flight.iter().copied() {
            if settled.contains_key(name) {
                continue;
            }
            let r = ledger
                .begin_execution(begin_request(name, &keys))
                .await
                .unwrap()
                .into_inner();
            match r.outcome() {
                BeginOutcome::InProgress => assert_eq!(r.fencing_token, 0),
                BeginOutcome::ReconcileRequired => {
                    assert_eq!(r.state(), ExecutionState::InProgress);
                    assert_eq!(r.error.as_ref().unwrap().code, "reconcile_required");
                    settled.insert(name, BeginOutcome::ReconcileRequired);
                }
                // Its completion committed, but the kill ate the answer.
                BeginOutcome::Completed => {
                    assert!(name.starts_with("busy-"), "{name} was never completed");
                    assert_eq!(r.result_json, result(name));
                    settled.insert(name, BeginOutcome::Completed);
                }
                other => panic!("{name}: {other:?} {:?}", r.error),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for name in &held {
        assert_eq!(
            settled.get(name),
            Some(&BeginOutcome::ReconcileRequired),
            "{name}"
        );
    }
    // A held one is reconciled as applied; the late executor, restarted with
    // its token, is then told it lost rather than overwriting the outcome.
    let first = &held[0];
    let r = ledger
        .reconcile_execution(pb::ReconcileExecutionRequest {
            auth: Some(agent_bob()),
            idempotency_key: key(first),
            applied: true,
            result_json: result(first),
            fencing_token: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.state(), ExecutionState::Succeeded);
    let mut late = complete_request(first, log.acquired[first]);
    late.status = CompletionStatus::FailedFinal.into();
    late.result_json = String::new();
    let late = ledger.complete_execution(late).await.unwrap().into_inner();
    assert_eq!(late.error.unwrap().code, "lease_lost");
    eprintln!(
        "crash: {} acknowledged completions, {} in flight at the kill",
        log.completed.len(),
        in_flight.len()
    );
    sidecar.kill();
}
