//! The store suite's checks of the approval a gateway call finds (DESIGN
//! §11.3), as every backend must find it: bound to the call minus its
//! request id, consumed once. Run by `suite::store_suite!` with the rest.

use std::collections::HashSet;

use super::suite::{Backend, at_once, decision, new_approval};
use crate::approvals::{ApprovalStatus, NewApproval, PendingLimits, PendingScope};
use crate::clock::UnixMillis;
use crate::store::{
    ApprovalDecision, ApprovalUse, DecideOutcome, GatewayApproval, Store, StoreError,
};
use crate::tools::Risk;

/// A gateway call of `new_approval`'s call (tenant `t1`, alice,
/// `refund_order` 1, financial, hash `ab`) with request id `r{n}`: the
/// approval it would create is `g{n}`, its idempotency key `k{n}`.
fn call(n: u32, now: UnixMillis) -> (NewApproval, String) {
    let mut new = new_approval(&format!("g{n}"), now);
    new.request_id = format!("r{n}");
    (new, format!("k{n}"))
}

/// What a gateway call `n` at `now` finds, as (kind, approval id).
async fn ask(store: &dyn Store, n: u32, now: UnixMillis) -> (&'static str, String) {
    let (new, key) = call(n, now);
    named(
        store
            .approval_for_gateway_call(new, &key, now)
            .await
            .unwrap(),
    )
}

fn named(found: GatewayApproval) -> (&'static str, String) {
    match found {
        GatewayApproval::Consumed {
            record,
            first: true,
        } => ("consumed", record.approval_id),
        GatewayApproval::Consumed {
            record,
            first: false,
        } => ("reused", record.approval_id),
        GatewayApproval::Pending(r) => ("pending", r.approval_id),
        GatewayApproval::Rejected(r) => ("rejected", r.approval_id),
        GatewayApproval::Requested(r) => ("requested", r.approval_id),
    }
}

async fn decide(store: &dyn Store, id: &str, approve: bool, at: UnixMillis, until: UnixMillis) {
    let d = ApprovalDecision {
        approved_expires_at: until,
        reason: if approve {
            "ok".into()
        } else {
            "refunds above 100 need a ticket".into()
        },
        ..decision(approve, "dana", at)
    };
    let outcome = store.decide_approval("t1", id, d).await.unwrap();
    assert!(matches!(outcome, DecideOutcome::Decided(_)), "{outcome:?}");
}

/// An executor's approval `id` of the same call, its request id `id`.
async fn executor_asks(store: &dyn Store, id: &str, now: UnixMillis) {
    let new = NewApproval {
        request_id: id.into(),
        ..new_approval(id, now)
    };
    let (record, created) = store.pending_approval_for_call(new, now).await.unwrap();
    assert_eq!((record.approval_id.as_str(), created), (id, true));
}

/// The whole life through a gateway: requested once, pending for every
/// other request id, approved then consumed by the first call that comes,
/// reused by that call's key only; the next operation needs a new one.
pub async fn a_gateway_call_finds_its_approval_without_its_request_id(backend: &dyn Backend) {
    let store = &*backend.open().await;
    let (new, key) = call(1, 0);
    let GatewayApproval::Requested(created) =
        store.approval_for_gateway_call(new, &key, 0).await.unwrap()
    else {
        panic!("not requested")
    };
    assert_eq!(
        (
            created.approval_id.as_str(),
            created.request_id.as_str(),
            created.status
        ),
        ("g1", "r1", ApprovalStatus::Pending)
    );
    assert_eq!(store.get_approval("t1", "g1").await.unwrap(), Some(created));
    // No second approval while one is pending, whatever the request id.
    assert_eq!(ask(store, 2, 5).await, ("pending", "g1".into()));
    assert_eq!(ask(store, 1, 5).await, ("pending", "g1".into()));
    decide(store, "g1", true, 10, 500).await;
    assert_eq!(ask(store, 3, 20).await, ("consumed", "g1".into()));
    let used = store.get_approval("t1", "g1").await.unwrap().unwrap();
    assert_eq!(used.consumed_by_idempotency_key.as_deref(), Some("k3"));
    // The same operation again (its key) reuses it; another does not.
    assert_eq!(ask(store, 3, 30).await, ("reused", "g1".into()));
    assert_eq!(ask(store, 4, 30).await, ("requested", "g4".into()));
    assert_eq!(ask(store, 3, 40).await, ("reused", "g1".into()));
    assert_eq!(ask(store, 5, 40).await, ("pending", "g4".into()));
    // Past its expiry not even the key that consumed it reuses it.
    decide(store, "g4", false, 50, 0).await;
    assert_eq!(ask(store, 3, 500).await, ("rejected", "g4".into()));
    // The rejection of g4 (created at 30) holds until 1030.
    assert_eq!(ask(store, 3, 1029).await, ("rejected", "g4".into()));
    assert_eq!(ask(store, 3, 1030).await, ("requested", "g3".into()));
}

/// Another tenant, subject, tool, tool version, risk or hash is another
/// call: it never finds, waits on, or is refused by this call's approvals.
pub async fn a_gateway_approval_serves_only_its_own_call(backend: &dyn Backend) {
    let store = &*backend.open().await;
    assert_eq!(ask(store, 1, 0).await, ("requested", "g1".into()));
    decide(store, "g1", true, 1, 500).await;
    let (base, _) = call(9, 2);
    let others: Vec<(&str, NewApproval)> = vec![
        (
            "t2",
            NewApproval {
                tenant_id: "t2".into(),
                ..base.clone()
            },
        ),
        (
            "bob",
            NewApproval {
                requester_subject_id: "bob".into(),
                ..base.clone()
            },
        ),
        (
            "tool",
            NewApproval {
                tool: "cancel_order".into(),
                ..base.clone()
            },
        ),
        (
            "version",
            NewApproval {
                tool_version: "2".into(),
                ..base.clone()
            },
        ),
        (
            "risk",
            NewApproval {
                risk: Risk::Destructive,
                ..base.clone()
            },
        ),
        (
            "hash",
            NewApproval {
                arguments_sha256: "cd".into(),
                ..base.clone()
            },
        ),
    ];
    for (i, (what, other)) in others.into_iter().enumerate() {
        let other = NewApproval {
            approval_id: format!("o{i}"),
            ..other
        };
        let tenant = other.tenant_id.clone();
        let found = store
            .approval_for_gateway_call(other, &format!("ko{i}"), 2)
            .await
            .unwrap();
        assert_eq!(named(found), ("requested", format!("o{i}")), "{what}");
        // Each other call has its own pending one now; reject it, and the
        // approved `g1` still waits for its own call.
        let d = ApprovalDecision {
            reason: "no".into(),
            ..decision(false, "dana", 3)
        };
        let outcome = store
            .decide_approval(&tenant, &format!("o{i}"), d)
            .await
            .unwrap();
        assert!(matches!(outcome, DecideOutcome::Decided(_)), "{what}");
    }
    let g1 = store.get_approval("t1", "g1").await.unwrap().unwrap();
    assert_eq!(g1.consumed_by_idempotency_key, None);
    assert_eq!(ask(store, 2, 4).await, ("consumed", "g1".into()));
}

/// The oldest approved one is used first, an expired approved or pending
/// one is ignored, a rejection holds until it expires and only while it is
/// the latest, and a new approval is under the pending caps.
pub async fn a_gateway_call_takes_the_oldest_usable_approval(backend: &dyn Backend) {
    let store = &*backend.open().await;
    // Two executor calls of the same call, approved: `x9` is the older
    // (created first), though its id sorts last.
    for (id, at) in [("x9", 0), ("x1", 1)] {
        executor_asks(store, id, at).await;
    }
    decide(store, "x1", true, 2, 300).await;
    decide(store, "x9", true, 3, 200).await;
    assert_eq!(ask(store, 1, 10).await, ("consumed", "x9".into()));
    assert_eq!(ask(store, 2, 10).await, ("consumed", "x1".into()));
    // An approved one past its expiry is not used; nor a pending one.
    executor_asks(store, "e3", 20).await;
    decide(store, "e3", true, 21, 100).await;
    assert_eq!(ask(store, 4, 100).await, ("requested", "g4".into()));
    assert_eq!(
        store
            .get_approval("t1", "e3")
            .await
            .unwrap()
            .unwrap()
            .consumed_by_idempotency_key,
        None
    );
    // g4 is due at 1100: afterwards a new one, and a rejected one holds
    // until its own expiry (2100).
    assert_eq!(ask(store, 5, 1100).await, ("requested", "g5".into()));
    decide(store, "g5", false, 1101, 0).await;
    let rejected = store
        .approval_for_gateway_call(call(6, 1102).0, "k6", 1102)
        .await
        .unwrap();
    let GatewayApproval::Rejected(r) = rejected else {
        panic!("{rejected:?}")
    };
    assert_eq!(
        (r.approval_id.as_str(), r.reason.as_deref()),
        ("g5", Some("refunds above 100 need a ticket"))
    );
    // An approved one (an executor's, created after the rejection) is
    // used even while the rejection holds; then the rejection is no
    // longer the latest, so the next operation gets a new approval.
    executor_asks(store, "e7", 1200).await;
    decide(store, "e7", true, 1201, 1900).await;
    assert_eq!(ask(store, 7, 1202).await, ("consumed", "e7".into()));
    assert_eq!(ask(store, 8, 1203).await, ("requested", "g8".into()));
    // The caps hold: alice already has g8 pending.
    let capped = NewApproval {
        requester_subject_id: "alice".into(),
        arguments_sha256: "other".into(),
        limits: PendingLimits {
            per_subject: 1,
            per_tenant: 10,
        },
        ..call(9, 1204).0
    };
    assert!(matches!(
        store.approval_for_gateway_call(capped, "k9", 1204).await,
        Err(StoreError::PendingLimit(PendingScope::Subject))
    ));
    assert_eq!(store.get_approval("t1", "g9").await.unwrap(), None);
}

/// One approved approval, 16 operations at once on two connections: half
/// gateway calls (each its own request id and key), half executors
/// presenting its id. Exactly one consumes it; every executor that lost is
/// told another consumed it; of the gateway calls that lost, exactly one
/// requests a new approval and the others wait on that one.
pub async fn one_approval_runs_one_of_racing_gateway_and_executor_calls(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    stores[0]
        .pending_approval_for_call(new_approval("a1", 0), 0)
        .await
        .unwrap();
    decide(&*stores[0], "a1", true, 1, 500).await;
    let answers = at_once(&stores, 16, |store, i| async move {
        let n = u32::try_from(i).unwrap();
        if i % 2 == 0 {
            named(
                store
                    .approval_for_gateway_call(call(n, 2).0, &format!("k{n}"), 2)
                    .await
                    .unwrap(),
            )
        } else {
            match store
                .consume_approval("t1", "a1", &format!("k{n}"), 2)
                .await
                .unwrap()
            {
                ApprovalUse::Consumed { first: true } => ("consumed", "a1".into()),
                ApprovalUse::ConsumedByOther => ("consumed_by_other", "a1".into()),
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
    let count = |kind: &str| answers.iter().filter(|(k, _)| *k == kind).count();
    assert_eq!(count("consumed"), 1, "{answers:?}");
    assert_eq!(count("requested"), 1, "{answers:?}");
    let executor_won = answers
        .iter()
        .skip(1)
        .step_by(2)
        .any(|(k, _)| *k == "consumed");
    assert_eq!(count("consumed_by_other"), if executor_won { 7 } else { 8 });
    assert_eq!(count("pending"), if executor_won { 7 } else { 6 });
    let waited_on: HashSet<&String> = answers
        .iter()
        .filter(|(k, _)| *k == "pending" || *k == "requested")
        .map(|(_, id)| id)
        .collect();
    assert_eq!(waited_on.len(), 1, "{answers:?}");
    let listed = stores[1]
        .list_approvals("t1", None, None, 100)
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);
    let a1 = stores[1].get_approval("t1", "a1").await.unwrap().unwrap();
    assert!(a1.consumed_by_idempotency_key.is_some());
}
