//! Evaluating one tool call (DESIGN §3.3): entities, request, Cedar, and the
//! approval-required rule.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use cedar_policy::{Context, Effect, Entities, Entity, EntityUid, Request, RestrictedExpression};
use serde_json::{Map, Value};

use super::PolicyEngine;
use super::parts::{DecideError, InvalidEntities, uid};
use super::slice::{Evaluation, evaluate};
use super::values;
use crate::budgets::{Seen, SessionSeen};
use crate::identity::Caller;
use crate::tools::ToolContract;

/// Everything Cedar needs to know about one call, all of it already
/// validated: the arguments passed the tool's schema.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    pub caller: &'a Caller,
    pub tool: &'a ToolContract,
    pub arguments: &'a Value,
    /// The executor's trusted entity data (a Cedar entity JSON array), if any.
    pub entities: Option<&'a Value>,
    /// Whether a valid approval bound to this exact call was presented.
    pub approved: bool,
    /// `context.budgets`: what each budget counting the tool has used, this
    /// call's charge and the limit (DESIGN §13.1); empty for a tool no
    /// budget counts.
    pub budgets: &'a [Seen],
    /// `context.session`'s `labels`, `tools` and `calls` (DESIGN §13.2):
    /// `None` for a call whose session no policy reads, or without one
    /// (empty sets, 0).
    pub session: Option<&'a SessionSeen>,
}

/// The policy answer for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyDecision {
    /// Permitted as it stands.
    Allow { policies: Vec<String> },
    /// Denied now, permitted once a human approves (DESIGN §3.3 rule 3).
    /// `reason` is the `@reason` of the forbid an approval lifts, shown to
    /// the approver (`Approval.why`, §14).
    ApprovalRequired {
        policies: Vec<String>,
        reason: Option<String>,
    },
    /// Denied. `reason` is the `@reason` of the determining forbid, the one
    /// piece of policy text the model may see.
    Deny {
        policies: Vec<String>,
        reason: Option<String>,
    },
    /// A policy failed to evaluate: fail closed (DESIGN §3.3 rule 4).
    Errored { policies: Vec<String> },
}

/// A Cedar request. Built from values typed by the generated schema, it is
/// checked against the schema in debug builds, so every decision the test
/// suite makes proves the context conforms; release builds skip the check
/// (it copied the context twice). INVARIANT: skipping it never widens a
/// decision: a value of the wrong type makes a policy error, and any error
/// is a `policy_error` deny.
fn request(
    schema: &cedar_policy::Schema,
    principal: &EntityUid,
    action: &EntityUid,
    resource: &EntityUid,
    context: Context,
) -> Result<Request, DecideError> {
    let check = cfg!(debug_assertions).then_some(schema);
    Request::new(
        principal.clone(),
        action.clone(),
        resource.clone(),
        context,
        check,
    )
    .map_err(DecideError::request)
}

impl PolicyEngine {
    /// Decides one tool call.
    ///
    /// # Errors
    /// [`DecideError`] when the call cannot be evaluated: bad entity data,
    /// a missing resource, or an argument Cedar cannot represent.
    pub fn decide_tool_call(&self, call: &ToolCall<'_>) -> Result<PolicyDecision, DecideError> {
        let tool = call.tool;
        let tenant = uid("Tenant", &call.caller.tenant_id)?;
        let principal = uid("User", &call.caller.subject_id)?;
        let action = uid("Action", &tool.name)?;
        let resource = match (&tool.resource, tool.resource_id(call.arguments)) {
            (Some(r), Some(id)) => uid(&r.entity_type, id)?,
            // INVARIANT: the contract loader guarantees the id pointer is a
            // required string, so a validated argument always has it.
            (Some(r), None) => return Err(DecideError::ResourceNotFound(r.entity_type.clone())),
            (None, _) => uid("Tool", &tool.name)?,
        };

        let entities = self.request_entities(
            call.caller,
            call.entities,
            &principal,
            &tenant,
            (&tool.name, &action),
        )?;
        if entities.get(&resource).is_none() {
            return Err(DecideError::ResourceNotFound(resource.to_string()));
        }

        let input = tool.input_type.project(call.arguments)?;
        let evaluate = |approved: bool| -> Result<Evaluation, DecideError> {
            let context = self.context(call, &input, approved, &action)?;
            let request = request(&self.schema, &principal, &action, &resource, context)?;
            Ok(evaluate(&self.policies, &action, &request, &entities))
        };

        let first = evaluate(call.approved)?;
        if !first.errors.is_empty() {
            return Ok(PolicyDecision::Errored {
                policies: first.errors,
            });
        }
        if first.allowed {
            return Ok(PolicyDecision::Allow {
                policies: first.reasons,
            });
        }
        let policies = first.reasons;
        // The forbids that still hold with an approval are the ones no human
        // can lift: their reason is the one worth telling the model.
        let mut unliftable = Vec::new();
        if !call.approved {
            let second = evaluate(true)?;
            if !second.errors.is_empty() {
                return Ok(PolicyDecision::Errored {
                    policies: second.errors,
                });
            }
            if second.allowed {
                // The forbids that fired without approval are what a human lifts.
                let reason = self.deny_reason(&policies);
                return Ok(PolicyDecision::ApprovalRequired { policies, reason });
            }
            unliftable = second.reasons;
        }
        let reason = self
            .deny_reason(&unliftable)
            .or_else(|| self.deny_reason(&policies));
        Ok(PolicyDecision::Deny { policies, reason })
    }

    /// The first `@reason` among the determining forbid policies (in id order).
    fn deny_reason(&self, policies: &[String]) -> Option<String> {
        policies.iter().find_map(|id| {
            let pid = cedar_policy::PolicyId::new(id);
            let p = self.policies.full().policy(&pid)?;
            if p.effect() == Effect::Forbid {
                p.annotation("reason").map(ToOwned::to_owned)
            } else {
                None
            }
        })
    }

    /// The action's base with the principal (from the caller only, see
    /// `principals`) and the executor's entities, validated against the
    /// schema. Without executor entities, the memoised base itself.
    fn request_entities(
        &self,
        caller: &Caller,
        supplied_json: Option<&Value>,
        principal: &EntityUid,
        tenant: &EntityUid,
        (action_name, action): (&str, &EntityUid),
    ) -> Result<Arc<Entities>, DecideError> {
        let base = self.principal_bases.get(
            action_name,
            caller,
            &self.schema,
            self.static_entities.for_action(action),
            principal,
            tenant,
        )?;
        let Some(json) = supplied_json else {
            return Ok(base);
        };
        let Value::Array(items) = json else {
            return Err(DecideError::invalid_entities(InvalidEntities::NotAnArray));
        };
        if items.is_empty() {
            return Ok(base);
        }
        // One entity at a time, each checked against the schema (an
        // action only as the schema declares it). `Entities::from_json_value`
        // would also materialise every action of the schema on every
        // call: thousands of entities for a deployment of thousands of tools.
        // Explicit forms are converted directly (see `values`); if any
        // item is in another form, or the converted set does not fit the
        // schema, Cedar's parser reads them all and has the last word.
        let fast: Option<Vec<Entity>> = items.iter().map(values::entity).collect();
        if let Some(fast) = fast
            && let Ok(entities) = with_entities(&base, &self.schema, principal, fast)
        {
            return Ok(Arc::new(entities));
        }
        let mut extra = Vec::with_capacity(items.len());
        for item in items {
            let entity = Entity::from_json_value(item.clone(), Some(&self.schema))
                .map_err(DecideError::entities)?;
            extra.push(entity);
        }
        with_entities(&base, &self.schema, principal, extra).map(Arc::new)
    }
}

/// `base` (which holds the principal) plus the executor's `extra`, checked
/// against the schema; none of `extra` may be the principal, which comes
/// from the auth context alone (DESIGN §1).
fn with_entities(
    base: &Entities,
    schema: &cedar_policy::Schema,
    principal: &EntityUid,
    extra: Vec<Entity>,
) -> Result<Entities, DecideError> {
    if extra.iter().any(|e| e.uid() == *principal) {
        return Err(DecideError::invalid_entities(
            InvalidEntities::DefinesPrincipal(principal.clone()),
        ));
    }
    base.clone()
        .add_entities(extra, Some(schema))
        .map_err(DecideError::entities)
}

fn context_json(call: &ToolCall<'_>, input: &Value, approved: bool) -> Value {
    let mut c = Map::new();
    c.insert(
        "scopes".into(),
        Value::Array(
            call.caller
                .scopes
                .iter()
                .cloned()
                .map(Value::String)
                .collect(),
        ),
    );
    c.insert("risk".into(), call.tool.risk.as_str().into());
    c.insert("approved".into(), approved.into());
    c.insert("agent".into(), call.caller.agent_id.clone().into());
    let empty = SessionSeen::default();
    let seen = call.session.unwrap_or(&empty);
    c.insert(
        "session".into(),
        serde_json::json!({
            "id": call.caller.session_id,
            "labels": seen.labels,
            "tools": seen.tools,
            "calls": seen.calls,
        }),
    );
    if !call.budgets.is_empty() {
        let budgets: Map<String, Value> = call
            .budgets
            .iter()
            .map(|b| {
                let seen =
                    serde_json::json!({"used": b.used, "this_call": b.this_call, "limit": b.limit});
                (b.name.clone(), seen)
            })
            .collect();
        c.insert("budgets".into(), Value::Object(budgets));
    }
    c.insert("input".into(), input.clone());
    Value::Object(c)
}

impl PolicyEngine {
    /// The context of a tool call (DESIGN §3.2), built as Cedar values; the
    /// request checks it against the action's context type.
    fn context(
        &self,
        call: &ToolCall<'_>,
        input: &Value,
        approved: bool,
        action: &EntityUid,
    ) -> Result<Context, DecideError> {
        let Some(input) = values::restricted(input) else {
            // The projection only writes explicit forms; should that ever
            // change, Cedar's parser still reads what it wrote.
            return Context::from_json_value(
                context_json(call, input, approved),
                Some((&self.schema, action)),
            )
            .map_err(DecideError::request);
        };
        let scopes = call
            .caller
            .scopes
            .iter()
            .map(|s| RestrictedExpression::new_string(s.clone()));
        let pairs = [
            ("scopes".to_owned(), RestrictedExpression::new_set(scopes)),
            (
                "risk".to_owned(),
                RestrictedExpression::new_string(call.tool.risk.as_str().to_owned()),
            ),
            (
                "approved".to_owned(),
                RestrictedExpression::new_bool(approved),
            ),
            (
                "agent".to_owned(),
                RestrictedExpression::new_string(call.caller.agent_id.clone()),
            ),
            ("session".to_owned(), session_record(call)?),
            ("input".to_owned(), input),
        ];
        let mut budgets = None;
        if !call.budgets.is_empty() {
            let long = RestrictedExpression::new_long;
            let mut records = Vec::with_capacity(call.budgets.len());
            for b in call.budgets {
                let record = RestrictedExpression::new_record([
                    ("used".to_owned(), long(b.used)),
                    ("this_call".to_owned(), long(b.this_call)),
                    ("limit".to_owned(), long(b.limit)),
                ])
                .map_err(DecideError::request)?;
                records.push((b.name.clone(), record));
            }
            let all = RestrictedExpression::new_record(records).map_err(DecideError::request)?;
            budgets = Some(("budgets".to_owned(), all));
        }
        Context::from_pairs(pairs.into_iter().chain(budgets)).map_err(DecideError::request)
    }
}

/// `context.session` of a call: its id, and what its session touched
/// before it (nothing for a call whose session no policy reads).
fn session_record(call: &ToolCall<'_>) -> Result<RestrictedExpression, DecideError> {
    let strings = |set: &std::collections::BTreeSet<String>| {
        RestrictedExpression::new_set(set.iter().cloned().map(RestrictedExpression::new_string))
    };
    let empty = SessionSeen::default();
    let seen = call.session.unwrap_or(&empty);
    RestrictedExpression::new_record([
        (
            "id".to_owned(),
            RestrictedExpression::new_string(call.caller.session_id.clone()),
        ),
        ("labels".to_owned(), strings(&seen.labels)),
        ("tools".to_owned(), strings(&seen.tools)),
        (
            "calls".to_owned(),
            RestrictedExpression::new_long(seen.calls),
        ),
    ])
    .map_err(DecideError::request)
}

/// What the two questions on an approval know of it: the attributes of
/// the `Approval` entity (DESIGN §4). The approvals' records give it
/// (`ApprovalRecord::subject`), so the policy core needs none of their types.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalSubject<'a> {
    pub approval_id: &'a str,
    pub tenant_id: &'a str,
    pub tool: &'a str,
    pub risk: crate::tools::Risk,
    pub requester_subject_id: &'a str,
}

impl PolicyEngine {
    /// May `approver` record `verdict` (`"approve"` or `"reject"`) on this
    /// approval? Action `decide_approval` on the `Approval` entity (DESIGN §4).
    ///
    /// # Errors
    /// [`DecideError::Request`] if the request cannot be built (a bug).
    pub fn decide_approval(
        &self,
        approver: &Caller,
        approval: &ApprovalSubject<'_>,
        verdict: &str,
    ) -> Result<PolicyDecision, DecideError> {
        let mut c = Map::new();
        c.insert("verdict".into(), verdict.into());
        self.approval_question(approver, approval, "decide_approval", c)
    }

    /// May `viewer` read this approval (list, get, watch)? Action
    /// `view_approval` on the `Approval` entity (DESIGN §4), no context.
    /// Nothing permits it unless a policy does: no view policy, nobody views.
    ///
    /// # Errors
    /// [`DecideError::Request`] if the request cannot be built (a bug).
    pub fn view_approval(
        &self,
        viewer: &Caller,
        approval: &ApprovalSubject<'_>,
    ) -> Result<PolicyDecision, DecideError> {
        self.approval_question(viewer, approval, "view_approval", Map::new())
    }

    /// One Cedar question on the `Approval` entity: `caller` as the
    /// principal, the approval's tenant, tool, risk and requester as its
    /// attributes.
    fn approval_question(
        &self,
        caller: &Caller,
        approval: &ApprovalSubject<'_>,
        action: &str,
        context: Map<String, Value>,
    ) -> Result<PolicyDecision, DecideError> {
        let tenant = uid("Tenant", &caller.tenant_id)?;
        let principal = uid("User", &caller.subject_id)?;
        let action_name = action;
        let action = uid("Action", action_name)?;
        let resource = uid("Approval", approval.approval_id)?;
        let attrs = HashMap::from([
            (
                "tenant".to_owned(),
                RestrictedExpression::new_entity_uid(uid("Tenant", approval.tenant_id)?),
            ),
            (
                "tool".to_owned(),
                RestrictedExpression::new_string(approval.tool.to_owned()),
            ),
            (
                "risk".to_owned(),
                RestrictedExpression::new_string(approval.risk.as_str().to_owned()),
            ),
            (
                "requester".to_owned(),
                RestrictedExpression::new_entity_uid(uid("User", approval.requester_subject_id)?),
            ),
        ]);
        let approval_entity =
            Entity::new(resource.clone(), attrs, HashSet::new()).map_err(DecideError::request)?;
        let base =
            self.request_entities(caller, None, &principal, &tenant, (action_name, &action))?;
        let entities = Entities::clone(&base)
            .add_entities([approval_entity], Some(&self.schema))
            .map_err(DecideError::request)?;
        let context =
            Context::from_json_value(Value::Object(context), Some((&self.schema, &action)))
                .map_err(DecideError::request)?;
        let request = Request::new(
            principal,
            action.clone(),
            resource,
            context,
            Some(&self.schema),
        )
        .map_err(DecideError::request)?;
        let answer = evaluate(&self.policies, &action, &request, &entities);
        if !answer.errors.is_empty() {
            return Ok(PolicyDecision::Errored {
                policies: answer.errors,
            });
        }
        let policies = answer.reasons;
        if answer.allowed {
            return Ok(PolicyDecision::Allow { policies });
        }
        let reason = self.deny_reason(&policies);
        Ok(PolicyDecision::Deny { policies, reason })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn engine() -> PolicyEngine {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        PolicyEngine::load(&dir).unwrap()
    }

    fn bob() -> Caller {
        Caller {
            subject_id: "bob".into(),
            tenant_id: "acme".into(),
            scopes: vec!["orders:refund".into()],
            roles: vec!["support_agent".into()],
            agent_id: String::new(),
            session_id: String::new(),
        }
    }

    fn order_and(action: Value) -> Value {
        json!([
            {"uid": {"type": "Order", "id": "ord_1"}, "parents": [{"type": "Tenant", "id": "acme"}],
             "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}},
                       "owner": {"__entity": {"type": "User", "id": "alice"}},
                       "status": "delivered", "total_cents": 50000}},
            action
        ])
    }

    /// A request's entity base keeps the generated entities its slice names
    /// as literals: another action's group and another tool's attributes
    /// are still seen by a condition (see `reach.rs`).
    #[test]
    fn literals_of_other_actions_and_tools_are_evaluated() {
        let (_tmp, dir) = crate::policy::test_support::examples();
        std::fs::write(
            dir.join("probe.cedar"),
            r#"@id("literal-probe")
@reason("probe")
forbid (principal, action == Action::"refund_order", resource)
when { Action::"delete_account" in Action::"risk:destructive" && Tool::"search_docs".risk == "read" };
"#,
        )
        .unwrap();
        let engine = PolicyEngine::load(&dir).unwrap();
        let caller = bob();
        let tool = engine.tools().get("refund_order").unwrap();
        let args =
            json!({"order_id": "ord_1", "amount_cents": 500, "currency": "USD", "reason": "late"});
        let entities = json!([
            {"uid": {"type": "Order", "id": "ord_1"}, "parents": [{"type": "Tenant", "id": "acme"}],
             "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}},
                       "owner": {"__entity": {"type": "User", "id": "alice"}},
                       "status": "delivered", "total_cents": 50000}}
        ]);
        let decision = engine
            .decide_tool_call(&ToolCall {
                caller: &caller,
                tool,
                arguments: &args,
                entities: Some(&entities),
                approved: false,
                budgets: &engine.unspent_budgets(&tool.name),
                session: None,
            })
            .unwrap();
        assert_eq!(
            decision,
            PolicyDecision::Deny {
                policies: vec!["literal-probe".into()],
                reason: Some("probe".into())
            }
        );
    }

    /// Slicing relies on the action hierarchy being the schema's: supplied
    /// entities may repeat an action exactly, never move it to another group.
    #[test]
    fn supplied_entities_cannot_regroup_an_action() {
        let engine = engine();
        let caller = bob();
        let tool = engine.tools().get("refund_order").unwrap();
        let args =
            json!({"order_id": "ord_1", "amount_cents": 500, "currency": "USD", "reason": "late"});
        let decide = |action: Value| {
            let entities = order_and(action);
            engine.decide_tool_call(&ToolCall {
                caller: &caller,
                tool,
                arguments: &args,
                entities: Some(&entities),
                approved: false,
                budgets: &engine.unspent_budgets(&tool.name),
                session: None,
            })
        };
        let regrouped = decide(json!({"uid": {"type": "Action", "id": "refund_order"},
            "parents": [{"type": "Action", "id": "risk:read"}], "attrs": {}}));
        assert!(
            matches!(&regrouped, Err(DecideError::Entities(m)) if m.to_string().contains("does not conform")),
            "{regrouped:?}"
        );
        let ungrouped = decide(json!({"uid": {"type": "Action", "id": "delete_account"},
            "parents": [], "attrs": {}}));
        assert!(
            matches!(&ungrouped, Err(DecideError::Entities(m)) if m.to_string().contains("does not conform")),
            "{ungrouped:?}"
        );
        let same = decide(json!({"uid": {"type": "Action", "id": "delete_account"},
            "parents": [{"type": "Action", "id": "risk:destructive"}], "attrs": {}}));
        assert_eq!(
            same.unwrap(),
            PolicyDecision::Allow {
                policies: vec!["support-refunds-orders".into()]
            }
        );
    }
}
