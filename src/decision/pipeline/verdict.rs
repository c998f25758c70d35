//! The verdict stage: Cedar's answer made the call's outcome, with the one
//! store step each answer needs (a presented approval consumed on ALLOW,
//! the PENDING approval found or opened on APPROVAL_REQUIRED).

use serde_json::Value;

use super::refusal::{approval_envelope, used_at_gateway};
use super::refusal::{forbidden, policy_errored};
use super::{AcrossCalls, Hashed, ToolCallAuthorizer};
use crate::approvals::{ApprovalEventKind, ApprovalRecord, ApprovalWhy};
use crate::clock::UnixMillis;
use crate::decision::outcome::{AuthorizeInput, AuthorizeOutcome, Decision, Door};
use crate::envelope::{Envelope, ErrorCode};
use crate::identity::Caller;
use crate::policy::{PolicyDecision, PolicyEngine, ToolCall};
use crate::store::ApprovalUse;

/// What the stages before the verdict learnt of a call.
pub(super) struct Judged<'e> {
    pub(super) hashed: Hashed<'e>,
    pub(super) entities: Option<Value>,
    pub(super) approval: Option<ApprovalRecord>,
    pub(super) decision: PolicyDecision,
    pub(super) now: UnixMillis,
    /// The budgets counting the call and its session (none: stateless).
    pub(super) across: AcrossCalls,
    /// The entities came from the entity store.
    pub(super) from_store: bool,
}

impl ToolCallAuthorizer {
    pub(super) async fn verdict(
        &self,
        input: &AuthorizeInput,
        engine: &PolicyEngine,
        caller: &Caller,
        judged: Judged<'_>,
        mut out: AuthorizeOutcome,
    ) -> AuthorizeOutcome {
        let Judged {
            hashed,
            entities,
            approval,
            decision,
            now,
            across,
            from_store,
        } = judged;
        let tool = hashed.tool;
        match decision {
            PolicyDecision::Allow { policies } => {
                out.policies = policies;
                if let Some(record) = approval
                    && let Err(refused) = self.consume(input, &record, &hashed.key, now).await
                {
                    if out.charged {
                        self.uncharge(caller, &hashed.key, now).await;
                        out.charged = false;
                    }
                    return out.deny(refused);
                }
                out.decision = Decision::Allow;
                out
            }
            PolicyDecision::ApprovalRequired { policies, reason } => {
                out.policies = policies;
                let why = ApprovalWhy::of_call(reason, &out.budgets, engine.budgets());
                let new = self.new_approval(input, caller, &hashed, why, now);
                if input.door == Door::Gateway && input.approval_id.is_empty() {
                    let call = ToolCall {
                        caller,
                        tool,
                        arguments: &hashed.args,
                        entities: entities.as_ref(),
                        approved: false,
                        budgets: &[],
                        session: None,
                    };
                    return self
                        .gateway_approval(
                            out,
                            engine,
                            call,
                            new,
                            (&hashed, &across, from_store),
                            now,
                        )
                        .await;
                }
                match self.store.pending_approval_for_call(new, now).await {
                    Ok((record, created)) => self.approval_requested(out, record, created),
                    Err(e) => out.deny(self.approval_not_requested(&e)),
                }
            }
            PolicyDecision::Deny { policies, reason } => {
                out.policies = policies;
                out.deny(forbidden(reason))
            }
            PolicyDecision::Errored { policies } => {
                tracing::warn!(policies = ?policies, tool = %tool.name, "policy evaluation error: denied (fail closed)");
                out.policies = policies;
                out.deny(policy_errored())
            }
        }
    }

    /// The presented approval consumed by this call's key.
    async fn consume(
        &self,
        input: &AuthorizeInput,
        record: &ApprovalRecord,
        key: &str,
        now: UnixMillis,
    ) -> Result<(), Envelope> {
        match self
            .store
            .consume_approval(&record.tenant_id, &record.approval_id, key, now)
            .await
        {
            Ok(ApprovalUse::Consumed { first: true }) => {
                self.events
                    .publish(ApprovalEventKind::Consumed, record, Some(key));
                Ok(())
            }
            // A retry of the operation that consumed it: the executor's
            // ledger makes it the same execution. At a gateway no ledger
            // stands between the allow and the tool, and the key is the
            // client's, so the approval allowed its one request (DESIGN
            // §11.3).
            Ok(ApprovalUse::Consumed { first: false }) if input.door == Door::Gateway => {
                Err(used_at_gateway(record))
            }
            Ok(ApprovalUse::Consumed { first: false }) => Ok(()),
            Ok(ApprovalUse::ConsumedByOther) => {
                Err(approval_envelope(ErrorCode::ApprovalConsumed, record))
            }
            Ok(ApprovalUse::NotUsable) => {
                Err(approval_envelope(ErrorCode::ApprovalExpired, record))
            }
            Err(e) => Err(self.store_failure(&e)),
        }
    }
}
