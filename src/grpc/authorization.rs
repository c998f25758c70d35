//! `AuthorizationService`: Authorize, BatchAuthorize, ValidateResult, ListTools.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use super::{convert, pb};
use crate::access::TenantScope;
use crate::decision::{
    AuthorizeInput, AuthorizeOutcome, DecidedBatch, DecidedCall, Door, ExecutorCall, ExecutorCalls,
    ToolCallAuthorizer,
};
use crate::envelope::{Checked, Envelope, ErrorCode};
use crate::ledger::desk::LedgerDesk;
use crate::tools::ToolContract;

/// The decision API for executors.
#[derive(Debug, Clone)]
pub struct AuthorizationApi {
    calls: ExecutorCalls,
    /// The COAZ-MCP declared mapping every tool publishes (`[authzen]`).
    mcp_mapping: Arc<serde_json::Value>,
}

impl AuthorizationApi {
    pub fn new(
        authorizer: Arc<ToolCallAuthorizer>,
        ledger: Arc<LedgerDesk>,
        mcp_mapping: serde_json::Value,
    ) -> Self {
        Self {
            calls: ExecutorCalls::new(authorizer, ledger),
            mcp_mapping: Arc::new(mcp_mapping),
        }
    }

    fn authorizer(&self) -> &ToolCallAuthorizer {
        self.calls.authorizer()
    }
}

/// What one request of the caller (its connection's peer and tenants) asks.
fn call(
    req: pb::AuthorizeRequest,
    metadata: &tonic::metadata::MetadataMap,
    arrived: Instant,
    peer: &str,
    tenants: &TenantScope,
) -> ExecutorCall {
    let pb::AuthorizeRequest {
        tool,
        arguments,
        auth,
        call_id,
        request_id,
        approval_id,
        deadline,
        entities_json,
        tool_version,
        begin_execution,
        lease_ms,
    } = req;
    let identity_token = auth
        .as_ref()
        .map(|a| a.identity_token.clone())
        .unwrap_or_default();
    let input = AuthorizeInput {
        tool,
        arguments,
        caller: convert::caller(auth),
        identity_token,
        peer: peer.to_owned(),
        tenants: tenants.clone(),
        call_id,
        request_id,
        approval_id,
        deadline: convert::deadline(deadline.as_ref(), metadata, arrived),
        entities_json,
        tool_version,
        door: Door::Executor,
        action: String::new(),
    };
    ExecutorCall {
        input,
        begin_execution,
        lease_ms,
    }
}

fn response(decided: DecidedCall) -> pb::AuthorizeResponse {
    let DecidedCall {
        outcome: o,
        execution,
        execution_ticket,
    } = decided;
    let AuthorizeOutcome {
        decision,
        decision_id,
        call_id,
        normalized_arguments,
        arguments_sha256,
        idempotency_key,
        conflict_key,
        risk,
        timeout_ms,
        parallel,
        idempotent,
        approval,
        error,
        policy_version,
        tool_version,
        policies: _,
        principal: _,
        budgets: _,
        session: _,
        charged: _,
    } = o;
    pb::AuthorizeResponse {
        decision: convert::decision(decision).into(),
        decision_id,
        call_id,
        normalized_arguments,
        arguments_sha256,
        idempotency_key,
        conflict_key,
        risk: convert::risk(risk).into(),
        timeout_ms,
        parallel,
        idempotent,
        approval: approval.map(|(approval_id, expires_at)| pb::ApprovalRef {
            approval_id,
            expires_at: Some(convert::timestamp(expires_at)),
        }),
        model_output: error
            .as_ref()
            .map(Envelope::model_output)
            .unwrap_or_default(),
        error: error.as_ref().map(convert::envelope),
        policy_version,
        tool_version,
        execution: execution.map(super::ledger::begin_response),
        execution_ticket,
    }
}

#[tonic::async_trait]
impl pb::authorization_service_server::AuthorizationService for AuthorizationApi {
    async fn authorize(
        &self,
        request: Request<pb::AuthorizeRequest>,
    ) -> Result<Response<pb::AuthorizeResponse>, Status> {
        let arrived = Instant::now();
        let metadata = request.metadata().clone();
        let peer = super::admitted::peer(&request);
        let tenants = super::admitted::tenants(&request);
        let call = call(request.into_inner(), &metadata, arrived, &peer, &tenants);
        let decided = self
            .calls
            .authorize(call)
            .await
            .map_err(|e| convert::request_status(&e))?;
        Ok(Response::new(response(decided)))
    }

    async fn batch_authorize(
        &self,
        request: Request<pb::BatchAuthorizeRequest>,
    ) -> Result<Response<pb::BatchAuthorizeResponse>, Status> {
        let arrived = Instant::now();
        let metadata = request.metadata().clone();
        let peer = super::admitted::peer(&request);
        let tenants = super::admitted::tenants(&request);
        let pb::BatchAuthorizeRequest { requests } = request.into_inner();
        let calls = requests
            .into_iter()
            .map(|req| call(req, &metadata, arrived, &peer, &tenants))
            .collect();
        let DecidedBatch { calls, waves } = self
            .calls
            .batch(calls)
            .await
            .map_err(|e| convert::request_status(&e))?;
        Ok(Response::new(pb::BatchAuthorizeResponse {
            responses: calls.into_iter().map(response).collect(),
            waves: waves
                .into_iter()
                .map(|w| pb::Wave {
                    call_indexes: w
                        .into_iter()
                        .filter_map(|i| u32::try_from(i).ok())
                        .collect(),
                })
                .collect(),
        }))
    }

    async fn validate_result(
        &self,
        request: Request<pb::ValidateResultRequest>,
    ) -> Result<Response<pb::ValidateResultResponse>, Status> {
        let pb::ValidateResultRequest { tool, result_json } = request.into_inner();
        let error = self.calls.validate_result(&tool, &result_json).err();
        Ok(Response::new(pb::ValidateResultResponse {
            valid: error.is_none(),
            error: error.as_ref().map(convert::envelope),
        }))
    }

    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let tenants = super::admitted::tenants(&request);
        let pb::ListToolsRequest { auth } = request.into_inner();
        let Some(auth) = auth else {
            let engine = self.authorizer().engine();
            return Ok(Response::new(pb::ListToolsResponse {
                tools: engine
                    .tools()
                    .iter()
                    .map(|t| tool_info(t, &self.mcp_mapping))
                    .collect(),
                policy_version: engine.version().to_owned(),
            }));
        };
        let identity_token = auth.identity_token.clone();
        let caller = convert::caller(Some(auth));
        let callable = match self
            .authorizer()
            .callable_tools(caller.as_ref(), &identity_token, &tenants)
            .map_err(|e| convert::request_status(&e))?
        {
            Checked::Passed(callable) => callable,
            Checked::Refused(e) if e.code == ErrorCode::Unauthorized => {
                return Err(convert::unauthenticated(&e));
            }
            Checked::Refused(e) => return Err(Status::internal(e.message)),
        };
        Ok(Response::new(pb::ListToolsResponse {
            tools: callable
                .tools
                .iter()
                .map(|t| tool_info(t, &self.mcp_mapping))
                .collect(),
            policy_version: callable.policy_version,
        }))
    }
}

/// A tool as `ListTools` shows it, with the AuthZEN mapping an MCP server
/// declares for it (`x-authzen-mapping`, DESIGN §11.1).
fn tool_info(t: &ToolContract, mcp_mapping: &serde_json::Value) -> pb::ToolInfo {
    pb::ToolInfo {
        name: t.name.clone(),
        version: t.version.clone(),
        description: t.description.clone(),
        risk: convert::risk(Some(t.risk)).into(),
        input_schema_json: t.input_schema_json.to_string(),
        output_schema_json: t
            .output_schema_json
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        parallel: t.parallel,
        idempotent: t.idempotent,
        timeout_ms: t.timeout_ms,
        authzen_mapping_json: mcp_mapping.to_string(),
    }
}
