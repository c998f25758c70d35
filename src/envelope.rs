//! Error codes and the error envelope (DESIGN §6): the one table that fixes,
//! for every stable code, its category, whether it is retryable, what the
//! caller should do about it, and who may see its message.
//!
//! This module owns the *shape* of a non-allow answer. It must not decide
//! anything: the pipeline picks a code, this table says what the code means.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// Every stable error code toolgate can answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorCode {
    InvalidJson,
    InvalidArguments,
    SchemaViolation,
    ToolNotFound,
    Unauthorized,
    Forbidden,
    ResourceNotFound,
    PolicyError,
    ApprovalRequired,
    ApprovalPending,
    ApprovalRejected,
    ApprovalExpired,
    ApprovalMismatch,
    ApprovalConsumed,
    ApprovalNotFound,
    ApprovalAlreadyDecided,
    DeadlineExhausted,
    RateLimited,
    OperationInProgress,
    ReconcileRequired,
    TimeoutUnknown,
    IdempotencyKeyReused,
    LeaseLost,
    OutputInvalid,
    BudgetInvalid,
    StoreUnavailable,
    InternalError,
}

/// What the caller should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    RepairArguments,
    RefreshTools,
    Reauthenticate,
    Stop,
    AwaitApproval,
    RequestNewApproval,
    RetrySameKey,
    Poll,
    Reconcile,
    Inspect,
}

impl Resolution {
    /// The stable wire string.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RepairArguments => "repair_arguments",
            Self::RefreshTools => "refresh_tools",
            Self::Reauthenticate => "reauthenticate",
            Self::Stop => "stop",
            Self::AwaitApproval => "await_approval",
            Self::RequestNewApproval => "request_new_approval",
            Self::RetrySameKey => "retry_same_key",
            Self::Poll => "poll",
            Self::Reconcile => "reconcile",
            Self::Inspect => "inspect",
        }
    }
}

/// The fixed meaning of one code: one row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeInfo {
    pub code: &'static str,
    pub category: &'static str,
    pub retryable: bool,
    pub resolution: Resolution,
    /// Whether the message and details may be handed back to the model.
    pub expose_to_model: bool,
    /// Whether the message may be shown to the end user.
    pub expose_to_user: bool,
}

impl ErrorCode {
    /// Every code, in table order (used by the table test and the docs).
    pub const ALL: [Self; 27] = [
        Self::InvalidJson,
        Self::InvalidArguments,
        Self::SchemaViolation,
        Self::ToolNotFound,
        Self::Unauthorized,
        Self::Forbidden,
        Self::ResourceNotFound,
        Self::PolicyError,
        Self::ApprovalRequired,
        Self::ApprovalPending,
        Self::ApprovalRejected,
        Self::ApprovalExpired,
        Self::ApprovalMismatch,
        Self::ApprovalConsumed,
        Self::ApprovalNotFound,
        Self::ApprovalAlreadyDecided,
        Self::DeadlineExhausted,
        Self::RateLimited,
        Self::OperationInProgress,
        Self::ReconcileRequired,
        Self::TimeoutUnknown,
        Self::IdempotencyKeyReused,
        Self::LeaseLost,
        Self::OutputInvalid,
        Self::BudgetInvalid,
        Self::StoreUnavailable,
        Self::InternalError,
    ];

    /// The table (DESIGN §6). Changing a row is a breaking change for every
    /// executor: `envelope::tests::table_is_locked` pins it.
    #[must_use]
    pub const fn info(self) -> CodeInfo {
        use Resolution as R;
        let (code, category, retryable, resolution, model, user) = match self {
            Self::InvalidJson => (
                "invalid_json",
                "arguments",
                false,
                R::RepairArguments,
                true,
                true,
            ),
            Self::InvalidArguments => (
                "invalid_arguments",
                "arguments",
                false,
                R::RepairArguments,
                true,
                true,
            ),
            Self::SchemaViolation => (
                "schema_violation",
                "arguments",
                false,
                R::RepairArguments,
                true,
                true,
            ),
            Self::ToolNotFound => ("tool_not_found", "tool", false, R::RefreshTools, true, true),
            Self::Unauthorized => (
                "unauthorized",
                "authentication",
                false,
                R::Reauthenticate,
                false,
                true,
            ),
            Self::Forbidden => ("forbidden", "authorization", false, R::Stop, true, true),
            Self::ResourceNotFound => (
                "resource_not_found",
                "authorization",
                false,
                R::Stop,
                false,
                true,
            ),
            Self::PolicyError => (
                "policy_error",
                "authorization",
                false,
                R::Stop,
                false,
                false,
            ),
            Self::ApprovalRequired => (
                "approval_required",
                "approval",
                false,
                R::AwaitApproval,
                true,
                true,
            ),
            Self::ApprovalPending => (
                "approval_pending",
                "approval",
                true,
                R::AwaitApproval,
                true,
                true,
            ),
            Self::ApprovalRejected => (
                "approval_rejected",
                "approval",
                false,
                R::RequestNewApproval,
                true,
                true,
            ),
            Self::ApprovalExpired => (
                "approval_expired",
                "approval",
                false,
                R::RequestNewApproval,
                true,
                true,
            ),
            Self::ApprovalMismatch => (
                "approval_mismatch",
                "approval",
                false,
                R::RequestNewApproval,
                true,
                true,
            ),
            Self::ApprovalConsumed => (
                "approval_consumed",
                "approval",
                false,
                R::RequestNewApproval,
                true,
                true,
            ),
            Self::ApprovalNotFound => (
                "approval_not_found",
                "approval",
                false,
                R::RequestNewApproval,
                true,
                true,
            ),
            Self::ApprovalAlreadyDecided => (
                "approval_already_decided",
                "approval",
                false,
                R::Stop,
                false,
                true,
            ),
            Self::DeadlineExhausted => (
                "deadline_exhausted",
                "deadline",
                true,
                R::RetrySameKey,
                false,
                false,
            ),
            // Nothing was started: the same operation may be retried, after
            // `details.retry_after_ms`, or (`details.limit`, a cap on pending
            // approvals) once approvers have decided some. The model may see
            // it, to back off.
            Self::RateLimited => (
                "rate_limited",
                "rate_limit",
                true,
                R::RetrySameKey,
                true,
                true,
            ),
            Self::OperationInProgress => (
                "operation_in_progress",
                "execution",
                true,
                R::Poll,
                false,
                false,
            ),
            Self::ReconcileRequired => (
                "reconcile_required",
                "execution",
                false,
                R::Reconcile,
                false,
                false,
            ),
            Self::TimeoutUnknown => (
                "timeout_unknown",
                "execution",
                false,
                R::Reconcile,
                false,
                false,
            ),
            Self::IdempotencyKeyReused => (
                "idempotency_key_reused",
                "execution",
                false,
                R::Stop,
                false,
                false,
            ),
            Self::LeaseLost => ("lease_lost", "execution", false, R::Stop, false, false),
            Self::OutputInvalid => (
                "output_invalid",
                "execution",
                false,
                R::Inspect,
                false,
                false,
            ),
            // A budget's charge cannot be computed for these arguments
            // (`details.budget`, `details.reason`: a negative measure, one
            // that is not an integer, a sum past a Long; `details.pointer`
            // for the measure): nothing was charged. The model may see it
            // and send other arguments.
            Self::BudgetInvalid => (
                "budget_invalid",
                "budget",
                false,
                R::RepairArguments,
                true,
                true,
            ),
            // The store a budgeted decision needs did not answer: nothing
            // was charged or allowed; the same operation may be retried.
            Self::StoreUnavailable => (
                "store_unavailable",
                "internal",
                true,
                R::RetrySameKey,
                false,
                false,
            ),
            Self::InternalError => (
                "internal_error",
                "internal",
                true,
                R::RetrySameKey,
                false,
                false,
            ),
        };
        CodeInfo {
            code,
            category,
            retryable,
            resolution,
            expose_to_model: model,
            expose_to_user: user,
        }
    }

    /// The stable wire string of the code.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        self.info().code
    }

    /// The code whose wire string is `s`, if it is one of ours.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// What a check of the model's call gives once the executor's request is
/// well formed: the value it establishes, or the refusal that becomes the
/// call's answer. A refusal is a decision the caller is told, in an
/// envelope; an executor's mistake is the `Err` of the `Result` around it
/// ([`RequestError`]), never a `Checked`.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum Checked<T> {
    Passed(T),
    Refused(Envelope),
}

impl<T> Checked<T> {
    /// The value, or the refusal as the error (for `?` and `and_then`).
    ///
    /// # Errors
    /// The refusal's [`Envelope`].
    pub fn into_result(self) -> Result<T, Envelope> {
        match self {
            Self::Passed(v) => Ok(v),
            Self::Refused(e) => Err(e),
        }
    }

    /// The value, if the check passed.
    pub const fn passed(&self) -> Option<&T> {
        match self {
            Self::Passed(v) => Some(v),
            Self::Refused(_) => None,
        }
    }
}

/// One non-allow answer: a code with its message and details.
///
/// `message` is written for the model and the user: it never holds stack
/// traces, tokens, SQL, host names or raw arguments. Details are a JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub code: ErrorCode,
    pub message: String,
    pub details: Map<String, Value>,
}

impl Envelope {
    /// An envelope with no details.
    #[must_use]
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: Map::new(),
        }
    }

    /// Adds one detail field.
    #[must_use]
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    /// The fixed row of this envelope's code.
    #[must_use]
    pub const fn info(&self) -> CodeInfo {
        self.code.info()
    }

    /// The details as JSON object text, in canonical (RFC 8785) form so the
    /// bytes do not depend on insertion order.
    #[must_use]
    pub fn details_json(&self) -> String {
        canonical(&Value::Object(self.details.clone()))
    }

    /// The JSON text to hand back to the model: only model-safe fields. For a
    /// code the model may not see in full, only the code, a generic message
    /// and what to do are given.
    #[must_use]
    pub fn model_output(&self) -> String {
        let info = self.info();
        let mut error = Map::new();
        error.insert("code".into(), info.code.into());
        let message = if info.expose_to_model {
            self.message.clone()
        } else {
            generic_message(self.code).to_owned()
        };
        error.insert("message".into(), message.into());
        error.insert("retryable".into(), info.retryable.into());
        error.insert("resolution".into(), info.resolution.as_str().into());
        if info.expose_to_model && !self.details.is_empty() {
            error.insert("details".into(), Value::Object(self.details.clone()));
        }
        let mut root = Map::new();
        root.insert("error".into(), Value::Object(error));
        canonical(&Value::Object(root))
    }
}

/// Canonical text of a value built here; it holds no non-finite numbers, so
/// this cannot fail, and if it ever did an empty object is the safe answer.
fn canonical(v: &Value) -> String {
    crate::decode::canonical_json(v).unwrap_or_else(|_| "{}".to_owned())
}

/// The envelope of schema violations (`schema_violation` for arguments,
/// `output_invalid` for results): the first in `message`, all of them in
/// `details.violations`. `None` when there are none.
#[must_use]
pub fn violations(code: ErrorCode, list: &[crate::tools::Violation]) -> Option<Envelope> {
    let first = list.first()?;
    let all: Vec<Value> = list
        .iter()
        .map(|v| serde_json::json!({"pointer": v.pointer, "keyword": v.keyword, "message": v.message}))
        .collect();
    Some(
        Envelope::new(code, format!("{} at `{}`", first.message, first.pointer))
            .with("violations", all),
    )
}

/// What the model is told when the full message is not for it.
const fn generic_message(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::Unauthorized => "the caller could not be authenticated",
        ErrorCode::ResourceNotFound | ErrorCode::PolicyError => "the call is not permitted",
        ErrorCode::ApprovalAlreadyDecided => "the approval was already decided",
        ErrorCode::DeadlineExhausted => "no time is left to run the call",
        _ => "the call could not be completed",
    }
}

/// A malformed request from the executor itself (not the model): answered
/// as a gRPC `INVALID_ARGUMENT`, not as a decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {description}")]
pub struct ExecutorError {
    pub field: &'static str,
    pub description: String,
}

impl ExecutorError {
    pub fn new(field: &'static str, description: impl Into<String>) -> Self {
        Self {
            field,
            description: description.into(),
        }
    }
}

/// A request for a tenant its caller's `[[access]]` grants do not name: the
/// request itself is refused (gRPC `PERMISSION_DENIED`), not decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the caller's grants do not name tenant `{tenant}`: it may not act for it")]
pub struct TenantNotGranted {
    /// The tenant the request would have run as, echoed safely.
    pub tenant: String,
}

impl TenantNotGranted {
    #[must_use]
    pub fn new(tenant: &str) -> Self {
        Self {
            tenant: echo(tenant),
        }
    }
}

/// Why an executor's request is refused as a request (a gRPC status)
/// rather than answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The executor's own mistake: `INVALID_ARGUMENT`.
    #[error(transparent)]
    Invalid(#[from] ExecutorError),
    /// The caller may not act for the request's tenant: `PERMISSION_DENIED`.
    #[error(transparent)]
    TenantNotGranted(#[from] TenantNotGranted),
}

/// `tool_not_found` for a name the model or executor gave, echoed safely.
#[must_use]
pub fn unknown_tool(name: &str) -> Envelope {
    Envelope::new(
        ErrorCode::ToolNotFound,
        format!("unknown tool `{}`", echo(name)),
    )
    .with("tool", echo(name))
}

/// How long a model-supplied name may be before it is cut in messages.
const MAX_ECHO: usize = 64;

/// A model-supplied string cut to a length safe to echo, its control
/// characters escaped ([`crate::decode::shown`]): a message shows what was
/// sent and never acts on the reader's terminal or log viewer.
pub fn echo(s: &str) -> String {
    let cut: Cow<'_, str> = if s.chars().count() <= MAX_ECHO {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.chars().take(MAX_ECHO).chain("…".chars()).collect())
    };
    crate::decode::shown(&cut).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole table, row by row. Any change here breaks executors: it
    /// must be deliberate and announced.
    #[test]
    fn table_is_locked() {
        let rows: Vec<(&str, &str, bool, &str)> = ErrorCode::ALL
            .iter()
            .map(|c| {
                let i = c.info();
                (i.code, i.category, i.retryable, i.resolution.as_str())
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                ("invalid_json", "arguments", false, "repair_arguments"),
                ("invalid_arguments", "arguments", false, "repair_arguments"),
                ("schema_violation", "arguments", false, "repair_arguments"),
                ("tool_not_found", "tool", false, "refresh_tools"),
                ("unauthorized", "authentication", false, "reauthenticate"),
                ("forbidden", "authorization", false, "stop"),
                ("resource_not_found", "authorization", false, "stop"),
                ("policy_error", "authorization", false, "stop"),
                ("approval_required", "approval", false, "await_approval"),
                ("approval_pending", "approval", true, "await_approval"),
                (
                    "approval_rejected",
                    "approval",
                    false,
                    "request_new_approval"
                ),
                (
                    "approval_expired",
                    "approval",
                    false,
                    "request_new_approval"
                ),
                (
                    "approval_mismatch",
                    "approval",
                    false,
                    "request_new_approval"
                ),
                (
                    "approval_consumed",
                    "approval",
                    false,
                    "request_new_approval"
                ),
                (
                    "approval_not_found",
                    "approval",
                    false,
                    "request_new_approval"
                ),
                ("approval_already_decided", "approval", false, "stop"),
                ("deadline_exhausted", "deadline", true, "retry_same_key"),
                ("rate_limited", "rate_limit", true, "retry_same_key"),
                ("operation_in_progress", "execution", true, "poll"),
                ("reconcile_required", "execution", false, "reconcile"),
                ("timeout_unknown", "execution", false, "reconcile"),
                ("idempotency_key_reused", "execution", false, "stop"),
                ("lease_lost", "execution", false, "stop"),
                ("output_invalid", "execution", false, "inspect"),
                ("budget_invalid", "budget", false, "repair_arguments"),
                ("store_unavailable", "internal", true, "retry_same_key"),
                ("internal_error", "internal", true, "retry_same_key"),
            ]
        );
    }

    #[test]
    fn model_output_hides_what_the_model_may_not_see() {
        let e = Envelope::new(ErrorCode::PolicyError, "policy `p7` errored: overflow")
            .with("policy_ids", vec!["p7"]);
        assert_eq!(
            e.model_output(),
            r#"{"error":{"code":"policy_error","message":"the call is not permitted","resolution":"stop","retryable":false}}"#
        );
        let f = Envelope::new(ErrorCode::Forbidden, "refunds above 500 need a manager")
            .with("reason", "x");
        assert_eq!(
            f.model_output(),
            r#"{"error":{"code":"forbidden","details":{"reason":"x"},"message":"refunds above 500 need a manager","resolution":"stop","retryable":false}}"#
        );
    }
}
