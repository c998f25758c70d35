//! `LedgerService`: BeginExecution, CompleteExecution, ReconcileExecution,
//! GetExecution, translated to and from the [`LedgerDesk`].

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{convert, pb};
use crate::access::TenantScope;
use crate::ledger::desk::{
    BeginRequest, CompleteRequest, CompletionStatus, ExecutorAuth, LedgerDesk, LedgerError,
    ReconcileRequest,
};
use crate::ledger::{BeginAnswer, BeginOutcome, ExecutionRecord, ExecutionState, RecordedError};

/// The execution ledger API for executors.
#[derive(Debug, Clone)]
pub struct LedgerApi {
    desk: Arc<LedgerDesk>,
}

impl LedgerApi {
    pub fn new(desk: Arc<LedgerDesk>) -> Self {
        Self { desk }
    }
}

pub fn state(s: Option<ExecutionState>) -> pb::ExecutionState {
    match s {
        None => pb::ExecutionState::Unspecified,
        Some(ExecutionState::InProgress) => pb::ExecutionState::InProgress,
        Some(ExecutionState::Succeeded) => pb::ExecutionState::Succeeded,
        Some(ExecutionState::FailedRetryable) => pb::ExecutionState::FailedRetryable,
        Some(ExecutionState::Unknown) => pb::ExecutionState::Unknown,
        Some(ExecutionState::FailedFinal) => pb::ExecutionState::FailedFinal,
    }
}

/// The answer to a Begin, also carried by `AuthorizeResponse.execution`.
pub fn begin_response(a: BeginAnswer) -> pb::BeginExecutionResponse {
    let BeginAnswer {
        outcome,
        state: s,
        attempt,
        fencing_token,
        lease_expires_at,
        result_json,
        error,
        retry_after_ms,
    } = a;
    let outcome = match outcome {
        BeginOutcome::Acquired => pb::BeginOutcome::Acquired,
        BeginOutcome::InProgress => pb::BeginOutcome::InProgress,
        BeginOutcome::Completed => pb::BeginOutcome::Completed,
        BeginOutcome::ReconcileRequired => pb::BeginOutcome::ReconcileRequired,
        BeginOutcome::Refused => pb::BeginOutcome::Refused,
    };
    pb::BeginExecutionResponse {
        outcome: outcome.into(),
        attempt,
        fencing_token,
        lease_expires_at: lease_expires_at.map(convert::timestamp),
        state: state(s).into(),
        result_json: result_json.unwrap_or_default(),
        error: error.as_ref().map(convert::recorded_error),
        retry_after_ms,
    }
}

fn execution(r: ExecutionRecord) -> pb::Execution {
    let ExecutionRecord {
        tenant_id: _,
        idempotency_key,
        tool,
        state: s,
        attempt,
        arguments_sha256,
        result_json,
        error,
        created_at,
        updated_at,
        max_attempts,
        lease_expires_at,
        // The holder's token is never shown to anyone else.
        fencing_token: _,
        revision: _,
    } = r;
    pb::Execution {
        idempotency_key,
        tool,
        state: state(Some(s)).into(),
        attempt,
        arguments_sha256,
        result_json: result_json.unwrap_or_default(),
        error: error.as_ref().map(convert::recorded_error),
        created_at: Some(convert::timestamp(created_at)),
        updated_at: Some(convert::timestamp(updated_at)),
        max_attempts,
        lease_expires_at: Some(convert::timestamp(lease_expires_at)),
    }
}

/// The executor's own report of a failure.
fn reported_error(e: Option<pb::ErrorEnvelope>) -> Option<RecordedError> {
    let pb::ErrorEnvelope {
        code,
        category,
        message,
        retryable,
        resolution,
        expose_to_model,
        expose_to_user,
        details_json,
    } = e?;
    Some(RecordedError {
        code,
        category,
        message,
        retryable,
        resolution,
        expose_to_model,
        expose_to_user,
        details_json,
    })
}

#[tonic::async_trait]
impl pb::ledger_service_server::LedgerService for LedgerApi {
    async fn begin_execution(
        &self,
        request: Request<pb::BeginExecutionRequest>,
    ) -> Result<Response<pb::BeginExecutionResponse>, Status> {
        let peer = super::admitted::peer(&request);
        let tenants = super::admitted::tenants(&request);
        let pb::BeginExecutionRequest {
            auth,
            idempotency_key,
            arguments_sha256,
            tool,
            lease_ms,
            execution_ticket,
        } = request.into_inner();
        let answer = self
            .desk
            .begin(BeginRequest {
                auth: executor_auth(auth, peer, tenants),
                idempotency_key,
                arguments_sha256,
                tool,
                lease_ms,
                execution_ticket,
            })
            .await
            .map_err(|e| convert::request_status(&e))?;
        Ok(Response::new(begin_response(answer)))
    }

    async fn complete_execution(
        &self,
        request: Request<pb::CompleteExecutionRequest>,
    ) -> Result<Response<pb::CompleteExecutionResponse>, Status> {
        let peer = super::admitted::peer(&request);
        let tenants = super::admitted::tenants(&request);
        let pb::CompleteExecutionRequest {
            auth,
            idempotency_key,
            fencing_token,
            status,
            result_json,
            error,
        } = request.into_inner();
        let status = match pb::CompletionStatus::try_from(status) {
            Ok(pb::CompletionStatus::Succeeded) => Some(CompletionStatus::Succeeded),
            Ok(pb::CompletionStatus::FailedRetryable) => Some(CompletionStatus::FailedRetryable),
            Ok(pb::CompletionStatus::FailedFinal) => Some(CompletionStatus::FailedFinal),
            Ok(pb::CompletionStatus::Unknown) => Some(CompletionStatus::Unknown),
            Ok(pb::CompletionStatus::Unspecified) | Err(_) => None,
        };
        let settled = self
            .desk
            .complete(CompleteRequest {
                auth: executor_auth(auth, peer, tenants),
                idempotency_key,
                fencing_token,
                status,
                result_json,
                error: reported_error(error),
            })
            .await
            .map_err(|e| convert::request_status(&e))?;
        Ok(Response::new(pb::CompleteExecutionResponse {
            state: state(settled.state).into(),
            error: settled.error.as_ref().map(convert::recorded_error),
        }))
    }

    async fn reconcile_execution(
        &self,
        request: Request<pb::ReconcileExecutionRequest>,
    ) -> Result<Response<pb::ReconcileExecutionResponse>, Status> {
        let peer = super::admitted::peer(&request);
        let tenants = super::admitted::tenants(&request);
        let reconcile_tenants = super::admitted::reconcile_tenants(&request);
        let pb::ReconcileExecutionRequest {
            auth,
            idempotency_key,
            applied,
            result_json,
            fencing_token,
        } = request.into_inner();
        let settled = self
            .desk
            .reconcile(ReconcileRequest {
                auth: ExecutorAuth {
                    reconcile_tenants,
                    ..executor_auth(auth, peer, tenants)
                },
                idempotency_key,
                applied,
                result_json,
                fencing_token,
            })
            .await
            .map_err(|e| convert::request_status(&e))?
            .ok_or_else(not_found)?;
        Ok(Response::new(pb::ReconcileExecutionResponse {
            state: state(settled.state).into(),
            error: settled.error.as_ref().map(convert::recorded_error),
        }))
    }

    async fn get_execution(
        &self,
        request: Request<pb::GetExecutionRequest>,
    ) -> Result<Response<pb::GetExecutionResponse>, Status> {
        let peer = super::admitted::peer(&request);
        let tenants = super::admitted::tenants(&request);
        let pb::GetExecutionRequest {
            auth,
            idempotency_key,
        } = request.into_inner();
        let auth = executor_auth(auth, peer, tenants);
        let record = match self.desk.get(&auth, &idempotency_key).await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(not_found()),
            Err(LedgerError::Executor(e)) => return Err(convert::executor_status(&e)),
            Err(LedgerError::TenantNotGranted(e)) => return Err(convert::tenant_status(&e)),
            Err(LedgerError::Unauthorized(e)) => return Err(convert::unauthenticated(&e)),
            Err(LedgerError::Unavailable) => {
                return Err(Status::unavailable(
                    "the execution ledger is unavailable; retry",
                ));
            }
        };
        Ok(Response::new(pb::GetExecutionResponse {
            execution: Some(execution(record)),
        }))
    }
}

/// Who sent a ledger request: its auth context and identity token, the
/// transport identity the access layer saw and the tenants it may act for.
fn executor_auth(
    auth: Option<pb::AuthContext>,
    peer: String,
    tenants: TenantScope,
) -> ExecutorAuth {
    let identity_token = auth
        .as_ref()
        .map(|a| a.identity_token.clone())
        .unwrap_or_default();
    ExecutorAuth {
        caller: convert::caller(auth),
        identity_token,
        peer,
        tenants,
        reconcile_tenants: TenantScope::default(),
    }
}

/// No record of this key in the caller's tenant (another tenant's record
/// is answered the same way).
fn not_found() -> Status {
    Status::not_found("no execution with this idempotency key")
}
