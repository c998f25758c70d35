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

mod approval;
mod budget;
mod call;
mod refusal;
mod verdict;

use budget::Budgeted;
use refusal::Stop;
use verdict::Judged;

use crate::access::TenantScope;
use crate::approvals::ApprovalEvents;
use crate::audit::{Audit, AuditEvent, DecisionAudit};
use crate::clock::Clock;
use crate::decision::AuthorizerConfig;
use crate::decision::outcome::{AuthorizeInput, AuthorizeOutcome, Decision};
use crate::decode::{self, DecodeError};
use crate::entities::EntityKey;
use crate::envelope::{Checked, Envelope, ErrorCode, ExecutorError, RequestError};
use crate::identity::{Caller, Principals};
use crate::metrics::{Metrics, UNKNOWN_TOOL};
use crate::policy::{PolicyEngine, ToolCall};
use crate::ratelimit::{Limited, RateLimits};
use crate::store::Store;
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

/// What a call's decision depends on beyond the call (DESIGN §13): the
/// budgets counting it and its session. Empty for a stateless call.
#[derive(Debug, Default)]
pub(super) struct AcrossCalls {
    pub(super) meters: Vec<crate::budgets::Meter>,
    /// The caller's session, when the call has one and the set reads or
    /// adds to it.
    pub(super) session: Option<SessionNeed>,
}

/// How one call meets its session (DESIGN §13.2).
#[derive(Debug)]
pub(super) struct SessionNeed {
    pub(super) key: String,
    pub(super) uses: crate::budgets::SessionUse,
}

impl AcrossCalls {
    /// Whether the decision needs the store for anything of §13.
    pub(super) fn is_empty(&self) -> bool {
        self.meters.is_empty() && self.session.is_none()
    }
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
            session: None,
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
        let across = Self::across(engine, &hashed, caller)?;
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
            session: None,
        };
        let Budgeted {
            decision,
            seen,
            session,
            charged,
        } = self
            .decide_budgeted(engine, call, &across, &hashed, now, from_store)
            .await?;
        out.budgets = seen;
        out.session = session;
        out.charged = charged;
        Ok(Judged {
            hashed,
            entities,
            approval,
            decision,
            now,
            across,
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
        session: outcome.session.as_ref(),
    }
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
