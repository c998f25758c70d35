//! The entity desk: `EntityService`'s upsert, delete and get (DESIGN §11.6).
//!
//! Every call names its tenant, which must be one the caller's grants of
//! the `entities` service name (`access::TenantScope`), checked before
//! anything is read, validated or written. An upsert is strictly decoded,
//! shaped ([`super::candidates`]), checked against the live schema
//! ([`PolicyEngine::check_entities`]) and written in one store transaction:
//! a refusal writes nothing. Each write is audited (counts only, never an
//! entity) and every call counted. This module knows nothing of gRPC.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;

use super::{
    EntityKey, EntityLimits, EntityRefusal, StoredEntity, candidates, check_tenant, check_uids,
};
use crate::access::TenantScope;
use crate::audit::{Audit, AuditEvent, EntityAudit};
use crate::clock::Clock;
use crate::decode::Limits;
use crate::envelope::TenantNotGranted;
use crate::metrics::Metrics;
use crate::policy::PolicyEngine;
use crate::store::{Store, StoreError};

/// Why an entity call failed.
#[derive(Debug, thiserror::Error)]
pub enum EntityError {
    /// The request itself is wrong (`INVALID_ARGUMENT`); nothing was written.
    #[error(transparent)]
    Refused(#[from] EntityRefusal),
    /// The caller may not act for this tenant (`PERMISSION_DENIED`).
    #[error(transparent)]
    TenantNotGranted(#[from] TenantNotGranted),
    /// The store failed (retryable); nothing was written.
    #[error("the entity store is unavailable")]
    Store(#[source] StoreError),
}

impl EntityError {
    /// The outcome label of metrics and audit events.
    #[must_use]
    pub const fn outcome(&self) -> &'static str {
        match self {
            Self::Refused(r) => r.code.as_str(),
            Self::TenantNotGranted(_) => "tenant_not_granted",
            Self::Store(_) => "internal_error",
        }
    }
}

/// Who calls, for which tenant: what every entity call carries.
#[derive(Debug, Clone, Copy)]
pub struct EntityCall<'a> {
    pub tenant_id: &'a str,
    /// The transport identity, for the audit log.
    pub peer: &'a str,
    /// The tenants the caller's grants of `entities` name.
    pub tenants: &'a TenantScope,
}

/// Everything an [`EntityDesk`] needs; none of it has a default.
#[derive(Debug)]
pub(crate) struct EntityDeskParts {
    pub engine: Arc<ArcSwap<PolicyEngine>>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub audit: Arc<Audit>,
    pub metrics: Arc<Metrics>,
    pub limits: EntityLimits,
    /// How strictly `entities_json` is decoded (size and depth).
    pub decoding: Limits,
}

/// The entity desk.
#[derive(Debug)]
pub struct EntityDesk {
    engine: Arc<ArcSwap<PolicyEngine>>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    audit: Arc<Audit>,
    metrics: Arc<Metrics>,
    limits: EntityLimits,
    decoding: Limits,
}

impl EntityDesk {
    /// A desk wired as production wires it (see [`crate::server`]).
    #[must_use]
    pub(crate) fn new(parts: EntityDeskParts) -> Self {
        let EntityDeskParts {
            engine,
            store,
            clock,
            audit,
            metrics,
            limits,
            decoding,
        } = parts;
        Self {
            engine,
            store,
            clock,
            audit,
            metrics,
            limits,
            decoding,
        }
    }

    /// Writes the entities of `entities_json` (a Cedar entity JSON array)
    /// into the tenant's rows, each replacing the stored entity of its uid;
    /// returns how many.
    ///
    /// # Errors
    /// [`EntityError`]: a refusal (nothing written), a tenant not granted,
    /// or a store failure (nothing written).
    pub async fn upsert(
        &self,
        call: EntityCall<'_>,
        entities_json: &str,
    ) -> Result<usize, EntityError> {
        let started = Instant::now();
        self.admit("upsert", call)?;
        let engine = self.engine.load_full();
        let result = self.write_entities(&engine, call, entities_json).await;
        // A refused upsert names no entity the event could count.
        let named = *result.as_ref().unwrap_or(&0);
        self.finish("upsert", call, named, &engine, &result, started)
            .await;
        result
    }

    async fn write_entities(
        &self,
        engine: &PolicyEngine,
        call: EntityCall<'_>,
        entities_json: &str,
    ) -> Result<usize, EntityError> {
        let candidates = candidates(entities_json, &self.decoding, &self.limits)?;
        engine.check_entities(&candidates)?;
        let n = candidates.len();
        let entities: Vec<StoredEntity> = candidates
            .into_iter()
            .map(|c| StoredEntity {
                key: c.key,
                parents: c.parents,
                json: c.json,
            })
            .collect();
        if !entities.is_empty() {
            self.store
                .upsert_entities(call.tenant_id, entities, self.clock.now_ms())
                .await
                .map_err(|e| self.store_failure(e))?;
        }
        Ok(n)
    }

    /// Deletes these uids from the tenant's rows; returns how many were stored.
    ///
    /// # Errors
    /// As [`Self::upsert`].
    pub async fn delete(
        &self,
        call: EntityCall<'_>,
        uids: Vec<EntityKey>,
    ) -> Result<usize, EntityError> {
        let started = Instant::now();
        self.admit("delete", call)?;
        let engine = self.engine.load_full();
        let named = uids.len();
        let result = match check_uids(&uids, &self.limits) {
            Err(e) => Err(e.into()),
            Ok(()) => self
                .store
                .delete_entities(call.tenant_id, distinct(uids))
                .await
                .map_err(|e| self.store_failure(e)),
        };
        self.finish("delete", call, named, &engine, &result, started)
            .await;
        result
    }

    /// The tenant's stored entities of these uids, each once, in the order
    /// first asked; a uid not stored is left out.
    ///
    /// # Errors
    /// As [`Self::upsert`].
    pub async fn get(
        &self,
        call: EntityCall<'_>,
        uids: Vec<EntityKey>,
    ) -> Result<Vec<(EntityKey, String)>, EntityError> {
        let result = self.read(call, uids).await;
        self.metrics.entity_call(
            "get",
            result.as_ref().map_or_else(EntityError::outcome, |_| "ok"),
        );
        result
    }

    async fn read(
        &self,
        call: EntityCall<'_>,
        uids: Vec<EntityKey>,
    ) -> Result<Vec<(EntityKey, String)>, EntityError> {
        admit(call)?;
        check_uids(&uids, &self.limits)?;
        self.store
            .get_entities(call.tenant_id, distinct(uids))
            .await
            .map_err(|e| self.store_failure(e))
    }

    /// Counts the call and audits it, once the tenant was admitted: a
    /// write is durable before its event, so a full queue loses (and
    /// counts) the event, never the answer.
    async fn finish(
        &self,
        operation: &'static str,
        call: EntityCall<'_>,
        named: usize,
        engine: &PolicyEngine,
        result: &Result<usize, EntityError>,
        started: Instant,
    ) {
        let outcome = result.as_ref().map_or_else(EntityError::outcome, |_| "ok");
        self.metrics.entity_call(operation, outcome);
        let event = AuditEvent::entities(
            &EntityAudit {
                operation,
                tenant: call.tenant_id,
                peer: call.peer,
                uids: named,
                changed: *result.as_ref().unwrap_or(&0),
                outcome,
                policy_version: engine.version(),
            },
            started.elapsed(),
        );
        let _ = self.audit.record(event).await;
    }

    /// [`admit`], counted when it refuses.
    fn admit(&self, operation: &'static str, call: EntityCall<'_>) -> Result<(), EntityError> {
        admit(call).inspect_err(|e| self.metrics.entity_call(operation, e.outcome()))
    }

    fn store_failure(&self, e: StoreError) -> EntityError {
        self.metrics.store_error();
        tracing::error!(error = %e, "entity store failure");
        EntityError::Store(e)
    }
}

/// The tenant named and granted, or the call is refused before anything
/// else (and, like a decision for a tenant not granted, not audited).
fn admit(call: EntityCall<'_>) -> Result<(), EntityError> {
    check_tenant(call.tenant_id)?;
    call.tenants.admit(call.tenant_id)?;
    Ok(())
}

/// `uids` without repeats, in first-seen order.
fn distinct(uids: Vec<EntityKey>) -> Vec<EntityKey> {
    let mut seen = HashSet::new();
    uids.into_iter()
        .filter(|u| seen.insert(u.clone()))
        .collect()
}
