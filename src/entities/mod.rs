//! The entity store's rules (DESIGN §11.6): what a stored entity is, the
//! bounds of a request and of the ancestor walk, and every refusal with
//! its stable code. `desk.rs` ([`desk::EntityDesk`]) does the IO.
//!
//! A gateway carries no `entities_json`, yet a tool's policies usually look
//! at its resource. toolgate keeps Cedar entities per tenant: a write for
//! tenant T lands in T's rows only, and a decision for T reads only T's
//! rows, so no caller can change another tenant's decisions.
//!
//! This module holds data and rules only: no IO, no Cedar (the schema check
//! is [`crate::policy::PolicyEngine::check_entities`]), no gRPC.

pub mod desk;

use std::collections::HashSet;
use std::fmt;

use serde_json::Value;

use crate::decode::{self, Limits};

/// An entity's key within a tenant: its Cedar type and id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntityKey {
    /// The Cedar entity type, as written (`Order`, `Shop::Order`).
    pub entity_type: String,
    pub id: String,
}

impl EntityKey {
    #[must_use]
    pub fn new(entity_type: impl Into<String>, id: impl Into<String>) -> Self {
        Self {
            entity_type: entity_type.into(),
            id: id.into(),
        }
    }
}

impl fmt::Display for EntityKey {
    /// Cedar's spelling of a uid, `Order::"ord_1"`, with the id escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}::{:?}", self.entity_type, self.id)
    }
}

/// One entity as stored: checked against the schema when written, kept as
/// canonical Cedar entity JSON with its parents beside it (the ancestor
/// walk follows them without reading the JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntity {
    pub key: EntityKey,
    pub parents: Vec<EntityKey>,
    /// The entity as Cedar entity JSON (RFC 8785 canonical form).
    pub json: String,
}

/// What a decision's ancestor walk found in one tenant's rows: the
/// resource (when stored) and every stored ancestor it reaches.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntityWalk {
    /// The stored entities reached, each as its canonical JSON.
    pub found: Vec<String>,
    /// The walk reached more than its bound of entities: what it found is
    /// incomplete, and no decision may be made on it (fail closed).
    pub exceeded: bool,
}

/// The bounds of the entity store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntityLimits {
    /// The most entities one `UpsertEntities` writes.
    pub max_entities_per_request: usize,
    /// The most uids one `GetEntities` or `DeleteEntities` names.
    pub max_uids_per_request: usize,
    /// The largest one entity may be, in bytes of its canonical JSON.
    pub max_entity_bytes: usize,
    /// The most parents one entity may name.
    pub max_parents: usize,
    /// The most entities (the resource and its ancestors, stored or not)
    /// one decision's walk visits; a walk that would visit more is refused.
    pub max_walk: usize,
}

impl Default for EntityLimits {
    fn default() -> Self {
        Self {
            max_entities_per_request: 1_000,
            max_uids_per_request: 1_000,
            max_entity_bytes: 64 * 1024,
            max_parents: 64,
            max_walk: 256,
        }
    }
}

/// Why an entity request is refused: each a stable code (the `ErrorInfo`
/// reason of the `INVALID_ARGUMENT` status a client sees).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    /// `tenant_id` is empty.
    TenantRequired,
    /// `entities_json` is not strict JSON (a duplicate key, a lone
    /// surrogate, a size or depth over the limit, …).
    InvalidJson,
    /// `entities_json` is not a JSON array.
    NotAnArray,
    /// More entities (or uids) than one request may carry.
    TooManyEntities,
    /// One entity's JSON is larger than the limit.
    EntityTooLarge,
    /// An item is not an object with a `uid` of `{"type", "id"}` strings.
    MalformedEntity,
    /// The uid's type is not an entity type of the schema.
    UnknownEntityType,
    /// The uid is an action: actions come from the schema alone.
    ActionEntity,
    /// The uid's type is one toolgate generates (`User`, `Tenant`, `Tool`,
    /// `Approval`): those come from the auth context, the contracts and
    /// the approvals, never from stored data.
    GeneratedEntityType,
    /// The uid is one of `policies/entities.json`: static entities apply
    /// to every tenant and are not shadowed per tenant.
    StaticEntity,
    /// The same uid twice in one request.
    DuplicateUid,
    /// More parents than one entity may name.
    TooManyParents,
    /// An attribute's value is not of its declared type.
    AttributeTypeMismatch,
    /// A required attribute is missing.
    MissingAttribute,
    /// An attribute the schema does not declare.
    UnexpectedAttribute,
    /// A parent of a type the schema does not allow for this type.
    InvalidParentType,
    /// Any other disagreement with the schema.
    EntityInvalid,
    /// A uid of `GetEntities` / `DeleteEntities` with an empty type.
    MalformedUid,
}

impl RefusalCode {
    /// The stable code.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TenantRequired => "tenant_required",
            Self::InvalidJson => "invalid_json",
            Self::NotAnArray => "not_an_array",
            Self::TooManyEntities => "too_many_entities",
            Self::EntityTooLarge => "entity_too_large",
            Self::MalformedEntity => "malformed_entity",
            Self::UnknownEntityType => "unknown_entity_type",
            Self::ActionEntity => "action_entity",
            Self::GeneratedEntityType => "generated_entity_type",
            Self::StaticEntity => "static_entity",
            Self::DuplicateUid => "duplicate_uid",
            Self::TooManyParents => "too_many_parents",
            Self::AttributeTypeMismatch => "attribute_type_mismatch",
            Self::MissingAttribute => "missing_attribute",
            Self::UnexpectedAttribute => "unexpected_attribute",
            Self::InvalidParentType => "invalid_parent_type",
            Self::EntityInvalid => "entity_invalid",
            Self::MalformedUid => "malformed_uid",
        }
    }
}

/// A refused entity request: nothing of it was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EntityRefusal {
    pub code: RefusalCode,
    /// The request field at fault (`tenant_id`, `entities_json`, `uids`).
    pub field: &'static str,
    /// What is wrong, for the caller; never an attribute's value.
    pub message: String,
    /// The index of the entity or uid at fault, when there is one.
    pub index: Option<usize>,
    /// A finer reason, when the code has one (the strict decoder's:
    /// `duplicate_key`, `lone_surrogate`, `too_large`, …).
    pub reason: Option<&'static str>,
}

impl EntityRefusal {
    #[must_use]
    pub fn new(code: RefusalCode, field: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            field,
            message: message.into(),
            index: None,
            reason: None,
        }
    }

    /// The same refusal, about the item at `index`.
    #[must_use]
    pub fn at(mut self, index: usize) -> Self {
        self.index = Some(index);
        self
    }
}

/// One entity of an upsert whose shape is checked (a uid, parents, the
/// size bound); the schema check is [`crate::policy::PolicyEngine::check_entities`].
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub key: EntityKey,
    pub parents: Vec<EntityKey>,
    /// The entity as sent (strictly decoded).
    pub value: Value,
    /// Its canonical form: what is stored.
    pub json: String,
}

/// `entities_json` of an upsert, decoded as strictly as a model's
/// arguments (`decoding`: size and depth) and shaped: an array of at most
/// [`EntityLimits::max_entities_per_request`] objects, each with a `uid` of
/// exactly `{"type", "id"}` strings and `parents` (if any) of the same form,
/// at most [`EntityLimits::max_parents`] of them, at most
/// [`EntityLimits::max_entity_bytes`] in canonical form, no uid twice.
///
/// # Errors
/// [`EntityRefusal`] naming the first problem (and the entity's index).
pub fn candidates(
    text: &str,
    decoding: &Limits,
    limits: &EntityLimits,
) -> Result<Vec<Candidate>, EntityRefusal> {
    const FIELD: &str = "entities_json";
    let value = decode::parse_strict(text.as_bytes(), decoding).map_err(|e| {
        let mut refusal = EntityRefusal::new(RefusalCode::InvalidJson, FIELD, e.to_string());
        refusal.reason = Some(e.reason());
        refusal
    })?;
    let Value::Array(items) = value else {
        return Err(EntityRefusal::new(
            RefusalCode::NotAnArray,
            FIELD,
            "must be a JSON array of Cedar entities",
        ));
    };
    if items.len() > limits.max_entities_per_request {
        return Err(EntityRefusal::new(
            RefusalCode::TooManyEntities,
            FIELD,
            format!(
                "{} entities, more than the {} one request may write",
                items.len(),
                limits.max_entities_per_request
            ),
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, value) in items.into_iter().enumerate() {
        let candidate = candidate(value, limits).map_err(|r| r.at(i))?;
        if !seen.insert(candidate.key.clone()) {
            return Err(EntityRefusal::new(
                RefusalCode::DuplicateUid,
                FIELD,
                format!("`{}` appears more than once", candidate.key),
            )
            .at(i));
        }
        out.push(candidate);
    }
    Ok(out)
}

fn candidate(value: Value, limits: &EntityLimits) -> Result<Candidate, EntityRefusal> {
    let malformed = |what: &str| {
        EntityRefusal::new(
            RefusalCode::MalformedEntity,
            "entities_json",
            what.to_owned(),
        )
    };
    let Value::Object(map) = &value else {
        return Err(malformed("an entity must be a JSON object"));
    };
    let key = map.get("uid").and_then(explicit_uid).ok_or_else(|| {
        malformed("an entity needs a `uid` of exactly {\"type\", \"id\"} strings")
    })?;
    let parents = match map.get("parents") {
        None => Vec::new(),
        Some(Value::Array(parents)) => {
            if parents.len() > limits.max_parents {
                return Err(EntityRefusal::new(
                    RefusalCode::TooManyParents,
                    "entities_json",
                    format!(
                        "`{key}` names {} parents, more than {}",
                        parents.len(),
                        limits.max_parents
                    ),
                ));
            }
            parents
                .iter()
                .map(explicit_uid)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    malformed("each parent must be exactly {\"type\", \"id\"} strings")
                })?
        }
        Some(_) => return Err(malformed("`parents` must be an array")),
    };
    let json = decode::canonical_json(&value)
        .map_err(|e| malformed(&format!("cannot be put in canonical form: {e}")))?;
    if json.len() > limits.max_entity_bytes {
        return Err(EntityRefusal::new(
            RefusalCode::EntityTooLarge,
            "entities_json",
            format!(
                "`{key}` is {} bytes in canonical form, more than {}",
                json.len(),
                limits.max_entity_bytes
            ),
        ));
    }
    Ok(Candidate {
        key,
        parents,
        value,
        json,
    })
}

/// `{"type": "...", "id": "..."}`, exactly, both non-empty strings.
fn explicit_uid(value: &Value) -> Option<EntityKey> {
    let map = value.as_object()?;
    if map.len() != 2 {
        return None;
    }
    let entity_type = map.get("type")?.as_str()?;
    let id = map.get("id")?.as_str()?;
    (!entity_type.is_empty()).then(|| EntityKey::new(entity_type, id))
}

/// The uids of a `GetEntities` or `DeleteEntities`, checked: at most
/// [`EntityLimits::max_uids_per_request`], none with an empty type (Cedar
/// allows an empty id).
///
/// # Errors
/// [`EntityRefusal`] naming the first problem.
pub fn check_uids(uids: &[EntityKey], limits: &EntityLimits) -> Result<(), EntityRefusal> {
    if uids.len() > limits.max_uids_per_request {
        return Err(EntityRefusal::new(
            RefusalCode::TooManyEntities,
            "uids",
            format!(
                "{} uids, more than the {} one request may name",
                uids.len(),
                limits.max_uids_per_request
            ),
        ));
    }
    if let Some(i) = uids.iter().position(|u| u.entity_type.is_empty()) {
        return Err(EntityRefusal::new(
            RefusalCode::MalformedUid,
            "uids",
            "a uid needs a non-empty type",
        )
        .at(i));
    }
    Ok(())
}

/// The tenant of an entity request, which must be named.
///
/// # Errors
/// [`RefusalCode::TenantRequired`] when it is empty.
pub fn check_tenant(tenant_id: &str) -> Result<(), EntityRefusal> {
    if tenant_id.is_empty() {
        return Err(EntityRefusal::new(
            RefusalCode::TenantRequired,
            "tenant_id",
            "must not be empty",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_bounded_and_never_empty() {
        let limits = EntityLimits {
            max_uids_per_request: 2,
            ..EntityLimits::default()
        };
        let ok = [EntityKey::new("Order", "a"), EntityKey::new("Order", "b")];
        assert_eq!(check_uids(&ok, &limits), Ok(()));
        let many = [
            EntityKey::new("Order", "a"),
            EntityKey::new("Order", "b"),
            EntityKey::new("Order", "c"),
        ];
        assert_eq!(
            check_uids(&many, &limits).unwrap_err().code,
            RefusalCode::TooManyEntities
        );
        let empty = [EntityKey::new("Order", "a"), EntityKey::new("", "b")];
        let refusal = check_uids(&empty, &limits).unwrap_err();
        assert_eq!(
            (refusal.code, refusal.index),
            (RefusalCode::MalformedUid, Some(1))
        );
        assert_eq!(
            check_tenant("").unwrap_err().code.as_str(),
            "tenant_required"
        );
    }

    #[test]
    fn a_key_prints_as_a_cedar_uid() {
        assert_eq!(
            EntityKey::new("Order", "ord \"1\"").to_string(),
            r#"Order::"ord \"1\"""#
        );
    }
}
