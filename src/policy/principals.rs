//! Per action and caller, the request's base with the caller's principal in
//! it, memoised for the life of one [`super::PolicyEngine`].
//!
//! Every decision used to add the principal (and its tenant, when the base
//! lacks it) to the action's base: Cedar checks each added entity against
//! the schema and repairs the transitive closure, about a tenth of a
//! decision in process. What it builds is a pure function of the engine
//! (schema, the action's base), the action and three fields of the
//! caller — the subject, the tenant and the roles — so it is built once per such
//! tuple, checked exactly as before, and shared: a call without entities of
//! its own evaluates on it as it is, a call with some adds them to a copy.
//!
//! INVARIANT: a cached base is exactly what the uncached path built: the
//! same entities, checked against the same schema, with the closure
//! computed; an error is never cached. The engine owns the memo, so a
//! reload (new schema, new bases) starts an empty one.
//!
//! The memo is bounded by weight (entities held, counting the base each
//! entry copies), so a deployment with many callers or a large static
//! entity file costs at most [`WEIGHT_CAPACITY`] map slots.

use std::sync::Arc;

use cedar_policy::{Entities, EntityUid, Schema};
use quick_cache::{Equivalent, Weighter};

use super::parts::{DecideError, principal_entities};
use crate::identity::Caller;

/// Entities the memo holds at most, over all entries (a few MiB of map
/// slots at worst; one entry holds its base's entities plus one or two).
pub(super) const WEIGHT_CAPACITY: u64 = 65_536;

/// Entries expected; the memo sizes its shards for this many.
const ITEMS: usize = 1_024;

/// What the principal's base depends on besides the engine.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    action: String,
    subject: String,
    tenant: String,
    roles: Vec<String>,
}

/// A [`Key`] by reference: looked up without copying the caller's strings.
/// Hashes exactly as the `Key` it names (`&str` as `String`, `&[String]` as
/// `Vec<String>`, fields in the same order).
#[derive(Hash)]
struct Lookup<'a> {
    action: &'a str,
    subject: &'a str,
    tenant: &'a str,
    roles: &'a [String],
}

impl Equivalent<Key> for Lookup<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.action == key.action
            && self.subject == key.subject
            && self.tenant == key.tenant
            && self.roles == key.roles.as_slice()
    }
}

/// An entry weighs the entities it holds (at least 1).
#[derive(Debug, Clone, Copy)]
struct ByEntities;

impl Weighter<Key, Arc<Entities>> for ByEntities {
    fn weight(&self, _: &Key, value: &Arc<Entities>) -> u64 {
        u64::try_from(value.len()).unwrap_or(u64::MAX).max(1)
    }
}

/// The memo of one engine.
pub(super) struct PrincipalBases {
    cache: quick_cache::sync::Cache<Key, Arc<Entities>, ByEntities>,
}

impl PrincipalBases {
    pub(super) fn new() -> Self {
        Self {
            cache: quick_cache::sync::Cache::with_weighter(ITEMS, WEIGHT_CAPACITY, ByEntities),
        }
    }

    /// `base` (the base of the action named `action`) plus the principal `caller`
    /// acts as, checked against `schema`; built on a miss.
    ///
    /// # Errors
    /// [`DecideError`] when the principal cannot be built or does not fit
    /// the schema (nothing is cached then).
    pub(super) fn get(
        &self,
        action: &str,
        caller: &Caller,
        schema: &Schema,
        base: &Entities,
        principal: &EntityUid,
        tenant: &EntityUid,
    ) -> Result<Arc<Entities>, DecideError> {
        let lookup = Lookup {
            action,
            subject: &caller.subject_id,
            tenant: &caller.tenant_id,
            roles: &caller.roles,
        };
        if let Some(found) = self.cache.get(&lookup) {
            return Ok(found);
        }
        let extra = principal_entities(caller, base, principal, tenant)?;
        let built = Arc::new(
            base.clone()
                .add_entities(extra, Some(schema))
                .map_err(DecideError::entities)?,
        );
        self.cache.insert(
            Key {
                action: action.to_owned(),
                subject: caller.subject_id.clone(),
                tenant: caller.tenant_id.clone(),
                roles: caller.roles.clone(),
            },
            Arc::clone(&built),
        );
        Ok(built)
    }

    /// How many bases are memoised (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.cache.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use std::hash::BuildHasher;

    use super::*;
    use crate::policy::callable_tests::{examples, order as order_entity};
    use crate::policy::{DecideError, PolicyDecision, PolicyEngine, ToolCall};

    /// A support agent of `tenant` (the example policies' refund caller).
    fn caller(subject: &str, tenant: &str, roles: &[&str]) -> Caller {
        crate::policy::callable_tests::caller(
            subject,
            tenant,
            roles,
            &["orders:read", "orders:refund"],
            "support-bot",
        )
    }

    /// The executor's entities of a refund: the order, of `tenant`.
    fn order(tenant: &str) -> Value {
        json!([order_entity("ord_1001", tenant, "alice", 50_000)])
    }

    fn refund(
        engine: &PolicyEngine,
        caller: &Caller,
        entities: &Value,
    ) -> Result<PolicyDecision, DecideError> {
        let tool = engine.tools().get("refund_order").unwrap();
        let arguments = json!({"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"});
        assert!(tool.validate_input(&arguments, 5).is_empty());
        engine.decide_tool_call(&ToolCall {
            caller,
            tool,
            arguments: &arguments,
            entities: Some(entities),
            approved: false,
            budgets: &engine.unspent_budgets(&tool.name),
            session: None,
        })
    }

    /// A decision on a memoised base is the decision a fresh engine makes,
    /// for every caller, and one entry serves each (action, caller).
    #[test]
    fn a_memoised_base_decides_as_a_fresh_one() {
        let memo = examples();
        let callers = [
            caller("bob", "acme", &["support_agent"]),
            caller("bob", "acme", &[]),
            caller("bob", "acme", &["support_agent", "support_lead"]),
            caller("carol", "globex", &["support_agent"]),
            // A tenant the static entities lack: the base gains it.
            caller("dave", "initech", &["support_agent"]),
        ];
        let mut answers = Vec::new();
        for c in &callers {
            for tenant in ["acme", "globex", "initech"] {
                let fresh = refund(&examples(), c, &order(tenant));
                let first = refund(&memo, c, &order(tenant));
                let again = refund(&memo, c, &order(tenant));
                assert_eq!(format!("{first:?}"), format!("{fresh:?}"), "{c:?} {tenant}");
                assert_eq!(format!("{again:?}"), format!("{fresh:?}"), "{c:?} {tenant}");
                answers.push(format!("{fresh:?}"));
            }
        }
        assert_eq!(memo.principal_bases.len(), callers.len());
        // The callers are told apart: not one answer for everybody.
        answers.sort();
        answers.dedup();
        assert!(answers.len() > 1, "{answers:?}");
    }

    /// What the executor supplies is checked on every call, hit or miss,
    /// and answered as a fresh engine answers: it may not define the
    /// principal, and may repeat the tenant the base gained only as it is.
    #[test]
    fn a_hit_checks_the_supplied_entities_as_a_miss_does() {
        let engine = examples();
        let dave = caller("dave", "initech", &["support_agent"]);
        let spoof = json!([{"uid": {"type": "User", "id": "dave"},
                            "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "initech"}},
                                      "roles": ["admin"]},
                            "parents": [{"type": "Tenant", "id": "initech"}]}]);
        let mut same_tenant = order("initech");
        same_tenant
            .as_array_mut()
            .unwrap()
            .push(json!({"uid": {"type": "Tenant", "id": "initech"}, "attrs": {}, "parents": []}));
        let other_tenant = json!([{"uid": {"type": "Tenant", "id": "initech"}, "attrs": {},
                                   "parents": [{"type": "Tenant", "id": "acme"}]}]);
        for round in ["miss", "hit"] {
            let answers = [&spoof, &same_tenant, &other_tenant].map(|supplied| {
                (
                    refund(&examples(), &dave, supplied),
                    refund(&engine, &dave, supplied),
                )
            });
            for (fresh, memo) in &answers {
                assert_eq!(format!("{memo:?}"), format!("{fresh:?}"), "{round}");
            }
            let [(_, spoofed), (_, same), (_, other)] = answers;
            let Err(DecideError::Entities(e)) = spoofed else {
                panic!("{round}: the principal was redefined")
            };
            assert_eq!(
                e.to_string(),
                "entities must not define the principal `User::\"dave\"`",
                "{round}"
            );
            assert_eq!(
                format!("{:?}", same.unwrap()),
                format!("{:?}", refund(&engine, &dave, &order("initech")).unwrap()),
                "{round}"
            );
            assert!(
                matches!(other, Err(DecideError::Entities(_))),
                "{round}: {other:?}"
            );
            assert_eq!(engine.principal_bases.len(), 1, "{round}");
        }
    }

    /// A lookup must hash as the key it names, or every call would miss.
    #[test]
    fn a_lookup_hashes_as_its_key() {
        let roles = vec!["support".to_owned(), "admin".to_owned()];
        let key = Key {
            action: "refund_order".into(),
            subject: "user:bob".into(),
            tenant: "acme".into(),
            roles: roles.clone(),
        };
        let lookup = Lookup {
            action: "refund_order",
            subject: "user:bob",
            tenant: "acme",
            roles: &roles,
        };
        let state = std::hash::RandomState::new();
        assert_eq!(state.hash_one(&key), state.hash_one(&lookup));
        assert!(lookup.equivalent(&key));
        // Moving a byte between fields is another key.
        let shifted = Lookup {
            action: "refund_orde",
            subject: "ruser:bob",
            tenant: "acme",
            roles: &roles,
        };
        assert!(!shifted.equivalent(&key));
        assert_ne!(state.hash_one(&key), state.hash_one(&shifted));
    }
}
