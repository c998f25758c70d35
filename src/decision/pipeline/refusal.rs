//! How a stage ends a decision early ([`Stop`]), and the named refusals
//! the stages give: each envelope built in one place, its code, message
//! and details as the wire has always carried them.

use crate::approvals::ApprovalRecord;
use crate::budgets::MeterRefusal;
use crate::envelope::{Envelope, ErrorCode, ExecutorError, echo};
use crate::policy::{DecideError, PolicyDecision};
use crate::tools::ToolContract;

/// Why a stage ended the decision: a deny with its envelope, or the
/// executor's own mistake (a request error, not a decision).
pub(super) enum Stop {
    Deny(Envelope),
    Executor(ExecutorError),
}

impl From<Envelope> for Stop {
    fn from(envelope: Envelope) -> Self {
        Self::Deny(envelope)
    }
}

impl From<ExecutorError> for Stop {
    fn from(e: ExecutorError) -> Self {
        Self::Executor(e)
    }
}

pub(super) fn not_an_object() -> Envelope {
    Envelope::new(
        ErrorCode::InvalidArguments,
        "the arguments must be a JSON object",
    )
    .with("reason", "not_an_object")
}

pub(super) fn version_mismatch(tool: &ToolContract, asked: &str) -> Envelope {
    Envelope::new(
        ErrorCode::ToolNotFound,
        format!(
            "tool `{}` is at version `{}`, not `{}`",
            tool.name,
            tool.version,
            echo(asked)
        ),
    )
    .with("reason", "version_mismatch")
    .with("version", tool.version.clone())
}

pub(super) fn deadline_exhausted() -> Envelope {
    Envelope::new(
        ErrorCode::DeadlineExhausted,
        "no time is left before the caller's deadline; nothing was started, retry with the same key",
    )
}

pub(super) fn forbidden(reason: Option<String>) -> Envelope {
    let message = reason.unwrap_or_else(|| "the call is not permitted by policy".to_owned());
    Envelope::new(ErrorCode::Forbidden, message)
}

pub(super) fn policy_errored() -> Envelope {
    Envelope::new(
        ErrorCode::PolicyError,
        "a policy could not be evaluated; the call is denied",
    )
}

/// Cedar could not be asked: what each reason means for the call.
pub(super) fn evaluation_refused(e: DecideError, from_store: bool, tool: &ToolContract) -> Stop {
    match e {
        DecideError::Entities(_) if from_store => {
            // Stored under an earlier schema, say: not the caller's
            // mistake, and never decided on (fail closed). Cedar's
            // message quotes values, the deployment's data: not logged.
            tracing::warn!(tool = %tool.name, "stored entities do not fit the schema: denied");
            Stop::Deny(
                Envelope::new(
                    ErrorCode::PolicyError,
                    "the stored entities of this call do not fit the schema; the call is denied",
                )
                .with("reason", "stored_entities_invalid"),
            )
        }
        DecideError::Entities(e) => {
            Stop::Executor(ExecutorError::new("entities_json", e.to_string()))
        }
        DecideError::ResourceNotFound(uid) => Stop::Deny(
            Envelope::new(
                ErrorCode::ResourceNotFound,
                "the resource of this call was not supplied",
            )
            .with("resource", uid),
        ),
        DecideError::Projection(e) => Stop::Deny(
            Envelope::new(ErrorCode::InvalidArguments, e.to_string())
                .with("reason", e.reason())
                .with("pointer", e.pointer()),
        ),
        DecideError::Request(e) => {
            // The kind only: Cedar's message may quote the call's values.
            tracing::error!(kind = e.kind(), tool = %tool.name, "cannot build the Cedar request");
            Stop::Deny(Envelope::new(
                ErrorCode::InternalError,
                "the call could not be evaluated",
            ))
        }
    }
}

/// A budget's charge the arguments cannot give (DESIGN §13.1).
pub(super) fn budget_invalid(refusal: &MeterRefusal) -> Envelope {
    let message = match refusal {
        MeterRefusal::Negative { .. } => "the call's measure for a budget is negative",
        MeterRefusal::NotAnInteger { .. } => "the call's measure for a budget is not an integer",
        MeterRefusal::Overflow { .. } => "a budget's total would not fit a 64-bit integer",
    };
    let envelope = Envelope::new(ErrorCode::BudgetInvalid, message)
        .with("budget", refusal.budget().to_owned())
        .with("reason", refusal.reason());
    match refusal.pointer() {
        Some(pointer) => envelope.with("pointer", pointer.to_owned()),
        None => envelope,
    }
}

/// The store a budgeted decision needs did not answer: nothing was charged.
pub(super) fn store_unavailable() -> Envelope {
    Envelope::new(
        ErrorCode::StoreUnavailable,
        "the budgets of this call could not be read or charged; nothing was allowed, retry with the same key",
    )
}

/// A gateway call whose approval was consumed but that the budgets as they
/// stand now no longer allow (DESIGN §13.1: the approved call is charged
/// when allowed): denied as its decision says.
pub(super) fn not_allowed_once_approved(decision: PolicyDecision) -> Envelope {
    match decision {
        PolicyDecision::Deny { reason, .. } => forbidden(reason),
        PolicyDecision::ApprovalRequired { .. } => forbidden(None),
        PolicyDecision::Errored { .. } | PolicyDecision::Allow { .. } => policy_errored(),
    }
}

pub(super) fn approval_envelope(code: ErrorCode, record: &ApprovalRecord) -> Envelope {
    let message = match code {
        ErrorCode::ApprovalPending => "the approval is still pending",
        ErrorCode::ApprovalRejected => "the approval was rejected",
        ErrorCode::ApprovalExpired => "the approval has expired",
        ErrorCode::ApprovalMismatch => "the approval was granted for a different call",
        ErrorCode::ApprovalConsumed => "the approval was already used by another operation",
        _ => "the approval cannot be used",
    };
    Envelope::new(code, message).with("approval_id", record.approval_id.clone())
}

/// `approval_consumed` for a gateway request after the one its approval
/// allowed (DESIGN §11.3), the same idempotency key included.
pub(super) fn used_at_gateway(record: &ApprovalRecord) -> Envelope {
    Envelope::new(
        ErrorCode::ApprovalConsumed,
        "the approval allowed one request, which was made; a new approval is needed to run the call again",
    )
    .with("approval_id", record.approval_id.clone())
    .with("reason", "single_use")
}
