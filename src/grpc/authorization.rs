//! `AuthorizationService`: Authorize, BatchAuthorize, ValidateResult, ListTools.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use super::{convert, pb};
use crate::access::TenantScope;
use crate::decision::{
    AuthorizeInput, AuthorizeOutcome, Door, ScheduleItem, ToolCallAuthorizer, schedule,
};
use crate::decode;
use crate::envelope::{Checked, Envelope, ErrorCode, ExecutorError, unknown_tool};
use crate::ledger::BeginAnswer;
use crate::ledger::desk::LedgerDesk;
use crate::tools::ToolContract;

/// Most calls one `BatchAuthorize` may carry (one model turn).
const MAX_BATCH: usize = 128;

/// The decision API for executors.
#[derive(Debug, Clone)]
pub struct AuthorizationApi {
    authorizer: Arc<ToolCallAuthorizer>,
    ledger: Arc<LedgerDesk>,
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
            authorizer,
            ledger,
            mcp_mapping: Arc::new(mcp_mapping),
        }
    }

    /// Decides one call, and begins its execution when asked and allowed.
    async fn decide(&self, call: Call) -> Result<pb::AuthorizeResponse, Status> {
        let Call {
            input,
            begin_execution,
            lease_ms,
        } = call;
        let outcome = self
            .authorizer
            .authorize(&input)
            .await
            .map_err(|e| convert::request_status(&e))?;
        let allowed = outcome.allowed_call(&input.tool);
        let execution = if begin_execution {
            self.ledger
                .begin_allowed(allowed.as_ref(), lease_ms, &input.peer)
                .await
        } else {
            None
        };
        let ticket = self.ledger.ticket_for(allowed.as_ref()).await;
        Ok(response(outcome, execution, ticket))
    }
}

/// One call as the domain takes it, and what to do once it is decided.
struct Call {
    input: AuthorizeInput,
    begin_execution: bool,
    lease_ms: u32,
}

/// What one request of the caller (its connection's peer and tenants) asks.
fn call(
    req: pb::AuthorizeRequest,
    metadata: &tonic::metadata::MetadataMap,
    arrived: Instant,
    peer: &str,
    tenants: &TenantScope,
) -> Call {
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
    Call {
        input,
        begin_execution,
        lease_ms,
    }
}

fn response(
    o: AuthorizeOutcome,
    execution: Option<BeginAnswer>,
    execution_ticket: String,
) -> pb::AuthorizeResponse {
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
        let answer = self.decide(call).await?;
        Ok(Response::new(answer))
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
        if requests.len() > MAX_BATCH {
            return Err(convert::executor_status(&ExecutorError {
                field: "requests",
                description: format!("at most {MAX_BATCH} calls per batch"),
            }));
        }
        let calls: Vec<Call> = requests
            .into_iter()
            .map(|req| call(req, &metadata, arrived, &peer, &tenants))
            .collect();
        // The whole batch is refused before any call of it is decided (no
        // approval created, no execution begun) if one would run as a
        // tenant the caller may not act for or has an executor error.
        for c in &calls {
            self.authorizer
                .precheck(&c.input)
                .map_err(|e| convert::request_status(&e))?;
        }
        let mut responses = Vec::with_capacity(calls.len());
        for c in calls {
            responses.push(self.decide(c).await?);
        }
        let items: Vec<ScheduleItem> = responses
            .iter()
            .map(|r| ScheduleItem {
                allowed: r.decision() == pb::Decision::Allow,
                conflict_key: r.conflict_key.clone(),
                risk: risk_of(r.risk()),
                parallel: r.parallel,
            })
            .collect();
        let waves = schedule(&items)
            .into_iter()
            .map(|w| pb::Wave {
                call_indexes: w
                    .into_iter()
                    .filter_map(|i| u32::try_from(i).ok())
                    .collect(),
            })
            .collect();
        Ok(Response::new(pb::BatchAuthorizeResponse {
            responses,
            waves,
        }))
    }

    async fn validate_result(
        &self,
        request: Request<pb::ValidateResultRequest>,
    ) -> Result<Response<pb::ValidateResultResponse>, Status> {
        let pb::ValidateResultRequest { tool, result_json } = request.into_inner();
        let engine = self.authorizer.engine();
        let Some(contract) = engine.tools().get(&tool) else {
            return Ok(Response::new(pb::ValidateResultResponse {
                valid: false,
                error: Some(convert::envelope(&unknown_tool(&tool))),
            }));
        };
        let value = match decode::parse_strict(result_json.as_bytes(), &decode::Limits::default()) {
            Ok(v) => v,
            Err(e) => {
                let env = Envelope::new(
                    ErrorCode::OutputInvalid,
                    format!("the result is not valid JSON: {e}"),
                )
                .with("reason", e.reason());
                return Ok(Response::new(pb::ValidateResultResponse {
                    valid: false,
                    error: Some(convert::envelope(&env)),
                }));
            }
        };
        let violations = contract.validate_output(&value, 20);
        let Some(env) = crate::envelope::violations(ErrorCode::OutputInvalid, &violations) else {
            return Ok(Response::new(pb::ValidateResultResponse {
                valid: true,
                error: None,
            }));
        };
        Ok(Response::new(pb::ValidateResultResponse {
            valid: false,
            error: Some(convert::envelope(&env)),
        }))
    }

    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let tenants = super::admitted::tenants(&request);
        let pb::ListToolsRequest { auth } = request.into_inner();
        let Some(auth) = auth else {
            let engine = self.authorizer.engine();
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
            .authorizer
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

fn risk_of(r: pb::RiskLevel) -> crate::tools::Risk {
    use crate::tools::Risk;
    match r {
        pb::RiskLevel::Read => Risk::Read,
        pb::RiskLevel::Write => Risk::Write,
        pb::RiskLevel::External => Risk::External,
        pb::RiskLevel::Financial => Risk::Financial,
        // Unknown risk schedules as the most dangerous: never shares a wave on its key.
        pb::RiskLevel::Destructive | pb::RiskLevel::Unspecified => Risk::Destructive,
    }
}
