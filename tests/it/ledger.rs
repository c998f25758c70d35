//! The execution ledger over real gRPC on the real SQLite store: every row
//! of DESIGN §5, fencing tokens, key reuse, output quarantine,
//! reconciliation, the retry budget, retention and tenants, on an injected
//! clock; and 32 executors on 32 connections racing for one key.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;
use tonic::{Code, Status};

use toolgate::clock::ManualClock;
use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::{self, BeginOutcome, CompletionStatus, Decision, ExecutionState};
use toolgate::ledger::LedgerConfig;

use crate::support::{
    Backend, TestServer, agent_bob, auth, bad_request_field, both_backends, request,
    test_ledger_config, ticket_claims,
};

const T0: i64 = 1_700_000_000_000;
const REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#;
const RESULT: &str = r#"{"refund_id":"re_1","amount_cents":2500}"#;

fn hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// An operation's key and arguments hash, as Authorize would give them.
fn op(name: &str) -> (String, String) {
    (
        format!("refund_order:{}", hex(name)),
        hex(&format!("args of {name}")),
    )
}

fn ms(ts: Option<&prost_types::Timestamp>) -> i64 {
    let ts = ts.expect("a timestamp");
    ts.seconds * 1000 + i64::from(ts.nanos) / 1_000_000
}

fn code(e: Option<&pb::ErrorEnvelope>) -> &str {
    e.map_or("", |e| e.code.as_str())
}

fn details(e: Option<&pb::ErrorEnvelope>) -> Value {
    serde_json::from_str(&e.expect("an envelope").details_json).unwrap()
}

/// One executor: a connection of its own and its caller's auth context.
struct Executor {
    ledger: LedgerServiceClient<Channel>,
    auth: pb::AuthContext,
    /// Mints the execution ticket each Begin carries, as Authorize would.
    desk: std::sync::Arc<toolgate::ledger::desk::LedgerDesk>,
}

impl Executor {
    async fn new(server: &TestServer) -> Self {
        Self::of(server, agent_bob()).await
    }

    async fn of(server: &TestServer, auth: pb::AuthContext) -> Self {
        Self {
            ledger: server.ledger().await,
            auth,
            desk: std::sync::Arc::clone(&server.ledger_desk),
        }
    }

    async fn try_begin(
        &mut self,
        key: &str,
        sha: &str,
        tool: &str,
        lease_ms: u32,
    ) -> Result<pb::BeginExecutionResponse, Status> {
        let execution_ticket = self
            .desk
            .ticket(&ticket_claims(&self.auth, key, sha, tool))
            .await
            .unwrap();
        let req = pb::BeginExecutionRequest {
            auth: Some(self.auth.clone()),
            idempotency_key: key.into(),
            arguments_sha256: sha.into(),
            tool: tool.into(),
            lease_ms,
            execution_ticket,
        };
        self.ledger
            .begin_execution(req)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn begin(&mut self, (key, sha): &(String, String)) -> pb::BeginExecutionResponse {
        self.try_begin(key, sha, "refund_order", 5_000)
            .await
            .unwrap()
    }

    async fn try_complete(
        &mut self,
        key: &str,
        fencing_token: u64,
        status: CompletionStatus,
        result_json: &str,
        error: Option<pb::ErrorEnvelope>,
    ) -> Result<pb::CompleteExecutionResponse, Status> {
        let req = pb::CompleteExecutionRequest {
            auth: Some(self.auth.clone()),
            idempotency_key: key.into(),
            fencing_token,
            status: status.into(),
            result_json: result_json.into(),
            error,
        };
        self.ledger
            .complete_execution(req)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn complete(
        &mut self,
        key: &str,
        token: u64,
        status: CompletionStatus,
        result_json: &str,
    ) -> pb::CompleteExecutionResponse {
        self.try_complete(key, token, status, result_json, None)
            .await
            .unwrap()
    }

    /// Reports the refund made, with `RESULT`.
    async fn succeed(&mut self, key: &str, token: u64) -> pb::CompleteExecutionResponse {
        self.complete(key, token, CompletionStatus::Succeeded, RESULT)
            .await
    }

    /// Reconciles by the caller's grant (the test server's access is open,
    /// which grants `reconcile` for every tenant): no fencing token.
    async fn reconcile(
        &mut self,
        key: &str,
        applied: bool,
        result_json: &str,
    ) -> Result<pb::ReconcileExecutionResponse, Status> {
        let req = pb::ReconcileExecutionRequest {
            auth: Some(self.auth.clone()),
            idempotency_key: key.into(),
            applied,
            result_json: result_json.into(),
            fencing_token: 0,
        };
        self.ledger
            .reconcile_execution(req)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn get(&mut self, key: &str) -> Result<pb::Execution, Status> {
        let req = pb::GetExecutionRequest {
            auth: Some(self.auth.clone()),
            idempotency_key: key.into(),
        };
        let r = self.ledger.get_execution(req).await?.into_inner();
        Ok(r.execution.expect("an execution"))
    }
}

fn declined() -> pb::ErrorEnvelope {
    pb::ErrorEnvelope {
        code: "card_declined".into(),
        category: "payment".into(),
        message: "the card was declined".into(),
        retryable: false,
        resolution: "stop".into(),
        expose_to_model: true,
        expose_to_user: true,
        details_json: r#"{"decline_code":"do_not_honor"}"#.into(),
    }
}

async fn absent_is_acquired_and_a_live_lease_is_in_progress_for_everyone_else(backend: Backend) {
    let clock = ManualClock::new(T0);
    let server = TestServer::start_with_clock_on(backend, clock.clone()).await;
    let mut first = Executor::new(&server).await;
    let mut second = Executor::new(&server).await;
    let refund = op("row-absent");

    let acquired = first.begin(&refund).await;
    assert_eq!(acquired.outcome(), BeginOutcome::Acquired);
    assert_eq!(acquired.state(), ExecutionState::InProgress);
    assert_eq!(acquired.attempt, 1);
    assert!(acquired.fencing_token > 0);
    assert_eq!(ms(acquired.lease_expires_at.as_ref()), T0 + 5_000);
    assert_eq!(acquired.error, None);

    clock.advance(4_600);
    let busy = second.begin(&refund).await;
    assert_eq!(busy.outcome(), BeginOutcome::InProgress);
    assert_eq!(busy.state(), ExecutionState::InProgress);
    assert_eq!(busy.fencing_token, 0, "the holder's token is never shown");
    assert_eq!(busy.retry_after_ms, 400);
    assert_eq!(ms(busy.lease_expires_at.as_ref()), T0 + 5_000);
    let e = busy.error.as_ref().unwrap();
    assert_eq!(
        (e.code.as_str(), e.retryable, e.resolution.as_str()),
        ("operation_in_progress", true, "poll")
    );
    server.stop().await;
}

async fn an_expired_lease_answers_reconcile_required_never_acquired(backend: Backend) {
    let clock = ManualClock::new(T0);
    let server = TestServer::start_with_clock_on(backend, clock.clone()).await;
    let mut first = Executor::new(&server).await;
    let mut second = Executor::new(&server).await;
    let refund = op("row-expired");
    let acquired = first.begin(&refund).await;
    clock.advance(5_000);

    for _ in 0..3 {
        let r = second.begin(&refund).await;
        assert_eq!(r.outcome(), BeginOutcome::ReconcileRequired);
        assert_eq!(
            (r.state(), r.attempt, r.fencing_token),
            (ExecutionState::InProgress, 1, 0)
        );
        let e = r.error.as_ref().unwrap();
        assert_eq!(
            (e.code.as_str(), e.resolution.as_str()),
            ("reconcile_required", "reconcile")
        );
        assert_eq!(
            details(r.error.as_ref()),
            json!({"reason": "lease_expired", "attempt": 1})
        );
        assert!(
            e.message.contains("ReconcileExecution with applied=true"),
            "{}",
            e.message
        );
    }
    // The holder finishing late, with its still-current token, is heard:
    // nobody else was let in, and it alone knows what happened.
    let late = first.succeed(&refund.0, acquired.fencing_token).await;
    assert_eq!(
        (late.state(), late.error),
        (ExecutionState::Succeeded, None)
    );
    server.stop().await;
}

async fn a_success_is_completed_with_its_result_for_every_retry(backend: Backend) {
    let server = TestServer::start_with_clock_on(backend, ManualClock::new(T0)).await;
    let mut executor = Executor::new(&server).await;
    let refund = op("row-succeeded");
    let acquired = executor.begin(&refund).await;
    let done = executor.succeed(&refund.0, acquired.fencing_token).await;
    assert_eq!(
        (done.state(), done.error),
        (ExecutionState::Succeeded, None)
    );
    // The answer was lost and the executor says it again: acknowledged, unchanged.
    let again = executor.succeed(&refund.0, acquired.fencing_token).await;
    assert_eq!(
        (again.state(), again.error),
        (ExecutionState::Succeeded, None)
    );

    for _ in 0..2 {
        let r = executor.begin(&refund).await;
        assert_eq!(r.outcome(), BeginOutcome::Completed);
        assert_eq!(r.state(), ExecutionState::Succeeded);
        assert_eq!(
            (r.result_json.as_str(), r.fencing_token, r.attempt),
            (RESULT, 0, 1)
        );
    }
    let stored = executor.get(&refund.0).await.unwrap();
    assert_eq!(stored.state(), ExecutionState::Succeeded);
    assert_eq!(
        (
            stored.tool.as_str(),
            stored.arguments_sha256.as_str(),
            stored.result_json.as_str()
        ),
        ("refund_order", refund.1.as_str(), RESULT)
    );
    assert_eq!((stored.attempt, stored.max_attempts), (1, 3));
    assert_eq!(ms(stored.created_at.as_ref()), T0);
    server.stop().await;
}

async fn a_retryable_failure_is_acquired_again_until_the_budget_then_final(backend: Backend) {
    let server = TestServer::start_with_clock_on(backend, ManualClock::new(T0)).await;
    let mut executor = Executor::new(&server).await;
    let refund = op("row-retryable");
    let mut tokens = Vec::new();
    // refund_order has "maxAttempts": 3.
    for attempt in 1..=3 {
        let r = executor.begin(&refund).await;
        assert_eq!((r.outcome(), r.attempt), (BeginOutcome::Acquired, attempt));
        tokens.push(r.fencing_token);
        let failed = executor
            .try_complete(
                &refund.0,
                r.fencing_token,
                CompletionStatus::FailedRetryable,
                "",
                Some(declined()),
            )
            .await
            .unwrap();
        let expected = if attempt < 3 {
            ExecutionState::FailedRetryable
        } else {
            ExecutionState::FailedFinal
        };
        assert_eq!(failed.state(), expected, "attempt {attempt}");
    }
    // Each attempt holds a token of its own (random secrets; the attempt
    // number is the fence).
    let distinct: std::collections::HashSet<_> = tokens.iter().collect();
    assert_eq!(distinct.len(), 3, "{tokens:?}");
    // FAILED_FINAL: completed with the executor's stored error, never run again.
    let r = executor.begin(&refund).await;
    assert_eq!(
        (r.outcome(), r.state(), r.attempt),
        (BeginOutcome::Completed, ExecutionState::FailedFinal, 3)
    );
    assert_eq!(r.error, Some(declined()));
    assert_eq!(r.result_json, "");
    server.stop().await;
}

async fn the_configured_default_budget_applies_to_tools_without_max_attempts(backend: Backend) {
    let ledger = LedgerConfig {
        default_max_attempts: 1,
        ..test_ledger_config()
    };
    let server = TestServer::start_with_ledger_on(backend, ManualClock::new(T0), ledger).await;
    let mut executor = Executor::new(&server).await;
    let (key, sha) = op("default-budget");
    // send_email's contract has no maxAttempts.
    let r = executor
        .try_begin(&key, &sha, "send_email", 0)
        .await
        .unwrap();
    assert_eq!(r.outcome(), BeginOutcome::Acquired);
    assert_eq!(
        ms(r.lease_expires_at.as_ref()),
        T0 + 5_000 + 5_000,
        "timeoutMs + margin"
    );
    let failed = executor
        .complete(&key, r.fencing_token, CompletionStatus::FailedRetryable, "")
        .await;
    assert_eq!(failed.state(), ExecutionState::FailedFinal);
    assert_eq!(executor.get(&key).await.unwrap().max_attempts, 1);
    server.stop().await;
}

async fn an_unknown_outcome_is_timeout_unknown_then_reconcile_required(backend: Backend) {
    let server = TestServer::start_with_clock_on(backend, ManualClock::new(T0)).await;
    let mut executor = Executor::new(&server).await;
    let refund = op("row-unknown");
    let r = executor.begin(&refund).await;
    let unknown = executor
        .complete(&refund.0, r.fencing_token, CompletionStatus::Unknown, "")
        .await;
    assert_eq!(unknown.state(), ExecutionState::Unknown);
    let e = unknown.error.as_ref().unwrap();
    assert_eq!(
        (e.code.as_str(), e.resolution.as_str()),
        ("timeout_unknown", "reconcile")
    );
    let again = executor.begin(&refund).await;
    assert_eq!(again.outcome(), BeginOutcome::ReconcileRequired);
    assert_eq!(again.state(), ExecutionState::Unknown);
    assert_eq!(code(again.error.as_ref()), "reconcile_required");
    assert_eq!(
        details(again.error.as_ref())["reason"],
        json!("timeout_unknown")
    );
    server.stop().await;
}

async fn failed_final_is_completed_with_the_stored_error(backend: Backend) {
    let server = TestServer::start_with_clock_on(backend, ManualClock::new(T0)).await;
    let mut executor = Executor::new(&server).await;
    let refund = op("row-final");
    let r = executor.begin(&refund).await;
    let failed = executor
        .try_complete(
            &refund.0,
            r.fencing_token,
            CompletionStatus::FailedFinal,
            "",
            Some(declined()),
        )
        .await
        .unwrap();
    assert_eq!(
        (failed.state(), failed.error),
        (ExecutionState::FailedFinal, None)
    );
    let again = executor.begin(&refund).await;
    assert_eq!(
        (again.outcome(), again.state()),
        (BeginOutcome::Completed, ExecutionState::FailedFinal)
    );
    assert_eq!(again.error, Some(declined()));
    assert_eq!(
        executor.get(&refund.0).await.unwrap().error,
        Some(declined())
    );
    server.stop().await;
}

async fn stale_fencing_tokens_are_lease_lost_and_change_nothing(backend: Backend) {
    let server = TestServer::start_with_clock_on(backend, ManualClock::new(T0)).await;
    let mut old = Executor::new(&server).await;
    let mut new = Executor::new(&server).await;
    let refund = op("stale-token");
    let first = old.begin(&refund).await;
    old.complete(
        &refund.0,
        first.fencing_token,
        CompletionStatus::FailedRetryable,
        "",
    )
    .await;
    let second = new.begin(&refund).await;
    assert_eq!(second.attempt, 2);
    assert_ne!(second.fencing_token, first.fencing_token);
    let before = new.get(&refund.0).await.unwrap();

    // The first attempt's executor reports late, with its old token.
    let stale = old.succeed(&refund.0, first.fencing_token).await;
    assert_eq!(stale.state(), ExecutionState::InProgress);
    let e = stale.error.as_ref().unwrap();
    assert_eq!(
        (e.code.as_str(), e.resolution.as_str()),
        ("lease_lost", "stop")
    );
    assert_eq!(
        details(stale.error.as_ref()),
        json!({"reason": "stale_token"})
    );
    assert_eq!(new.get(&refund.0).await.unwrap(), before, "nothing changed");

    let done = new.succeed(&refund.0, second.fencing_token).await;
    assert_eq!(done.state(), ExecutionState::Succeeded);
    // A different report under the same token, once settled, changes nothing either.
    let changed_mind = new
        .complete(
            &refund.0,
            second.fencing_token,
            CompletionStatus::FailedFinal,
            "",
        )
        .await;
    assert_eq!(changed_mind.state(), ExecutionState::Succeeded);
    assert_eq!(
        details(changed_mind.error.as_ref()),
        json!({"reason": "already_settled"})
    );
    // And a token for a key nobody began.
    let nothing = new
        .succeed(&op("never-begun").0, second.fencing_token)
        .await;
    assert_eq!(nothing.state(), ExecutionState::Unspecified);
    assert_eq!(
        details(nothing.error.as_ref()),
        json!({"reason": "no_record"})
    );
    assert_eq!(new.get(&refund.0).await.unwrap().result_json, RESULT);
    server.stop().await;
}

async fn a_key_back_with_other_arguments_or_tool_is_idempotency_key_reused(backend: Backend) {
    let server = TestServer::start_with_clock_on(backend, ManualClock::new(T0)).await;
    let mut executor = Executor::new(&server).await;
    let (key, sha) = op("reused");
    let r = executor.begin(&(key.clone(), sha.clone())).await;
    executor.succeed(&key, r.fencing_token).await;
    let before = executor.get(&key).await.unwrap();

    let other_args = executor
        .try_begin(&key, &hex("other"), "refund_order", 0)
        .await
        .unwrap();
    assert_eq!(other_args.outcome(), BeginOutcome::Refused);
    let e = other_args.error.as_ref().unwrap();
    assert_eq!(
        (e.code.as_str(), e.resolution.as_str()),
        ("idempotency_key_reused", "stop")
    );
    assert_eq!(
        details(other_args.error.as_ref()),
        json!({"reason": "arguments_differ"})
    );
    assert_eq!(
        (other_args.result_json.as_str(), other_args.fencing_token),
        ("", 0)
    );

    let other_tool = executor
        .try_begin(&key, &sha, "send_email", 0)
        .await
        .unwrap();
    assert_eq!(other_tool.outcome(), BeginOutcome::Refused);
    assert_eq!(
        details(other_tool.error.as_ref()),
        json!({"reason": "tool_differs"})
    );
    assert_eq!(executor.get(&key).await.unwrap(), before);
    server.stop().await;
}

async fn a_result_that_fails_the_output_schema_is_quarantined_as_unknown(backend: Backend) {
    let server = TestServer::start_with_clock_on(backend, ManualClock::new(T0)).await;
    let mut executor = Executor::new(&server).await;
    let refund = op("quarantine");
    let r = executor.begin(&refund).await;

    // Not JSON, or JSON a strict decoder refuses: an executor mistake; nothing stored.
    for (bad, why) in [
        (r#"{"refund_id": "re_1""#, "invalid json"),
        (
            r#"{"refund_id":"a","refund_id":"b","amount_cents":1}"#,
            "duplicate object key",
        ),
        ("", "is required"),
    ] {
        let e = executor
            .try_complete(
                &refund.0,
                r.fencing_token,
                CompletionStatus::Succeeded,
                bad,
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(bad_request_field(&e), "result_json");
        assert!(e.message().contains(why), "{}", e.message());
    }
    assert_eq!(
        executor.get(&refund.0).await.unwrap().state(),
        ExecutionState::InProgress
    );

    let invalid = r#"{"refund_id":5,"amount_cents":2500}"#;
    let q = executor
        .complete(
            &refund.0,
            r.fencing_token,
            CompletionStatus::Succeeded,
            invalid,
        )
        .await;
    assert_eq!(q.state(), ExecutionState::Unknown);
    let e = q.error.as_ref().unwrap();
    assert_eq!(
        (e.code.as_str(), e.resolution.as_str()),
        ("output_invalid", "inspect")
    );
    assert_eq!(
        details(q.error.as_ref())["violations"],
        json!([{"pointer": "/refund_id", "keyword": "type", "message": "expected string, found integer"}])
    );
    let stored = executor.get(&refund.0).await.unwrap();
    assert_eq!(stored.state(), ExecutionState::Unknown);
    assert_eq!(
        stored.result_json, invalid,
        "the result is kept for inspection"
    );
    assert_eq!(code(stored.error.as_ref()), "output_invalid");
    let again = executor.begin(&refund).await;
    assert_eq!(again.outcome(), BeginOutcome::ReconcileRequired);
    assert_eq!(
        details(again.error.as_ref())["reason"],
        json!("output_invalid")
    );
    server.stop().await;
}

async fn reconciliation_settles_an_unknown_outcome_both_ways(backend: Backend) {
    let clock = ManualClock::new(T0);
    let server = TestServer::start_with_clock_on(backend, clock.clone()).await;
    let mut executor = Executor::new(&server).await;

    // Applied: it happened; the stored result is what later retries get.
    let happened = op("reconcile-applied");
    let r = executor.begin(&happened).await;
    executor
        .complete(&happened.0, r.fencing_token, CompletionStatus::Unknown, "")
        .await;
    let invalid = executor
        .reconcile(&happened.0, true, r#"{"refund_id":"re_1"}"#)
        .await
        .unwrap();
    assert_eq!(
        invalid.state(),
        ExecutionState::Unknown,
        "an invalid result changes nothing"
    );
    assert_eq!(code(invalid.error.as_ref()), "output_invalid");
    let settled = executor.reconcile(&happened.0, true, RESULT).await.unwrap();
    assert_eq!(
        (settled.state(), settled.error),
        (ExecutionState::Succeeded, None)
    );
    let after = executor.begin(&happened).await;
    assert_eq!(
        (after.outcome(), after.result_json.as_str()),
        (BeginOutcome::Completed, RESULT)
    );
    // Said again, it is acknowledged; said otherwise, it is refused.
    assert_eq!(
        executor
            .reconcile(&happened.0, true, RESULT)
            .await
            .unwrap()
            .error,
        None
    );
    let contradiction = executor.reconcile(&happened.0, false, "").await.unwrap();
    assert_eq!(contradiction.state(), ExecutionState::Succeeded);
    assert_eq!(code(contradiction.error.as_ref()), "lease_lost");

    // Not applied: it did not happen; the next Begin runs it as attempt 2.
    let missed = op("reconcile-not-applied");
    let r = executor.begin(&missed).await;
    let live = executor.reconcile(&missed.0, false, "").await.unwrap();
    assert_eq!(live.state(), ExecutionState::InProgress);
    assert_eq!(
        code(live.error.as_ref()),
        "operation_in_progress",
        "a live lease may still report"
    );
    clock.advance(5_000);
    let settled = executor.reconcile(&missed.0, false, "").await.unwrap();
    assert_eq!(
        (settled.state(), settled.error),
        (ExecutionState::FailedRetryable, None)
    );
    let retry = executor.begin(&missed).await;
    assert_eq!(
        (retry.outcome(), retry.attempt),
        (BeginOutcome::Acquired, 2)
    );
    assert_ne!(retry.fencing_token, r.fencing_token);
    // The first attempt's executor, back from the dead, is told it lost.
    let zombie = executor.succeed(&missed.0, r.fencing_token).await;
    assert_eq!(code(zombie.error.as_ref()), "lease_lost");

    let nothing = executor
        .reconcile(&op("reconcile-nothing").0, true, RESULT)
        .await
        .unwrap_err();
    assert_eq!(nothing.code(), Code::NotFound);
    let mixed = executor
        .reconcile(&missed.0, false, RESULT)
        .await
        .unwrap_err();
    assert_eq!(bad_request_field(&mixed), "result_json");
    let bare = executor.reconcile(&missed.0, true, "").await.unwrap_err();
    assert_eq!(bad_request_field(&bare), "result_json");
    server.stop().await;
}

async fn records_are_collected_after_the_retention_period(backend: Backend) {
    let clock = ManualClock::new(T0);
    let server = TestServer::start_with_clock_on(backend, clock.clone()).await;
    let mut executor = Executor::new(&server).await;
    let old = op("retention-old");
    let r = executor.begin(&old).await;
    executor.succeed(&old.0, r.fencing_token).await;
    clock.advance(1_000);
    let young = op("retention-young");
    let r = executor.begin(&young).await;
    executor.succeed(&young.0, r.fencing_token).await;

    // The default retention is 24 h after the last change: `old` is due, `young` not yet.
    clock.advance(24 * 3_600_000 - 500);
    let started = Instant::now();
    loop {
        match executor.get(&old.0).await {
            Err(e) if e.code() == Code::NotFound => break,
            Ok(_) => {}
            Err(e) => panic!("{e:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never collected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The sweep that removed `old` judged `young` on the same clock and kept it.
    assert_eq!(
        executor.get(&young.0).await.unwrap().state(),
        ExecutionState::Succeeded
    );
    // A forgotten key starts over.
    let again = executor.begin(&old).await;
    assert_eq!(
        (again.outcome(), again.attempt),
        (BeginOutcome::Acquired, 1)
    );
    server.stop().await;
}

/// Retention never re-arms a call that may have run (issue 18.4): an
/// UNKNOWN outcome and a lease that expired while IN_PROGRESS outlive the
/// retention period, and a retry of either key, after a sweep that did
/// collect a settled record judged on the same clock, still answers
/// RECONCILE_REQUIRED, never ACQUIRED.
async fn a_call_that_may_have_run_outlives_retention_and_still_needs_reconciling(backend: Backend) {
    let clock = ManualClock::new(T0);
    let server = TestServer::start_with_clock_on(backend, clock.clone()).await;
    let mut executor = Executor::new(&server).await;
    let timed_out = op("retention-unknown");
    let r = executor.begin(&timed_out).await;
    executor
        .complete(&timed_out.0, r.fencing_token, CompletionStatus::Unknown, "")
        .await;
    let abandoned = op("retention-abandoned");
    executor.begin(&abandoned).await;
    // A settled record changed after both: when a sweep has collected it,
    // the same sweep found the other two due by age.
    clock.advance(1_000);
    let settled = op("retention-settled");
    let r = executor.begin(&settled).await;
    executor.succeed(&settled.0, r.fencing_token).await;

    clock.advance(24 * 3_600_000 + 1_000);
    let started = Instant::now();
    loop {
        match executor.get(&settled.0).await {
            Err(e) if e.code() == Code::NotFound => break,
            Ok(_) => {}
            Err(e) => panic!("{e:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never collected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let unknown = executor.begin(&timed_out).await;
    assert_eq!(
        (unknown.outcome(), unknown.state(), unknown.fencing_token),
        (BeginOutcome::ReconcileRequired, ExecutionState::Unknown, 0)
    );
    assert_eq!(
        details(unknown.error.as_ref())["reason"],
        json!("timeout_unknown")
    );
    let expired = executor.begin(&abandoned).await;
    assert_eq!(
        (expired.outcome(), expired.state(), expired.fencing_token),
        (
            BeginOutcome::ReconcileRequired,
            ExecutionState::InProgress,
            0
        )
    );
    assert_eq!(
        details(expired.error.as_ref()),
        json!({"reason": "lease_expired", "attempt": 1})
    );
    // Reconciled, the records are settled like any other and age out.
    executor
        .reconcile(&timed_out.0, true, RESULT)
        .await
        .unwrap();
    executor.reconcile(&abandoned.0, false, "").await.unwrap();
    clock.advance(24 * 3_600_000 + 1_000);
    let started = Instant::now();
    for key in [&timed_out.0, &abandoned.0] {
        loop {
            match executor.get(key).await {
                Err(e) if e.code() == Code::NotFound => break,
                Ok(_) => {}
                Err(e) => panic!("{e:?}"),
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never collected once reconciled"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    server.stop().await;
}

async fn records_are_visible_to_their_own_tenant_only(backend: Backend) {
    let server = TestServer::start_with_clock_on(backend, ManualClock::new(T0)).await;
    let mut acme = Executor::new(&server).await;
    let mut globex = Executor::of(&server, auth("gina", "globex", &["support_agent"], &[])).await;
    let refund = op("tenant");
    let held = acme.begin(&refund).await;
    let before = acme.get(&refund.0).await.unwrap();

    assert_eq!(
        globex.get(&refund.0).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        globex
            .reconcile(&refund.0, false, "")
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    let foreign = globex.succeed(&refund.0, held.fencing_token).await;
    assert_eq!(foreign.state(), ExecutionState::Unspecified);
    assert_eq!(
        details(foreign.error.as_ref()),
        json!({"reason": "no_record"})
    );
    // The same key in another tenant is another record.
    let theirs = globex.begin(&refund).await;
    assert_eq!(
        (theirs.outcome(), theirs.attempt),
        (BeginOutcome::Acquired, 1)
    );
    assert_eq!(acme.get(&refund.0).await.unwrap(), before);
    server.stop().await;
}

#[tokio::test]
async fn executor_mistakes_are_invalid_argument_with_bad_request_details() {
    let server = TestServer::start_with_clock(ManualClock::new(T0)).await;
    let mut executor = Executor::new(&server).await;
    let (key, sha) = op("mistakes");

    let mut anonymous = Executor::new(&server).await;
    let mut no_auth = pb::BeginExecutionRequest {
        auth: None,
        idempotency_key: key.clone(),
        arguments_sha256: sha.clone(),
        tool: "refund_order".into(),
        lease_ms: 0,
        execution_ticket: String::new(),
    };
    let e = anonymous
        .ledger
        .begin_execution(no_auth.clone())
        .await
        .unwrap_err();
    assert_eq!(bad_request_field(&e), "auth");
    no_auth.auth = Some(auth("bob", "", &[], &[]));
    let e = anonymous.ledger.begin_execution(no_auth).await.unwrap_err();
    assert_eq!(bad_request_field(&e), "auth.tenant_id");
    let e = anonymous
        .ledger
        .get_execution(pb::GetExecutionRequest {
            auth: None,
            idempotency_key: key.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_request_field(&e), "auth");

    let cases = [
        ("", sha.as_str(), "refund_order", "idempotency_key"),
        (
            &"k".repeat(257),
            sha.as_str(),
            "refund_order",
            "idempotency_key",
        ),
        (key.as_str(), "ABC", "refund_order", "arguments_sha256"),
        (
            key.as_str(),
            &sha.to_uppercase(),
            "refund_order",
            "arguments_sha256",
        ),
        (key.as_str(), sha.as_str(), "", "tool"),
    ];
    for (k, s, tool, field) in cases {
        let e = executor.try_begin(k, s, tool, 0).await.unwrap_err();
        assert_eq!(bad_request_field(&e), field, "{k} {s} {tool}");
    }
    // An unknown tool is about the call, not the request: an answer.
    let unknown = executor
        .try_begin(&key, &sha, "refund_everything", 0)
        .await
        .unwrap();
    assert_eq!(unknown.outcome(), BeginOutcome::Refused);
    assert_eq!(code(unknown.error.as_ref()), "tool_not_found");

    let r = executor.begin(&(key.clone(), sha.clone())).await;
    let t = r.fencing_token;
    let huge = pb::ErrorEnvelope {
        message: "x".repeat(20_000),
        ..declined()
    };
    let not_object = pb::ErrorEnvelope {
        details_json: "[1]".into(),
        ..declined()
    };
    let no_code = pb::ErrorEnvelope {
        code: String::new(),
        ..declined()
    };
    let cases = [
        (
            0,
            CompletionStatus::Succeeded,
            RESULT,
            None,
            "fencing_token",
        ),
        (t, CompletionStatus::Unspecified, "", None, "status"),
        (
            t,
            CompletionStatus::FailedFinal,
            RESULT,
            None,
            "result_json",
        ),
        (
            t,
            CompletionStatus::Succeeded,
            RESULT,
            Some(declined()),
            "error",
        ),
        (t, CompletionStatus::FailedFinal, "", Some(huge), "error"),
        (
            t,
            CompletionStatus::FailedFinal,
            "",
            Some(not_object),
            "error.details_json",
        ),
        (
            t,
            CompletionStatus::FailedFinal,
            "",
            Some(no_code),
            "error.code",
        ),
    ];
    for (token, status, result, error, field) in cases {
        let e = executor
            .try_complete(&key, token, status, result, error)
            .await
            .unwrap_err();
        assert_eq!(bad_request_field(&e), field, "{status:?}");
    }
    assert_eq!(
        executor.get(&key).await.unwrap().state(),
        ExecutionState::InProgress
    );
    server.stop().await;
}

async fn authorize_with_begin_execution_begins_an_allowed_call_in_the_same_round_trip(
    backend: Backend,
) {
    let clock = ManualClock::new(T0);
    let server = TestServer::start_with_clock_on(backend, clock.clone()).await;
    let mut client = server.client().await;
    let mut executor = Executor::new(&server).await;
    let mut req = request("refund_order", REFUND);
    req.request_id = "refund-begin-1".into();
    req.begin_execution = true;

    let first = client.authorize(req.clone()).await.unwrap().into_inner();
    assert_eq!(first.decision(), Decision::Allow);
    let run = first.execution.clone().expect("an execution answer");
    assert_eq!((run.outcome(), run.attempt), (BeginOutcome::Acquired, 1));
    // lease_ms 0: the tool's timeoutMs (10 s) plus the 5 s margin.
    assert_eq!(ms(run.lease_expires_at.as_ref()), T0 + 15_000);
    let stored = executor.get(&first.idempotency_key).await.unwrap();
    assert_eq!(stored.arguments_sha256, first.arguments_sha256);
    assert_eq!(stored.tool, "refund_order");

    // The same call again (a retry after a timeout) is not a second executor.
    let retry = client.authorize(req.clone()).await.unwrap().into_inner();
    assert_eq!(retry.idempotency_key, first.idempotency_key);
    assert_eq!(
        retry.execution.as_ref().unwrap().outcome(),
        BeginOutcome::InProgress
    );
    executor
        .succeed(&first.idempotency_key, run.fencing_token)
        .await;
    let done = client.authorize(req.clone()).await.unwrap().into_inner();
    let done = done.execution.unwrap();
    assert_eq!(
        (done.outcome(), done.result_json.as_str()),
        (BeginOutcome::Completed, RESULT)
    );

    // An explicit lease is honoured.
    let mut leased = req.clone();
    leased.request_id = "refund-begin-2".into();
    leased.lease_ms = 750;
    let r = client.authorize(leased).await.unwrap().into_inner();
    assert_eq!(ms(r.execution.unwrap().lease_expires_at.as_ref()), T0 + 750);

    // Only an ALLOW begins anything; without the option nothing is begun.
    let mut big = request(
        "refund_order",
        r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#,
    );
    big.begin_execution = true;
    let waits = client.authorize(big).await.unwrap().into_inner();
    assert_eq!(
        (waits.decision(), waits.execution),
        (Decision::ApprovalRequired, None)
    );
    let mut bad = request(
        "refund_order",
        r#"{"order_id":"ord_1001","amount_cents":"2500"}"#,
    );
    bad.begin_execution = true;
    let denied = client.authorize(bad).await.unwrap().into_inner();
    assert_eq!(
        (denied.decision(), denied.execution),
        (Decision::Deny, None)
    );
    let mut plain = req.clone();
    plain.request_id = "refund-begin-3".into();
    plain.begin_execution = false;
    let allowed = client.authorize(plain).await.unwrap().into_inner();
    assert_eq!(
        (allowed.decision(), allowed.execution),
        (Decision::Allow, None)
    );
    assert_eq!(
        executor
            .get(&allowed.idempotency_key)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    server.stop().await;
}

/// 32 executors, each on its own connection, send BeginExecution for the
/// same new key at once: exactly one is ACQUIRED, the rest IN_PROGRESS,
/// every round.
async fn exactly_one_of_32_concurrent_begins_is_acquired_every_round(backend: Backend) {
    const EXECUTORS: usize = 32;
    const ROUNDS: usize = 50;
    let server = TestServer::start_on(backend).await;
    let mut clients = Vec::with_capacity(EXECUTORS);
    for _ in 0..EXECUTORS {
        clients.push(server.ledger().await);
    }
    let started = Instant::now();
    for round in 0..ROUNDS {
        let (key, sha) = op(&format!("contention-{round}"));
        let ticket = server
            .ticket(&agent_bob(), &key, &sha, "refund_order")
            .await;
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(EXECUTORS));
        let tasks: Vec<_> = clients
            .iter()
            .map(|client| {
                let mut client = client.clone();
                let barrier = std::sync::Arc::clone(&barrier);
                let req = pb::BeginExecutionRequest {
                    auth: Some(agent_bob()),
                    idempotency_key: key.clone(),
                    arguments_sha256: sha.clone(),
                    tool: "refund_order".into(),
                    lease_ms: 60_000,
                    execution_ticket: ticket.clone(),
                };
                tokio::spawn(async move {
                    barrier.wait().await;
                    client.begin_execution(req).await.unwrap().into_inner()
                })
            })
            .collect();
        let mut acquired = Vec::new();
        for task in tasks {
            let r = tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .unwrap()
                .unwrap();
            match r.outcome() {
                BeginOutcome::Acquired => acquired.push(r.fencing_token),
                BeginOutcome::InProgress => assert_eq!(r.fencing_token, 0),
                other => panic!("round {round}: {other:?} {:?}", r.error),
            }
        }
        assert_eq!(acquired.len(), 1, "round {round}: {acquired:?}");
    }
    eprintln!(
        "contention: {ROUNDS} rounds of {EXECUTORS} concurrent BeginExecution in {:?}",
        started.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_store_failure_is_a_retryable_internal_error_never_acquired() {
    let server = TestServer::start_with_clock(ManualClock::new(T0)).await;
    let mut executor = Executor::new(&server).await;
    let refund = op("store-failure");
    let held = executor.begin(&refund).await;
    rusqlite::Connection::open(&server.db_path)
        .unwrap()
        .execute_batch("DROP TABLE executions")
        .unwrap();

    let r = executor.begin(&op("store-failure-2")).await;
    assert_eq!((r.outcome(), r.fencing_token), (BeginOutcome::Refused, 0));
    let e = r.error.as_ref().unwrap();
    assert_eq!(
        (e.code.as_str(), e.retryable, e.resolution.as_str()),
        ("internal_error", true, "retry_same_key")
    );
    assert!(!e.message.to_lowercase().contains("sql"), "{}", e.message);
    let c = executor.succeed(&refund.0, held.fencing_token).await;
    assert_eq!(c.state(), ExecutionState::Unspecified);
    assert_eq!(code(c.error.as_ref()), "internal_error");
    let r = executor.reconcile(&refund.0, false, "").await.unwrap();
    assert_eq!(code(r.error.as_ref()), "internal_error");
    assert_eq!(
        executor.get(&refund.0).await.unwrap_err().code(),
        Code::Unavailable
    );
    server.stop().await;
}

both_backends!(
    absent_is_acquired_and_a_live_lease_is_in_progress_for_everyone_else,
    an_expired_lease_answers_reconcile_required_never_acquired,
    a_success_is_completed_with_its_result_for_every_retry,
    a_retryable_failure_is_acquired_again_until_the_budget_then_final,
    the_configured_default_budget_applies_to_tools_without_max_attempts,
    an_unknown_outcome_is_timeout_unknown_then_reconcile_required,
    failed_final_is_completed_with_the_stored_error,
    stale_fencing_tokens_are_lease_lost_and_change_nothing,
    a_key_back_with_other_arguments_or_tool_is_idempotency_key_reused,
    a_result_that_fails_the_output_schema_is_quarantined_as_unknown,
    reconciliation_settles_an_unknown_outcome_both_ways,
    records_are_collected_after_the_retention_period,
    a_call_that_may_have_run_outlives_retention_and_still_needs_reconciling,
    records_are_visible_to_their_own_tenant_only,
    authorize_with_begin_execution_begins_an_allowed_call_in_the_same_round_trip,
    exactly_one_of_32_concurrent_begins_is_acquired_every_round,
);
