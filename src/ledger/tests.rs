//! Every rule of the state machine on plain data: the table of DESIGN §5,
//! row by row, and each decision of the module docs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::envelope::ErrorCode;
use crate::tools::ToolContract;

const NOW: UnixMillis = 1_000_000;
const TOKEN: u64 = 41;

/// The output schemas of one real contract: `refund_order` wants `{"refund_id": string}`.
#[derive(Debug)]
struct OneTool(ToolContract);

impl OutputSchemas for OneTool {
    fn check(&self, tool: &str, result: &Value) -> Option<Vec<Violation>> {
        (tool == self.0.name).then(|| self.0.validate_output(result, 20))
    }
}

fn outputs() -> Arc<dyn OutputSchemas> {
    let text = r#"{"name": "refund_order", "version": "1", "risk": "financial", "timeoutMs": 100,
        "inputSchema": {"type": "object"},
        "outputSchema": {"type": "object", "required": ["refund_id"], "properties": {"refund_id": {"type": "string"}}}}"#;
    Arc::new(OneTool(
        ToolContract::parse(Path::new("refund_order.json"), text).unwrap(),
    ))
}

fn id() -> ExecutionId {
    ExecutionId {
        tenant_id: "acme".into(),
        idempotency_key: "refund_order:k1".into(),
    }
}

fn begin(now: UnixMillis) -> Begin {
    Begin {
        id: id(),
        tool: "refund_order".into(),
        arguments_sha256: "aa".into(),
        lease_ms: 5_000,
        max_attempts: 3,
        now,
    }
}

/// A record of attempt 1 in `state`, acquired at `NOW` with token 7 and a 5 s lease.
fn record(state: ExecutionState) -> ExecutionRecord {
    ExecutionRecord {
        tenant_id: "acme".into(),
        idempotency_key: "refund_order:k1".into(),
        tool: "refund_order".into(),
        arguments_sha256: "aa".into(),
        state,
        attempt: 1,
        max_attempts: 3,
        fencing_token: 7,
        lease_expires_at: NOW + 5_000,
        result_json: None,
        error: None,
        created_at: NOW,
        updated_at: NOW,
        revision: 1,
    }
}

fn code(e: Option<&RecordedError>) -> &str {
    e.map_or("", |e| e.code.as_str())
}

fn details(e: Option<&RecordedError>) -> Value {
    serde_json::from_str(&e.unwrap().details_json).unwrap()
}

#[test]
fn absent_is_acquired_with_attempt_one_a_token_and_a_lease() {
    let (a, w) = begin(NOW).apply(None, TOKEN);
    assert_eq!(a.outcome, BeginOutcome::Acquired);
    assert_eq!(
        (a.attempt, a.fencing_token, a.lease_expires_at),
        (1, TOKEN, Some(NOW + 5_000))
    );
    assert_eq!(a.state, Some(ExecutionState::InProgress));
    assert_eq!(a.error, None);
    let Write::Insert(r) = w else { panic!("{w:?}") };
    assert_eq!(
        (
            r.state,
            r.attempt,
            r.max_attempts,
            r.fencing_token,
            r.revision
        ),
        (ExecutionState::InProgress, 1, 3, TOKEN, 1)
    );
    assert_eq!(
        (r.created_at, r.updated_at, r.lease_expires_at),
        (NOW, NOW, NOW + 5_000)
    );
}

#[test]
fn a_live_lease_is_in_progress_without_the_holders_token() {
    let r = record(ExecutionState::InProgress);
    let (a, w) = begin(NOW + 4_700).apply(Some(&r), TOKEN);
    assert_eq!(w, Write::Nothing);
    assert_eq!(a.outcome, BeginOutcome::InProgress);
    assert_eq!(a.fencing_token, 0);
    assert_eq!(a.retry_after_ms, 300);
    assert_eq!(a.lease_expires_at, Some(NOW + 5_000));
    assert_eq!(code(a.error.as_ref()), "operation_in_progress");
    assert_eq!(details(a.error.as_ref())["retry_after_ms"], json!(300));
    // Far from expiry, the advice is bounded.
    let (a, _) = begin(NOW).apply(Some(&r), TOKEN);
    assert_eq!(a.retry_after_ms, MAX_RETRY_AFTER_MS);
}

#[test]
fn an_expired_lease_requires_reconciliation_never_a_second_executor() {
    let r = record(ExecutionState::InProgress);
    for now in [NOW + 5_000, NOW + 86_400_000] {
        let (a, w) = begin(now).apply(Some(&r), TOKEN);
        assert_eq!(w, Write::Nothing);
        assert_eq!(a.outcome, BeginOutcome::ReconcileRequired);
        assert_eq!((a.fencing_token, a.attempt), (0, 1));
        assert_eq!(code(a.error.as_ref()), "reconcile_required");
        assert_eq!(
            details(a.error.as_ref()),
            json!({"reason": "lease_expired", "attempt": 1})
        );
        assert!(
            a.error.unwrap().message.contains("ReconcileExecution"),
            "the answer says how to reconcile"
        );
    }
}

#[test]
fn succeeded_and_failed_final_are_completed_with_what_was_stored() {
    let mut ok = record(ExecutionState::Succeeded);
    ok.result_json = Some(r#"{"refund_id":"re_1"}"#.into());
    let (a, w) = begin(NOW + 10).apply(Some(&ok), TOKEN);
    assert_eq!(w, Write::Nothing);
    assert_eq!(a.outcome, BeginOutcome::Completed);
    assert_eq!(a.state, Some(ExecutionState::Succeeded));
    assert_eq!(a.result_json.as_deref(), Some(r#"{"refund_id":"re_1"}"#));
    assert_eq!(a.fencing_token, 0);

    let mut failed = record(ExecutionState::FailedFinal);
    let declined = RecordedError {
        code: "card_declined".into(),
        category: "payment".into(),
        message: "the card was declined".into(),
        retryable: false,
        resolution: "stop".into(),
        expose_to_model: true,
        expose_to_user: true,
        details_json: "{}".into(),
    };
    failed.error = Some(declined.clone());
    let (a, w) = begin(NOW + 10).apply(Some(&failed), TOKEN);
    assert_eq!(w, Write::Nothing);
    assert_eq!(
        (a.outcome, a.state, a.error),
        (
            BeginOutcome::Completed,
            Some(ExecutionState::FailedFinal),
            Some(declined)
        )
    );
}

#[test]
fn failed_retryable_is_acquired_again_until_the_budget_then_final() {
    let mut r = record(ExecutionState::FailedRetryable);
    r.revision = 2;
    let (a, w) = begin(NOW + 10).apply(Some(&r), TOKEN);
    assert_eq!(a.outcome, BeginOutcome::Acquired);
    assert_eq!((a.attempt, a.fencing_token), (2, TOKEN));
    let Write::Update {
        record: next,
        previous_revision: 2,
    } = w
    else {
        panic!("{w:?}")
    };
    assert_eq!((next.attempt, next.revision, next.created_at), (2, 3, NOW));
    assert_eq!(next.lease_expires_at, NOW + 10 + 5_000);

    // A record at its last attempt (reached only if the budget rule was
    // bypassed) is finished, not run again.
    r.attempt = 3;
    let (a, w) = begin(NOW + 10).apply(Some(&r), TOKEN);
    assert_eq!(
        (a.outcome, a.state),
        (BeginOutcome::Completed, Some(ExecutionState::FailedFinal))
    );
    assert_eq!(
        w.record().map(|r| r.state),
        Some(ExecutionState::FailedFinal)
    );
}

#[test]
fn unknown_requires_reconciliation_naming_its_cause() {
    let mut r = record(ExecutionState::Unknown);
    r.error = Some((&Envelope::new(ErrorCode::OutputInvalid, "bad")).into());
    let (a, w) = begin(NOW + 10).apply(Some(&r), TOKEN);
    assert_eq!(w, Write::Nothing);
    assert_eq!(a.outcome, BeginOutcome::ReconcileRequired);
    assert_eq!(details(a.error.as_ref())["reason"], json!("output_invalid"));
}

#[test]
fn a_key_back_with_other_arguments_or_another_tool_is_refused() {
    let r = record(ExecutionState::Succeeded);
    let mut other_args = begin(NOW);
    other_args.arguments_sha256 = "bb".into();
    let (a, w) = other_args.apply(Some(&r), TOKEN);
    assert_eq!(w, Write::Nothing);
    assert_eq!(a.outcome, BeginOutcome::Refused);
    assert_eq!(code(a.error.as_ref()), "idempotency_key_reused");
    assert_eq!(
        details(a.error.as_ref())["reason"],
        json!("arguments_differ")
    );
    let mut other_tool = begin(NOW);
    other_tool.tool = "send_email".into();
    let (a, _) = other_tool.apply(Some(&r), TOKEN);
    assert_eq!(details(a.error.as_ref())["reason"], json!("tool_differs"));
}

fn complete(token: u64, completion: Completion, now: UnixMillis) -> Complete {
    Complete {
        id: id(),
        fencing_token: token,
        completion,
        now,
        outputs: outputs(),
    }
}

fn success(text: &str) -> Completion {
    Completion::Succeeded {
        result_json: text.into(),
        result: serde_json::from_str(text).unwrap(),
    }
}

#[test]
fn a_valid_success_is_stored_and_a_stale_token_changes_nothing() {
    let r = record(ExecutionState::InProgress);
    let (a, w) = complete(7, success(r#"{"refund_id":"re_1"}"#), NOW + 20).apply(Some(&r), TOKEN);
    assert_eq!(
        a,
        Settled {
            state: Some(ExecutionState::Succeeded),
            error: None,
            record: Some(RecordSummary::of(&r)),
        }
    );
    let stored = w.record().unwrap();
    assert_eq!(
        stored.result_json.as_deref(),
        Some(r#"{"refund_id":"re_1"}"#)
    );
    assert_eq!((stored.updated_at, stored.revision), (NOW + 20, 2));

    for (token, current, reason) in [
        (6, Some(&r), "stale_token"),
        (8, Some(&r), "stale_token"),
        (7, None, "no_record"),
    ] {
        let (a, w) = complete(token, success(r#"{"refund_id":"re_1"}"#), NOW).apply(current, TOKEN);
        assert_eq!(w, Write::Nothing);
        assert_eq!(code(a.error.as_ref()), "lease_lost");
        assert_eq!(details(a.error.as_ref())["reason"], json!(reason));
        assert_eq!(a.state, current.map(|r| r.state));
    }
}

#[test]
fn an_invalid_result_is_quarantined_as_unknown() {
    let r = record(ExecutionState::InProgress);
    let (a, w) = complete(7, success(r#"{"refund":"re_1"}"#), NOW).apply(Some(&r), TOKEN);
    assert_eq!(a.state, Some(ExecutionState::Unknown));
    assert_eq!(code(a.error.as_ref()), "output_invalid");
    assert_eq!(
        details(a.error.as_ref())["violations"][0]["keyword"],
        json!("required")
    );
    let stored = w.record().unwrap();
    assert_eq!(stored.state, ExecutionState::Unknown);
    assert_eq!(stored.result_json.as_deref(), Some(r#"{"refund":"re_1"}"#));
    // A tool whose contract is gone cannot have its result checked: quarantined too.
    let mut orphan = r.clone();
    orphan.tool = "retired_tool".into();
    let (a, _) = complete(7, success("{}"), NOW).apply(Some(&orphan), TOKEN);
    assert_eq!(a.state, Some(ExecutionState::Unknown));
    assert_eq!(details(a.error.as_ref())["reason"], json!("tool_not_found"));
}

#[test]
fn failures_spend_the_budget_and_unknown_is_timeout_unknown() {
    let mut r = record(ExecutionState::InProgress);
    let (a, _) = complete(7, Completion::FailedRetryable(None), NOW).apply(Some(&r), TOKEN);
    assert_eq!(a.state, Some(ExecutionState::FailedRetryable));
    r.attempt = 3;
    let (a, w) = complete(7, Completion::FailedRetryable(None), NOW).apply(Some(&r), TOKEN);
    assert_eq!(
        (a.state, w.record().map(|r| r.state)),
        (
            Some(ExecutionState::FailedFinal),
            Some(ExecutionState::FailedFinal)
        )
    );
    let (a, _) = complete(7, Completion::FailedFinal(None), NOW).apply(Some(&r), TOKEN);
    assert_eq!(a.state, Some(ExecutionState::FailedFinal));

    let reported = RecordedError {
        code: "upstream_timeout".into(),
        category: "tool".into(),
        message: "no answer in 10 s".into(),
        retryable: true,
        resolution: "reconcile".into(),
        expose_to_model: false,
        expose_to_user: false,
        details_json: "{}".into(),
    };
    let (a, w) = complete(7, Completion::Unknown(Some(reported)), NOW).apply(Some(&r), TOKEN);
    assert_eq!(a.state, Some(ExecutionState::Unknown));
    assert_eq!(code(a.error.as_ref()), "timeout_unknown");
    assert_eq!(
        details(a.error.as_ref()),
        json!({"attempt": 3, "executor_error": {"code": "upstream_timeout", "message": "no answer in 10 s"}})
    );
    assert_eq!(code(w.record().unwrap().error.as_ref()), "timeout_unknown");
}

#[test]
fn a_late_completion_with_the_current_token_is_accepted() {
    let r = record(ExecutionState::InProgress);
    let late = NOW + 60_000;
    assert!(!r.lease_live(late));
    let (a, w) = complete(7, success(r#"{"refund_id":"re_1"}"#), late).apply(Some(&r), TOKEN);
    assert_eq!(a.state, Some(ExecutionState::Succeeded));
    assert_eq!(w.record().unwrap().updated_at, late);
}

#[test]
fn a_repeated_completion_is_acknowledged_and_a_different_one_is_lease_lost() {
    let r = record(ExecutionState::InProgress);
    let done = complete(7, success(r#"{"refund_id":"re_1"}"#), NOW);
    let (first, w) = done.apply(Some(&r), TOKEN);
    let stored = w.record().unwrap().clone();
    let (again, w) = done.apply(Some(&stored), TOKEN);
    assert_eq!((again, w), (first, Write::Nothing));

    let other = complete(7, success(r#"{"refund_id":"re_2"}"#), NOW);
    let (a, w) = other.apply(Some(&stored), TOKEN);
    assert_eq!(w, Write::Nothing);
    assert_eq!(
        (a.state, details(a.error.as_ref())["reason"].clone()),
        (Some(ExecutionState::Succeeded), json!("already_settled"))
    );
}

fn reconcile(verdict: Verdict, now: UnixMillis) -> Reconcile {
    Reconcile {
        id: id(),
        holder_token: None,
        verdict,
        now,
        outputs: outputs(),
    }
}

fn applied(text: &str) -> Verdict {
    Verdict::Applied {
        result_json: text.into(),
        result: serde_json::from_str(text).unwrap(),
    }
}

#[test]
fn reconciliation_settles_unknown_both_ways() {
    let mut r = record(ExecutionState::Unknown);
    r.error = Some((&Envelope::new(ErrorCode::TimeoutUnknown, "t")).into());
    let (a, w) = reconcile(applied(r#"{"refund_id":"re_9"}"#), NOW).apply(Some(&r), TOKEN);
    assert_eq!(
        a,
        Some(Settled {
            state: Some(ExecutionState::Succeeded),
            error: None,
            record: Some(RecordSummary::of(&r)),
        })
    );
    let stored = w.record().unwrap();
    assert_eq!(
        (
            stored.result_json.as_deref(),
            &stored.error,
            stored.fencing_token
        ),
        (Some(r#"{"refund_id":"re_9"}"#), &None, 7)
    );

    let (a, w) = reconcile(Verdict::NotApplied, NOW).apply(Some(&r), TOKEN);
    assert_eq!(a.unwrap().state, Some(ExecutionState::FailedRetryable));
    assert_eq!(w.record().unwrap().result_json, None);
    // The next Begin runs it again, as attempt 2 under a new token.
    let (next, _) = begin(NOW + 1).apply(w.record(), TOKEN);
    assert_eq!(
        (next.outcome, next.attempt, next.fencing_token),
        (BeginOutcome::Acquired, 2, TOKEN)
    );
    // Not applied at the last attempt is final.
    r.attempt = 3;
    let (a, _) = reconcile(Verdict::NotApplied, NOW).apply(Some(&r), TOKEN);
    assert_eq!(a.unwrap().state, Some(ExecutionState::FailedFinal));
}

#[test]
fn reconciliation_needs_an_expired_lease_and_a_valid_result() {
    let r = record(ExecutionState::InProgress);
    let (a, w) = reconcile(Verdict::NotApplied, NOW + 1).apply(Some(&r), TOKEN);
    assert_eq!(w, Write::Nothing);
    let a = a.unwrap();
    assert_eq!(a.state, Some(ExecutionState::InProgress));
    assert_eq!(code(a.error.as_ref()), "operation_in_progress");

    let (a, w) = reconcile(applied(r#"{"refund_id":"re_9"}"#), NOW + 5_000).apply(Some(&r), TOKEN);
    assert_eq!(a.unwrap().state, Some(ExecutionState::Succeeded));
    assert_eq!(w.record().unwrap().state, ExecutionState::Succeeded);

    let (a, w) = reconcile(applied(r#"{"refund_id":9}"#), NOW + 5_000).apply(Some(&r), TOKEN);
    assert_eq!(w, Write::Nothing);
    let a = a.unwrap();
    assert_eq!(a.state, Some(ExecutionState::InProgress));
    assert_eq!(code(a.error.as_ref()), "output_invalid");

    assert_eq!(
        reconcile(Verdict::NotApplied, NOW).apply(None, TOKEN),
        (None, Write::Nothing)
    );
}

#[test]
fn reconciling_a_settled_record_is_acknowledged_or_lease_lost() {
    let mut ok = record(ExecutionState::Succeeded);
    ok.result_json = Some(r#"{"refund_id":"re_1"}"#.into());
    let (a, w) = reconcile(applied(r#"{"refund_id":"re_1"}"#), NOW).apply(Some(&ok), TOKEN);
    assert_eq!(w, Write::Nothing);
    assert_eq!(a.unwrap().error, None);
    let (a, _) = reconcile(Verdict::NotApplied, NOW).apply(Some(&ok), TOKEN);
    assert_eq!(code(a.unwrap().error.as_ref()), "lease_lost");
    let failed = record(ExecutionState::FailedRetryable);
    let (a, _) = reconcile(Verdict::NotApplied, NOW).apply(Some(&failed), TOKEN);
    assert_eq!(a.unwrap().error, None);
    let (a, _) = reconcile(applied(r#"{"refund_id":"re_1"}"#), NOW).apply(Some(&failed), TOKEN);
    assert_eq!(code(a.unwrap().error.as_ref()), "lease_lost");
}

#[test]
fn a_reconciler_naming_a_token_must_hold_the_current_one() {
    let mut r = record(ExecutionState::Unknown);
    r.fencing_token = 7;
    let stale = Reconcile {
        holder_token: Some(8),
        ..reconcile(Verdict::NotApplied, NOW)
    };
    let (a, w) = stale.apply(Some(&r), TOKEN);
    assert_eq!(w, Write::Nothing);
    let a = a.unwrap();
    assert_eq!(code(a.error.as_ref()), "lease_lost");
    assert_eq!(a.state, Some(ExecutionState::Unknown));
    let holder = Reconcile {
        holder_token: Some(7),
        ..reconcile(Verdict::NotApplied, NOW)
    };
    let (a, w) = holder.apply(Some(&r), TOKEN);
    assert_eq!(a.unwrap().error, None);
    assert_eq!(w.record().unwrap().state, ExecutionState::FailedRetryable);
}

#[test]
fn leases_and_budgets_are_bounded() {
    let c = LedgerConfig::default();
    assert_eq!(c.lease_ms(0, 10_000), 15_000);
    assert_eq!(c.lease_ms(250, 10_000), 250);
    assert_eq!(c.lease_ms(u32::MAX, 10_000), 900_000);
    assert_eq!(c.lease_ms(0, u64::MAX), 900_000);
    assert_eq!(c.max_attempts(None), 3);
    assert_eq!(c.max_attempts(Some(1)), 1);
    let tight = LedgerConfig {
        max_lease: Duration::ZERO,
        ..LedgerConfig::default()
    };
    assert_eq!(tight.lease_ms(0, 10), 1);
}

#[test]
fn retention_collects_old_settled_records_but_never_a_call_that_may_have_run() {
    let day = Duration::from_secs(86_400);
    let later = NOW + 86_400_000;
    let c = Collect::new(later, day, 10);
    assert_eq!(c.updated_at_or_before, NOW);
    for state in [
        ExecutionState::Succeeded,
        ExecutionState::FailedRetryable,
        ExecutionState::FailedFinal,
    ] {
        assert!(c.covers(&record(state)), "{state:?}");
        let mut young = record(state);
        young.updated_at = NOW + 1;
        assert!(!c.covers(&young), "{state:?} is not due yet");
    }
    // Its lease expired long ago, but the call may have run: kept, however old.
    let mut expired = record(ExecutionState::InProgress);
    expired.updated_at = i64::MIN;
    assert!(!expired.lease_live(later));
    assert!(!c.covers(&expired));
    let mut held = record(ExecutionState::InProgress);
    held.lease_expires_at = later + 1;
    assert!(!c.covers(&held));
    let mut unknown = record(ExecutionState::Unknown);
    unknown.updated_at = i64::MIN;
    assert!(!c.covers(&unknown));
    assert_eq!(Collect::new(later, day, 0).limit, 1);
}

#[test]
fn the_collectable_states_are_exactly_the_settled_ones() {
    let collectable: Vec<_> = ExecutionState::ALL
        .into_iter()
        .filter(|s| s.collectable())
        .collect();
    assert_eq!(collectable, ExecutionState::COLLECTABLE);
    assert!(!ExecutionState::Unknown.collectable());
    assert!(!ExecutionState::InProgress.collectable());
}

#[test]
fn state_names_round_trip() {
    for s in ExecutionState::ALL {
        assert_eq!(ExecutionState::parse(s.as_str()), Some(s));
    }
    assert_eq!(ExecutionState::parse("in_progress"), None);
}

#[test]
fn only_a_retryable_failure_unchanged_past_its_tickets_and_the_grace_lapses() {
    let ttl = Duration::from_secs(300);
    let wait = 300_000 + i64::try_from(LAPSE_GRACE.as_millis()).unwrap();
    let due = Lapse::new(NOW + wait, ttl, 0);
    assert_eq!(
        due,
        Lapse {
            updated_at_or_before: NOW,
            now: NOW + wait,
            limit: 1
        }
    );
    assert!(due.covers(&record(ExecutionState::FailedRetryable)));
    let early = Lapse::new(NOW + wait - 1, ttl, 10);
    assert!(!early.covers(&record(ExecutionState::FailedRetryable)));
    for state in ExecutionState::ALL {
        if state != ExecutionState::FailedRetryable {
            assert!(!due.covers(&record(state)), "{state:?}");
        }
    }
}
