//! The decision pipeline (DESIGN §2): raw bytes in, one decision out.
//!
//! [`ToolCallAuthorizer`] is the one home of the order of the checks. Each
//! step's rules live in its own module (decode, tools, policy, approvals);
//! this module only sequences them and turns their failures into envelopes.
//! It knows nothing of gRPC.
//!
//! Invariant: fail closed. Every error on the way ends in a deny with an
//! envelope or an executor error, never in an allow.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use serde_json::Value;

mod budget;
mod call;
mod refusal;
mod verdict;

use budget::Budgeted;
use refusal::Stop;
use verdict::Judged;

use crate::access::TenantScope;
use crate::approvals::machine::{self, Refusal};
use crate::approvals::{self, ApprovalEventKind, ApprovalEvents, ApprovalRecord, NewApproval};
use crate::audit::{Audit, AuditEvent, DecisionAudit};
use crate::budgets::Meter;
use crate::clock::{Clock, UnixMillis};
use crate::decision::AuthorizerConfig;
use crate::decision::outcome::{AuthorizeInput, AuthorizeOutcome, Decision, Door};
use crate::decode::{self, DecodeError};
use crate::entities::EntityKey;
use crate::envelope::{Checked, Envelope, ErrorCode, ExecutorError, RequestError, echo};
use crate::identity::{Caller, Principals};
use crate::metrics::{Metrics, UNKNOWN_TOOL};
use crate::policy::{PolicyDecision, PolicyEngine, ToolCall};
use crate::ratelimit::{Limited, RateLimits};
use crate::store::{GatewayApproval, Store, StoreError};
use crate::tools::{Risk, ToolContract};

/// Everything a [`ToolCallAuthorizer`] needs; none of it has a default, so
/// a wiring that forgets the audit log or the metrics does not compile.
#[derive(Debug)]
pub(crate) struct AuthorizerParts {
    pub engine: Arc<ArcSwap<PolicyEngine>>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: AuthorizerConfig,
    /// Announces created and consumed approvals.
    pub events: Arc<ApprovalEvents>,
    /// Records every decision (fail closed when it cannot).
    pub audit: Arc<Audit>,
    /// Counts decisions, rate limits and store errors.
    pub metrics: Arc<Metrics>,
    /// Per-tenant and per-tool rate limits.
    pub limits: Arc<RateLimits>,
    /// Who each call runs as.
    pub principals: Principals,
}

/// The orchestrator of one decision.
#[derive(Debug)]
pub struct ToolCallAuthorizer {
    engine: Arc<ArcSwap<PolicyEngine>>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: AuthorizerConfig,
    events: Arc<ApprovalEvents>,
    audit: Arc<Audit>,
    metrics: Arc<Metrics>,
    limits: Arc<RateLimits>,
    principals: Principals,
}

/// A call past the executor's own mistakes ([`ToolCallAuthorizer::admit`]).
struct Admitted {
    principal: Checked<Caller>,
    /// `entities_json` decoded, when the caller gave it.
    entities: Option<Value>,
}

/// The tools a principal could be allowed to call, and the policy set that said so.
#[derive(Debug, Clone)]
pub struct CallableTools {
    /// In name order.
    pub tools: Vec<Arc<ToolContract>>,
    pub policy_version: String,
}

/// What the pipeline knows of a call after hashing: shared by every answer from there on.
struct Hashed<'a> {
    tool: &'a ToolContract,
    args: Value,
    normalized: String,
    sha: String,
    key: String,
    conflict_key: String,
}

impl ToolCallAuthorizer {
    /// An authorizer wired as production wires it (see
    /// [`crate::server::build`], its one caller outside unit tests).
    #[must_use]
    pub(crate) fn new(parts: AuthorizerParts) -> Self {
        let AuthorizerParts {
            engine,
            store,
            clock,
            config,
            events,
            audit,
            metrics,
            limits,
            principals,
        } = parts;
        Self {
            engine,
            store,
            clock,
            config,
            events,
            audit,
            metrics,
            limits,
            principals,
        }
    }

    /// The policy engine now live.
    #[must_use]
    pub fn engine(&self) -> Arc<PolicyEngine> {
        self.engine.load_full()
    }

    /// The pipeline's settings.
    pub(in crate::decision) const fn config(&self) -> &AuthorizerConfig {
        &self.config
    }

    /// Decides one call.
    ///
    /// # Errors
    /// [`RequestError::Invalid`] when the executor's own request is
    /// malformed (no auth context, no tool, no `request_id` for a
    /// side-effecting tool, malformed entity JSON);
    /// [`RequestError::TenantNotGranted`] when the call would run as a
    /// tenant outside `input.tenants` (nothing is decided, audited or
    /// stored). Everything about the model's call is an [`AuthorizeOutcome`].
    pub async fn authorize(
        &self,
        input: &AuthorizeInput,
    ) -> Result<AuthorizeOutcome, RequestError> {
        let started = Instant::now();
        let mut outcome = self.evaluate(input).await?;
        let event = AuditEvent::decision(&audited(input, &outcome), started.elapsed());
        if self.audit.record(event).await.is_err() {
            // Fail closed: no decision leaves unaudited. Nothing ran, and a
            // consumed approval stays usable by this same key; what this
            // decision charged is released.
            if outcome.charged
                && let Some(caller) = &outcome.principal
            {
                self.uncharge(caller, &outcome.idempotency_key, self.clock.now_ms())
                    .await;
                outcome.charged = false;
            }
            outcome = outcome.deny(Envelope::new(
                ErrorCode::InternalError,
                "the decision could not be recorded; retry with the same key",
            ));
        }
        let tool = if self.engine.load().tools().get(&input.tool).is_some() {
            input.tool.as_str()
        } else {
            UNKNOWN_TOOL
        };
        self.metrics.decision(
            tool,
            outcome.decision.as_str(),
            outcome.error.as_ref().map_or("", |e| e.code.as_str()),
            started.elapsed(),
        );
        Ok(outcome)
    }

    /// The principal of a call (see [`Principals`]), once it is known to be
    /// of a tenant the caller may act for.
    fn principal(&self, input: &AuthorizeInput) -> Result<Checked<Caller>, RequestError> {
        self.principals.resolve_within(
            input.caller.as_ref(),
            &input.identity_token,
            self.clock.now_ms(),
            &input.tenants,
        )
    }

    /// The tools a principal could be allowed to call under the live policy
    /// set (DESIGN §11.4), in name order: the principal established and its
    /// tenant checked exactly as for [`Self::authorize`] (the auth context,
    /// or the verified identity token when the deployment requires one;
    /// its tenant one of `tenants`). A tool is left out only when every
    /// call of it would be denied for this principal; a tool whose calls
    /// need an approval is in. Nothing is decided, counted or audited.
    ///
    /// [`Checked::Refused`] is `unauthorized` (the principal could not be
    /// established, `details.reason` says why) or `internal_error` (the
    /// policy set could not answer; a bug).
    ///
    /// # Errors
    /// [`RequestError::Invalid`] without an auth context (or, where tokens
    /// are not required, one naming no subject or tenant);
    /// [`RequestError::TenantNotGranted`] for a principal of a tenant
    /// outside `tenants`.
    pub fn callable_tools(
        &self,
        caller: Option<&Caller>,
        identity_token: &str,
        tenants: &TenantScope,
    ) -> Result<Checked<CallableTools>, RequestError> {
        let engine = self.engine.load_full();
        let caller = match self.principals.resolve_within(
            caller,
            identity_token,
            self.clock.now_ms(),
            tenants,
        )? {
            Checked::Passed(caller) => caller,
            Checked::Refused(envelope) => return Ok(Checked::Refused(envelope)),
        };
        Ok(match engine.callable_tools(&caller) {
            Ok(tools) => Checked::Passed(CallableTools {
                tools,
                policy_version: engine.version().to_owned(),
            }),
            Err(e) => {
                tracing::error!(
                    kind = e.kind(),
                    "cannot compute the tools a principal may call"
                );
                Checked::Refused(Envelope::new(
                    ErrorCode::InternalError,
                    "the tools this caller may call could not be computed",
                ))
            }
        })
    }

    /// Every executor error [`Self::authorize`] could answer for `input`,
    /// checked before anything of it is decided (`BatchAuthorize` checks
    /// every entry first, so a bad entry refuses the batch with no approval
    /// created and no execution begun): the auth context and the tenant
    /// grant, the tool name, `entities_json`, and a `request_id` for a
    /// side-effecting tool of the current policy set. Pure: nothing is
    /// counted, stored or audited.
    ///
    /// # Errors
    /// The [`RequestError`] naming the first failed check.
    pub fn precheck(&self, input: &AuthorizeInput) -> Result<(), RequestError> {
        // As in `decide`, only a call with a principal gets further.
        let Admitted {
            principal: Checked::Passed(_),
            ..
        } = self.admit(input)?
        else {
            return Ok(());
        };
        if let Some(tool) = self.engine.load().tools().get(&input.tool)
            && tool.risk != Risk::Read
            && input.request_id.is_empty()
        {
            return Err(request_id_required(tool).into());
        }
        Ok(())
    }

    /// The executor's own mistakes, checked first by [`Self::precheck`] and
    /// by every decision alike: the auth context and the tenant grant (the
    /// principal, or the refusal that answers the call), a tool name, and
    /// `entities_json` decoded.
    fn admit(&self, input: &AuthorizeInput) -> Result<Admitted, RequestError> {
        let principal = self.principal(input)?;
        if input.tool.is_empty() {
            return Err(ExecutorError::new("tool", "must not be empty").into());
        }
        let entities = parse_entities(&input.entities_json, &self.config.entity_limits)?;
        Ok(Admitted {
            principal,
            entities,
        })
    }

    /// The pipeline itself.
    async fn evaluate(&self, input: &AuthorizeInput) -> Result<AuthorizeOutcome, RequestError> {
        // The whole decision runs on one policy set, even across a reload.
        let engine = self.engine.load_full();
        let Admitted {
            principal,
            entities,
        } = self.admit(input)?;
        let out = AuthorizeOutcome {
            decision: Decision::Deny,
            decision_id: uuid::Uuid::now_v7().to_string(),
            call_id: input.call_id.clone(),
            normalized_arguments: String::new(),
            arguments_sha256: String::new(),
            idempotency_key: String::new(),
            conflict_key: String::new(),
            risk: None,
            timeout_ms: 0,
            parallel: false,
            idempotent: false,
            approval: None,
            error: None,
            policy_version: engine.version().to_owned(),
            tool_version: String::new(),
            policies: Vec::new(),
            principal: None,
            budgets: Vec::new(),
            charged: false,
        };
        let caller = match principal {
            Checked::Passed(c) => c,
            Checked::Refused(envelope) => return Ok(out.deny(envelope)),
        };
        let mut out = self.decide(input, &engine, &caller, entities, out).await?;
        out.principal = Some(caller);
        Ok(out)
    }

    /// One call through the stages, in DESIGN §2's order: the call (decoded,
    /// looked up, validated, hashed, timed), its entities, the approval it
    /// presents, Cedar, then the verdict (the store step an answer needs).
    /// A stage that refuses ends it: a deny with its envelope, or an
    /// executor error. A new stage goes where its check belongs in that
    /// order, as one method returning `Result<_, Stop>`.
    async fn decide(
        &self,
        input: &AuthorizeInput,
        engine: &PolicyEngine,
        caller: &Caller,
        entities: Option<Value>,
        mut out: AuthorizeOutcome,
    ) -> Result<AuthorizeOutcome, ExecutorError> {
        match self.judge(input, engine, caller, entities, &mut out).await {
            Ok(judged) => Ok(self.verdict(input, engine, caller, judged, out).await),
            Err(Stop::Deny(envelope)) => Ok(out.deny(envelope)),
            Err(Stop::Executor(e)) => Err(e),
        }
    }

    /// Every stage up to and including Cedar's answer.
    async fn judge<'e>(
        &self,
        input: &AuthorizeInput,
        engine: &'e PolicyEngine,
        caller: &Caller,
        entities: Option<Value>,
        out: &mut AuthorizeOutcome,
    ) -> Result<Judged<'e>, Stop> {
        let hashed = self.the_call(input, engine, caller, out)?;
        let meters = Self::meters(engine, &hashed, caller)?;
        let from_store = entities.is_none();
        let entities = self
            .entities_of(hashed.tool, &hashed.args, caller, entities)
            .await?;
        let now = self.clock.now_ms();
        let approval = self.presented_approval(input, caller, &hashed, now).await?;
        let call = ToolCall {
            caller,
            tool: hashed.tool,
            arguments: &hashed.args,
            entities: entities.as_ref(),
            approved: approval.is_some(),
            budgets: &[],
        };
        let Budgeted {
            decision,
            seen,
            charged,
        } = self
            .decide_budgeted(engine, call, &meters, &hashed, now, from_store)
            .await?;
        out.budgets = seen;
        out.charged = charged;
        Ok(Judged {
            hashed,
            entities,
            approval,
            decision,
            now,
            meters,
            from_store,
        })
    }

    /// The entities: the caller's when it gave any (even `[]`), else the
    /// resource and its ancestors from the tenant's rows of the entity
    /// store (DESIGN §11.6), in one read.
    async fn entities_of(
        &self,
        tool: &ToolContract,
        args: &Value,
        caller: &Caller,
        given: Option<Value>,
    ) -> Result<Option<Value>, Stop> {
        match given {
            Some(given) => Ok(Some(given)),
            None => Ok(self.stored_entities(tool, args, caller).await?),
        }
    }

    /// A presented approval, which must be bound to exactly this call.
    async fn presented_approval(
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

    /// The stored resource of a call and its stored ancestors, as a Cedar
    /// entity JSON array: `None` for a tool without a resource (its
    /// `Tool` entity is static) or when nothing is stored. One store read.
    async fn stored_entities(
        &self,
        tool: &ToolContract,
        args: &Value,
        caller: &Caller,
    ) -> Result<Option<Value>, Envelope> {
        let (Some(resource), Some(id)) = (&tool.resource, tool.resource_id(args)) else {
            return Ok(None);
        };
        let root = EntityKey::new(resource.entity_type.clone(), id);
        let walk = self
            .store
            .walk_entities(&caller.tenant_id, root, self.config.entity_store.max_walk)
            .await
            .map_err(|e| self.store_failure(&e))?;
        if walk.exceeded {
            // An incomplete hierarchy could hide an ancestor a forbid names.
            return Err(Envelope::new(
                ErrorCode::PolicyError,
                "the resource has more stored ancestors than a decision reads; the call is denied",
            )
            .with("reason", "entity_walk_exceeded"));
        }
        if walk.found.is_empty() {
            return Ok(None);
        }
        let items = walk
            .found
            .iter()
            .map(|json| serde_json::from_str(json))
            .collect::<Result<Vec<Value>, _>>()
            .map_err(|e| {
                tracing::error!(error = %e, "a stored entity is not JSON");
                Envelope::new(
                    ErrorCode::InternalError,
                    "the stored entities could not be read",
                )
            })?;
        Ok(Some(Value::Array(items)))
    }

    /// `min(tool timeout, time left − margin)`, or `None` when no time is left.
    fn budget(&self, tool: &ToolContract, deadline: Option<Instant>) -> Option<u64> {
        let Some(deadline) = deadline else {
            return Some(tool.timeout_ms);
        };
        let left = deadline
            .checked_duration_since(Instant::now())?
            .checked_sub(self.config.deadline_margin)?;
        let left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        (left_ms > 0).then(|| left_ms.min(tool.timeout_ms))
    }

    /// A PENDING approval for this call, as it would be requested now.
    fn new_approval(
        &self,
        input: &AuthorizeInput,
        caller: &Caller,
        h: &Hashed<'_>,
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
            limits: self.config.pending_limits,
        }
    }

    /// APPROVAL_REQUIRED with `record`, the approval this call waits for
    /// (announced when this call `created` it).
    fn approval_requested(
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
    fn approval_not_requested(&self, e: &StoreError) -> Envelope {
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
    async fn gateway_approval(
        &self,
        mut out: AuthorizeOutcome,
        engine: &PolicyEngine,
        call: ToolCall<'_>,
        new: NewApproval,
        (hashed, meters, from_store): (&Hashed<'_>, &[Meter], bool),
        now: UnixMillis,
    ) -> AuthorizeOutcome {
        let idempotency_key = hashed.key.as_str();
        // The policies that allow the call once approved, as for an
        // executor presenting its approval; decided before anything is
        // consumed (the same policy set said so a moment ago, on the same
        // budgets).
        let seen = out.budgets.clone();
        let approved = ToolCall {
            approved: true,
            budgets: &seen,
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
                let allowed_by = if meters.is_empty() {
                    allowed_by
                } else {
                    let approved = ToolCall {
                        budgets: &[],
                        ..approved
                    };
                    match self
                        .decide_budgeted(engine, approved, meters, hashed, now, from_store)
                        .await
                    {
                        Ok(Budgeted {
                            decision: PolicyDecision::Allow { policies },
                            seen,
                            charged,
                        }) => {
                            out.budgets = seen;
                            out.charged = charged;
                            policies
                        }
                        Ok(Budgeted { decision, seen, .. }) => {
                            out.budgets = seen;
                            return out.deny(refusal::not_allowed_once_approved(decision));
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
    async fn check_approval(
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

    fn rate_limited(&self, limited: Limited) -> Envelope {
        self.metrics.rate_limited(limited.scope.as_str());
        // Rounded up: retrying at the stated time must not be refused again.
        let ms = limited.retry_after.as_micros().div_ceil(1000);
        Envelope::new(
            ErrorCode::RateLimited,
            format!(
                "too many calls for this {}; retry later",
                limited.scope.as_str()
            ),
        )
        .with("scope", limited.scope.as_str())
        .with("retry_after_ms", u64::try_from(ms).unwrap_or(u64::MAX))
    }

    fn store_failure(&self, e: &crate::store::StoreError) -> Envelope {
        self.metrics.store_error();
        tracing::error!(error = %e, "store failure: denied (fail closed)");
        Envelope::new(
            ErrorCode::InternalError,
            "the decision could not be recorded; retry with the same key",
        )
    }
}

/// What the audit log keeps of a decision: ids, hashes and the verdict.
fn audited<'a>(input: &'a AuthorizeInput, outcome: &'a AuthorizeOutcome) -> DecisionAudit<'a> {
    DecisionAudit {
        decision_id: &outcome.decision_id,
        request_id: &input.request_id,
        call_id: &input.call_id,
        tool: &input.tool,
        tool_version: &outcome.tool_version,
        policy_version: &outcome.policy_version,
        principal: outcome.principal.as_ref(),
        peer: &input.peer,
        idempotency_key: &outcome.idempotency_key,
        arguments_sha256: &outcome.arguments_sha256,
        decision: outcome.decision.as_str(),
        code: outcome.error.as_ref().map_or("", |e| e.code.as_str()),
        policies: &outcome.policies,
        approval_created: outcome.approval.as_ref().map(|a| a.0.as_str()),
        approval_presented: &input.approval_id,
        door: input.door.as_str(),
        action: &input.action,
        budgets: &outcome.budgets,
        charged: outcome.charged,
    }
}

/// The code a presented approval's refusal is answered with.
fn refused_code(refusal: Refusal) -> ErrorCode {
    match refusal {
        Refusal::Mismatch => ErrorCode::ApprovalMismatch,
        Refusal::Pending => ErrorCode::ApprovalPending,
        Refusal::Expired => ErrorCode::ApprovalExpired,
        Refusal::Rejected => ErrorCode::ApprovalRejected,
        Refusal::ConsumedByOther => ErrorCode::ApprovalConsumed,
    }
}

fn approval_envelope(code: ErrorCode, record: &ApprovalRecord) -> Envelope {
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
fn used_at_gateway(record: &ApprovalRecord) -> Envelope {
    Envelope::new(
        ErrorCode::ApprovalConsumed,
        "the approval allowed one request, which was made; a new approval is needed to run the call again",
    )
    .with("approval_id", record.approval_id.clone())
    .with("reason", "single_use")
}

/// The longest approver's reason shown to the model, in characters.
const MAX_APPROVER_REASON: usize = 200;

/// An approver's reason as the model may read it (`details.approver_reason`
/// of `approval_rejected` through a gateway, DESIGN §11.3): text a human
/// wrote for the requester, so it is cut to [`MAX_APPROVER_REASON`]
/// characters (marked by `…`), its control characters (line breaks
/// included) become spaces, and it travels as one JSON string inside the
/// envelope, never as instructions of its own. `None` when nothing is left.
fn approver_reason(reason: &str) -> Option<String> {
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

/// Canonical form, hashes and keys (DESIGN §2.3).
fn hash<'a>(
    tool: &'a ToolContract,
    args: Value,
    caller: &Caller,
    request_id: &str,
) -> Result<Hashed<'a>, Envelope> {
    let internal = |e: decode::CanonicalError| {
        tracing::error!(error = %e, "canonicalization failed");
        Envelope::new(
            ErrorCode::InternalError,
            "the arguments could not be canonicalized",
        )
    };
    let normalized = decode::canonical_json(&args).map_err(internal)?;
    let sha = decode::sha256_hex(normalized.as_bytes());
    let key = decode::idempotency_key(
        &tool.name,
        request_id,
        &caller.subject_id,
        &caller.tenant_id,
        &normalized,
    );
    let conflict_key = match (&tool.resource, tool.resource_id(&args)) {
        (Some(r), Some(id)) => format!("{}:{}:{}", caller.tenant_id, r.entity_type, id),
        _ => format!("{}:Tool:{}", caller.tenant_id, tool.name),
    };
    Ok(Hashed {
        tool,
        args,
        normalized,
        sha,
        key,
        conflict_key,
    })
}

fn request_id_required(tool: &ToolContract) -> ExecutorError {
    ExecutorError::new(
        "request_id",
        format!(
            "required for tool `{}` (risk `{}`)",
            tool.name,
            tool.risk.as_str()
        ),
    )
}

fn decode_envelope(e: &DecodeError) -> Envelope {
    let code = if e.is_limit() {
        ErrorCode::InvalidArguments
    } else {
        ErrorCode::InvalidJson
    };
    let mut env = Envelope::new(code, e.to_string()).with("reason", e.reason());
    if let Some(p) = e.position() {
        env = env.with("position", p);
    }
    if let DecodeError::DuplicateKey { pointer, .. }
    | DecodeError::NumberOutOfRange { pointer, .. } = e
    {
        env = env.with("pointer", pointer.clone());
    }
    env
}

/// `entities_json` decoded as strictly as the arguments (no duplicate key,
/// size and depth limits): a failure is the executor's mistake, never a
/// decision on one of the duplicates.
fn parse_entities(text: &str, limits: &decode::Limits) -> Result<Option<Value>, ExecutorError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let v = decode::parse_strict(text.as_bytes(), limits)
        .map_err(|e| ExecutorError::new("entities_json", format!("{} ({e})", e.reason())))?;
    if !v.is_array() {
        return Err(ExecutorError::new(
            "entities_json",
            "must be a JSON array of Cedar entities",
        ));
    }
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::{MAX_APPROVER_REASON, approver_reason};

    #[test]
    fn an_approvers_reason_is_one_bounded_line_or_nothing() {
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
