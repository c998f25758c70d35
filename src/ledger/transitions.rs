//! The three transitions of the ledger: begin, complete, reconcile. Each
//! takes the record as it is and says what to answer and what to write.

use std::sync::Arc;

use serde_json::Value;

use super::{
    ExecutionId, ExecutionRecord, ExecutionState, MAX_RETRY_AFTER_MS, OutputSchemas, RecordedError,
    Transition, Write,
};
use crate::clock::UnixMillis;
use crate::envelope::{Envelope, ErrorCode};

/// `BeginExecution`: may this executor run the operation now?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    pub id: ExecutionId,
    pub tool: String,
    pub arguments_sha256: String,
    /// The lease to grant, already bounded by the configuration.
    pub lease_ms: u64,
    /// The retry budget, for a new record.
    pub max_attempts: u32,
    pub now: UnixMillis,
}

/// The four answers of DESIGN §5, and a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeginOutcome {
    /// Run it, under `fencing_token`, before `lease_expires_at`.
    Acquired,
    /// Another executor holds a live lease: do not run it; poll.
    InProgress,
    /// It finished: the stored result (SUCCEEDED) or error (FAILED_FINAL).
    Completed,
    /// It may have run: find out, then `ReconcileExecution`.
    ReconcileRequired,
    /// Not for this key (`idempotency_key_reused`), or the ledger could not
    /// answer (`tool_not_found`, `internal_error`): see the error.
    Refused,
}

impl BeginOutcome {
    /// Lowercase name, for the audit log and metrics.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::ReconcileRequired => "reconcile_required",
            Self::Refused => "refused",
        }
    }
}

/// The answer to a Begin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginAnswer {
    pub outcome: BeginOutcome,
    pub state: Option<ExecutionState>,
    pub attempt: u32,
    /// Only with ACQUIRED; 0 otherwise (a holder's token is never shown to another).
    pub fencing_token: u64,
    pub lease_expires_at: Option<UnixMillis>,
    pub result_json: Option<String>,
    pub error: Option<RecordedError>,
    pub retry_after_ms: u64,
}

impl BeginAnswer {
    /// A refusal carrying `error`.
    #[must_use]
    pub fn refused(error: &Envelope) -> Self {
        Self {
            outcome: BeginOutcome::Refused,
            state: None,
            attempt: 0,
            fencing_token: 0,
            lease_expires_at: None,
            result_json: None,
            error: Some(error.into()),
            retry_after_ms: 0,
        }
    }

    fn about(outcome: BeginOutcome, r: &ExecutionRecord) -> Self {
        Self {
            outcome,
            state: Some(r.state),
            attempt: r.attempt,
            fencing_token: 0,
            lease_expires_at: None,
            result_json: None,
            error: None,
            retry_after_ms: 0,
        }
    }
}

impl Transition for Begin {
    type Answer = BeginAnswer;

    fn id(&self) -> &ExecutionId {
        &self.id
    }

    fn apply(&self, current: Option<&ExecutionRecord>, next_token: u64) -> (BeginAnswer, Write) {
        let Some(r) = current else {
            return self.acquire(None, next_token);
        };
        if r.tool != self.tool || r.arguments_sha256 != self.arguments_sha256 {
            let reason = if r.tool == self.tool {
                "arguments_differ"
            } else {
                "tool_differs"
            };
            let e = Envelope::new(
                ErrorCode::IdempotencyKeyReused,
                "this idempotency key belongs to another call; a new operation needs a new request_id",
            )
            .with("reason", reason);
            return (BeginAnswer::refused(&e), Write::Nothing);
        }
        match r.state {
            ExecutionState::InProgress if r.lease_live(self.now) => {
                let wait = r.lease_expires_at.saturating_sub(self.now);
                let retry_after_ms = u64::try_from(wait)
                    .unwrap_or(0)
                    .clamp(1, MAX_RETRY_AFTER_MS);
                let e = Envelope::new(
                    ErrorCode::OperationInProgress,
                    "another executor is running this operation; do not run it, ask again later",
                )
                .with("attempt", r.attempt)
                .with("retry_after_ms", retry_after_ms);
                let answer = BeginAnswer {
                    lease_expires_at: Some(r.lease_expires_at),
                    error: Some((&e).into()),
                    retry_after_ms,
                    ..BeginAnswer::about(BeginOutcome::InProgress, r)
                };
                (answer, Write::Nothing)
            }
            ExecutionState::InProgress => (reconcile_required(r, "lease_expired"), Write::Nothing),
            ExecutionState::Unknown => {
                let cause = r
                    .error
                    .as_ref()
                    .map_or("timeout_unknown", |e| e.code.as_str());
                (reconcile_required(r, cause), Write::Nothing)
            }
            ExecutionState::FailedRetryable if r.budget_left() => self.acquire(Some(r), next_token),
            ExecutionState::FailedRetryable => {
                // INVARIANT: completions and reconciliations store FAILED_FINAL
                // for the last attempt, so this only finishes what they would have.
                let record = updated(r, self.now, |rec| rec.state = ExecutionState::FailedFinal);
                let answer = completed(&record);
                let write = Write::Update {
                    previous_revision: r.revision,
                    record,
                };
                (answer, write)
            }
            ExecutionState::Succeeded | ExecutionState::FailedFinal => {
                (completed(r), Write::Nothing)
            }
        }
    }
}

impl Begin {
    /// A new attempt: the first (`previous` absent) or the next after a
    /// retryable failure, under `token`.
    fn acquire(&self, previous: Option<&ExecutionRecord>, token: u64) -> (BeginAnswer, Write) {
        let lease = i64::try_from(self.lease_ms).unwrap_or(i64::MAX);
        let record = ExecutionRecord {
            tenant_id: self.id.tenant_id.clone(),
            idempotency_key: self.id.idempotency_key.clone(),
            tool: self.tool.clone(),
            arguments_sha256: self.arguments_sha256.clone(),
            state: ExecutionState::InProgress,
            attempt: previous.map_or(1, |p| p.attempt.saturating_add(1)),
            max_attempts: previous.map_or(self.max_attempts, |p| p.max_attempts),
            fencing_token: token,
            lease_expires_at: self.now.saturating_add(lease),
            result_json: None,
            error: None,
            created_at: previous.map_or(self.now, |p| p.created_at),
            updated_at: self.now,
            revision: previous.map_or(1, |p| p.revision.saturating_add(1)),
        };
        let answer = BeginAnswer {
            fencing_token: token,
            lease_expires_at: Some(record.lease_expires_at),
            ..BeginAnswer::about(BeginOutcome::Acquired, &record)
        };
        let write = match previous {
            None => Write::Insert(record),
            Some(p) => Write::Update {
                record,
                previous_revision: p.revision,
            },
        };
        (answer, write)
    }
}

fn completed(r: &ExecutionRecord) -> BeginAnswer {
    BeginAnswer {
        result_json: r.result_json.clone(),
        error: r.error.clone(),
        ..BeginAnswer::about(BeginOutcome::Completed, r)
    }
}

fn reconcile_required(r: &ExecutionRecord, cause: &str) -> BeginAnswer {
    let e = Envelope::new(
        ErrorCode::ReconcileRequired,
        format!(
            "attempt {} may have run ({cause}): check whether its side effect happened, \
             then call ReconcileExecution with applied=true and the result, or applied=false to allow a retry",
            r.attempt
        ),
    )
    .with("reason", cause)
    .with("attempt", r.attempt);
    BeginAnswer {
        error: Some((&e).into()),
        ..BeginAnswer::about(BeginOutcome::ReconcileRequired, r)
    }
}

/// `r` changed by `change` at `now`, one revision later.
fn updated(
    r: &ExecutionRecord,
    now: UnixMillis,
    change: impl FnOnce(&mut ExecutionRecord),
) -> ExecutionRecord {
    let mut record = r.clone();
    change(&mut record);
    record.updated_at = now;
    record.revision = r.revision.saturating_add(1);
    record
}

/// The state after a retryable failure of `r`'s attempt: FAILED_FINAL once
/// the budget is spent.
const fn after_retryable_failure(r: &ExecutionRecord) -> ExecutionState {
    if r.budget_left() {
        ExecutionState::FailedRetryable
    } else {
        ExecutionState::FailedFinal
    }
}

/// What is wrong with `result` as an output of `tool`, if anything.
fn output_problem(outputs: &dyn OutputSchemas, tool: &str, result: &Value) -> Option<Envelope> {
    match outputs.check(tool, result) {
        Some(violations) => crate::envelope::violations(ErrorCode::OutputInvalid, &violations),
        None => Some(
            Envelope::new(
                ErrorCode::OutputInvalid,
                format!("no contract of tool `{tool}` is loaded, so its result cannot be checked"),
            )
            .with("reason", "tool_not_found"),
        ),
    }
}

/// The answer to a completion or a reconciliation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The record's state after the call (`None`: there is no record).
    pub state: Option<ExecutionState>,
    pub error: Option<RecordedError>,
    /// Which operation the answer is about (`None`: there is no record).
    pub record: Option<RecordSummary>,
}

/// What may be said of a record outside the ledger (the audit log,
/// metrics): which tool, which arguments, which attempt — never its result
/// or error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    pub tool: String,
    pub arguments_sha256: String,
    pub attempt: u32,
}

impl RecordSummary {
    /// The summary of `r`.
    #[must_use]
    pub fn of(r: &ExecutionRecord) -> Self {
        Self {
            tool: r.tool.clone(),
            arguments_sha256: r.arguments_sha256.clone(),
            attempt: r.attempt,
        }
    }
}

impl Settled {
    /// An answer about `r` carrying `error`; the record is left as it is.
    fn refusal(r: Option<&ExecutionRecord>, e: &Envelope) -> Self {
        Self {
            state: r.map(|r| r.state),
            error: Some(e.into()),
            record: r.map(RecordSummary::of),
        }
    }
}

fn lease_lost(r: Option<&ExecutionRecord>, reason: &str) -> Settled {
    let e = Envelope::new(
        ErrorCode::LeaseLost,
        "this executor no longer holds the operation; nothing was changed",
    )
    .with("reason", reason);
    Settled::refusal(r, &e)
}

/// The answer about a record just written or found settled: UNKNOWN carries
/// its cause, which asks for reconciliation; other states need no error.
fn settled(r: &ExecutionRecord) -> Settled {
    Settled {
        state: Some(r.state),
        error: (r.state == ExecutionState::Unknown)
            .then(|| r.error.clone())
            .flatten(),
        record: Some(RecordSummary::of(r)),
    }
}

/// What an executor reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    /// The side effect happened; the result, strictly decoded.
    Succeeded {
        result_json: String,
        result: Value,
    },
    FailedRetryable(Option<RecordedError>),
    FailedFinal(Option<RecordedError>),
    /// It cannot tell (it timed out waiting).
    Unknown(Option<RecordedError>),
}

/// `CompleteExecution`: the holder of `fencing_token` reports the outcome.
#[derive(Debug, Clone)]
pub struct Complete {
    pub id: ExecutionId,
    pub fencing_token: u64,
    pub completion: Completion,
    pub now: UnixMillis,
    pub outputs: Arc<dyn OutputSchemas>,
}

impl Complete {
    /// The state, result and error this completion stores on `r`.
    fn outcome(
        &self,
        r: &ExecutionRecord,
    ) -> (ExecutionState, Option<String>, Option<RecordedError>) {
        match &self.completion {
            Completion::Succeeded {
                result_json,
                result,
            } => match output_problem(self.outputs.as_ref(), &r.tool, result) {
                None => (ExecutionState::Succeeded, Some(result_json.clone()), None),
                // The side effect happened; the result is quarantined, not dropped.
                Some(e) => (
                    ExecutionState::Unknown,
                    Some(result_json.clone()),
                    Some((&e).into()),
                ),
            },
            Completion::FailedRetryable(e) => (after_retryable_failure(r), None, e.clone()),
            Completion::FailedFinal(e) => (ExecutionState::FailedFinal, None, e.clone()),
            Completion::Unknown(reported) => {
                let mut e = Envelope::new(
                    ErrorCode::TimeoutUnknown,
                    format!(
                        "attempt {} ended without a known outcome: it may have run; reconcile before retrying",
                        r.attempt
                    ),
                )
                .with("attempt", r.attempt);
                if let Some(reported) = reported {
                    e = e.with(
                        "executor_error",
                        serde_json::json!({"code": reported.code, "message": reported.message}),
                    );
                }
                (ExecutionState::Unknown, None, Some((&e).into()))
            }
        }
    }
}

impl Transition for Complete {
    type Answer = Settled;

    fn id(&self) -> &ExecutionId {
        &self.id
    }

    fn apply(&self, current: Option<&ExecutionRecord>, _: u64) -> (Settled, Write) {
        let Some(r) = current else {
            return (lease_lost(None, "no_record"), Write::Nothing);
        };
        if r.fencing_token != self.fencing_token {
            return (lease_lost(Some(r), "stale_token"), Write::Nothing);
        }
        let (state, result_json, error) = self.outcome(r);
        if r.state == ExecutionState::InProgress {
            // Accepted even after the lease expired: see the module docs.
            let record = updated(r, self.now, |rec| {
                rec.state = state;
                rec.result_json = result_json;
                rec.error = error;
            });
            let answer = settled(&record);
            let write = Write::Update {
                previous_revision: r.revision,
                record,
            };
            return (answer, write);
        }
        if (r.state, &r.result_json, &r.error) == (state, &result_json, &error) {
            return (settled(r), Write::Nothing);
        }
        (lease_lost(Some(r), "already_settled"), Write::Nothing)
    }
}

/// What a reconciler found out.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The side effect happened; its result, strictly decoded.
    Applied {
        result_json: String,
        result: Value,
    },
    NotApplied,
}

/// `ReconcileExecution`: settle an operation whose outcome is unknown.
#[derive(Debug, Clone)]
pub struct Reconcile {
    pub id: ExecutionId,
    /// The fencing token the reconciler holds; `None`: it reconciles by its
    /// `reconcile` grant, which the desk checked.
    pub holder_token: Option<u64>,
    pub verdict: Verdict,
    pub now: UnixMillis,
    pub outputs: Arc<dyn OutputSchemas>,
}

impl Transition for Reconcile {
    /// `None`: no such record.
    type Answer = Option<Settled>;

    fn id(&self) -> &ExecutionId {
        &self.id
    }

    fn apply(&self, current: Option<&ExecutionRecord>, _: u64) -> (Option<Settled>, Write) {
        let Some(r) = current else {
            return (None, Write::Nothing);
        };
        if self.holder_token.is_some_and(|t| t != r.fencing_token) {
            return (Some(lease_lost(Some(r), "stale_token")), Write::Nothing);
        }
        let (state, result_json, error) = match (&self.verdict, r.state) {
            (_, ExecutionState::InProgress) if r.lease_live(self.now) => {
                let e = Envelope::new(
                    ErrorCode::OperationInProgress,
                    "an executor holds a live lease on this operation; it may still report",
                )
                .with("attempt", r.attempt);
                return (Some(Settled::refusal(Some(r), &e)), Write::Nothing);
            }
            (
                Verdict::Applied {
                    result_json,
                    result,
                },
                ExecutionState::InProgress | ExecutionState::Unknown,
            ) => {
                if let Some(e) = output_problem(self.outputs.as_ref(), &r.tool, result) {
                    return (Some(Settled::refusal(Some(r), &e)), Write::Nothing);
                }
                (ExecutionState::Succeeded, Some(result_json.clone()), None)
            }
            (Verdict::NotApplied, ExecutionState::InProgress | ExecutionState::Unknown) => {
                (after_retryable_failure(r), None, r.error.clone())
            }
            (Verdict::Applied { result_json, .. }, settled_state) => {
                let agrees = settled_state == ExecutionState::Succeeded
                    && r.result_json.as_deref() == Some(result_json.as_str());
                return (Some(acknowledged(r, agrees)), Write::Nothing);
            }
            (Verdict::NotApplied, settled_state) => {
                let agrees = settled_state != ExecutionState::Succeeded;
                return (Some(acknowledged(r, agrees)), Write::Nothing);
            }
        };
        let record = updated(r, self.now, |rec| {
            rec.state = state;
            rec.result_json = result_json;
            rec.error = error;
        });
        let answer = settled(&record);
        let write = Write::Update {
            previous_revision: r.revision,
            record,
        };
        (Some(answer), write)
    }
}

/// A reconciliation of a record already settled: acknowledged if it agrees,
/// `lease_lost` if somebody settled it otherwise.
fn acknowledged(r: &ExecutionRecord, agrees: bool) -> Settled {
    if agrees {
        settled(r)
    } else {
        lease_lost(Some(r), "already_settled")
    }
}
