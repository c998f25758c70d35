//! `ApprovalService`: answers `UNIMPLEMENTED` until the approvals issue lands.

use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::pb;

/// The approval API for approval UIs.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalApi;

#[tonic::async_trait]
impl pb::approval_service_server::ApprovalService for ApprovalApi {
    type WatchApprovalsStream = ReceiverStream<Result<pb::WatchApprovalsResponse, Status>>;

    async fn list_approvals(
        &self,
        _: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        Err(Status::unimplemented(
            "ListApprovals is not implemented yet",
        ))
    }

    async fn get_approval(
        &self,
        _: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::GetApprovalResponse>, Status> {
        Err(Status::unimplemented("GetApproval is not implemented yet"))
    }

    async fn decide_approval(
        &self,
        _: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::DecideApprovalResponse>, Status> {
        Err(Status::unimplemented(
            "DecideApproval is not implemented yet",
        ))
    }

    async fn watch_approvals(
        &self,
        _: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        Err(Status::unimplemented(
            "WatchApprovals is not implemented yet",
        ))
    }
}
