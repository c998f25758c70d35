//! Budgets (DESIGN §13.1) over a real `toolgate serve`: what each decision
//! saw and charged, on SQLite and on PostgreSQL with two replicas, under
//! concurrency; a retry charged once; a call that failed for good freed;
//! the counters per budget name; and a stateless call that never reaches
//! the store.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use toolgate::budgets::BudgetKey;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::{self, CompletionStatus, Decision};
use toolgate::store::{PostgresStore, SqliteStore, Store, StoreSettings};

use crate::sidecar::Sidecar;
use crate::support::{
    Backend, TestServer, both_backends, code, examples_with_refund_budget, identity_args, request,
    scratch_schema, test_config,
};

/// 32 refunds of 10.00 at once against a budget of 100.00, each its own
/// operation; 20 rounds, each round by another agent (another key).
const CALLS: usize = 32;
const ROUNDS: usize = 20;

/// The example deployment with the daily refund budget at 100.00.
fn policies_with_a_budget_of_100() -> (tempfile::TempDir, std::path::PathBuf) {
    examples_with_refund_budget(10_000)
}

fn refund(agent: &str, i: usize, amount: u32) -> pb::AuthorizeRequest {
    let mut req = request(
        "refund_order",
        &format!(
            r#"{{"order_id":"ord_1001","amount_cents":{amount},"currency":"USD","reason":"late"}}"#
        ),
    );
    req.request_id = format!("{agent}-refund-{i}");
    if let Some(auth) = req.auth.as_mut() {
        auth.agent_id = agent.to_owned();
        // Each agent its own subject: the race's 22 approvals a round stay
        // under the per-subject cap on pending approvals.
        auth.subject_id = format!("{agent}-owner");
    }
    req
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// What the store holds charged, live, on `agent`'s daily refund key.
async fn charged(store: &dyn Store, agent: &str) -> i64 {
    let key = BudgetKey {
        budget: "refunds_daily".into(),
        key: format!(r#"["tenant","acme","agent","{agent}"]"#),
        window_ms: 86_400_000,
    };
    let usage = store
        .budget_usage("acme", "none", &[key], now_ms())
        .await
        .unwrap();
    usage[0].used.unwrap()
}

/// Every round: `CALLS` refunds at once, spread over `clients` in turn;
/// exactly 10 allowed, the rest waiting for a human, and the store's
/// charges on the key sum to exactly 100.00.
async fn race(
    clients: &[AuthorizationServiceClient<tonic::transport::Channel>],
    store: &dyn Store,
) {
    for round in 0..ROUNDS {
        let agent = format!("racer-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(CALLS));
        let tasks: Vec<_> = (0..CALLS)
            .map(|i| {
                let mut client = clients[i % clients.len()].clone();
                let req = refund(&agent, i, 1_000);
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    client.authorize(req).await.unwrap().into_inner()
                })
            })
            .collect();
        let mut allowed = 0;
        let mut waiting = 0;
        for task in tasks {
            let r = tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("a decision within 30 s")
                .unwrap();
            match r.decision() {
                Decision::Allow => allowed += 1,
                Decision::ApprovalRequired => waiting += 1,
                other => panic!("round {round}: {other:?} {:?}", r.error),
            }
        }
        assert_eq!((allowed, waiting), (10, 22), "round {round}");
        assert_eq!(charged(store, &agent).await, 10_000, "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_refunds_never_overspend_the_budget_on_two_postgres_replicas() {
    let Some(schema) = scratch_schema().await else {
        return;
    };
    let (_policies_dir, policies) = policies_with_a_budget_of_100();
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let start = |dir: &Path| Sidecar::start_serving(dir, &policies, schema.url(), &identity_args());
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| start(a_dir.path()));
        let b = s.spawn(|| start(b_dir.path()));
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut clients = Vec::new();
    for replica in [&a, &b] {
        for _ in 0..4 {
            clients.push(AuthorizationServiceClient::new(replica.channel().await));
        }
    }
    let store = PostgresStore::connect(schema.url(), StoreSettings::default())
        .await
        .unwrap();
    race(&clients, &store).await;
    a.kill();
    b.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_refunds_never_overspend_the_budget_on_sqlite() {
    let (_policies_dir, policies) = policies_with_a_budget_of_100();
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start_with_policies(dir.path(), &policies, &identity_args());
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(AuthorizationServiceClient::new(sidecar.channel().await));
    }
    // A second connection to the same file, as an operator would open it.
    let store = SqliteStore::open(&dir.path().join("toolgate.db")).unwrap();
    race(&clients, &store).await;
    sidecar.kill();
}

/// support-bot's five refunds of 100.00, each allowed (the agent's 500.00
/// of the day); the fifth begun in its Authorize: its answer.
async fn five_refunds_the_fifth_begun(
    client: &mut AuthorizationServiceClient<tonic::transport::Channel>,
) -> pb::AuthorizeResponse {
    let mut last = None;
    for i in 1..=5 {
        let mut req = refund("support-bot", i, 10_000);
        req.begin_execution = i == 5;
        let r = client.authorize(req).await.unwrap().into_inner();
        assert_eq!(r.decision(), Decision::Allow, "refund {i}: {:?}", r.error);
        last = Some(r);
    }
    last.unwrap()
}

/// The begun refund's outcome reported as `status`: the record's state.
async fn report(
    ledger: &mut LedgerServiceClient<tonic::transport::Channel>,
    begun: &pb::AuthorizeResponse,
    status: CompletionStatus,
) -> pb::ExecutionState {
    let run = begun.execution.as_ref().expect("the refund began");
    ledger
        .complete_execution(pb::CompleteExecutionRequest {
            auth: request("refund_order", "{}").auth,
            idempotency_key: begun.idempotency_key.clone(),
            fencing_token: run.fencing_token,
            status: status.into(),
            result_json: String::new(),
            error: None,
        })
        .await
        .unwrap()
        .into_inner()
        .state()
}

both_backends!(a_retry_is_charged_once_and_a_call_that_failed_for_good_frees_its_charge);

/// Five refunds of 100.00 spend the agent's 500.00 of the day; a retry of
/// one of them is allowed and charged nothing; the sixth waits for a human
/// until one of the five fails for good (FAILED_FINAL), which frees its
/// 100.00. The counters say so per budget name.
async fn a_retry_is_charged_once_and_a_call_that_failed_for_good_frees_its_charge(
    backend: Backend,
) {
    let server = TestServer::start_on(backend).await;
    let mut client = server.client().await;
    let fifth = five_refunds_the_fifth_begun(&mut client).await;
    let retry = client
        .authorize(refund("support-bot", 3, 10_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retry.decision(), Decision::Allow, "{:?}", retry.error);
    let sixth = client
        .authorize(refund("support-bot", 6, 10_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (sixth.decision(), code(&sixth)),
        (Decision::ApprovalRequired, "approval_required")
    );

    let mut ledger = LedgerServiceClient::new(server.channel().await);
    let failed = report(&mut ledger, &fifth, CompletionStatus::FailedFinal).await;
    assert_eq!(failed, pb::ExecutionState::FailedFinal);
    let sixth = client
        .authorize(refund("support-bot", 6, 10_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sixth.decision(), Decision::Allow, "{:?}", sixth.error);

    let metrics = server.metrics_endpoint().scrape().await;
    for (event, n) in [("charged", 6), ("released", 1), ("over_limit", 1)] {
        let line = format!(
            "toolgate_budget_events_total{{budget=\"refunds_daily\",event=\"{event}\"}} {n}\n"
        );
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
    server.stop().await;
}

/// A call no budget counts reaches no store; a budgeted one reads its
/// usage and makes its charge: two store calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_no_budget_counts_makes_no_store_access() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path());
    let clock: Arc<dyn toolgate::clock::Clock> = Arc::new(toolgate::clock::SystemClock);
    let policies = Arc::new(
        toolgate::policy::PolicyReloader::load(&config.policies, Arc::clone(&clock)).unwrap(),
    );
    let sqlite = SqliteStore::open(&dir.path().join("counted.db")).unwrap();
    let services =
        toolgate::server::assemble_on(&config, clock, policies, Arc::new(sqlite.clone()))
            .await
            .unwrap();
    let input = |tool: &str, args: &str, request_id: &str| {
        let req = request(tool, args);
        toolgate::decision::AuthorizeInput {
            tool: tool.into(),
            arguments: args.as_bytes().to_vec(),
            caller: Some(toolgate::identity::Caller {
                subject_id: "bob".into(),
                tenant_id: "acme".into(),
                scopes: req.auth.as_ref().unwrap().scopes.clone(),
                roles: vec!["support_agent".into()],
                agent_id: "support-bot".into(),
                session_id: "sess-1".into(),
            }),
            call_id: String::new(),
            request_id: request_id.into(),
            approval_id: String::new(),
            deadline: None,
            entities_json: req.entities_json,
            tool_version: String::new(),
            identity_token: String::new(),
            peer: String::new(),
            tenants: toolgate::access::TenantScope::Any,
            door: toolgate::decision::Door::Executor,
            action: String::new(),
        }
    };
    let before = sqlite.accesses();
    for i in 0..10 {
        let read = services
            .authorizer
            .authorize(&input(
                "get_order",
                r#"{"order_id":"ord_1001"}"#,
                &format!("g{i}"),
            ))
            .await
            .unwrap();
        assert_eq!(read.decision, toolgate::decision::Decision::Allow);
    }
    assert_eq!(
        sqlite.accesses(),
        before,
        "a stateless call touched the store"
    );
    let refund = services
        .authorizer
        .authorize(&input(
            "refund_order",
            r#"{"order_id":"ord_1001","amount_cents":100,"currency":"USD","reason":"late"}"#,
            "r1",
        ))
        .await
        .unwrap();
    assert_eq!(refund.decision, toolgate::decision::Decision::Allow);
    assert_eq!(sqlite.accesses(), before + 2, "one read, one charge");
    assert_eq!(
        refund.budgets,
        [toolgate::budgets::Seen {
            name: "refunds_daily".into(),
            used: 0,
            this_call: 100,
            limit: 50_000,
        }]
    );
    assert!(refund.charged);
}

/// BatchAuthorize decides in request order, each call on the charges of
/// the ones before it: the sixth and seventh refunds of 100.00 wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_charged_in_request_order() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let requests = (0..7).map(|i| refund("batch-bot", i, 10_000)).collect();
    let r = client
        .batch_authorize(pb::BatchAuthorizeRequest { requests })
        .await
        .unwrap()
        .into_inner();
    let decisions: Vec<Decision> = r
        .responses
        .iter()
        .map(pb::AuthorizeResponse::decision)
        .collect();
    assert_eq!(
        decisions,
        [
            Decision::Allow,
            Decision::Allow,
            Decision::Allow,
            Decision::Allow,
            Decision::Allow,
            Decision::ApprovalRequired,
            Decision::ApprovalRequired
        ]
    );
    server.stop().await;
}

/// SIGKILL while refunds are being decided and charged, then a restart on
/// the same file: every refund answered ALLOW before the kill holds its
/// charge (none lost), and every refund sent, asked again with its key
/// after the restart, is allowed and charged exactly once (none twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_between_charge_and_answer_loses_no_charge_and_charges_nothing_twice() {
    const CLIENTS: usize = 8;
    const MOST: usize = 400;
    const CENTS: i64 = 100;
    let (_policies, policies) = examples_with_refund_budget(crate::support::GENEROUS);
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start_with_policies(dir.path(), &policies, &identity_args());
    let channel = sidecar.channel().await;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let mut client = AuthorizationServiceClient::new(channel.clone());
            tokio::spawn(async move {
                let (mut sent, mut allowed) = (Vec::new(), 0_usize);
                for n in 0..MOST {
                    let i = c * MOST + n;
                    sent.push(i);
                    let asked = client.authorize(refund("crash-bot", i, 100));
                    match tokio::time::timeout(Duration::from_secs(10), asked).await {
                        Ok(Ok(r)) if r.get_ref().decision() == Decision::Allow => allowed += 1,
                        Ok(Ok(r)) => panic!("refund {i}: {:?}", r.into_inner().error),
                        // The sidecar is gone.
                        Ok(Err(_)) | Err(_) => break,
                    }
                }
                (sent, allowed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    sidecar.kill();
    let (mut sent, mut allowed) = (Vec::new(), 0);
    for task in tasks {
        let (s, a) = task.await.unwrap();
        sent.extend(s);
        allowed += a;
    }
    assert!(allowed > 0, "no refund was decided before the kill");
    assert!(allowed < CLIENTS * MOST, "the kill came after every refund");

    let sidecar = Sidecar::start_with_policies(dir.path(), &policies, &identity_args());
    let store = SqliteStore::open(&dir.path().join("toolgate.db")).unwrap();
    let before = charged(&store, "crash-bot").await;
    let (allowed, sent_n) = (
        i64::try_from(allowed).unwrap(),
        i64::try_from(sent.len()).unwrap(),
    );
    assert!(
        (allowed * CENTS..=sent_n * CENTS).contains(&before),
        "{before} charged for {allowed} allowed of {sent_n} sent"
    );
    let mut client = AuthorizationServiceClient::new(sidecar.channel().await);
    for &i in &sent {
        let r = client
            .authorize(refund("crash-bot", i, 100))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.decision(), Decision::Allow, "refund {i}: {:?}", r.error);
    }
    assert_eq!(charged(&store, "crash-bot").await, sent_n * CENTS);
    sidecar.kill();
}

both_backends!(a_retryable_failure_nobody_retried_before_its_ticket_expired_frees_its_charge);

/// The fifth refund of 100.00 fails retryably and is never retried: while
/// a ticket could still retry it (ticket TTL plus the lapse grace) its
/// charge stands and the sixth refund waits for a human; then the sweep
/// makes it FAILED_FINAL, frees the 100.00, and the sixth is allowed.
async fn a_retryable_failure_nobody_retried_before_its_ticket_expired_frees_its_charge(
    backend: Backend,
) {
    let clock = toolgate::clock::ManualClock::new(now_ms());
    let ledger = crate::support::test_ledger_config();
    let wait =
        i64::try_from((ledger.ticket_ttl + toolgate::ledger::LAPSE_GRACE).as_millis()).unwrap();
    let server = TestServer::start_with_ledger_on(backend, clock.clone(), ledger).await;
    let mut client = server.client().await;
    let fifth = five_refunds_the_fifth_begun(&mut client).await;
    let mut ledger = LedgerServiceClient::new(server.channel().await);
    let failed = report(&mut ledger, &fifth, CompletionStatus::FailedRetryable).await;
    assert_eq!(failed, pb::ExecutionState::FailedRetryable);
    let sixth = async |client: &mut AuthorizationServiceClient<_>| {
        client
            .authorize(refund("support-bot", 6, 10_000))
            .await
            .unwrap()
            .into_inner()
            .decision()
    };
    // One millisecond before the lapse, over several sweeps (every 100 ms).
    clock.advance(wait - 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(sixth(&mut client).await, Decision::ApprovalRequired);
    let state = async |ledger: &mut LedgerServiceClient<_>| {
        ledger
            .get_execution(pb::GetExecutionRequest {
                auth: request("refund_order", "{}").auth,
                idempotency_key: fifth.idempotency_key.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .execution
            .expect("the record")
            .state()
    };
    assert_eq!(
        state(&mut ledger).await,
        pb::ExecutionState::FailedRetryable
    );
    clock.advance(1);
    let mut lapsed = false;
    for _ in 0..100 {
        if state(&mut ledger).await == pb::ExecutionState::FailedFinal {
            lapsed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(lapsed, "the sweep never made the unretried refund final");
    assert_eq!(sixth(&mut client).await, Decision::Allow);
    let metrics = server.metrics_endpoint().scrape().await;
    let line = "toolgate_budget_events_total{budget=\"refunds_daily\",event=\"released\"} 1\n";
    assert!(metrics.contains(line), "{line} in:\n{metrics}");
    server.stop().await;
}
