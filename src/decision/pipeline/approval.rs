//! The approval stage: the approval a call presents checked against the
//! whole call (DESIGN §4, the gateway's binding §11.3), the PENDING one
//! opened or found for APPROVAL_REQUIRED, and the gateway's approval found
//! by the call minus its request id; with the envelopes each answer gives.

use super::budget::Budgeted;
use super::refusal::{self, Stop, approval_envelope, used_at_gateway};
use super::{AcrossCalls, Hashed, ToolCallAuthorizer};
use crate::approvals::machine::{self, Refusal};
use crate::approvals::{self, ApprovalEventKind, ApprovalRecord, NewApproval};
use crate::clock::UnixMillis;
use crate::decision::outcome::{AuthorizeInput, AuthorizeOutcome, Decision, Door};
use crate::envelope::{Envelope, ErrorCode, echo};
use crate::identity::Caller;
use crate::policy::{PolicyDecision, PolicyEngine, ToolCall};
use crate::store::{GatewayApproval, StoreError};

impl ToolCallAuthorizer {
    /// A presented approval, which must be bound to exactly this call.
    pub(super) async fn presented_approval(
        &self,
        input: &AuthorizeInput,
        caller: &Caller,
        hashed: &Hashed<'_>,
        now: UnixMillis,
    ) -> Result<Option<ApprovalRecord>, Stop> {
        if input.approval_id.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.check_approval(input, caller, hashed, now).await?))
    }

    /// A PENDING approval for this call, as it would be requested now.
    pub(super) fn new_approval(
        &self,
        input: &AuthorizeInput,
        caller: &Caller,
        h: &Hashed<'_>,
        why: approvals::ApprovalWhy,
        now: UnixMillis,
    ) -> NewApproval {
        let ttl = i64::try_from(self.config.pending_approval_ttl.as_millis()).unwrap_or(i64::MAX);
        NewApproval {
            approval_id: uuid::Uuid::now_v7().to_string(),
            tenant_id: caller.tenant_id.clone(),
            requester_subject_id: caller.subject_id.clone(),
            agent_id: caller.agent_id.clone(),
            tool: h.tool.name.clone(),
            tool_version: h.tool.version.clone(),
            risk: h.tool.risk,
            arguments_sha256: h.sha.clone(),
            display_arguments: approvals::display_arguments(&h.args, &h.tool.sensitive),
            request_id: input.request_id.clone(),
            created_at: now,
            expires_at: now.saturating_add(ttl),
            why,
            limits: self.config.pending_limits,
        }
    }

    /// APPROVAL_REQUIRED with `record`, the approval this call waits for
    /// (announced when this call `created` it).
    pub(super) fn approval_requested(
        &self,
        mut out: AuthorizeOutcome,
        record: ApprovalRecord,
        created: bool,
    ) -> AuthorizeOutcome {
        if created {
            self.events
                .publish(ApprovalEventKind::Created, &record, None);
        }
        out.decision = Decision::ApprovalRequired;
        out.error = Some(
            Envelope::new(
                ErrorCode::ApprovalRequired,
                "this call needs a human approval; it was requested",
            )
            .with("approval_id", record.approval_id.clone())
            .with("expires_at_ms", record.expires_at),
        );
        out.approval = Some((record.approval_id, record.expires_at));
        out
    }

    /// Why no approval could be requested.
    pub(super) fn approval_not_requested(&self, e: &StoreError) -> Envelope {
        match e {
            // Nothing was requested: the caller may retry once approvers
            // have decided some of the pending ones.
            StoreError::PendingLimit(scope) => Envelope::new(
                ErrorCode::RateLimited,
                "too many approvals are pending; retry after some are decided",
            )
            .with("limit", scope.as_str()),
            e => self.store_failure(e),
        }
    }

    /// A gateway call that needs an approval and names none (DESIGN §11.3):
    /// the store finds the approval of this call minus its request id, and
    /// consumes it when it is approved; `call` is the Cedar request that
    /// was allowed only with an approval.
    pub(super) async fn gateway_approval(
        &self,
        mut out: AuthorizeOutcome,
        engine: &PolicyEngine,
        call: ToolCall<'_>,
        new: NewApproval,
        (hashed, across, from_store): (&Hashed<'_>, &AcrossCalls, bool),
        now: UnixMillis,
    ) -> AuthorizeOutcome {
        let idempotency_key = hashed.key.as_str();
        // The policies that allow the call once approved, as for an
        // executor presenting its approval; decided before anything is
        // consumed (the same policy set said so a moment ago, on the same
        // budgets).
        let seen = out.budgets.clone();
        let session = out.session.clone();
        let approved = ToolCall {
            approved: true,
            budgets: &seen,
            session: session.as_ref(),
            ..call
        };
        let allowed_by = match engine.decide_tool_call(&approved) {
            Ok(PolicyDecision::Allow { policies }) => policies,
            other => {
                tracing::error!(decision = ?other, tool = %call.tool.name, "an approval-required call is not allowed once approved: denied (fail closed)");
                return out.deny(Envelope::new(
                    ErrorCode::PolicyError,
                    "a policy could not be evaluated; the call is denied",
                ));
            }
        };
        let found = match self
            .store
            .approval_for_gateway_call(new, idempotency_key, now)
            .await
        {
            Ok(found) => found,
            Err(e) => return out.deny(self.approval_not_requested(&e)),
        };
        match found {
            GatewayApproval::Consumed {
                record,
                first: true,
            } => {
                self.events
                    .publish(ApprovalEventKind::Consumed, &record, Some(idempotency_key));
                out.approval = Some((record.approval_id, record.expires_at));
                // The approved call is charged when allowed, on the
                // budgets as they stand now.
                let allowed_by = if across.is_empty() {
                    allowed_by
                } else {
                    let approved = ToolCall {
                        budgets: &[],
                        session: None,
                        ..approved
                    };
                    match self
                        .decide_budgeted(engine, approved, across, hashed, now, from_store)
                        .await
                    {
                        Ok(Budgeted {
                            decision: PolicyDecision::Allow { policies },
                            seen,
                            session,
                            charged,
                        }) => {
                            out.budgets = seen;
                            out.session = session;
                            out.charged = charged;
                            policies
                        }
                        Ok(other) => {
                            out.budgets = other.seen;
                            out.session = other.session;
                            return out.deny(refusal::not_allowed_once_approved(other.decision));
                        }
                        Err(Stop::Deny(envelope)) => return out.deny(envelope),
                        Err(Stop::Executor(e)) => {
                            return out
                                .deny(Envelope::new(ErrorCode::InternalError, e.to_string()));
                        }
                    }
                };
                out.policies = allowed_by;
                out.decision = Decision::Allow;
                out
            }
            // This key already used it: at a gateway an approval allows
            // exactly one request, a repeat of the same key included
            // (DESIGN §11.3); the upstream deduplicates its own retries
            // with `toolgate-idempotency-key`.
            GatewayApproval::Consumed {
                record,
                first: false,
            } => {
                out.approval = Some((record.approval_id.clone(), record.expires_at));
                out.deny(used_at_gateway(&record))
            }
            GatewayApproval::Pending(record) => {
                let envelope = approval_envelope(ErrorCode::ApprovalPending, &record)
                    .with("expires_at_ms", record.expires_at);
                out.approval = Some((record.approval_id, record.expires_at));
                out.deny(envelope)
            }
            GatewayApproval::Rejected(record) => {
                let mut envelope = approval_envelope(ErrorCode::ApprovalRejected, &record);
                if let Some(reason) = record.reason.as_deref().and_then(approver_reason) {
                    envelope = envelope.with("approver_reason", reason);
                }
                out.approval = Some((record.approval_id, record.expires_at));
                out.deny(envelope)
            }
            GatewayApproval::Requested(record) => self.approval_requested(out, record, true),
        }
    }

    /// The approval `input` names, if it is usable by this call: bound to
    /// the whole call (DESIGN §4), or for a gateway call to the whole call
    /// but its request id (§11.3).
    pub(super) async fn check_approval(
        &self,
        input: &AuthorizeInput,
        caller: &Caller,
        h: &Hashed<'_>,
        now: UnixMillis,
    ) -> Result<ApprovalRecord, Envelope> {
        let approval_id = input.approval_id.as_str();
        let record = match self
            .store
            .get_approval(&caller.tenant_id, approval_id)
            .await
        {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Err(
                    Envelope::new(ErrorCode::ApprovalNotFound, "no such approval")
                        .with("approval_id", echo(approval_id)),
                );
            }
            Err(e) => return Err(self.store_failure(&e)),
        };
        // The gateway's binding leaves the request id out (DESIGN §11.3).
        let call = machine::Call {
            tenant_id: &caller.tenant_id,
            requester_subject_id: &caller.subject_id,
            tool: &h.tool.name,
            tool_version: &h.tool.version,
            risk: h.tool.risk,
            arguments_sha256: &h.sha,
            request_id: match input.door {
                Door::Executor => Some(&input.request_id),
                Door::Gateway => None,
            },
        };
        match machine::check_use(&record, &call, &h.key, now) {
            Ok(()) => Ok(record),
            Err(refusal) => Err(approval_envelope(refused_code(refusal), &record)),
        }
    }
}

/// The code a presented approval's refusal is answered with.
pub(super) fn refused_code(refusal: Refusal) -> ErrorCode {
    match refusal {
        Refusal::Mismatch => ErrorCode::ApprovalMismatch,
        Refusal::Pending => ErrorCode::ApprovalPending,
        Refusal::Expired => ErrorCode::ApprovalExpired,
        Refusal::Rejected => ErrorCode::ApprovalRejected,
        Refusal::ConsumedByOther => ErrorCode::ApprovalConsumed,
    }
}

/// The longest approver's reason shown to the model, in characters.
const MAX_APPROVER_REASON: usize = 200;

/// An approver's reason as the model may read it (`details.approver_reason`
/// of `approval_rejected` through a gateway, DESIGN §11.3): text a human
/// wrote for the requester, so it is cut to [`MAX_APPROVER_REASON`]
/// characters (marked by `…`), its control characters (line breaks
/// included) become spaces, and it travels as one JSON string inside the
/// envelope, never as instructions of its own. `None` when nothing is left.
pub(super) fn approver_reason(reason: &str) -> Option<String> {
    let flat: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let flat = flat.trim();
    if flat.is_empty() {
        return None;
    }
    if flat.chars().count() <= MAX_APPROVER_REASON {
        return Some(flat.to_owned());
    }
    let mut cut: String = flat.chars().take(MAX_APPROVER_REASON).collect();
    cut.push('…');
    Some(cut)
}

#[cfg(test)]
mod tests {
    use super::{MAX_APPROVER_REASON, approver_reason};

    #[test]
    pub(super) fn an_approvers_reason_is_one_bounded_line_or_nothing() {
        assert_eq!(approver_reason(""), None);
        assert_eq!(approver_reason(" \n\t\r "), None);
        assert_eq!(
            approver_reason("  no:\r\nopen a ticket\u{1b}[31m  ").as_deref(),
            Some("no:  open a ticket [31m")
        );
        let exact = "é".repeat(MAX_APPROVER_REASON);
        assert_eq!(approver_reason(&exact).as_deref(), Some(exact.as_str()));
        let long = format!("{exact}z");
        assert_eq!(
            approver_reason(&long),
            Some(format!("{exact}…")),
            "cut at {MAX_APPROVER_REASON} characters, not bytes"
        );
    }
}
