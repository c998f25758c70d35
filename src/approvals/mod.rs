//! The approval lifecycle (DESIGN §4): what an approval is bound to, its
//! states, how the arguments are shown to a human, and the events hub
//! (`events`); [`machine`] holds the state machine's rules as pure
//! functions, which every store must follow; [`desk`] is the IO side, what
//! approval UIs call.
//!
//! This module and `events` hold rules and data, no IO: the store persists
//! records, the decision pipeline decides when to create them, the desk
//! reads and decides them. An approval is usable only when tenant, subject,
//! tool, risk and arguments hash all match, unexpired and unconsumed.

pub mod desk;
mod events;
pub mod machine;
#[cfg(test)]
mod model_check;

pub use events::{ApprovalEvent, ApprovalEventKind, ApprovalEvents, WatchEnd};

use serde_json::Value;

use crate::clock::UnixMillis;
use crate::tools::Risk;

/// The marker that replaces a `sensitive` value in display arguments.
pub const REDACTED: &str = "[REDACTED]";

/// Where an approval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
    Expired,
}

impl ApprovalStatus {
    /// The stored name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Approved => "APPROVED",
            Self::Rejected => "REJECTED",
            Self::Expired => "EXPIRED",
        }
    }

    /// Parses a stored name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PENDING" => Self::Pending,
            "APPROVED" => Self::Approved,
            "REJECTED" => Self::Rejected,
            "EXPIRED" => Self::Expired,
            _ => return None,
        })
    }
}

/// What a new approval request is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApproval {
    pub approval_id: String,
    pub tenant_id: String,
    pub requester_subject_id: String,
    pub agent_id: String,
    pub tool: String,
    pub tool_version: String,
    pub risk: Risk,
    pub arguments_sha256: String,
    pub display_arguments: String,
    pub request_id: String,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
    /// Why the call needs a human, as the decision saw it.
    pub why: ApprovalWhy,
    /// The caps on PENDING approvals this one must fit under.
    pub limits: PendingLimits,
}

/// Why a call needed a human (DESIGN §14, `Approval.why`): the `@reason` of
/// the forbid an approval lifts, and the budgets (§13.1) the call would
/// exceed, with the figures its decision saw. Fixed when the approval is
/// opened: an approver sees what the decision saw, not today's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalWhy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<BudgetWhy>,
}

/// A budget the call would exceed: `used + this_call > limit`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetWhy {
    pub name: String,
    pub used: i64,
    pub this_call: i64,
    pub limit: i64,
    /// How the budget's integers are shown: 2 shows 62000 as 620.00.
    pub decimals: u8,
    pub window_seconds: u64,
}

impl ApprovalWhy {
    /// The why of a call: `reason`, and of the budgets its decision saw
    /// (`seen`, with their definitions in `budgets`) the ones the call
    /// takes past their limit. A total that overflows is past any limit.
    #[must_use]
    pub fn of_call(
        reason: Option<String>,
        seen: &[crate::budgets::Seen],
        budgets: &crate::budgets::Budgets,
    ) -> Self {
        let budgets = seen
            .iter()
            .filter(|s| s.exceeded())
            .map(|s| {
                let def = budgets.all().iter().find(|b| b.name == s.name);
                BudgetWhy {
                    name: s.name.clone(),
                    used: s.used,
                    this_call: s.this_call,
                    limit: s.limit,
                    decimals: def.map_or(0, |b| b.decimals),
                    window_seconds: def.map_or(0, |b| b.window.as_secs()),
                }
            })
            .collect();
        Self { reason, budgets }
    }

    /// A refund's why past the daily budget: 600.00 used, 20.00 more, of 500.00.
    #[cfg(test)]
    #[must_use]
    pub fn example() -> Self {
        Self {
            reason: Some("the agent's refunds today would exceed 500.00".into()),
            budgets: vec![BudgetWhy {
                name: "refunds_daily".into(),
                used: 60_000,
                this_call: 2_000,
                limit: 50_000,
                decimals: 2,
                window_seconds: 86_400,
            }],
        }
    }

    /// The stored form: a JSON object (`{}` when there is nothing to say).
    #[must_use]
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Reads the stored form.
    ///
    /// # Errors
    /// The text is not a why this version wrote.
    pub fn from_stored(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// The most PENDING, unexpired approvals at once: per (tenant, requester
/// subject) and per tenant (`[decisions]` in `toolgate.toml`), so that a
/// misled model cannot flood approvers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingLimits {
    pub per_subject: u32,
    pub per_tenant: u32,
}

impl Default for PendingLimits {
    fn default() -> Self {
        Self {
            per_subject: 100,
            per_tenant: 1000,
        }
    }
}

/// Which cap on PENDING approvals a new one would exceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingScope {
    Subject,
    Tenant,
}

impl PendingScope {
    /// The stable name, in an envelope's `details.limit`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Subject => "pending_approvals_per_subject",
            Self::Tenant => "pending_approvals_per_tenant",
        }
    }

    /// The scope a count of PENDING approvals exceeds, if any.
    #[must_use]
    pub fn exceeded(limits: PendingLimits, subject: i64, tenant: i64) -> Option<Self> {
        if subject >= i64::from(limits.per_subject) {
            Some(Self::Subject)
        } else if tenant >= i64::from(limits.per_tenant) {
            Some(Self::Tenant)
        } else {
            None
        }
    }
}

/// A stored approval.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ApprovalRecord {
    pub approval_id: String,
    pub tenant_id: String,
    pub requester_subject_id: String,
    pub agent_id: String,
    pub tool: String,
    pub tool_version: String,
    pub risk: Risk,
    pub arguments_sha256: String,
    pub display_arguments: String,
    pub request_id: String,
    pub status: ApprovalStatus,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
    pub decided_by: Option<String>,
    pub decided_at: Option<UnixMillis>,
    pub reason: Option<String>,
    pub consumed_by_idempotency_key: Option<String>,
    /// Why the call needed a human, fixed when the approval was opened.
    pub why: ApprovalWhy,
}

impl ApprovalRecord {
    /// The call the approval is bound to, as its audit event tells it.
    #[must_use]
    pub fn audited(&self) -> crate::audit::ApprovedCall<'_> {
        crate::audit::ApprovedCall {
            requester_subject_id: &self.requester_subject_id,
            agent_id: &self.agent_id,
            tool: &self.tool,
            tool_version: &self.tool_version,
            request_id: &self.request_id,
            arguments_sha256: &self.arguments_sha256,
        }
    }

    /// The approval as the policy's two questions on it see it.
    #[must_use]
    pub fn subject(&self) -> crate::policy::ApprovalSubject<'_> {
        crate::policy::ApprovalSubject {
            approval_id: &self.approval_id,
            tenant_id: &self.tenant_id,
            tool: &self.tool,
            risk: self.risk,
            requester_subject_id: &self.requester_subject_id,
        }
    }
}

/// The result of trying to consume an approval for one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApprovalUse {
    /// Now bound to this idempotency key (or already was: a retry).
    /// `first` is true for the call that consumed it.
    Consumed { first: bool },
    /// Already consumed by another idempotency key.
    ConsumedByOther,
    /// No longer approved and unexpired.
    NotUsable,
}

/// What a gateway call that names no approval finds (DESIGN §11.3): the
/// approvals bound to its call minus the request id, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayApproval {
    /// An APPROVED, unexpired approval, now bound to the call's idempotency
    /// key (`first`: the oldest unconsumed one), or already bound to it (a
    /// retry of the same operation). The record shows the binding.
    Consumed { record: ApprovalRecord, first: bool },
    /// A PENDING, unexpired one (the oldest): the call waits for it.
    Pending(ApprovalRecord),
    /// The latest one was REJECTED and has not expired.
    Rejected(ApprovalRecord),
    /// None of those: a new PENDING approval, created from the request.
    Requested(ApprovalRecord),
}

/// A human's decision, to record on a PENDING approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalDecision {
    pub approve: bool,
    pub decided_by: String,
    pub reason: String,
    pub decided_at: UnixMillis,
    /// When an approved one stops being usable (the contract's TTL from now).
    pub approved_expires_at: UnixMillis,
}

/// What recording a decision did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideOutcome {
    Decided(ApprovalRecord),
    /// Somebody decided first (or it expired): the first decision wins.
    AlreadyDecided(ApprovalRecord),
    NotFound,
}

/// The canonical arguments with every `sensitive` pointer's value replaced
/// by [`REDACTED`]. Pointers that resolve to nothing are ignored.
#[must_use]
pub fn display_arguments(arguments: &Value, sensitive: &[String]) -> String {
    let mut shown = arguments.clone();
    for pointer in sensitive {
        if let Some(v) = shown.pointer_mut(pointer) {
            *v = Value::String(REDACTED.to_owned());
        }
    }
    // Shown in canonical form, like the arguments the hash was taken of.
    crate::decode::canonical_json(&shown).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sensitive_pointers_are_redacted() {
        let args = json!({"card": {"number": "4111"}, "note": "hi", "list": ["a", "b"]});
        let shown = display_arguments(
            &args,
            &["/card/number".into(), "/list/1".into(), "/absent".into()],
        );
        assert_eq!(
            shown,
            r#"{"card":{"number":"[REDACTED]"},"list":["a","[REDACTED]"],"note":"hi"}"#
        );
    }
}
