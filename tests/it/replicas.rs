//! Several real `toolgate serve` processes on one PostgreSQL database: the
//! ledger and approvals have one source of truth, every replica's watchers
//! see every replica's approval events, and an outage of the database fails
//! closed within the configured bounds and is recovered from without a
//! restart.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::{self, BeginOutcome, Decision};
use toolgate::store::scratch::{self, ScratchSchema};

use crate::sidecar::Sidecar;
use toolgate::ledger::TicketKeys;

use crate::support::{
    agent_bob, code, identity_args, postgres_or_skip, request, scratch_schema, store_ticket_keys,
    ticket_with, token,
};

const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;

fn hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Two replicas on one store URL, started at the same moment (so their
/// migrations race, and the advisory lock must order them).
fn two_replicas(dir: &Path, url: &str) -> (Sidecar, Sidecar) {
    std::thread::scope(|s| {
        let a = s.spawn(|| Sidecar::start_with_store(dir, url, &identity_args()));
        let b = s.spawn(|| Sidecar::start_with_store(dir, url, &identity_args()));
        (a.join().unwrap(), b.join().unwrap())
    })
}

/// A Begin with the ticket its ALLOW would carry, under the database's
/// key: one replica's ticket is good on every replica of the database.
fn begin_request(key: &str, sha: &str, keys: &TicketKeys) -> pb::BeginExecutionRequest {
    pb::BeginExecutionRequest {
        auth: Some(agent_bob()),
        idempotency_key: key.into(),
        arguments_sha256: sha.into(),
        tool: "refund_order".into(),
        lease_ms: 60_000,
        execution_ticket: ticket_with(keys, &agent_bob(), key, sha, "refund_order"),
    }
}

/// 32 executors, 16 on each replica, each on its own connection, begin the
/// same new key at once: exactly one is ACQUIRED, every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begins_split_across_two_replicas_are_acquired_exactly_once() {
    const EXECUTORS: usize = 32;
    const ROUNDS: usize = 50;
    let Some(schema) = scratch_schema().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_replicas(dir.path(), schema.url());
    let mut clients = Vec::with_capacity(EXECUTORS);
    for i in 0..EXECUTORS {
        let replica = if i % 2 == 0 { &a } else { &b };
        clients.push(LedgerServiceClient::new(replica.channel().await));
    }
    let keys = store_ticket_keys(schema.url()).await;
    let started = Instant::now();
    let mut tokens = std::collections::HashSet::new();
    for round in 0..ROUNDS {
        let key = format!("refund_order:{}", hex(&format!("replicas-{round}")));
        let sha = hex(&format!("args of replicas-{round}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(EXECUTORS));
        let tasks: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, client)| {
                let mut client = client.clone();
                let barrier = Arc::clone(&barrier);
                let req = begin_request(&key, &sha, &keys);
                tokio::spawn(async move {
                    barrier.wait().await;
                    (
                        i % 2,
                        client.begin_execution(req).await.unwrap().into_inner(),
                    )
                })
            })
            .collect();
        let mut acquired = Vec::new();
        for task in tasks {
            let (replica, r) = tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .unwrap()
                .unwrap();
            match r.outcome() {
                BeginOutcome::Acquired => acquired.push((replica, r.fencing_token)),
                BeginOutcome::InProgress => assert_eq!(r.fencing_token, 0),
                other => panic!("round {round}: {other:?} {:?}", r.error),
            }
        }
        assert_eq!(acquired.len(), 1, "round {round}: {acquired:?}");
        let (_, token) = acquired[0];
        assert!(tokens.insert(token), "round {round}: token {token} again");
    }
    eprintln!(
        "replicas: {ROUNDS} rounds of {EXECUTORS} concurrent BeginExecution over two sidecars in {:?}",
        started.elapsed()
    );
}

async fn watch(channel: Channel, token: &str) -> tonic::Streaming<pb::WatchApprovalsResponse> {
    ApprovalServiceClient::new(channel)
        .watch_approvals(pb::WatchApprovalsRequest {
            identity_token: token.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

async fn next_event(
    stream: &mut tonic::Streaming<pb::WatchApprovalsResponse>,
) -> (pb::ApprovalEventKind, pb::Approval) {
    let e = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event within 10 s")
        .unwrap()
        .unwrap()
        .event
        .unwrap();
    (e.kind(), e.approval.unwrap())
}

/// Created through A, decided through B, consumed through A exactly once;
/// a watch on each replica sees every event once, in order, whichever
/// replica caused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_travels_between_replicas_and_every_watch_sees_it_once() {
    use pb::ApprovalEventKind::{Consumed, Created, Decided};
    let Some(schema) = scratch_schema().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_replicas(dir.path(), schema.url());
    let admin = token("dana", "acme", &["support_admin"]);
    let mut watches = [
        watch(a.channel().await, &admin).await,
        watch(b.channel().await, &admin).await,
    ];
    let mut client_a = AuthorizationServiceClient::new(a.channel().await);
    let mut client_b = AuthorizationServiceClient::new(b.channel().await);

    // Created through A; the same call through B gets the same approval.
    let first = client_a
        .authorize(request("refund_order", BIG_REFUND))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.decision(), Decision::ApprovalRequired);
    let id = first.approval.unwrap().approval_id;
    for w in &mut watches {
        let (kind, approval) = next_event(w).await;
        assert_eq!(
            (kind, approval.approval_id.as_str()),
            (Created, id.as_str())
        );
        assert_eq!(approval.status(), pb::ApprovalStatus::Pending);
    }
    let same = client_b
        .authorize(request("refund_order", BIG_REFUND))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.approval.unwrap().approval_id, id);

    // Decided through B: the first decision wins on either replica.
    let mut approvals_b = ApprovalServiceClient::new(b.channel().await);
    let mut approvals_a = ApprovalServiceClient::new(a.channel().await);
    let decide = |verdict: pb::Verdict| pb::DecideApprovalRequest {
        identity_token: admin.clone(),
        approval_id: id.clone(),
        verdict: verdict.into(),
        arguments_sha256: first.arguments_sha256.clone(),
        reason: "checked".into(),
    };
    let decided = approvals_b
        .decide_approval(decide(pb::Verdict::Approve))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
    for w in &mut watches {
        let (kind, approval) = next_event(w).await;
        assert_eq!(
            (kind, approval.approval_id.as_str()),
            (Decided, id.as_str())
        );
        assert_eq!(approval.status(), pb::ApprovalStatus::Approved);
    }
    let late = approvals_a
        .decide_approval(decide(pb::Verdict::Reject))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(late.error.unwrap().code, "approval_already_decided");

    // Consumed through A by this operation, and only by it.
    let mut use_it = request("refund_order", BIG_REFUND);
    use_it.approval_id.clone_from(&id);
    let allowed = client_a
        .authorize(use_it.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);
    for w in &mut watches {
        let (kind, approval) = next_event(w).await;
        assert_eq!(
            (kind, approval.approval_id.as_str()),
            (Consumed, id.as_str())
        );
        assert_eq!(
            approval.consumed_by_idempotency_key,
            allowed.idempotency_key
        );
    }
    // A retry of the same operation, on either replica, may use it again.
    for client in [&mut client_a, &mut client_b] {
        let again = client.authorize(use_it.clone()).await.unwrap().into_inner();
        assert_eq!(again.decision(), Decision::Allow);
    }
    let mut other = use_it.clone();
    other.request_id = "req-other".into();
    for client in [&mut client_b, &mut client_a] {
        let refused = client.authorize(other.clone()).await.unwrap().into_inner();
        assert_eq!(code(&refused), "approval_mismatch");
    }

    // Nothing was announced twice: the next event on each watch is a new
    // approval's creation, through B.
    let mut sentinel = request("refund_order", BIG_REFUND);
    sentinel.request_id = "req-sentinel".into();
    let next = client_b.authorize(sentinel).await.unwrap().into_inner();
    let next_id = next.approval.unwrap().approval_id;
    for w in &mut watches {
        let (kind, approval) = next_event(w).await;
        assert_eq!(
            (kind, approval.approval_id.as_str()),
            (Created, next_id.as_str())
        );
    }
}

/// What one call during the outage test saw.
#[derive(Debug, Clone)]
struct Call {
    what: &'static str,
    started: Instant,
    took: Duration,
    /// ACQUIRED / ALLOW.
    granted: bool,
    /// The envelope code ("" for none).
    code: String,
    retryable: bool,
    /// For an ACQUIRED begin: the key to find in the ledger.
    acquired: Option<String>,
}

/// One kind of traffic, until `stop`: each call bounded by a 10 s client
/// deadline (far above the sidecar's own bounds), 20 ms apart.
async fn traffic(
    channel: Channel,
    what: &'static str,
    approval_id: String,
    stop: Arc<AtomicBool>,
    keys: Arc<TicketKeys>,
) -> Vec<Call> {
    let mut ledger = LedgerServiceClient::new(channel.clone());
    let mut authorize = AuthorizationServiceClient::new(channel);
    let mut calls = Vec::new();
    for n in 0..10_000 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let started = Instant::now();
        let call = match what {
            "begin" => {
                let key = format!("refund_order:{}", hex(&format!("outage-{n}")));
                let mut req = tonic::Request::new(begin_request(&key, &hex("outage args"), &keys));
                req.set_timeout(Duration::from_secs(10));
                let r = ledger.begin_execution(req).await.unwrap().into_inner();
                let granted = r.outcome() == BeginOutcome::Acquired;
                Call {
                    what,
                    started,
                    took: started.elapsed(),
                    granted,
                    code: r.error.as_ref().map_or(String::new(), |e| e.code.clone()),
                    retryable: r.error.as_ref().is_some_and(|e| e.retryable),
                    acquired: granted.then_some(key),
                }
            }
            _ => {
                let mut req = if what == "approved" {
                    let mut r = request("refund_order", BIG_REFUND);
                    r.approval_id.clone_from(&approval_id);
                    r
                } else {
                    request("get_order", r#"{"order_id":"ord_1001"}"#)
                };
                req.request_id = "req-1".into();
                let mut req = tonic::Request::new(req);
                req.set_timeout(Duration::from_secs(10));
                let r = authorize.authorize(req).await.unwrap().into_inner();
                Call {
                    what,
                    started,
                    took: started.elapsed(),
                    granted: r.decision() == Decision::Allow,
                    code: code(&r).to_owned(),
                    retryable: r.error.as_ref().is_some_and(|e| e.retryable),
                    acquired: None,
                }
            }
        };
        calls.push(call);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    calls
}

async fn health(channel: Channel, service: &str) -> ServingStatus {
    let mut client = HealthClient::new(channel);
    client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

/// Polls health until it is `want` (bounded: 20 s, then fail); when it is.
async fn health_becomes(channel: &Channel, want: ServingStatus) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if health(channel.clone(), "").await == want {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "health never became {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sidecar's own role is locked out of the database and its connections
/// are killed while executors keep calling: no call is granted without the
/// store (a presented approval, a BeginExecution), none takes longer than
/// twice the configured bounds, health is NOT_SERVING while the store is
/// down and SERVING once it is back, and the same process serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_fails_closed_within_bounds_and_service_resumes() {
    if !postgres_or_skip().await {
        return;
    }
    let schema = ScratchSchema::create_with_role(&scratch::test_url())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("toolgate.toml"),
        "[store]\npool_size = 4\nconnect_timeout_ms = 500\nstatement_timeout_ms = 1000\nhealth_interval_ms = 100\n",
    )
    .unwrap();
    // connect_timeout + statement_timeout: no call may take twice that.
    let limit = Duration::from_millis(2 * 1_500);
    let mut sidecar = Sidecar::start_with_store(dir.path(), schema.url(), &identity_args());
    let channel = sidecar.channel().await;
    assert_eq!(health(channel.clone(), "").await, ServingStatus::Serving);
    let keys = Arc::new(store_ticket_keys(schema.url()).await);

    // Before: a granted approval for one refund, and a watch.
    let admin = token("dana", "acme", &["support_admin"]);
    let mut client = AuthorizationServiceClient::new(channel.clone());
    let pending = client
        .authorize(request("refund_order", BIG_REFUND))
        .await
        .unwrap()
        .into_inner();
    let approval_id = pending.approval.unwrap().approval_id;
    let mut approvals = ApprovalServiceClient::new(channel.clone());
    let decided = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: admin.clone(),
            approval_id: approval_id.clone(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: pending.arguments_sha256.clone(),
            reason: "ok".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
    let mut watch = watch(channel.clone(), &admin).await;

    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = ["begin", "approved", "read"]
        .into_iter()
        .map(|what| {
            tokio::spawn(traffic(
                channel.clone(),
                what,
                approval_id.clone(),
                Arc::clone(&stop),
                Arc::clone(&keys),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The cut: the role may not log in, and its sessions are killed.
    let admin_db = schema.admin().await.unwrap();
    admin_db
        .batch_execute(&format!(
            "ALTER ROLE {0} NOLOGIN; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{0}'",
            schema.name()
        ))
        .await
        .unwrap();
    // A session that was authenticating while the role was locked out can
    // still appear after the first termination: terminate until none is
    // left (bounded), so that the outage is whole before it is measured.
    let mut remaining = 1;
    for _ in 0..40 {
        remaining = admin_db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
                &[&schema.name()],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        if remaining == 0 {
            break;
        }
        admin_db
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                &[&schema.name()],
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(remaining, 0, "sessions of the locked-out role survive");
    let down = health_becomes(&channel, ServingStatus::NotServing).await;
    for service in ["toolgate.v1.LedgerService", "toolgate.v1.ApprovalService"] {
        assert_eq!(
            health(channel.clone(), service).await,
            ServingStatus::NotServing
        );
    }
    // The watch (which saw the traffic consume the approval) learns that
    // other replicas' events may be lost, and ends.
    let mut seen = Vec::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .unwrap()
        {
            Ok(Some(m)) if seen.len() < 10 => seen.push(m.event.unwrap().kind()),
            other => break other,
        }
    };
    assert_eq!(seen, vec![pb::ApprovalEventKind::Consumed]);
    assert_eq!(end.unwrap_err().code(), tonic::Code::DataLoss);
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // Back: the same process recovers by itself.
    let restored = Instant::now();
    admin_db
        .batch_execute(&format!("ALTER ROLE {} LOGIN", schema.name()))
        .await
        .unwrap();
    let up = health_becomes(&channel, ServingStatus::Serving).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    for t in tasks {
        calls.extend(
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert!(sidecar.is_running());

    // None hung past twice the bounds.
    let slowest = calls.iter().max_by_key(|c| c.took).unwrap();
    assert!(slowest.took <= limit, "{slowest:?}");
    // While the store was down, nothing that needs it was granted; every
    // refusal is a retryable internal_error.
    let during: Vec<&Call> = calls
        .iter()
        .filter(|c| c.started >= down && c.started + c.took <= restored)
        .collect();
    for what in ["begin", "approved", "read"] {
        assert!(
            during.iter().any(|c| c.what == what),
            "no `{what}` call fell inside the outage"
        );
    }
    for c in &during {
        if c.what == "read" {
            // A read tool with no approval and no ledger needs no store.
            assert!(c.granted, "{c:?}");
        } else {
            assert!(!c.granted, "granted while the store was down: {c:?}");
            assert_eq!(
                (c.code.as_str(), c.retryable),
                ("internal_error", true),
                "{c:?}"
            );
        }
    }
    // After it came back, everything is granted again.
    let after: Vec<&Call> = calls.iter().filter(|c| c.started >= up).collect();
    for what in ["begin", "approved", "read"] {
        let of: Vec<_> = after.iter().filter(|c| c.what == what).collect();
        assert!(!of.is_empty(), "no `{what}` call after the outage");
        assert!(of.iter().all(|c| c.granted), "{of:?}");
    }
    // Every ACQUIRED answer was written: its record holds that token.
    let mut ledger = LedgerServiceClient::new(channel.clone());
    for key in calls.iter().filter_map(|c| c.acquired.clone()) {
        let e = ledger
            .get_execution(pb::GetExecutionRequest {
                auth: Some(agent_bob()),
                idempotency_key: key.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .execution
            .unwrap();
        assert_eq!(
            (e.state(), e.attempt),
            (pb::ExecutionState::InProgress, 1),
            "{key}"
        );
    }
    // The approval was consumed by the one operation that presented it.
    let approval = approvals
        .get_approval(pb::GetApprovalRequest {
            identity_token: admin,
            approval_id,
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(
        approval.consumed_by_idempotency_key,
        pending.idempotency_key
    );
    eprintln!(
        "outage: {} calls, {} inside the outage, slowest {:?}",
        calls.len(),
        during.len(),
        slowest.took
    );
}
