//! What one decision takes in and gives out: the executor's call as sent,
//! the three answers, and everything the executor needs to run the call.

use std::time::Instant;

use crate::access::TenantScope;
use crate::budgets::{Seen, SessionSeen};
use crate::clock::UnixMillis;
use crate::envelope::Envelope;
use crate::identity::Caller;
use crate::ledger::desk::AllowedCall;
use crate::tools::Risk;

/// One call to decide, as the executor sent it.
#[derive(Debug, Clone, Default)]
pub struct AuthorizeInput {
    pub tool: String,
    pub arguments: Vec<u8>,
    pub caller: Option<Caller>,
    pub call_id: String,
    pub request_id: String,
    pub approval_id: String,
    /// When the caller stops waiting, on the monotonic clock.
    pub deadline: Option<Instant>,
    pub entities_json: String,
    pub tool_version: String,
    /// The executor's identity token (`auth.identity_token`): the principal
    /// when the deployment requires one. Never logged.
    pub identity_token: String,
    /// The transport identity of the connection, for the audit log.
    pub peer: String,
    /// The tenants the caller's grants let it act for. The default is none:
    /// an input whose scope was never set is refused.
    pub tenants: TenantScope,
    /// Which door the call came through: it selects the approval rule
    /// (DESIGN §4 for an executor, §11.3 for a gateway).
    pub door: Door,
    /// The gateway's action name (AuthZEN `action.name`: `tools/call` or
    /// the tool's name), kept in the audit event; empty for an executor.
    pub action: String,
}

impl AuthorizeInput {
    /// The request id of a gateway call that names none: the call is its
    /// own operation (DESIGN §11.1, §11.2), under its door's `prefix`.
    #[must_use]
    pub fn own_operation(prefix: &str) -> String {
        format!("{prefix}-{}", uuid::Uuid::now_v7())
    }
}

/// The door a call came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Door {
    /// `Authorize` / `BatchAuthorize`: the executor names its approval and
    /// its request id (DESIGN §4).
    #[default]
    Executor,
    /// A gateway door (AuthZEN §11.1, Envoy ext_authz §11.2): its client
    /// cannot name an approval, so the call finds its own (§11.3).
    Gateway,
}

impl Door {
    /// Lowercase name for the audit event and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Executor => "executor",
            Self::Gateway => "gateway",
        }
    }
}

/// The three answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    ApprovalRequired,
}

impl Decision {
    /// Lowercase name for logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::ApprovalRequired => "approval_required",
        }
    }
}

/// Everything the executor needs to run (or not run) the call.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthorizeOutcome {
    pub decision: Decision,
    pub decision_id: String,
    pub call_id: String,
    pub normalized_arguments: String,
    pub arguments_sha256: String,
    pub idempotency_key: String,
    pub conflict_key: String,
    pub risk: Option<Risk>,
    pub timeout_ms: u64,
    pub parallel: bool,
    pub idempotent: bool,
    /// The approval this answer names, and its expiry: the one created or
    /// pending for APPROVAL_REQUIRED; for a gateway call (DESIGN §11.3)
    /// also the one it used (ALLOW), waits on (`approval_pending`) or was
    /// refused by (`approval_rejected`).
    pub approval: Option<(String, UnixMillis)>,
    pub error: Option<Envelope>,
    pub policy_version: String,
    pub tool_version: String,
    /// Determining policy ids: for the audit log, never for the model.
    pub policies: Vec<String>,
    /// The principal the call was decided for (`None` when it could not be
    /// established): what `begin_execution` keys the ledger by.
    pub principal: Option<Caller>,
    /// What the decision saw of each budget counting the call (DESIGN
    /// §13.1), in name order: empty for a call no budget counts.
    pub budgets: Vec<Seen>,
    /// What the decision saw of the call's session (DESIGN §13.2), when a
    /// policy that may apply read it.
    pub session: Option<SessionSeen>,
    /// Whether this decision charged the budgets (an ALLOW whose operation
    /// held no charge yet).
    pub charged: bool,
}

impl AuthorizeOutcome {
    /// The call as the ledger begins or tickets it: `None` unless the
    /// decision is ALLOW with its principal known.
    #[must_use]
    pub fn allowed_call<'a>(&'a self, tool: &'a str) -> Option<AllowedCall<'a>> {
        if self.decision != Decision::Allow {
            return None;
        }
        Some(AllowedCall {
            principal: self.principal.as_ref()?,
            tool,
            idempotency_key: &self.idempotency_key,
            arguments_sha256: &self.arguments_sha256,
            decision_id: &self.decision_id,
        })
    }

    pub(crate) fn deny(mut self, envelope: Envelope) -> Self {
        self.decision = Decision::Deny;
        self.error = Some(envelope);
        self
    }
}
