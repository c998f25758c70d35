//! Which tools a principal could be allowed to call (DESIGN §11.4): Cedar
//! partial evaluation of each tool's action with the principal known and
//! the resource, the executor's entities and `context.input` (the
//! arguments) unknown.
//!
//! A tool is hidden only when every call of it must be denied for this
//! principal; a residual (an answer that depends on the unknowns) is
//! "could be allowed". The approval-required rule (DESIGN §3.3) is
//! followed: a call is evaluated with `context.approved = false`, and, if
//! that is a definite deny, again with `true`, so a tool whose calls need a
//! human's yes is shown.
//!
//! What is unknown, and why it is sound:
//! - the resource: unknown, of the contract's type (a tool without a
//!   resource has the known `Tool::"<name>"`, as every decision does);
//! - every entity that is not static: the store is partial, so looking up
//!   one the executor (or the entity store) would supply is a residual,
//!   never an error;
//! - `context.input`: unknown as a whole. `scopes`, `risk`, `agent`,
//!   `session` and the principal entity (tenant, roles, member of its
//!   tenant) are what the caller's decisions would see, and the supplied
//!   entities can never change the principal or a static entity.
//!
//! Cedar's partial evaluator (feature `partial-eval`, experimental) is used
//! rather than its type-aware successor (`tpe`), whose requests take a
//! context that is either wholly known or wholly unknown: with the scopes
//! unknown, every scope-gated tool would be shown to everyone.
//!
//! Cost: per policy load, each tool's action, resource and what the
//! policies settle whoever asks (a partial evaluation with the principal,
//! scopes, agent and session unknown too) are computed once, and tools
//! whose answer must be the same for every principal are put in one class
//! (see [`ClassKey`]); a request evaluates one tool of each class that
//! depends on the principal, on one entity store built for it.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use cedar_policy::{
    Context, Decision, Entities, EntityTypeName, EntityUid, PolicyId, Request, RestrictedExpression,
};

use super::PolicyEngine;
use super::parts::{DecideError, principal_entities, uid};
use super::reach::RequestBases;
use super::slice::{PartialEvaluation, PolicySlices, evaluate_partial};
use crate::budgets::Budgets;
use crate::identity::Caller;
use crate::tools::{ToolContract, ToolRegistry};

/// Whether a principal could be allowed to call one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolReach {
    /// Some call of it could be allowed, or answered approval-required.
    Callable,
    /// Every call of it is denied for this principal, whatever the
    /// arguments, the resource and its entities.
    Hidden(HiddenReason),
}

/// Why every call of a tool is denied for a principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HiddenReason {
    /// No permit policy can hold, with or without an approval.
    NoPermit,
    /// These forbid policies hold whatever the call, even with an approval.
    Forbidden { policies: Vec<String> },
    /// These policies fail to evaluate whatever the call: every call is a
    /// `policy_error` (fail closed).
    Errors { policies: Vec<String> },
}

/// What partial evaluation settled about one tool.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The same for every value of the unknowns.
    Settled(ToolReach),
    /// Depends on the unknowns.
    Open,
}

/// Who asks: one caller, or anyone (at load, to settle what does not
/// depend on the principal).
#[derive(Clone, Copy)]
enum Who<'a> {
    Anyone,
    Caller(&'a Caller, &'a EntityUid),
}

/// The resource of a tool's requests.
#[derive(Debug)]
enum Resource {
    /// `Tool::"<name>"`, for a tool without a resource.
    Known(EntityUid),
    /// Unknown, of the contract's resource type.
    OfType(EntityTypeName),
}

/// One tool, ready to be asked about.
#[derive(Debug)]
pub(super) struct ToolQuery {
    pub(super) tool: Arc<ToolContract>,
    action: EntityUid,
    resource: Resource,
    /// Whether a budget counts the tool: its context then has `budgets`,
    /// unknown here (a call over a budget may still be approved).
    budgeted: bool,
    /// `Some(shown)` when the policies settle it whoever asks.
    pub(super) settled: Option<bool>,
    /// Its class: tools of one class get the same answer for every caller.
    pub(super) class: usize,
}

/// What makes two tools' requests evaluate alike: the same slice (the same
/// policies, every one's scope true for both actions), the same resource
/// type (unknown in both), the same `context.risk`, and no policy of the
/// slice reading `action` in its conditions. Two such requests differ only
/// in the action's uid, which nothing then observes: the principal, the
/// context (its `input` unknown in both) and the entities are the same, so
/// the partial evaluations are the same, residuals and errors included.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ClassKey {
    policies: Vec<String>,
    resource_type: String,
    risk: &'static str,
    /// The budgets that count the tool (its context's `budgets`).
    budgets: Vec<String>,
}

/// Whether a policy's conditions read the `action` variable (its scope was
/// already resolved into the slices). A policy that cannot be written out
/// counts as reading it.
fn reads_action(policy: &cedar_policy::Policy) -> bool {
    fn mentions(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(map) => {
                map.get("Var").and_then(serde_json::Value::as_str) == Some("action")
                    || map.values().any(mentions)
            }
            serde_json::Value::Array(items) => items.iter().any(mentions),
            _ => false,
        }
    }
    policy
        .to_json()
        .map_or(true, |est| est.get("conditions").is_none_or(mentions))
}

/// Per policy load: every tool's query, in name order.
#[derive(Debug)]
pub(super) struct CallableIndex {
    pub(super) tools: Vec<ToolQuery>,
    /// How many classes the tools fall into.
    classes: usize,
}

impl CallableIndex {
    /// The queries of every tool in `tools`, and what the policies settle
    /// about each whoever asks.
    ///
    /// # Errors
    /// [`DecideError::Request`] if a request cannot be built (a bug: the
    /// names come from a loaded schema).
    pub(super) fn build(
        tools: &ToolRegistry,
        budgets: &Budgets,
        policies: &PolicySlices,
        entities: &RequestBases,
    ) -> Result<Self, DecideError> {
        let anyone = entities.all().clone().partial();
        let mut queries: Vec<ToolQuery> = Vec::new();
        // Each class's number and what the policies settle for it.
        let mut classes: HashMap<ClassKey, (usize, Option<bool>)> = HashMap::new();
        let mut count = 0;
        // Written out once per policy, not once per tool of its slice.
        let reading: HashSet<&PolicyId> = policies
            .full()
            .policies()
            .filter(|p| reads_action(p))
            .map(cedar_policy::Policy::id)
            .collect();
        for tool in tools.iter().filter_map(|t| tools.get(&t.name)) {
            let action = uid("Action", &tool.name)?;
            let slice = policies.for_action(&action);
            let counting = budgets.of_tool(&tool.name);
            let key = match &tool.resource {
                Some(r) if !slice.policies().any(|p| reading.contains(p.id())) => {
                    let mut ids: Vec<String> =
                        slice.policies().map(|p| p.id().to_string()).collect();
                    ids.sort();
                    Some(ClassKey {
                        policies: ids,
                        resource_type: r.entity_type.clone(),
                        risk: tool.risk.as_str(),
                        budgets: counting.iter().map(|b| b.name.clone()).collect(),
                    })
                }
                _ => None,
            };
            let resource = match &tool.resource {
                Some(r) => Resource::OfType(
                    EntityTypeName::from_str(&r.entity_type).map_err(DecideError::request)?,
                ),
                None => Resource::Known(uid("Tool", &tool.name)?),
            };
            let mut query = ToolQuery {
                tool: Arc::clone(tool),
                action,
                resource,
                budgeted: !counting.is_empty(),
                settled: None,
                class: count,
            };
            if let Some((class, settled)) = key.as_ref().and_then(|k| classes.get(k)) {
                query.class = *class;
                query.settled = *settled;
            } else {
                query.settled = match query.verdict(Who::Anyone, policies, &anyone)? {
                    Verdict::Settled(reach) => Some(reach == ToolReach::Callable),
                    Verdict::Open => None,
                };
                if let Some(key) = key {
                    classes.insert(key, (count, query.settled));
                }
                count += 1;
            }
            queries.push(query);
        }
        Ok(Self {
            tools: queries,
            classes: count,
        })
    }
}

impl ToolQuery {
    /// Partial evaluation of this tool's requests for `who`, after DESIGN
    /// §3.3: without an approval; when that is a definite deny, with one.
    fn verdict(
        &self,
        who: Who<'_>,
        policies: &PolicySlices,
        entities: &Entities,
    ) -> Result<Verdict, DecideError> {
        let evaluate = |approved: bool| -> Result<PartialEvaluation, DecideError> {
            let request = self.request(who, approved)?;
            Ok(evaluate_partial(policies, &self.action, &request, entities))
        };
        let without = evaluate(false)?;
        if !without.errors.is_empty() {
            return Ok(Verdict::Settled(ToolReach::Hidden(HiddenReason::Errors {
                policies: without.errors,
            })));
        }
        match without.decision {
            Some(Decision::Allow) if !without.residual => {
                return Ok(Verdict::Settled(ToolReach::Callable));
            }
            Some(Decision::Deny) => {}
            _ => return Ok(Verdict::Open),
        }
        let with = evaluate(true)?;
        if !with.errors.is_empty() {
            return Ok(Verdict::Settled(ToolReach::Hidden(HiddenReason::Errors {
                policies: with.errors,
            })));
        }
        Ok(match with.decision {
            Some(Decision::Deny) => {
                Verdict::Settled(ToolReach::Hidden(if with.forbids.is_empty() {
                    HiddenReason::NoPermit
                } else {
                    HiddenReason::Forbidden {
                        policies: with.forbids,
                    }
                }))
            }
            // Every call is the same: denied without an approval (no
            // error), allowed with one.
            Some(Decision::Allow) if !without.residual && !with.residual => {
                Verdict::Settled(ToolReach::Callable)
            }
            _ => Verdict::Open,
        })
    }

    /// The partial request: the action known, the resource of the
    /// contract, the context of DESIGN §3.2 with `input` unknown (and, for
    /// anyone, the principal, scopes, agent and session unknown too).
    fn request(&self, who: Who<'_>, approved: bool) -> Result<Request, DecideError> {
        let (principal, scopes, agent, session) = match who {
            Who::Anyone => (
                None,
                RestrictedExpression::new_unknown("scopes"),
                RestrictedExpression::new_unknown("agent"),
                RestrictedExpression::new_unknown("session"),
            ),
            Who::Caller(caller, principal) => (
                Some(principal),
                RestrictedExpression::new_set(
                    caller
                        .scopes
                        .iter()
                        .map(|s| RestrictedExpression::new_string(s.clone())),
                ),
                RestrictedExpression::new_string(caller.agent_id.clone()),
                // Partial evaluation knows the session's id, never what
                // it touched: that is each call's own (DESIGN §13.2).
                RestrictedExpression::new_record([
                    (
                        "id".to_owned(),
                        RestrictedExpression::new_string(caller.session_id.clone()),
                    ),
                    (
                        "labels".to_owned(),
                        RestrictedExpression::new_unknown("session_labels"),
                    ),
                    (
                        "tools".to_owned(),
                        RestrictedExpression::new_unknown("session_tools"),
                    ),
                    (
                        "calls".to_owned(),
                        RestrictedExpression::new_unknown("session_calls"),
                    ),
                ])
                .map_err(DecideError::request)?,
            ),
        };
        let pairs = [
            ("scopes".to_owned(), scopes),
            (
                "risk".to_owned(),
                RestrictedExpression::new_string(self.tool.risk.as_str().to_owned()),
            ),
            (
                "approved".to_owned(),
                RestrictedExpression::new_bool(approved),
            ),
            ("agent".to_owned(), agent),
            ("session".to_owned(), session),
            (
                "input".to_owned(),
                RestrictedExpression::new_unknown("input"),
            ),
        ];
        let budgets = self.budgeted.then(|| {
            (
                "budgets".to_owned(),
                RestrictedExpression::new_unknown("budgets"),
            )
        });
        let context =
            Context::from_pairs(pairs.into_iter().chain(budgets)).map_err(DecideError::request)?;
        let builder = Request::builder().action(self.action.clone());
        let builder = match principal {
            Some(p) => builder.principal(p.clone()),
            None => builder.unknown_principal_with_type(user_type()?),
        };
        let builder = match &self.resource {
            Resource::Known(r) => builder.resource(r.clone()),
            Resource::OfType(t) => builder.unknown_resource_with_type(t.clone()),
        };
        // Not checked against the schema: Cedar's check refuses a context
        // holding unknowns. The known parts are built as `decide.rs` builds
        // a decision's (which is checked), from the same caller fields.
        Ok(builder.context(context).build())
    }
}

fn user_type() -> Result<EntityTypeName, DecideError> {
    EntityTypeName::from_str("User").map_err(DecideError::request)
}

impl PolicyEngine {
    /// The tools `caller` could be allowed to call (DESIGN §11.4), in name
    /// order: every tool but those every call of which is denied for this
    /// principal, whatever its arguments and resource. A tool whose calls
    /// need an approval is included.
    ///
    /// # Errors
    /// [`DecideError::Request`] if a request cannot be built (a bug).
    pub fn callable_tools(&self, caller: &Caller) -> Result<Vec<Arc<ToolContract>>, DecideError> {
        let mut store: Option<(EntityUid, Entities)> = None;
        // Each class's answer for this caller, once one of its tools is evaluated.
        let mut answers: Vec<Option<bool>> = vec![None; self.callable.classes];
        let mut shown = Vec::new();
        for query in &self.callable.tools {
            let known = query
                .settled
                .or_else(|| answers.get(query.class).copied().flatten());
            let callable = match known {
                Some(shown) => shown,
                None => {
                    if store.is_none() {
                        store = Some(self.principal_store(caller)?);
                    }
                    let Some((principal, entities)) = &store else {
                        continue;
                    };
                    let callable = query.reach(caller, principal, &self.policies, entities)?
                        == ToolReach::Callable;
                    if let Some(answer) = answers.get_mut(query.class) {
                        *answer = Some(callable);
                    }
                    callable
                }
            };
            if callable {
                shown.push(Arc::clone(&query.tool));
            }
        }
        Ok(shown)
    }

    /// Whether `caller` could be allowed to call the tool named `tool`, and
    /// if not, why (`None` for a tool that is not loaded). Always evaluated
    /// for this principal: the answer [`Self::callable_tools`] follows.
    ///
    /// # Errors
    /// [`DecideError::Request`] if a request cannot be built (a bug).
    pub fn tool_reach(
        &self,
        caller: &Caller,
        tool: &str,
    ) -> Result<Option<ToolReach>, DecideError> {
        let Some(query) = self.callable.tools.iter().find(|q| q.tool.name == tool) else {
            return Ok(None);
        };
        let (principal, entities) = self.principal_store(caller)?;
        query
            .reach(caller, &principal, &self.policies, &entities)
            .map(Some)
    }

    /// The principal's uid, and a partial store of every static entity
    /// plus the principal and its tenant, as every decision of it sees them.
    fn principal_store(&self, caller: &Caller) -> Result<(EntityUid, Entities), DecideError> {
        let principal = uid("User", &caller.subject_id)?;
        let tenant = uid("Tenant", &caller.tenant_id)?;
        let all = self.static_entities.all();
        let extra = principal_entities(caller, all, &principal, &tenant)?;
        let entities = all
            .clone()
            .add_entities(extra, Some(&self.schema))
            .map_err(DecideError::request)?
            .partial();
        Ok((principal, entities))
    }
}

impl ToolQuery {
    /// The answer for one caller: what partial evaluation settled, and
    /// "could be allowed" for every residual.
    fn reach(
        &self,
        caller: &Caller,
        principal: &EntityUid,
        policies: &PolicySlices,
        entities: &Entities,
    ) -> Result<ToolReach, DecideError> {
        Ok(
            match self.verdict(Who::Caller(caller, principal), policies, entities)? {
                Verdict::Settled(reach) => reach,
                Verdict::Open => ToolReach::Callable,
            },
        )
    }
}
