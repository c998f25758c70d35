//! Policy slicing and the one evaluation function every decision uses.
//!
//! At load, [`PolicySlices`] computes for every action the policies whose
//! action scope can match it: `action == A`, `action in [..]` naming A or a
//! group A belongs to (directly or transitively), and unscoped `action`
//! policies. A decision on action A evaluates only that slice, so its cost
//! follows the size of the slice, not of the whole set.
//!
//! This module owns [`evaluate`]: toolgate's tool-call decisions, approval
//! decisions and the Cedar integration tests (through [`super::plain`]) all
//! run through it, so the suite that proves Cedar's semantics also proves
//! the slicing.

use std::collections::{HashMap, HashSet};

use cedar_policy::{
    ActionConstraint, Authorizer, Decision, Entities, EntityUid, Policy, PolicyId, PolicySet,
    PolicySetError, Request,
};

/// The policies of a set, sliced by action.
#[derive(Debug, Clone)]
pub(crate) struct PolicySlices {
    full: PolicySet,
    by_action: HashMap<EntityUid, PolicySet>,
}

/// What Cedar answered for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Evaluation {
    pub(crate) allowed: bool,
    /// Determining policies, sorted.
    pub(crate) reasons: Vec<String>,
    /// Policies whose evaluation failed, sorted and without duplicates.
    pub(crate) errors: Vec<String>,
}

impl PolicySlices {
    /// Slices `policies` for every action entity in `actions` (an entity set
    /// holding the action hierarchy, transitive closure computed, as
    /// `Schema::action_entities` returns it).
    ///
    /// # Errors
    /// [`PolicySetError`] if a policy cannot be added to a slice (a bug: the
    /// ids of a valid set are unique).
    pub(crate) fn build(
        policies: PolicySet,
        actions: &Entities,
    ) -> Result<Self, Box<PolicySetError>> {
        // One pass over the policies indexes them by the actions their scope names.
        let mut unscoped: Vec<&Policy> = Vec::new();
        let mut equal: HashMap<EntityUid, Vec<&Policy>> = HashMap::new();
        let mut within: HashMap<EntityUid, Vec<&Policy>> = HashMap::new();
        for policy in policies.policies() {
            match policy.action_constraint() {
                ActionConstraint::Any => unscoped.push(policy),
                ActionConstraint::Eq(uid) => equal.entry(uid).or_default().push(policy),
                ActionConstraint::In(uids) => {
                    for uid in uids {
                        within.entry(uid).or_default().push(policy);
                    }
                }
            }
        }

        // INVARIANT: a policy left out of the slice of action A can never be
        // satisfied and can never error on a request for A, so leaving it out
        // changes neither the decision, nor the determining policies, nor the
        // errors. Why: Cedar evaluates a policy as
        //   principal-scope && (action-scope && (resource-scope && conditions))
        // with short-circuit `&&`. Scope constraints are `==`, `in` and `is`
        // on entity literals, which never error. A policy is left out only
        // when its action scope is `== B` with B ≠ A, or `in [B…]` where no B
        // is A or an ancestor of A in `actions`; for a request on A that
        // scope is false, so the conditions (the only part that can error)
        // are never evaluated. Decisions are evaluated against entities whose
        // action hierarchy is exactly `actions` (the schema's action entities;
        // supplied entities cannot redefine an action, see `decide.rs`), so
        // "ancestor" means the same here and at evaluation. A forbid that could
        // apply is therefore always in the slice. Every action not sliced
        // here falls back to the full set.
        let mut by_action = HashMap::new();
        for action in actions.iter().map(cedar_policy::Entity::uid) {
            let mut names: Vec<EntityUid> = vec![action.clone()];
            if let Some(ancestors) = actions.ancestors(&action) {
                names.extend(ancestors.cloned());
            }
            let mut slice = PolicySet::new();
            let mut seen: HashSet<PolicyId> = HashSet::new();
            let candidates = unscoped
                .iter()
                .chain(equal.get(&action).into_iter().flatten())
                .chain(names.iter().filter_map(|n| within.get(n)).flatten());
            for policy in candidates {
                if seen.insert(policy.id().clone()) {
                    slice.add((*policy).clone())?;
                }
            }
            by_action.insert(action, slice);
        }
        Ok(Self {
            full: policies,
            by_action,
        })
    }

    /// Every policy of the set.
    pub(crate) fn full(&self) -> &PolicySet {
        &self.full
    }

    /// The policies a request on `action` must evaluate: its slice, or the
    /// whole set for an action that was not sliced.
    pub(crate) fn for_action(&self, action: &EntityUid) -> &PolicySet {
        self.by_action.get(action).unwrap_or(&self.full)
    }

    /// The largest slice, for reports.
    pub(crate) fn largest_slice(&self) -> usize {
        self.by_action
            .values()
            .map(|s| s.policies().count())
            .max()
            .unwrap_or(0)
    }
}

/// Evaluates `request` (on `action`) against the slice of `action`. The one
/// place toolgate calls Cedar's authorizer.
pub(crate) fn evaluate(
    slices: &PolicySlices,
    action: &EntityUid,
    request: &Request,
    entities: &Entities,
) -> Evaluation {
    evaluate_set(slices.for_action(action), request, entities)
}

/// Evaluates `request` against a whole set, unsliced (the reference the
/// slicing is checked against).
pub(crate) fn evaluate_set(
    policies: &PolicySet,
    request: &Request,
    entities: &Entities,
) -> Evaluation {
    let response = Authorizer::new().is_authorized(request, policies, entities);
    let mut reasons: Vec<String> = response
        .diagnostics()
        .reason()
        .map(ToString::to_string)
        .collect();
    reasons.sort();
    let mut errors: Vec<String> = response
        .diagnostics()
        .errors()
        .map(|e| match e {
            cedar_policy::AuthorizationError::PolicyEvaluationError(e) => e.policy_id().to_string(),
        })
        .collect();
    errors.sort();
    errors.dedup();
    Evaluation {
        allowed: response.decision() == Decision::Allow,
        reasons,
        errors,
    }
}

/// What Cedar's partial evaluation answered for a request with unknowns
/// (DESIGN §11.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartialEvaluation {
    /// `Some` when the answer is the same whatever the unknowns are.
    pub(crate) decision: Option<Decision>,
    /// Forbid policies that hold whatever the unknowns are, sorted.
    pub(crate) forbids: Vec<String>,
    /// Policies that fail to evaluate whatever the unknowns are, sorted.
    pub(crate) errors: Vec<String>,
    /// Whether any policy's answer depends on the unknowns.
    pub(crate) residual: bool,
}

/// Partially evaluates `request` (on `action`, with unknowns) against the
/// slice of `action`: the one place toolgate calls Cedar's partial
/// authorizer. Slicing changes nothing here either: a policy left out of
/// the slice has an action scope that is false for `action`, a known
/// value, so it is neither satisfied, nor residual, nor in error.
pub(crate) fn evaluate_partial(
    slices: &PolicySlices,
    action: &EntityUid,
    request: &Request,
    entities: &Entities,
) -> PartialEvaluation {
    let response =
        Authorizer::new().is_authorized_partial(request, slices.for_action(action), entities);
    let mut forbids: Vec<String> = response
        .definitely_satisfied()
        .filter(|p| p.effect() == cedar_policy::Effect::Forbid)
        .map(|p| p.id().to_string())
        .collect();
    forbids.sort();
    let mut errors: Vec<String> = response
        .definitely_errored()
        .map(ToString::to_string)
        .collect();
    errors.sort();
    errors.dedup();
    PartialEvaluation {
        decision: response.decision(),
        forbids,
        errors,
        residual: response.nontrivial_residuals().next().is_some(),
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use cedar_policy::{Context, Entity};
    use proptest::prelude::*;

    use super::*;

    /// Actions `a0`…`a5`; groups `g0 ∋ {a0, a1}`, `g1 ∋ {a1, a2, g2}`,
    /// `g2 ∋ {a3}` (nested: `a3 in g1` transitively); `a4`, `a5` in no group.
    fn action_entities() -> Entities {
        let action = |id: &str, parents: &[&str]| {
            Entity::new_no_attrs(
                uid("Action", id),
                parents.iter().map(|p| uid("Action", p)).collect(),
            )
        };
        Entities::from_entities(
            [
                action("g0", &[]),
                action("g1", &[]),
                action("g2", &["g1"]),
                action("a0", &["g0"]),
                action("a1", &["g0", "g1"]),
                action("a2", &["g1"]),
                action("a3", &["g2"]),
                action("a4", &[]),
                action("a5", &[]),
            ],
            None,
        )
        .unwrap()
    }

    fn uid(ty: &str, id: &str) -> EntityUid {
        EntityUid::from_str(&format!("{ty}::\"{id}\"")).unwrap()
    }

    /// Users, a team and two documents, one without the `owner` attribute
    /// (so `resource.owner` errors on it), plus the action hierarchy.
    fn entities() -> Entities {
        let json = serde_json::json!([
            {"uid": {"type": "User", "id": "u0"}, "attrs": {}, "parents": [{"type": "Team", "id": "t0"}]},
            {"uid": {"type": "User", "id": "u1"}, "attrs": {}, "parents": []},
            {"uid": {"type": "Team", "id": "t0"}, "attrs": {}, "parents": []},
            {"uid": {"type": "Doc", "id": "d0"}, "attrs": {"owner": {"__entity": {"type": "User", "id": "u0"}}}, "parents": []},
            {"uid": {"type": "Doc", "id": "d1"}, "attrs": {}, "parents": []}
        ]);
        Entities::from_json_value(json, None)
            .unwrap()
            .add_entities(action_entities().iter().cloned(), None)
            .unwrap()
    }

    const ACTION_SCOPES: &[&str] = &[
        "action",
        "action == Action::\"a0\"",
        "action == Action::\"a3\"",
        "action == Action::\"a5\"",
        "action == Action::\"g1\"",
        "action == Action::\"zz\"",
        "action in Action::\"g0\"",
        "action in Action::\"g1\"",
        "action in Action::\"g2\"",
        "action in Action::\"a2\"",
        "action in [Action::\"a4\", Action::\"g0\"]",
        "action in [Action::\"a5\", Action::\"g2\", Action::\"a0\"]",
        "action in []",
    ];
    const PRINCIPAL_SCOPES: &[&str] = &[
        "principal",
        "principal == User::\"u0\"",
        "principal in Team::\"t0\"",
        "principal is User",
    ];
    const RESOURCE_SCOPES: &[&str] = &["resource", "resource == Doc::\"d0\"", "resource is Doc"];
    const CONDITIONS: &[&str] = &[
        "true",
        "false",
        "context.n > 4",
        // Overflows (an evaluation error) when n ≥ 8.
        "context.n + 9223372036854775800 > 0",
        // Errors on d1, which has no `owner`.
        "resource.owner == principal",
        "action in Action::\"g1\"",
        "context.missing",
    ];

    fn policy_text() -> impl Strategy<Value = String> {
        (
            prop::bool::ANY,
            prop::sample::select(PRINCIPAL_SCOPES),
            prop::sample::select(ACTION_SCOPES),
            prop::sample::select(RESOURCE_SCOPES),
            prop::sample::select(CONDITIONS),
        )
            .prop_map(|(permit, p, a, r, c)| {
                let effect = if permit { "permit" } else { "forbid" };
                format!("{effect} ({p}, {a}, {r}) when {{ {c} }};")
            })
    }

    fn policy_set(texts: &[String]) -> PolicySet {
        let mut set = PolicySet::new();
        for (i, text) in texts.iter().enumerate() {
            let p =
                cedar_policy::Policy::parse(Some(PolicyId::new(format!("p{i}"))), text).unwrap();
            set.add(p).unwrap();
        }
        set
    }

    fn request(principal: &str, action: &str, resource: &str, n: i64) -> Request {
        let context = Context::from_json_value(serde_json::json!({ "n": n }), None).unwrap();
        Request::new(
            uid("User", principal),
            uid("Action", action),
            uid("Doc", resource),
            context,
            None,
        )
        .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Sliced and full evaluation agree on the decision, the determining
        /// policies and the errors, for generated sets and requests
        /// (including actions outside the hierarchy, which use the full set).
        #[test]
        fn sliced_and_full_evaluation_agree(
            texts in prop::collection::vec(policy_text(), 0..24),
            requests in prop::collection::vec((
                prop::sample::select(&["u0", "u1"][..]),
                prop::sample::select(&["a0", "a1", "a2", "a3", "a4", "a5", "g0", "g1", "zz"][..]),
                prop::sample::select(&["d0", "d1"][..]),
                0i64..12,
            ), 1..8),
        ) {
            let set = policy_set(&texts);
            let slices = PolicySlices::build(set.clone(), &action_entities()).unwrap();
            let entities = entities();
            for (p, a, r, n) in requests {
                let req = request(p, a, r, n);
                let full = evaluate_set(&set, &req, &entities);
                let sliced = evaluate(&slices, &uid("Action", a), &req, &entities);
                prop_assert_eq!(&sliced, &full, "request {} {} {} n={}", p, a, r, n);
            }
        }
    }

    #[test]
    fn a_slice_holds_exactly_the_policies_whose_scope_can_match() {
        let texts: Vec<String> = [
            "permit (principal, action, resource);", // p0: unscoped
            "permit (principal, action == Action::\"a0\", resource);", // p1
            "forbid (principal, action in Action::\"g1\", resource);", // p2
            "permit (principal, action in [Action::\"a4\", Action::\"g2\"], resource);", // p3
            "forbid (principal, action == Action::\"a5\", resource);", // p4
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let slices = PolicySlices::build(policy_set(&texts), &action_entities()).unwrap();
        let ids = |a: &str| {
            let mut v: Vec<String> = slices
                .for_action(&uid("Action", a))
                .policies()
                .map(|p| p.id().to_string())
                .collect();
            v.sort();
            v
        };
        assert_eq!(ids("a0"), ["p0", "p1"]);
        assert_eq!(ids("a1"), ["p0", "p2"]);
        // a3 ∈ g2 ∈ g1: both groups' policies reach it.
        assert_eq!(ids("a3"), ["p0", "p2", "p3"]);
        assert_eq!(ids("a4"), ["p0", "p3"]);
        assert_eq!(ids("a5"), ["p0", "p4"]);
        // An action outside the hierarchy evaluates everything.
        assert_eq!(ids("zz"), ["p0", "p1", "p2", "p3", "p4"]);
        assert_eq!(slices.largest_slice(), 3);
    }
}
