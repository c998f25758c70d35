//! `LedgerService`: answers `UNIMPLEMENTED` until the ledger issue lands.

use tonic::{Request, Response, Status};

use super::pb;

/// The execution ledger API for executors.
#[derive(Debug, Clone, Copy)]
pub struct LedgerApi;

#[tonic::async_trait]
impl pb::ledger_service_server::LedgerService for LedgerApi {
    async fn begin_execution(
        &self,
        _: Request<pb::BeginExecutionRequest>,
    ) -> Result<Response<pb::BeginExecutionResponse>, Status> {
        Err(Status::unimplemented(
            "BeginExecution is not implemented yet",
        ))
    }

    async fn complete_execution(
        &self,
        _: Request<pb::CompleteExecutionRequest>,
    ) -> Result<Response<pb::CompleteExecutionResponse>, Status> {
        Err(Status::unimplemented(
            "CompleteExecution is not implemented yet",
        ))
    }

    async fn reconcile_execution(
        &self,
        _: Request<pb::ReconcileExecutionRequest>,
    ) -> Result<Response<pb::ReconcileExecutionResponse>, Status> {
        Err(Status::unimplemented(
            "ReconcileExecution is not implemented yet",
        ))
    }

    async fn get_execution(
        &self,
        _: Request<pb::GetExecutionRequest>,
    ) -> Result<Response<pb::GetExecutionResponse>, Status> {
        Err(Status::unimplemented("GetExecution is not implemented yet"))
    }
}
