//! What every Cedar request toolgate builds is made of: the uids of the
//! generated types, the principal entity (from the caller only), and why a
//! request could not be built ([`DecideError`]). A leaf of `policy`: the
//! decisions (`decide.rs`) and the tools a principal may call
//! (`callable.rs`) both build on it.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression};

use crate::identity::Caller;
use crate::tools::ProjectionError;

/// Why a call could not be evaluated at all.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecideError {
    /// The executor's entity data is malformed or does not match the schema.
    #[error("invalid entities: {0}")]
    Entities(String),
    /// The contract names a resource that the request did not supply.
    #[error("resource `{0}` was not supplied")]
    ResourceNotFound(String),
    /// An argument value has no exact Cedar representation.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// The request could not be built against the schema; a toolgate bug.
    #[error("cannot build the Cedar request: {0}")]
    Request(String),
}

pub(super) fn uid(ty: &str, id: &str) -> Result<EntityUid, DecideError> {
    let ty = match ty {
        "User" | "Tenant" | "Tool" | "Action" => GENERATED_TYPES
            .iter()
            .find(|t| t.basename() == ty)
            .cloned()
            .ok_or_else(|| DecideError::Request(format!("no type `{ty}`")))?,
        _ => EntityTypeName::from_str(ty).map_err(|e| DecideError::Request(e.to_string()))?,
    };
    Ok(EntityUid::from_type_name_and_id(ty, EntityId::new(id)))
}

/// The generated types every decision names, parsed once.
static GENERATED_TYPES: std::sync::LazyLock<Vec<EntityTypeName>> = std::sync::LazyLock::new(|| {
    ["User", "Tenant", "Tool", "Action"]
        .iter()
        .filter_map(|t| EntityTypeName::from_str(t).ok())
        .collect()
});

/// The principal (its tenant and roles from the caller only, a member of its
/// tenant) first, then its tenant when `base` does not hold it.
///
/// INVARIANT: reads only the caller's subject, tenant and roles, the key of
/// the memo in `principals.rs`; a field read here must join that key.
pub(super) fn principal_entities(
    caller: &Caller,
    base: &Entities,
    principal: &EntityUid,
    tenant: &EntityUid,
) -> Result<Vec<Entity>, DecideError> {
    let roles = caller
        .roles
        .iter()
        .map(|r| RestrictedExpression::new_string(r.clone()));
    let attrs = HashMap::from([
        (
            "tenant".to_owned(),
            RestrictedExpression::new_entity_uid(tenant.clone()),
        ),
        ("roles".to_owned(), RestrictedExpression::new_set(roles)),
    ]);
    let user = Entity::new(principal.clone(), attrs, HashSet::from([tenant.clone()]))
        .map_err(|e| DecideError::Request(e.to_string()))?;
    let mut extra = vec![user];
    if base.get(tenant).is_none() {
        extra.push(Entity::new_no_attrs(tenant.clone(), HashSet::new()));
    }
    Ok(extra)
}
