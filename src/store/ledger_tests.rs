//! The ledger's persistence as every backend must provide it, written
//! against `dyn Store` and a way to open more connections to the same
//! database, so that another backend runs the very same checks.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::Store;
use crate::clock::UnixMillis;
use crate::ledger::{
    Begin, BeginOutcome, Collect, Complete, Completion, ExecutionId, ExecutionState, OutputSchemas,
    Reconcile, RecordedError, Verdict,
};
use crate::tools::Violation;

/// Opens another connection (pool, process's worth) to the same database.
pub type Open = dyn Fn() -> Arc<dyn Store> + Send + Sync;

/// Every result is valid: these tests are about persistence, not schemas.
#[derive(Debug)]
struct AnyOutput;

impl OutputSchemas for AnyOutput {
    fn check(&self, _: &str, _: &Value) -> Option<Vec<Violation>> {
        Some(Vec::new())
    }
}

fn id(tenant: &str, key: &str) -> ExecutionId {
    ExecutionId {
        tenant_id: tenant.into(),
        idempotency_key: key.into(),
    }
}

fn begin(tenant: &str, key: &str, now: UnixMillis) -> Begin {
    Begin {
        id: id(tenant, key),
        tool: "refund_order".into(),
        arguments_sha256: "aa".into(),
        lease_ms: 1_000,
        max_attempts: 3,
        now,
    }
}

fn complete(key: &str, token: u64, completion: Completion, now: UnixMillis) -> Complete {
    Complete {
        id: id("acme", key),
        fencing_token: token,
        completion,
        now,
        outputs: Arc::new(AnyOutput),
    }
}

/// Begin, complete, reconcile and read back: every field survives the
/// round trip through the database, and tenants are apart.
pub async fn transitions_round_trip(store: &dyn Store) {
    let acquired = store
        .begin_execution(begin("acme", "k1", 100))
        .await
        .unwrap();
    assert_eq!(acquired.outcome, BeginOutcome::Acquired);
    let declined = RecordedError {
        code: "card_declined".into(),
        category: "payment".into(),
        message: "declined \u{1F4B3}".into(),
        retryable: true,
        resolution: "retry_same_key".into(),
        expose_to_model: true,
        expose_to_user: false,
        details_json: r#"{"issuer":"x"}"#.into(),
    };
    let settled = store
        .complete_execution(complete(
            "k1",
            acquired.fencing_token,
            Completion::FailedRetryable(Some(declined.clone())),
            150,
        ))
        .await
        .unwrap();
    assert_eq!(settled.state, Some(ExecutionState::FailedRetryable));
    let r = store.get_execution("acme", "k1").await.unwrap().unwrap();
    assert_eq!(
        (
            r.state,
            r.attempt,
            r.max_attempts,
            r.fencing_token,
            r.revision
        ),
        (
            ExecutionState::FailedRetryable,
            1,
            3,
            acquired.fencing_token,
            2
        )
    );
    assert_eq!(
        (r.created_at, r.updated_at, r.lease_expires_at),
        (100, 150, 1_100)
    );
    assert_eq!(r.error, Some(declined));
    assert_eq!(r.tool, "refund_order");
    assert_eq!(r.arguments_sha256, "aa");

    let again = store
        .begin_execution(begin("acme", "k1", 200))
        .await
        .unwrap();
    assert_eq!((again.outcome, again.attempt), (BeginOutcome::Acquired, 2));
    assert!(again.fencing_token > acquired.fencing_token);
    store
        .complete_execution(complete(
            "k1",
            again.fencing_token,
            Completion::Unknown(None),
            250,
        ))
        .await
        .unwrap();
    let reconciled = store
        .reconcile_execution(Reconcile {
            id: id("acme", "k1"),
            verdict: Verdict::Applied {
                result_json: r#"{"refund_id":"re_1"}"#.into(),
                result: serde_json::json!({"refund_id": "re_1"}),
            },
            now: 300,
            outputs: Arc::new(AnyOutput),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reconciled.state, Some(ExecutionState::Succeeded));
    let r = store.get_execution("acme", "k1").await.unwrap().unwrap();
    assert_eq!(r.result_json.as_deref(), Some(r#"{"refund_id":"re_1"}"#));
    assert_eq!((r.error, r.revision, r.updated_at), (None, 5, 300));

    // Another tenant sees nothing, and its own key is its own.
    assert_eq!(store.get_execution("globex", "k1").await.unwrap(), None);
    let theirs = store
        .begin_execution(begin("globex", "k1", 400))
        .await
        .unwrap();
    assert_eq!(
        (theirs.outcome, theirs.attempt),
        (BeginOutcome::Acquired, 1)
    );
    assert_eq!(
        store
            .get_execution("acme", "k1")
            .await
            .unwrap()
            .unwrap()
            .state,
        ExecutionState::Succeeded
    );
}

/// 32 concurrent Begins on one key, spread over two connections to the same
/// database, give exactly one ACQUIRED, for a new key and for a retry after
/// a retryable failure: the database's transaction, not an in-process lock,
/// decides.
pub async fn exactly_one_acquires_across_connections(open: &Open) {
    let stores = [open(), open()];
    for round in 0..5 {
        let key = format!("race-{round}");
        let winners = race(&stores, &key, 1_000).await;
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let (attempt, token) = winners[0];
        assert_eq!(attempt, 1);
        stores[0]
            .complete_execution(complete(
                &key,
                token,
                Completion::FailedRetryable(None),
                1_001,
            ))
            .await
            .unwrap();
        let retry = race(&stores, &key, 1_002).await;
        assert_eq!(retry.len(), 1, "round {round} retry: {retry:?}");
        assert_eq!(retry[0].0, 2);
        assert!(retry[0].1 > token);
    }
}

/// The (attempt, token) of every ACQUIRED among 32 concurrent Begins.
async fn race(stores: &[Arc<dyn Store>; 2], key: &str, now: UnixMillis) -> Vec<(u32, u64)> {
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let store = Arc::clone(&stores[i % 2]);
        let barrier = Arc::clone(&barrier);
        let step = begin("acme", key, now);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.begin_execution(step).await.unwrap()
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let a = tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .unwrap()
            .unwrap();
        match a.outcome {
            BeginOutcome::Acquired => winners.push((a.attempt, a.fencing_token)),
            BeginOutcome::InProgress => assert_eq!(a.fencing_token, 0),
            other => panic!("unexpected {other:?}"),
        }
    }
    winners
}

/// Collection deletes due records in batches of at most `limit`, spares a
/// live lease, and never lets a key's later life reuse a token.
pub async fn collection_is_batched_and_spares_live_leases(store: &dyn Store) {
    let mut first_token = 0;
    for i in 0..25 {
        let a = store
            .begin_execution(begin("acme", &format!("old-{i}"), 1_000))
            .await
            .unwrap();
        if i == 0 {
            first_token = a.fencing_token;
        }
        store
            .complete_execution(complete(
                &format!("old-{i}"),
                a.fencing_token,
                Completion::FailedFinal(None),
                1_000,
            ))
            .await
            .unwrap();
    }
    let mut held = begin("acme", "held", 1_000);
    held.lease_ms = 1_000_000;
    store.begin_execution(held).await.unwrap();
    store
        .begin_execution(begin("acme", "young", 6_000))
        .await
        .unwrap();

    let due = Collect::new(10_000, Duration::from_millis(5_000), 10);
    let mut batches = Vec::new();
    for _ in 0..10 {
        let n = store.collect_executions(due).await.unwrap();
        batches.push(n);
        if n == 0 {
            break;
        }
    }
    assert_eq!(batches, vec![10, 10, 5, 0]);
    assert_eq!(store.get_execution("acme", "old-0").await.unwrap(), None);
    assert!(store.get_execution("acme", "held").await.unwrap().is_some());
    assert!(
        store
            .get_execution("acme", "young")
            .await
            .unwrap()
            .is_some()
    );

    let reborn = store
        .begin_execution(begin("acme", "old-0", 20_000))
        .await
        .unwrap();
    assert_eq!(
        (reborn.outcome, reborn.attempt),
        (BeginOutcome::Acquired, 1)
    );
    assert!(reborn.fencing_token > first_token + 26);
    // The holder of the first life's token cannot complete the second.
    let stale = store
        .complete_execution(complete(
            "old-0",
            first_token,
            Completion::Unknown(None),
            20_001,
        ))
        .await
        .unwrap();
    assert_eq!(stale.error.map(|e| e.code), Some("lease_lost".to_owned()));
}
