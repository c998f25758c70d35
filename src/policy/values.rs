//! Cedar values built directly from JSON in Cedar's *explicit* entity-JSON
//! forms, without Cedar's JSON parser.
//!
//! Cedar's parser tries each form of a value in turn and builds an error
//! message for every form that does not match; on the decision path that was
//! most of the cost of a decision. The explicit forms are few and exact:
//! strings, booleans, integers, arrays (sets), objects (records),
//! `{"__entity": {"type", "id"}}` and `{"__extn": {"fn", "arg"}}`.
//! Anything else (a float, `null`, Cedar's implicit schema-directed forms,
//! `__expr`, entity tags) is `None` here, and the caller falls back to
//! Cedar's own parser, which accepts or refuses it with its own message.
//!
//! INVARIANT: for every input this module converts, Cedar's parser produces
//! the same value. Converted entities are still validated against the
//! schema by the caller (`Entities::add_entities` with the schema), exactly
//! as parsed ones were; a converted entity that fails that check is parsed
//! again by Cedar, so an implicit form Cedar reads differently (an entity
//! reference written as a record) never changes a decision.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression};
use serde_json::{Map, Value};

/// The value of an explicit Cedar JSON form, or `None` to defer to Cedar.
pub(super) fn restricted(value: &Value) -> Option<RestrictedExpression> {
    Some(match value {
        Value::String(s) => RestrictedExpression::new_string(s.clone()),
        Value::Bool(b) => RestrictedExpression::new_bool(*b),
        Value::Number(n) => RestrictedExpression::new_long(n.as_i64()?),
        Value::Array(items) => {
            RestrictedExpression::new_set(items.iter().map(restricted).collect::<Option<Vec<_>>>()?)
        }
        Value::Object(map) => return object(map),
        Value::Null => return None,
    })
}

fn object(map: &Map<String, Value>) -> Option<RestrictedExpression> {
    if let Some(escape) = single(map, "__entity") {
        return Some(RestrictedExpression::new_entity_uid(uid(escape)?));
    }
    if let Some(escape) = single(map, "__extn") {
        let escape = escape.as_object()?;
        if escape.len() != 2 {
            return None;
        }
        let arg = escape.get("arg")?.as_str()?;
        return Some(match escape.get("fn")?.as_str()? {
            "decimal" => RestrictedExpression::new_decimal(arg),
            "ip" => RestrictedExpression::new_ip(arg),
            "datetime" => RestrictedExpression::new_datetime(arg),
            "duration" => RestrictedExpression::new_duration(arg),
            _ => return None,
        });
    }
    // Any other `__` key is an escape this module does not know.
    if map.keys().any(|k| k.starts_with("__")) {
        return None;
    }
    let fields = map
        .iter()
        .map(|(k, v)| Some((k.clone(), restricted(v)?)))
        .collect::<Option<Vec<_>>>()?;
    RestrictedExpression::new_record(fields).ok()
}

/// The value of `key` when it is the object's only key.
fn single<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    if map.len() == 1 { map.get(key) } else { None }
}

/// `{"type": "...", "id": "..."}`, exactly.
fn uid(value: &Value) -> Option<EntityUid> {
    let map = value.as_object()?;
    if map.len() != 2 {
        return None;
    }
    let ty = EntityTypeName::from_str(map.get("type")?.as_str()?).ok()?;
    Some(EntityUid::from_type_name_and_id(
        ty,
        EntityId::new(map.get("id")?.as_str()?),
    ))
}

/// `{"uid", "attrs", "parents"}` in explicit forms (the uid and parents as
/// `{"type", "id"}` or `{"__entity": …}`), or `None` to defer to Cedar.
pub(super) fn entity(value: &Value) -> Option<Entity> {
    let map = value.as_object()?;
    if map
        .keys()
        .any(|k| !matches!(k.as_str(), "uid" | "attrs" | "parents"))
    {
        return None;
    }
    let entity_ref = |v: &Value| match v.as_object().and_then(|m| single(m, "__entity")) {
        Some(inner) => uid(inner),
        None => uid(v),
    };
    let id = entity_ref(map.get("uid")?)?;
    let attrs = match map.get("attrs") {
        None => HashMap::new(),
        Some(attrs) => attrs
            .as_object()?
            .iter()
            .map(|(k, v)| Some((k.clone(), restricted(v)?)))
            .collect::<Option<HashMap<_, _>>>()?,
    };
    let parents = match map.get("parents") {
        None => HashSet::new(),
        Some(parents) => parents
            .as_array()?
            .iter()
            .map(entity_ref)
            .collect::<Option<HashSet<_>>>()?,
    };
    Entity::new(id, attrs, parents).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every value converted here is the value Cedar's own parser gives.
    #[test]
    fn explicit_forms_convert_to_what_cedar_parses() {
        let entity_json = json!({
            "uid": {"type": "Order", "id": "ord_1"},
            "attrs": {
                "s": "text", "b": true, "n": -42, "big": 9_007_199_254_740_991_i64,
                "set": [1, 2, 3], "nested": {"a": {"b": ["x"]}},
                "e": {"__entity": {"type": "User", "id": "alice"}},
                "d": {"__extn": {"fn": "decimal", "arg": "12.5"}},
                "ip": {"__extn": {"fn": "ip", "arg": "10.0.0.0/8"}},
                "dt": {"__extn": {"fn": "datetime", "arg": "2024-01-01T00:00:00Z"}},
                "du": {"__extn": {"fn": "duration", "arg": "1h30m"}},
                "empty": {}
            },
            "parents": [{"type": "Tenant", "id": "acme"}, {"__entity": {"type": "Group", "id": "g"}}]
        });
        let ours = entity(&entity_json).unwrap();
        let cedars = Entity::from_json_value(entity_json, None).unwrap();
        assert_eq!(ours, cedars);
    }

    /// What this module does not know is left to Cedar, never guessed.
    #[test]
    fn other_forms_are_deferred() {
        for v in [
            json!(null),
            json!(1.5),
            json!({"__expr": "1 + 1"}),
            json!({"__entity": {"type": "User", "id": "a"}, "x": 1}),
            json!({"__extn": {"fn": "unknown", "arg": "1"}}),
            json!({"__extn": {"fn": "decimal", "arg": "1", "extra": 1}}),
            json!([1, null]),
            json!({"a": {"__other": 1}}),
        ] {
            assert!(restricted(&v).is_none(), "{v}");
        }
        for e in [
            json!({"uid": {"type": "User", "id": "a"}, "tags": {}}),
            json!({"uid": {"type": "User", "id": "a", "x": 1}}),
            json!({"uid": {"type": "User", "id": "a"}, "attrs": {"x": null}}),
            json!({"uid": {"type": "not a type", "id": "a"}}),
        ] {
            assert!(entity(&e).is_none(), "{e}");
        }
    }
}
