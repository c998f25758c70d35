//! What every Cedar request toolgate builds is made of: the uids of the
//! generated types, the principal entity (from the caller only), and why a
//! request could not be built ([`DecideError`]). A leaf of `policy`: the
//! decisions (`decide.rs`) and the tools a principal may call
//! (`callable.rs`) both build on it.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::entities_errors::EntitiesError;
use cedar_policy::{
    ContextCreationError, ContextJsonError, Entities, Entity, EntityAttrEvaluationError, EntityId,
    EntityTypeName, EntityUid, ParseErrors, RequestValidationError, RestrictedExpression,
};

use crate::identity::Caller;
use crate::tools::ProjectionError;

/// Why a call could not be evaluated at all. Cedar's own errors are kept
/// as they are (their structure and diagnostics reach the edge, which
/// decides what of them a caller or a log may see).
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The executor's entity data is malformed or does not match the schema.
    #[error("invalid entities: {0}")]
    Entities(#[source] Box<InvalidEntities>),
    /// The contract names a resource that the request did not supply.
    #[error("resource `{0}` was not supplied")]
    ResourceNotFound(String),
    /// An argument value has no exact Cedar representation.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// The request could not be built against the schema; a toolgate bug.
    #[error("cannot build the Cedar request: {0}")]
    Request(#[source] Box<BuildError>),
}

impl DecideError {
    /// The kind, for logs: a fixed word per reason (Cedar's messages may
    /// quote the call's values, which are never logged).
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Entities(_) => "entities",
            Self::ResourceNotFound(_) => "resource_not_found",
            Self::Projection(_) => "projection",
            Self::Request(e) => e.kind(),
        }
    }

    /// The executor's entities, refused by toolgate's own rules.
    pub(super) fn invalid_entities(e: InvalidEntities) -> Self {
        Self::Entities(Box::new(e))
    }

    /// The executor's entities, refused by Cedar.
    pub(super) fn entities(e: EntitiesError) -> Self {
        Self::Entities(Box::new(InvalidEntities::Cedar(e)))
    }

    /// A request, an entity or a context toolgate built that Cedar refused.
    pub(super) fn request(e: impl Into<BuildError>) -> Self {
        Self::Request(Box::new(e.into()))
    }
}

/// Why the executor's entities cannot be used.
#[derive(Debug, thiserror::Error)]
#[allow(
    clippy::large_enum_variant,
    reason = "Cedar's error held as it is; boxed once, in DecideError"
)]
pub enum InvalidEntities {
    #[error("must be a JSON array of Cedar entities")]
    NotAnArray,
    /// The principal comes from the auth context alone (DESIGN §1).
    #[error("entities must not define the principal `{0}`")]
    DefinesPrincipal(EntityUid),
    /// Cedar's parser or its schema check refused them.
    #[error(transparent)]
    Cedar(#[from] EntitiesError),
}

/// What Cedar refused of a value toolgate built for a request: each kind
/// with Cedar's own error. Any of them is a toolgate bug (the values are
/// built from the generated schema); the edge logs the kind, never the
/// message, which may quote the call's arguments.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Entities(#[from] EntitiesError),
    #[error(transparent)]
    Entity(#[from] EntityAttrEvaluationError),
    #[error(transparent)]
    TypeName(#[from] ParseErrors),
    #[error(transparent)]
    Request(#[from] RequestValidationError),
    #[error(transparent)]
    ContextJson(#[from] ContextJsonError),
    #[error(transparent)]
    Context(#[from] ContextCreationError),
    #[error(transparent)]
    Record(#[from] cedar_policy::ExpressionConstructionError),
    #[error("no type `{0}` among the generated ones")]
    NoGeneratedType(String),
}

impl BuildError {
    /// The kind, for logs and metrics: a fixed word per variant.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Entities(_) => "entities",
            Self::Entity(_) => "entity",
            Self::TypeName(_) => "type_name",
            Self::Request(_) => "request",
            Self::ContextJson(_) | Self::Context(_) | Self::Record(_) => "context",
            Self::NoGeneratedType(_) => "no_generated_type",
        }
    }
}

pub(super) fn uid(ty: &str, id: &str) -> Result<EntityUid, DecideError> {
    let ty = match ty {
        "User" | "Tenant" | "Tool" | "Action" => GENERATED_TYPES
            .iter()
            .find(|t| t.basename() == ty)
            .cloned()
            .ok_or_else(|| DecideError::request(BuildError::NoGeneratedType(ty.to_owned())))?,
        _ => EntityTypeName::from_str(ty).map_err(DecideError::request)?,
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
        .map_err(DecideError::request)?;
    let mut extra = vec![user];
    if base.get(tenant).is_none() {
        extra.push(Entity::new_no_attrs(tenant.clone(), HashSet::new()));
    }
    Ok(extra)
}
