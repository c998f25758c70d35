//! `EntityService`: UpsertEntities, DeleteEntities, GetEntities, translated
//! to and from the [`EntityDesk`].

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::{admitted, convert, pb};
use crate::access::TenantScope;
use crate::entities::EntityKey;
use crate::entities::desk::{EntityCall, EntityDesk, EntityError};

/// The entity store API.
#[derive(Debug, Clone)]
pub struct EntityApi {
    desk: Arc<EntityDesk>,
}

impl EntityApi {
    pub fn new(desk: Arc<EntityDesk>) -> Self {
        Self { desk }
    }
}

/// A refused entity call: `INVALID_ARGUMENT` with `ErrorInfo` (reason the
/// stable code; `index` and `reason` when known) and a `BadRequest` field
/// violation; a tenant not granted as every door answers it; a store
/// failure `UNAVAILABLE`.
fn status(e: &EntityError) -> Status {
    match e {
        EntityError::TenantNotGranted(t) => convert::tenant_status(t),
        EntityError::Refused(r) => {
            let mut metadata = HashMap::new();
            if let Some(i) = r.index {
                metadata.insert("index".to_owned(), i.to_string());
            }
            if let Some(reason) = r.reason {
                metadata.insert("reason".to_owned(), reason.to_owned());
            }
            let mut details = ErrorDetails::with_error_info(r.code.as_str(), "toolgate", metadata);
            details.add_bad_request_violation(r.field, r.message.clone());
            Status::with_error_details(Code::InvalidArgument, r.message.clone(), details)
        }
        EntityError::Store(_) => Status::with_error_details(
            Code::Unavailable,
            "the entity store is unavailable; retry",
            ErrorDetails::with_error_info("internal_error", "toolgate", HashMap::new()),
        ),
    }
}

fn keys(uids: Vec<pb::EntityUid>) -> Vec<EntityKey> {
    uids.into_iter()
        .map(|pb::EntityUid { r#type, id }| EntityKey::new(r#type, id))
        .collect()
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[tonic::async_trait]
impl pb::entity_service_server::EntityService for EntityApi {
    async fn upsert_entities(
        &self,
        request: Request<pb::UpsertEntitiesRequest>,
    ) -> Result<Response<pb::UpsertEntitiesResponse>, Status> {
        let (peer, tenants) = (admitted::peer(&request), admitted::tenants(&request));
        let pb::UpsertEntitiesRequest {
            tenant_id,
            entities_json,
        } = request.into_inner();
        let n = self
            .desk
            .upsert(call(&tenant_id, &peer, &tenants), &entities_json)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::UpsertEntitiesResponse {
            upserted_count: count(n),
        }))
    }

    async fn delete_entities(
        &self,
        request: Request<pb::DeleteEntitiesRequest>,
    ) -> Result<Response<pb::DeleteEntitiesResponse>, Status> {
        let (peer, tenants) = (admitted::peer(&request), admitted::tenants(&request));
        let pb::DeleteEntitiesRequest { tenant_id, uids } = request.into_inner();
        let n = self
            .desk
            .delete(call(&tenant_id, &peer, &tenants), keys(uids))
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::DeleteEntitiesResponse {
            deleted_count: count(n),
        }))
    }

    async fn get_entities(
        &self,
        request: Request<pb::GetEntitiesRequest>,
    ) -> Result<Response<pb::GetEntitiesResponse>, Status> {
        let (peer, tenants) = (admitted::peer(&request), admitted::tenants(&request));
        let pb::GetEntitiesRequest { tenant_id, uids } = request.into_inner();
        let found = self
            .desk
            .get(call(&tenant_id, &peer, &tenants), keys(uids))
            .await
            .map_err(|e| status(&e))?;
        // Each is canonical JSON already: joined, not re-encoded.
        let items: Vec<String> = found.into_iter().map(|(_, json)| json).collect();
        Ok(Response::new(pb::GetEntitiesResponse {
            entities_json: format!("[{}]", items.join(",")),
        }))
    }
}

fn call<'a>(tenant_id: &'a str, peer: &'a str, tenants: &'a TenantScope) -> EntityCall<'a> {
    EntityCall {
        tenant_id,
        peer,
        tenants,
    }
}
