//! Per action, the static entities a request on it can reach, built once at
//! load: a decision adds the principal and the executor's entities to this
//! small base instead of to every static entity.
//!
//! Cedar recomputes the transitive closure over the whole entity store each
//! time entities are added, so a store holding every action and `Tool` entity
//! of a deployment made each decision cost in proportion to the number of
//! tools (half a millisecond at 1,000 tools).

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::entities_errors::EntitiesError;
use cedar_policy::{Entities, Entity, EntityTypeName, EntityUid};

use super::slice::PolicySlices;

/// The entity base of each action.
pub(super) struct RequestBases {
    by_action: HashMap<EntityUid, Entities>,
    /// For an action without a base: every static entity.
    all: Entities,
}

/// Whether `uid` is one of the entities toolgate generates per tool.
fn generated(uid: &EntityUid) -> bool {
    let ty = uid.type_name();
    ty.namespace().is_empty() && matches!(ty.basename(), "Action" | "Tool")
}

impl RequestBases {
    /// The base of every action in `actions`, from `all` (the deployment's
    /// static entities with every action and `Tool` entity).
    ///
    /// INVARIANT: evaluation on action A never looks up a generated entity
    /// left out of A's base, except through an attribute of a `Tool` entity
    /// type declared by the team, which a lookup error would make a
    /// `policy_error` (a deny): it never widens a decision. Why: the base
    /// keeps every entity of the deployment's file; of the generated ones it
    /// keeps A, A's ancestors, `Tool::"A"` (the resource of a resource-less
    /// tool), and every generated entity literal of the policies in A's slice
    /// with its ancestors. Action entities have no attributes, so an action
    /// is reached only as the request's action or as a literal; policies
    /// outside the slice are never evaluated on A (see `slice.rs`).
    ///
    /// # Errors
    /// [`EntitiesError`] if a base cannot be built (a bug: `all` is valid).
    pub(super) fn build(
        all: Entities,
        actions: &Entities,
        slices: &PolicySlices,
    ) -> Result<Self, Box<EntitiesError>> {
        let shared: Vec<Entity> = all
            .iter()
            .filter(|e| !generated(&e.uid()))
            .cloned()
            .collect();
        let shared = Entities::from_entities(shared, None).map_err(Box::new)?;
        // INVARIANT: `Tool` is a valid type name, so this is always `Some`.
        let tool_type = EntityTypeName::from_str("Tool").ok();
        let mut by_action = HashMap::new();
        for action in actions.iter().map(Entity::uid) {
            let mut reached: HashSet<EntityUid> = HashSet::from([action.clone()]);
            if let Some(ty) = &tool_type {
                reached.insert(EntityUid::from_type_name_and_id(
                    ty.clone(),
                    action.id().clone(),
                ));
            }
            for policy in slices.for_action(&action).policies() {
                reached.extend(policy.entity_literals().into_iter().filter(generated));
            }
            let with_ancestors: HashSet<EntityUid> = reached
                .iter()
                .flat_map(|u| {
                    let ancestors = all.ancestors(u).into_iter().flatten().cloned();
                    std::iter::once(u.clone()).chain(ancestors)
                })
                .collect();
            let extra = with_ancestors.iter().filter_map(|u| all.get(u).cloned());
            by_action.insert(
                action,
                shared.clone().add_entities(extra, None).map_err(Box::new)?,
            );
        }
        Ok(Self { by_action, all })
    }

    /// Every static entity (the deployment's file, every action and `Tool`).
    pub(super) fn all(&self) -> &Entities {
        &self.all
    }

    /// Whether `uid` is a static entity (the deployment's file, or one
    /// toolgate generates).
    pub(super) fn contains(&self, uid: &EntityUid) -> bool {
        self.all.get(uid).is_some()
    }

    /// The base of a request on `action`.
    pub(super) fn for_action(&self, action: &EntityUid) -> &Entities {
        self.by_action.get(action).unwrap_or(&self.all)
    }
}
