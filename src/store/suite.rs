//! The store's semantics as every backend must provide them, approvals and
//! the ledger, written once against `dyn Store` and a [`Backend`] that opens
//! more stores (a process's worth: a connection, a pool) on one database.
//! [`store_suite!`] turns every check into a test of a backend, so SQLite
//! and PostgreSQL run the very same checks, unchanged.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{ApprovalDecision, ApprovalUse, DecideOutcome, Store, StoreError};
use crate::approvals::{ApprovalStatus, NewApproval, PendingLimits, PendingScope};
use crate::clock::UnixMillis;
use crate::ledger::{
    Begin, BeginOutcome, Collect, Complete, Completion, ExecutionId, ExecutionState, OutputSchemas,
    Reconcile, RecordedError, Verdict,
};
use crate::tools::{Risk, Violation};

/// One empty database for one test.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Opens another store (connection, pool) on the database: what another
    /// sidecar process would hold.
    async fn open(&self) -> Arc<dyn Store>;
}

/// One `#[tokio::test]` per check of this module, each on a fresh database
/// from `$make` (an async fn returning `Option<impl Backend>`; `None` skips,
/// which only a backend that is not reachable outside CI may do).
macro_rules! store_suite {
    ($make:path) => {
        $crate::store::suite::store_suite!(@each $make;
            transitions_round_trip,
            exactly_one_acquires_across_connections,
            collection_is_batched_and_spares_live_leases,
            collection_keeps_every_call_that_may_have_run,
            fencing_tokens_are_distinct_secrets_across_connections,
            ticket_keys_are_made_once_and_shared,
            the_first_decision_wins_and_expiry_sweeps_what_is_due,
            an_approval_is_consumed_by_the_first_key_only,
            the_same_call_gets_the_same_pending_approval_until_it_expires,
            another_version_risk_or_request_id_is_another_call,
            one_pending_approval_per_call_across_connections,
            the_first_of_concurrent_decisions_wins_across_connections,
            an_approval_is_consumed_once_across_connections,
            each_expiry_is_swept_once_across_connections,
            pending_approvals_are_capped_per_subject_and_per_tenant,
            the_pending_cap_holds_across_connections,
            a_gateway_call_finds_its_approval_without_its_request_id,
            a_gateway_approval_serves_only_its_own_call,
            a_gateway_call_takes_the_oldest_usable_approval,
            one_approval_runs_one_of_racing_gateway_and_executor_calls,
            approvals_follow_the_pure_rules,
            entities_are_replaced_read_and_deleted_by_uid,
            entities_of_one_tenant_are_invisible_to_another,
            the_ancestor_walk_is_transitive_and_bounded,
            concurrent_upserts_leave_one_whole_entity,
            budget_charges_slide_out_of_their_window_and_count_once,
            a_budget_sum_past_the_ceiling_is_an_overflow,
            concurrent_charges_never_sum_above_what_each_decision_saw,
            a_retryable_failure_nobody_retried_lapses_and_frees_its_charges,
            a_lapse_and_a_retry_at_once_never_leave_a_running_call_uncharged,
            sessions_join_count_once_and_forget_when_idle,
            concurrent_session_checks_never_pass_on_a_state_they_did_not_see,
        );
    };
    (@each $make:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                if let Some(backend) = $make().await {
                    $crate::store::suite::$check(&backend).await;
                }
            }
        )*
    };
}
pub(crate) use store_suite;

pub use super::budget_suite::{
    a_budget_sum_past_the_ceiling_is_an_overflow,
    a_lapse_and_a_retry_at_once_never_leave_a_running_call_uncharged,
    a_retryable_failure_nobody_retried_lapses_and_frees_its_charges,
    budget_charges_slide_out_of_their_window_and_count_once,
    concurrent_charges_never_sum_above_what_each_decision_saw,
};
pub use super::entity_suite::{
    concurrent_upserts_leave_one_whole_entity, entities_are_replaced_read_and_deleted_by_uid,
    entities_of_one_tenant_are_invisible_to_another, the_ancestor_walk_is_transitive_and_bounded,
};
pub use super::gateway_suite::{
    a_gateway_approval_serves_only_its_own_call,
    a_gateway_call_finds_its_approval_without_its_request_id,
    a_gateway_call_takes_the_oldest_usable_approval,
    one_approval_runs_one_of_racing_gateway_and_executor_calls,
};
pub use super::machine_suite::approvals_follow_the_pure_rules;
pub use super::session_suite::{
    concurrent_session_checks_never_pass_on_a_state_they_did_not_see,
    sessions_join_count_once_and_forget_when_idle,
};

/// Every result is valid: these tests are about persistence, not schemas.
#[derive(Debug)]
struct AnyOutput;

impl OutputSchemas for AnyOutput {
    fn check(&self, _: &str, _: &Value) -> Option<Vec<Violation>> {
        Some(Vec::new())
    }
}

pub(super) fn id(tenant: &str, key: &str) -> ExecutionId {
    ExecutionId {
        tenant_id: tenant.into(),
        idempotency_key: key.into(),
    }
}

pub(super) fn begin(tenant: &str, key: &str, now: UnixMillis) -> Begin {
    Begin {
        id: id(tenant, key),
        tool: "refund_order".into(),
        arguments_sha256: "aa".into(),
        lease_ms: 1_000,
        max_attempts: 3,
        now,
    }
}

pub(super) fn complete(key: &str, token: u64, completion: Completion, now: UnixMillis) -> Complete {
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
pub async fn transitions_round_trip(backend: &dyn Backend) {
    let store = &*backend.open().await;
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
    assert_ne!(again.fencing_token, acquired.fencing_token);
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
            holder_token: Some(again.fencing_token),
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
pub async fn exactly_one_acquires_across_connections(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
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
        assert_ne!(retry[0].1, token);
    }
}

/// `n` calls at once (released together by a barrier), spread over the
/// stores in turn; their results in call order, each bounded by 30 s.
pub(super) async fn at_once<T, F, Fut>(stores: &[Arc<dyn Store>; 2], n: usize, call: F) -> Vec<T>
where
    F: Fn(Arc<dyn Store>, usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let work = call(Arc::clone(&stores[i % 2]), i);
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    out
}

/// The (attempt, token) of every ACQUIRED among 32 concurrent Begins.
async fn race(stores: &[Arc<dyn Store>; 2], key: &str, now: UnixMillis) -> Vec<(u32, u64)> {
    let answers = at_once(stores, 32, |store, _| {
        let step = begin("acme", key, now);
        async move { store.begin_execution(step).await.unwrap() }
    })
    .await;
    let mut winners = Vec::new();
    for a in answers {
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
pub async fn collection_is_batched_and_spares_live_leases(backend: &dyn Backend) {
    let store = &*backend.open().await;
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
    assert_ne!(reborn.fencing_token, first_token);
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

/// Collection deletes only settled records (issue 18.4): an UNKNOWN record
/// and an IN_PROGRESS one whose lease expired long ago survive any number
/// of sweeps, however old, and a Begin on them still answers
/// RECONCILE_REQUIRED; settled ones of the same age are collected.
pub async fn collection_keeps_every_call_that_may_have_run(backend: &dyn Backend) {
    let store = &*backend.open().await;
    let settle = |key: &'static str, completion: Completion| async move {
        let a = store
            .begin_execution(begin("acme", key, 1_000))
            .await
            .unwrap();
        store
            .complete_execution(complete(key, a.fencing_token, completion, 1_000))
            .await
            .unwrap();
    };
    settle("unknown", Completion::Unknown(None)).await;
    settle("final", Completion::FailedFinal(None)).await;
    settle("retryable", Completion::FailedRetryable(None)).await;
    settle(
        "succeeded",
        Completion::Succeeded {
            result_json: "{}".into(),
            result: serde_json::json!({}),
        },
    )
    .await;
    // Begun at 1 000 with a 1 000 ms lease, never reported.
    store
        .begin_execution(begin("acme", "abandoned", 1_000))
        .await
        .unwrap();

    let due = Collect::new(1_000_000, Duration::from_millis(5_000), 10);
    assert_eq!(store.collect_executions(due).await.unwrap(), 3);
    assert_eq!(store.collect_executions(due).await.unwrap(), 0);
    for gone in ["final", "retryable", "succeeded"] {
        assert_eq!(
            store.get_execution("acme", gone).await.unwrap(),
            None,
            "{gone}"
        );
    }
    for (kept, state) in [
        ("unknown", ExecutionState::Unknown),
        ("abandoned", ExecutionState::InProgress),
    ] {
        let record = store.get_execution("acme", kept).await.unwrap();
        assert_eq!(record.map(|r| r.state), Some(state), "{kept}");
        let again = store
            .begin_execution(begin("acme", kept, 1_000_001))
            .await
            .unwrap();
        assert_eq!(again.outcome, BeginOutcome::ReconcileRequired, "{kept}");
    }
}

/// Tokens drawn on two connections at once are all distinct secrets (63
/// bits, never 0), and each key's later acquisition carries a new one (the
/// attempt number is the fence).
pub async fn fencing_tokens_are_distinct_secrets_across_connections(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = Arc::clone(&stores[i % 2]);
        tasks.push(tokio::spawn(async move {
            let key = format!("k{i}");
            let first = store.begin_execution(begin("acme", &key, 0)).await.unwrap();
            let step = complete(
                &key,
                first.fencing_token,
                Completion::FailedRetryable(None),
                1,
            );
            store.complete_execution(step).await.unwrap();
            let second = store.begin_execution(begin("acme", &key, 2)).await.unwrap();
            assert_eq!(
                (first.outcome, second.outcome, second.attempt),
                (BeginOutcome::Acquired, BeginOutcome::Acquired, 2)
            );
            assert_ne!(second.fencing_token, first.fencing_token, "{key}");
            [first.fencing_token, second.fencing_token]
        }));
    }
    let mut seen = HashSet::new();
    for t in tasks {
        for token in t.await.unwrap() {
            assert!(token >= 1 && i64::try_from(token).is_ok(), "{token}");
            assert!(seen.insert(token), "token {token} issued twice");
        }
    }
    assert_eq!(seen.len(), 32);
    // Not a counter: 32 consecutive values would all sit below 2^40.
    assert!(seen.iter().any(|t| *t > 1 << 40), "{seen:?}");
}

/// The first call stores its candidate as version 1; every later call, on
/// any connection, gets that key back whatever candidate it brings.
pub async fn ticket_keys_are_made_once_and_shared(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    let first = crate::ledger::TicketKey {
        version: 1,
        secret: [1; crate::ledger::KEY_BYTES],
    };
    let keys = stores[0].ticket_keys(first.clone()).await.unwrap();
    assert_eq!(keys, vec![first.clone()]);
    let other = crate::ledger::TicketKey {
        version: 1,
        secret: [2; crate::ledger::KEY_BYTES],
    };
    assert_eq!(
        stores[1].ticket_keys(other.clone()).await.unwrap(),
        vec![first.clone()]
    );
    assert_eq!(stores[0].ticket_keys(other).await.unwrap(), vec![first]);
}

/// A pending approval of tenant `t1`, due 1 s after `now`.
pub fn new_approval(id: &str, now: UnixMillis) -> NewApproval {
    NewApproval {
        approval_id: id.into(),
        tenant_id: "t1".into(),
        requester_subject_id: "alice".into(),
        agent_id: "agent".into(),
        tool: "refund_order".into(),
        tool_version: "1".into(),
        risk: Risk::Financial,
        arguments_sha256: "ab".into(),
        display_arguments: "{}".into(),
        request_id: "r1".into(),
        created_at: now,
        expires_at: now + 1000,
        // Kept and read back as written, on every backend.
        why: crate::approvals::ApprovalWhy::example(),
        limits: crate::approvals::PendingLimits::default(),
    }
}

pub(super) fn decision(approve: bool, by: &str, at: UnixMillis) -> ApprovalDecision {
    ApprovalDecision {
        approve,
        decided_by: by.into(),
        reason: "ok".into(),
        decided_at: at,
        approved_expires_at: 500,
    }
}

/// The first decision wins, another tenant finds nothing, and expiry sweeps
/// exactly the due pending and unconsumed approved ones; listing pages by id.
pub async fn the_first_decision_wins_and_expiry_sweeps_what_is_due(backend: &dyn Backend) {
    let store = backend.open().await;
    store
        .pending_approval_for_call(new_approval("a1", 0), 0)
        .await
        .unwrap();
    let first = store
        .decide_approval("t1", "a1", decision(true, "dana", 5))
        .await
        .unwrap();
    let DecideOutcome::Decided(r) = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        (
            r.status,
            r.expires_at,
            r.decided_by.as_deref(),
            r.decided_at
        ),
        (ApprovalStatus::Approved, 500, Some("dana"), Some(5))
    );
    assert_eq!(r.reason.as_deref(), Some("ok"));
    let second = store
        .decide_approval("t1", "a1", decision(false, "erin", 6))
        .await
        .unwrap();
    let DecideOutcome::AlreadyDecided(r) = second else {
        panic!("{second:?}")
    };
    assert_eq!(
        (r.status, r.decided_by.as_deref()),
        (ApprovalStatus::Approved, Some("dana"))
    );
    assert_eq!(
        store
            .decide_approval("t2", "a1", decision(true, "x", 6))
            .await
            .unwrap(),
        DecideOutcome::NotFound
    );
    let mut pending = new_approval("a2", 0);
    pending.request_id = "r2".into();
    store.pending_approval_for_call(pending, 0).await.unwrap();
    // A rejected one never expires; a consumed one neither.
    let mut rejected = new_approval("a3", 0);
    rejected.request_id = "r3".into();
    store.pending_approval_for_call(rejected, 0).await.unwrap();
    store
        .decide_approval("t1", "a3", decision(false, "dana", 5))
        .await
        .unwrap();
    assert!(store.expire_due(499).await.unwrap().is_empty());
    let mut expired: Vec<String> = store
        .expire_due(1000)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            assert_eq!(r.status, ApprovalStatus::Expired);
            r.approval_id
        })
        .collect();
    expired.sort();
    assert_eq!(expired, vec!["a1", "a2"]);
    assert!(store.expire_due(2000).await.unwrap().is_empty());
    let all = store
        .list_approvals("t1", Some(ApprovalStatus::Expired), None, 10)
        .await
        .unwrap();
    assert_eq!(all.len(), 2);
    let page = store
        .list_approvals("t1", None, Some("a1".into()), 10)
        .await
        .unwrap();
    let ids: Vec<&str> = page.iter().map(|r| r.approval_id.as_str()).collect();
    assert_eq!(ids, vec!["a2", "a3"]);
    let one = store.list_approvals("t1", None, None, 1).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].approval_id, "a1");
    assert!(
        store
            .list_approvals("t2", None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Only an approved, unexpired approval is consumed, by its first key; the
/// same key may use it again, another may not, nor another tenant.
pub async fn an_approval_is_consumed_by_the_first_key_only(backend: &dyn Backend) {
    let store = backend.open().await;
    store
        .pending_approval_for_call(new_approval("a1", 0), 0)
        .await
        .unwrap();
    assert_eq!(
        store.consume_approval("t1", "a1", "k1", 1).await.unwrap(),
        ApprovalUse::NotUsable
    );
    store
        .decide_approval("t1", "a1", decision(true, "dana", 1))
        .await
        .unwrap();
    assert_eq!(
        store.consume_approval("t1", "a1", "k1", 1).await.unwrap(),
        ApprovalUse::Consumed { first: true }
    );
    assert_eq!(
        store.consume_approval("t1", "a1", "k1", 2).await.unwrap(),
        ApprovalUse::Consumed { first: false }
    );
    assert_eq!(
        store.consume_approval("t1", "a1", "k2", 2).await.unwrap(),
        ApprovalUse::ConsumedByOther
    );
    assert_eq!(
        store.consume_approval("t2", "a1", "k1", 2).await.unwrap(),
        ApprovalUse::NotUsable
    );
    assert_eq!(
        store
            .consume_approval("t1", "a1", "k1", 1000)
            .await
            .unwrap(),
        ApprovalUse::NotUsable
    );
    assert_eq!(
        store.consume_approval("t1", "nope", "k1", 2).await.unwrap(),
        ApprovalUse::NotUsable
    );
    let r = store.get_approval("t1", "a1").await.unwrap().unwrap();
    assert_eq!(r.consumed_by_idempotency_key.as_deref(), Some("k1"));
    // A consumed approval is not swept as expired.
    assert!(store.expire_due(10_000).await.unwrap().is_empty());
}

/// Every field survives the round trip; the same call gets the same pending
/// approval until it expires, then a new one.
pub async fn the_same_call_gets_the_same_pending_approval_until_it_expires(backend: &dyn Backend) {
    let store = backend.open().await;
    let mut first = new_approval("a1", 0);
    first.display_arguments = r#"{"note":"caf\u{e9} \u{1F4B3}"}"#.into();
    let (a, created) = store
        .pending_approval_for_call(first.clone(), 0)
        .await
        .unwrap();
    assert!(created);
    let read = store.get_approval("t1", "a1").await.unwrap().unwrap();
    assert_eq!(read, a);
    let expected = crate::approvals::ApprovalRecord {
        approval_id: "a1".into(),
        tenant_id: "t1".into(),
        requester_subject_id: "alice".into(),
        agent_id: "agent".into(),
        tool: "refund_order".into(),
        tool_version: "1".into(),
        risk: Risk::Financial,
        arguments_sha256: "ab".into(),
        display_arguments: first.display_arguments.clone(),
        request_id: "r1".into(),
        status: ApprovalStatus::Pending,
        created_at: 0,
        expires_at: 1000,
        decided_by: None,
        decided_at: None,
        reason: None,
        consumed_by_idempotency_key: None,
        why: first.why.clone(),
    };
    assert_eq!(read, expected);
    let (b, created) = store
        .pending_approval_for_call(new_approval("a2", 10), 10)
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(b.approval_id, "a1");
    let (c, created) = store
        .pending_approval_for_call(new_approval("a3", 1000), 1000)
        .await
        .unwrap();
    assert!(created);
    assert_eq!(c.approval_id, "a3");
    let old = store.get_approval("t1", "a1").await.unwrap().unwrap();
    assert_eq!(old.status, ApprovalStatus::Expired);
    assert!(store.get_approval("t2", "a3").await.unwrap().is_none());
}

/// The pending approval is keyed on the whole call (DESIGN §4): another
/// tool version, risk or request id gets its own approval; each of them
/// asked again gets its own back.
pub async fn another_version_risk_or_request_id_is_another_call(backend: &dyn Backend) {
    let store = backend.open().await;
    let mut calls = vec![new_approval("a0", 0)];
    let mut v2 = new_approval("a1", 0);
    v2.tool_version = "2".into();
    calls.push(v2);
    let mut destructive = new_approval("a2", 0);
    destructive.risk = Risk::Destructive;
    calls.push(destructive);
    let mut r2 = new_approval("a3", 0);
    r2.request_id = "r2".into();
    calls.push(r2);
    for call in &calls {
        let (record, created) = store
            .pending_approval_for_call(call.clone(), 0)
            .await
            .unwrap();
        assert_eq!(
            (record.approval_id.as_str(), created),
            (call.approval_id.as_str(), true)
        );
    }
    for (i, call) in calls.into_iter().enumerate() {
        let expected = call.approval_id.clone();
        let mut again = call;
        again.approval_id = format!("again{i}");
        let (record, created) = store.pending_approval_for_call(again, 5).await.unwrap();
        assert_eq!((record.approval_id, created), (expected, false));
    }
}

/// 16 requests for the same call at once, on two connections: one approval,
/// created once.
pub async fn one_pending_approval_per_call_across_connections(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    let answers = at_once(&stores, 16, |store, i| async move {
        store
            .pending_approval_for_call(new_approval(&format!("a{i:02}"), 0), 0)
            .await
            .unwrap()
    })
    .await;
    let mut ids = HashSet::new();
    let mut created = 0;
    for (record, new) in answers {
        ids.insert(record.approval_id);
        created += usize::from(new);
    }
    assert_eq!((ids.len(), created), (1, 1), "{ids:?}");
    let listed = stores[0]
        .list_approvals("t1", None, None, 100)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
}

/// 16 approvers decide at once on two connections: exactly one decision is
/// recorded, and every other caller is told it was already decided.
pub async fn the_first_of_concurrent_decisions_wins_across_connections(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    stores[0]
        .pending_approval_for_call(new_approval("a1", 0), 0)
        .await
        .unwrap();
    let answers = at_once(&stores, 16, |store, i| async move {
        let by = format!("approver-{i}");
        store
            .decide_approval("t1", "a1", decision(i % 3 != 0, &by, 5))
            .await
            .unwrap()
    })
    .await;
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for answer in answers {
        match answer {
            DecideOutcome::Decided(r) => winners.push(r),
            DecideOutcome::AlreadyDecided(r) => losers.push(r),
            DecideOutcome::NotFound => panic!("not found"),
        }
    }
    assert_eq!((winners.len(), losers.len()), (1, 15));
    let stored = stores[1].get_approval("t1", "a1").await.unwrap().unwrap();
    assert_eq!(stored, winners[0]);
    assert!(losers.iter().all(|r| r.decided_by == stored.decided_by));
}

/// 16 operations present the same approval at once on two connections:
/// exactly one consumes it, every other is refused as consumed by another.
pub async fn an_approval_is_consumed_once_across_connections(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    stores[0]
        .pending_approval_for_call(new_approval("a1", 0), 0)
        .await
        .unwrap();
    stores[0]
        .decide_approval("t1", "a1", decision(true, "dana", 1))
        .await
        .unwrap();
    let answers = at_once(&stores, 16, |store, i| async move {
        let key = format!("k{i}");
        let used = store.consume_approval("t1", "a1", &key, 2).await.unwrap();
        (key, used)
    })
    .await;
    let mut first = Vec::new();
    for answer in answers {
        match answer {
            (key, ApprovalUse::Consumed { first: true }) => first.push(key),
            (_, ApprovalUse::ConsumedByOther) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(first.len(), 1, "{first:?}");
    let stored = stores[1].get_approval("t1", "a1").await.unwrap().unwrap();
    assert_eq!(stored.consumed_by_idempotency_key.as_ref(), first.first());
}

/// Two sweeps at once on two connections: every due approval is returned
/// (and so announced) by exactly one of them.
pub async fn each_expiry_is_swept_once_across_connections(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    for i in 0..40 {
        let mut a = new_approval(&format!("a{i:02}"), 0);
        a.request_id = format!("r{i}");
        stores[i % 2].pending_approval_for_call(a, 0).await.unwrap();
    }
    let sweeps: Vec<_> = stores
        .iter()
        .map(|s| {
            let s = Arc::clone(s);
            tokio::spawn(async move { s.expire_due(5_000).await.unwrap() })
        })
        .collect();
    let mut seen = Vec::new();
    for sweep in sweeps {
        seen.extend(sweep.await.unwrap().into_iter().map(|r| r.approval_id));
    }
    seen.sort();
    let expected: Vec<String> = (0..40).map(|i| format!("a{i:02}")).collect();
    assert_eq!(seen, expected);
}

/// A transition whose update expects a revision the record is not at: what
/// a backend must refuse with `StoreError::Conflict { expected: 98 }`,
/// writing nothing.
#[derive(Debug)]
pub struct Stale(pub ExecutionId);

impl crate::ledger::Transition for Stale {
    type Answer = ();
    fn id(&self) -> &ExecutionId {
        &self.0
    }
    fn apply(
        &self,
        current: Option<&crate::ledger::ExecutionRecord>,
        next: u64,
    ) -> ((), crate::ledger::Write) {
        let mut record = current.unwrap().clone();
        record.fencing_token = next;
        record.revision = 99;
        let write = crate::ledger::Write::Update {
            record,
            previous_revision: 98,
        };
        ((), write)
    }
}

/// The record `Stale` then meets: key `k` of `acme`, just acquired.
pub async fn stale_target(store: &dyn Store) -> (Stale, u64) {
    let begun = store.begin_execution(begin("acme", "k", 0)).await.unwrap();
    (Stale(id("acme", "k")), begun.fencing_token)
}

/// A distinct call (its own request id) of `subject` in tenant `t1`, under
/// the caps `limits`.
fn capped(id: &str, subject: &str, now: UnixMillis, limits: PendingLimits) -> NewApproval {
    NewApproval {
        requester_subject_id: subject.into(),
        request_id: id.into(),
        limits,
        ..new_approval(id, now)
    }
}

/// At most 2 PENDING per subject and 3 per tenant: the same call again
/// still gets its approval, a new one past a cap is refused and not stored,
/// and decided or expired approvals free their place.
pub async fn pending_approvals_are_capped_per_subject_and_per_tenant(backend: &dyn Backend) {
    let store = backend.open().await;
    let limits = PendingLimits {
        per_subject: 2,
        per_tenant: 3,
    };
    let ask = |id: &str, subject: &str, now: UnixMillis| {
        let store = Arc::clone(&store);
        let new = capped(id, subject, now, limits);
        async move {
            store
                .pending_approval_for_call(new, now)
                .await
                .map(|(r, created)| (r.approval_id, created))
        }
    };
    assert_eq!(ask("a1", "alice", 0).await.unwrap(), ("a1".into(), true));
    assert_eq!(ask("a2", "alice", 0).await.unwrap(), ("a2".into(), true));
    assert!(matches!(
        ask("a3", "alice", 0).await,
        Err(StoreError::PendingLimit(PendingScope::Subject))
    ));
    // The same call again is not a new approval: no cap applies.
    assert_eq!(ask("a2", "alice", 0).await.unwrap(), ("a2".into(), false));
    assert_eq!(ask("b1", "bob", 0).await.unwrap(), ("b1".into(), true));
    assert!(matches!(
        ask("c1", "carol", 0).await,
        Err(StoreError::PendingLimit(PendingScope::Tenant))
    ));
    let listed = store.list_approvals("t1", None, None, 100).await.unwrap();
    assert_eq!(listed.len(), 3);
    assert!(matches!(
        store
            .decide_approval("t1", "a1", decision(false, "ops", 1))
            .await
            .unwrap(),
        DecideOutcome::Decided(_)
    ));
    assert_eq!(ask("a4", "alice", 1).await.unwrap(), ("a4".into(), true));
    // All due at 1000 or 1001: expired ones do not count.
    assert_eq!(ask("c2", "carol", 1001).await.unwrap(), ("c2".into(), true));
    assert_eq!(ask("a5", "alice", 1001).await.unwrap(), ("a5".into(), true));
    assert_eq!(ask("a6", "alice", 1001).await.unwrap(), ("a6".into(), true));
    assert!(matches!(
        ask("c3", "carol", 1001).await,
        Err(StoreError::PendingLimit(PendingScope::Tenant))
    ));
}

/// 16 distinct calls of one subject at once on two connections, capped at
/// 3: exactly 3 approvals exist, the other 13 are refused.
pub async fn the_pending_cap_holds_across_connections(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    let limits = PendingLimits {
        per_subject: 3,
        per_tenant: 100,
    };
    let answers = at_once(&stores, 16, move |store, i| async move {
        let new = capped(&format!("a{i:02}"), "alice", 0, limits);
        match store.pending_approval_for_call(new, 0).await {
            Ok((_, created)) => Ok(created),
            Err(StoreError::PendingLimit(scope)) => Err(Some(scope)),
            Err(_) => Err(None),
        }
    })
    .await;
    let created = answers.iter().filter(|a| **a == Ok(true)).count();
    let refused = answers
        .iter()
        .filter(|a| **a == Err(Some(PendingScope::Subject)))
        .count();
    assert_eq!((created, refused), (3, 13), "{answers:?}");
    let listed = stores[0]
        .list_approvals("t1", None, None, 100)
        .await
        .unwrap();
    assert_eq!(listed.len(), 3);
}
