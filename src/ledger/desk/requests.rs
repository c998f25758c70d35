//! What executors send the ledger desk, and the checks of its shape
//! (key, results, errors) before any store call.

use crate::access::TenantScope;
use crate::decode::{self, Limits};
use crate::envelope::{Envelope, ExecutorError, RequestError, TenantNotGranted};
use crate::identity::Caller;
use crate::ledger::RecordedError;

/// What the ledger needs of an ALLOW decision to begin it or to ticket it:
/// the decision's own principal, key, hash and id (the decision layer
/// builds it, `AuthorizeOutcome::allowed_call`).
pub struct AllowedCall<'a> {
    pub principal: &'a Caller,
    pub tool: &'a str,
    pub idempotency_key: &'a str,
    pub arguments_sha256: &'a str,
    pub decision_id: &'a str,
}

/// The longest idempotency key accepted (ours are the tool name, a colon
/// and 64 hex digits).
pub(super) const MAX_KEY_BYTES: usize = 256;
/// The largest executor-reported error kept, all its fields together.
pub const MAX_ERROR_BYTES: usize = 16 * 1024;

/// Why a desk call could not be answered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LedgerError {
    /// The executor's request is malformed.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// The caller may not act for the principal's tenant.
    #[error(transparent)]
    TenantNotGranted(#[from] TenantNotGranted),
    /// The principal could not be established (`unauthorized`).
    #[error("{}", .0.message)]
    Unauthorized(Envelope),
    /// The store failed; nothing was changed.
    #[error("the execution ledger is unavailable")]
    Unavailable,
}

/// Who sent a ledger request.
#[derive(Clone, Default)]
pub struct ExecutorAuth {
    /// The auth context as the executor sent it.
    pub caller: Option<Caller>,
    /// `auth.identity_token`: the principal when the deployment requires
    /// one. Never logged.
    pub identity_token: String,
    /// The transport identity of the connection, for the audit log.
    pub peer: String,
    /// The tenants the caller's grants let it act for. The default is none:
    /// a request whose scope was never set is refused.
    pub tenants: TenantScope,
    /// The tenants whose records the caller may reconcile without the
    /// holder's fencing token (its `reconcile` grants). Default: none.
    pub reconcile_tenants: TenantScope,
}

impl From<RequestError> for LedgerError {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::Invalid(e) => Self::Executor(e),
            RequestError::TenantNotGranted(e) => Self::TenantNotGranted(e),
        }
    }
}

impl std::fmt::Debug for ExecutorAuth {
    /// Never shows the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorAuth")
            .field("caller", &self.caller)
            .field("identity_token", &"[REDACTED]")
            .field("peer", &self.peer)
            .field("tenants", &self.tenants)
            .field("reconcile_tenants", &self.reconcile_tenants)
            .finish()
    }
}

/// A `BeginExecution`, as the executor sent it.
#[derive(Debug, Clone, Default)]
pub struct BeginRequest {
    pub auth: ExecutorAuth,
    pub idempotency_key: String,
    pub arguments_sha256: String,
    pub tool: String,
    /// 0: the tool's timeout plus the configured margin.
    pub lease_ms: u32,
    /// The ALLOW decision's `execution_ticket`. Never logged.
    pub execution_ticket: String,
}

/// How the executor says the attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionStatus {
    Succeeded,
    FailedRetryable,
    FailedFinal,
    Unknown,
}

impl CompletionStatus {
    /// Lowercase name, for the audit log.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::FailedRetryable => "failed_retryable",
            Self::FailedFinal => "failed_final",
            Self::Unknown => "unknown",
        }
    }
}

/// A `CompleteExecution`, as the executor sent it.
#[derive(Debug, Clone, Default)]
pub struct CompleteRequest {
    pub auth: ExecutorAuth,
    pub idempotency_key: String,
    pub fencing_token: u64,
    /// `None`: the executor sent none.
    pub status: Option<CompletionStatus>,
    /// Required with SUCCEEDED, refused otherwise.
    pub result_json: String,
    /// The tool's own error; refused with SUCCEEDED.
    pub error: Option<RecordedError>,
}

/// A `ReconcileExecution`, as sent.
#[derive(Debug, Clone, Default)]
pub struct ReconcileRequest {
    pub auth: ExecutorAuth,
    pub idempotency_key: String,
    pub applied: bool,
    /// Required when applied, refused otherwise.
    pub result_json: String,
    /// The holder's fencing token; 0: reconcile by the `reconcile` grant.
    pub fencing_token: u64,
}

/// An idempotency key an executor may name.
pub(super) fn check_key(idempotency_key: &str) -> Result<(), ExecutorError> {
    if idempotency_key.is_empty() {
        return Err(ExecutorError::new("idempotency_key", "must not be empty"));
    }
    if idempotency_key.len() > MAX_KEY_BYTES {
        return Err(ExecutorError::new(
            "idempotency_key",
            format!("at most {MAX_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

pub(super) fn no_result(result_json: &str, when: &str) -> Result<(), ExecutorError> {
    if result_json.is_empty() {
        Ok(())
    } else {
        Err(ExecutorError::new("result_json", when))
    }
}

/// An executor's report of a failure, bounded in size, with details that
/// are a JSON object (empty details become `{}`).
pub(super) fn check_error(
    error: Option<RecordedError>,
    limits: &Limits,
) -> Result<Option<RecordedError>, ExecutorError> {
    let Some(mut e) = error else {
        return Ok(None);
    };
    if e.code.is_empty() {
        return Err(ExecutorError::new("error.code", "must not be empty"));
    }
    let size = e.code.len()
        + e.category.len()
        + e.message.len()
        + e.resolution.len()
        + e.details_json.len();
    if size > MAX_ERROR_BYTES {
        return Err(ExecutorError::new(
            "error",
            format!("at most {MAX_ERROR_BYTES} bytes in all"),
        ));
    }
    if e.details_json.is_empty() {
        "{}".clone_into(&mut e.details_json);
    } else {
        let details = decode::parse_strict(e.details_json.as_bytes(), limits).ok();
        if !details.is_some_and(|d| d.is_object()) {
            return Err(ExecutorError::new(
                "error.details_json",
                "must be a JSON object",
            ));
        }
    }
    Ok(Some(e))
}
