//! Budget charges (DESIGN §13.1) as every backend must keep them: a
//! sliding window, one charge per operation and key, a charge made only on
//! the version its decision read, releases, tenants apart, overflow told
//! apart from a sum; and, across connections, allowed charges that never
//! sum above what each decision saw. Run through `store_suite!`.

use std::sync::Arc;

use super::suite::{Backend, at_once, begin, complete};
use crate::budgets::{BudgetKey, Charge, Usage};
use crate::store::Store;

fn key(budget: &str, key: &str) -> BudgetKey {
    BudgetKey {
        budget: budget.into(),
        key: key.into(),
        window_ms: 1_000,
    }
}

fn charge(k: &BudgetKey, amount: i64, seen_version: i64) -> Charge {
    Charge {
        key: k.clone(),
        amount,
        seen_version,
    }
}

fn usage(used: Option<i64>, version: i64, charged: bool) -> Usage {
    Usage {
        used,
        version,
        charged,
    }
}

/// Read, charge, a stale charge refused whole, the window sliding, the
/// operation's own charge left out of its `used`, released and charged
/// again, tenants apart.
pub async fn budget_charges_slide_out_of_their_window_and_count_once(backend: &dyn Backend) {
    let store = &*backend.open().await;
    let (a, b) = (key("refunds", "[\"tenant\",\"acme\"]"), key("emails", "k"));
    let both = [a.clone(), b.clone()];
    assert_eq!(
        store.budget_usage("acme", "op1", &both, 100).await.unwrap(),
        [usage(Some(0), 0, false), usage(Some(0), 0, false)]
    );
    assert!(
        store
            .charge_budgets("acme", "op1", &[charge(&a, 10, 0), charge(&b, 1, 0)], 100)
            .await
            .unwrap()
    );
    // Another operation sees op1's charges; op1 sees its own as held.
    assert_eq!(
        store.budget_usage("acme", "op2", &both, 200).await.unwrap(),
        [usage(Some(10), 1, false), usage(Some(1), 1, false)]
    );
    assert_eq!(
        store.budget_usage("acme", "op1", &both, 200).await.unwrap(),
        [usage(Some(0), 1, true), usage(Some(0), 1, true)]
    );
    // A charge on a version that moved writes nothing, not even its other key.
    let fresh = key("fresh", "k");
    assert!(
        !store
            .charge_budgets(
                "acme",
                "op2",
                &[charge(&fresh, 5, 0), charge(&a, 5, 0)],
                200
            )
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .budget_usage("acme", "op3", &[a.clone(), fresh.clone()], 200)
            .await
            .unwrap(),
        [usage(Some(10), 1, false), usage(Some(0), 0, false)]
    );
    assert!(
        store
            .charge_budgets("acme", "op2", &[charge(&a, 5, 1)], 600)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .budget_usage("acme", "op3", std::slice::from_ref(&a), 1_099)
            .await
            .unwrap(),
        [usage(Some(15), 2, false)],
        "charged_at 100 is in the window (99, 1099]"
    );
    assert_eq!(
        store
            .budget_usage("acme", "op3", std::slice::from_ref(&a), 1_100)
            .await
            .unwrap(),
        [usage(Some(5), 2, false)],
        "the window slid past op1's charge"
    );
    // Another tenant's key of the same text is another key.
    assert_eq!(
        store
            .budget_usage("globex", "op3", std::slice::from_ref(&a), 700)
            .await
            .unwrap(),
        [usage(Some(0), 0, false)]
    );
    // Released: no longer counted, told once; charged again on a new decision.
    assert_eq!(
        store.release_charges("acme", "op1", 700).await.unwrap(),
        ["emails", "refunds"]
    );
    assert_eq!(
        store.release_charges("acme", "op1", 701).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        store
            .budget_usage("acme", "op1", std::slice::from_ref(&a), 800)
            .await
            .unwrap(),
        [usage(Some(5), 2, false)]
    );
    assert!(
        store
            .charge_budgets("acme", "op1", &[charge(&a, 7, 2)], 800)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .budget_usage("acme", "op9", std::slice::from_ref(&a), 900)
            .await
            .unwrap(),
        [usage(Some(12), 3, false)]
    );
}

/// A sum at or past the ceiling (9 × 10^18) is an overflow, never a
/// number that wrapped or saturated unnoticed.
pub async fn a_budget_sum_past_the_ceiling_is_an_overflow(backend: &dyn Backend) {
    let store = &*backend.open().await;
    let k = key("big", "k");
    let half = 4_500_000_000_000_000_000;
    assert!(
        store
            .charge_budgets("acme", "a", &[charge(&k, half, 0)], 10)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .budget_usage("acme", "x", std::slice::from_ref(&k), 20)
            .await
            .unwrap(),
        [usage(Some(half), 1, false)]
    );
    assert!(
        store
            .charge_budgets("acme", "b", &[charge(&k, i64::MAX, 1)], 10)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .budget_usage("acme", "x", std::slice::from_ref(&k), 20)
            .await
            .unwrap(),
        [usage(None, 2, false)]
    );
}

/// 32 decisions of 10 against a limit of 100 on one key, over two
/// connections (two replicas' pools), each one read–decide–charge, taken
/// again while its key moved: exactly 10 are charged, and they sum to 100.
pub async fn concurrent_charges_never_sum_above_what_each_decision_saw(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    let k = key("refunds", "[\"tenant\",\"acme\",\"agent\",\"bot\"]");
    let charged = at_once(&stores, 32, |store: Arc<dyn Store>, i| {
        let k = k.clone();
        async move {
            let op = format!("op{i}");
            for _ in 0..200 {
                let [seen] = store
                    .budget_usage("acme", &op, std::slice::from_ref(&k), 500)
                    .await
                    .unwrap()[..]
                else {
                    panic!("one key, one usage");
                };
                let used = seen.used.unwrap();
                if used + 10 > 100 {
                    return false;
                }
                if store
                    .charge_budgets("acme", &op, &[charge(&k, 10, seen.version)], 500)
                    .await
                    .unwrap()
                {
                    return true;
                }
            }
            panic!("{op} never got a stable read in 200 rounds");
        }
    })
    .await;
    assert_eq!(charged.iter().filter(|c| **c).count(), 10);
    assert_eq!(
        stores[0]
            .budget_usage("acme", "none", &[k], 500)
            .await
            .unwrap(),
        [usage(Some(100), 10, false)]
    );
}

/// A FAILED_RETRYABLE operation unchanged past the lapse instant becomes
/// FAILED_FINAL with its charges released, once; one in progress and one
/// failed later keep theirs; a Begin on the lapsed one answers COMPLETED
/// (it will not run).
pub async fn a_retryable_failure_nobody_retried_lapses_and_frees_its_charges(
    backend: &dyn Backend,
) {
    use crate::ledger::{BeginOutcome, Completion, ExecutionState, Lapse, Lapsed};
    let store = &*backend.open().await;
    let k = BudgetKey {
        window_ms: 1_000_000,
        ..key("refunds", "[\"tenant\",\"acme\"]")
    };
    for (version, (op, amount, fail_at)) in
        [("r1", 10, Some(200)), ("r2", 5, None), ("r3", 7, Some(300))]
            .into_iter()
            .enumerate()
    {
        let seen = i64::try_from(version).unwrap();
        assert!(
            store
                .charge_budgets("acme", op, &[charge(&k, amount, seen)], 100)
                .await
                .unwrap()
        );
        let run = store.begin_execution(begin("acme", op, 100)).await.unwrap();
        assert_eq!(run.outcome, BeginOutcome::Acquired);
        if let Some(at) = fail_at {
            let failed = store
                .complete_execution(complete(
                    op,
                    run.fencing_token,
                    Completion::FailedRetryable(None),
                    at,
                ))
                .await
                .unwrap();
            assert_eq!(failed.state, Some(ExecutionState::FailedRetryable));
        }
    }
    let keys = [k];
    let used = async |now| {
        store
            .budget_usage("acme", "other", &keys, now)
            .await
            .unwrap()[0]
            .used
    };
    let lapse = |before| Lapse {
        updated_at_or_before: before,
        now: 500,
        limit: 10,
    };
    assert_eq!(store.lapse_executions(lapse(199)).await.unwrap(), []);
    assert_eq!(used(400).await, Some(22));
    assert_eq!(
        store.lapse_executions(lapse(250)).await.unwrap(),
        [Lapsed {
            tenant_id: "acme".into(),
            idempotency_key: "r1".into(),
            tool: "refund_order".into(),
            arguments_sha256: "aa".into(),
            attempt: 1,
            released: vec!["refunds".into()],
        }]
    );
    assert_eq!(store.lapse_executions(lapse(250)).await.unwrap(), []);
    assert_eq!(used(600).await, Some(12));
    let r1 = store.get_execution("acme", "r1").await.unwrap().unwrap();
    assert_eq!(
        (r1.state, r1.updated_at, r1.revision),
        (ExecutionState::FailedFinal, 200, 3)
    );
    let again = store
        .begin_execution(begin("acme", "r1", 600))
        .await
        .unwrap();
    assert_eq!(again.outcome, BeginOutcome::Completed);
    for op in ["r2", "r3"] {
        let r = store.get_execution("acme", op).await.unwrap().unwrap();
        assert_ne!(r.state, ExecutionState::FailedFinal, "{op}");
    }
}

/// A lapse sweep and a retry's Begin of the same FAILED_RETRYABLE
/// operation at once, over two connections, 20 times: exactly one wins.
/// Either the retry runs (ACQUIRED) and the charge stands, or the record
/// is FAILED_FINAL, the Begin answers COMPLETED and the charge is freed:
/// never a call that runs uncharged, never a charge freed twice.
pub async fn a_lapse_and_a_retry_at_once_never_leave_a_running_call_uncharged(
    backend: &dyn Backend,
) {
    use crate::ledger::{BeginOutcome, Completion, ExecutionState, Lapse};
    let stores = [backend.open().await, backend.open().await];
    let (mut retried, mut lapsed) = (0, 0);
    for round in 0..20 {
        let op = format!("race{round}");
        let k = BudgetKey {
            window_ms: 1_000_000,
            ..key("refunds", &format!("[\"round\",{round}]"))
        };
        let store = &stores[0];
        assert!(
            store
                .charge_budgets("acme", &op, &[charge(&k, 10, 0)], 100)
                .await
                .unwrap()
        );
        let run = store
            .begin_execution(begin("acme", &op, 100))
            .await
            .unwrap();
        let failed = Completion::FailedRetryable(None);
        store
            .complete_execution(complete(&op, run.fencing_token, failed, 200))
            .await
            .unwrap();
        let answers = at_once(&stores, 2, |store: Arc<dyn Store>, i| {
            let op = op.clone();
            async move {
                if i == 0 {
                    let lapse = Lapse {
                        updated_at_or_before: 250,
                        now: 300,
                        limit: 100,
                    };
                    let n = store.lapse_executions(lapse).await.unwrap().len();
                    (Some(n), None)
                } else {
                    let again = store
                        .begin_execution(begin("acme", &op, 300))
                        .await
                        .unwrap();
                    (None, Some(again.outcome))
                }
            }
        })
        .await;
        let (n, outcome) = (answers[0].0.unwrap(), answers[1].1.unwrap());
        let record = store.get_execution("acme", &op).await.unwrap().unwrap();
        let used = store
            .budget_usage("acme", "other", std::slice::from_ref(&k), 400)
            .await
            .unwrap()[0]
            .used;
        match (n, outcome) {
            (0, BeginOutcome::Acquired) => {
                assert_eq!((record.state, used), (ExecutionState::InProgress, Some(10)));
                retried += 1;
            }
            (1, BeginOutcome::Completed) => {
                assert_eq!((record.state, used), (ExecutionState::FailedFinal, Some(0)));
                lapsed += 1;
            }
            other => panic!("round {round}: {other:?} with {record:?}, used {used:?}"),
        }
    }
    assert_eq!(retried + lapsed, 20);
}
