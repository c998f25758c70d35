//! The ext_authz door's IO: the principal from the verified bearer token,
//! the one pipeline, and one `request_refused` audit event per request the
//! door answers itself (a decided call is the pipeline's own decision
//! event).

use std::sync::Arc;

use super::{Answer, ExtAuthzConfig, HttpRequest, Read, Refusal, ToolCall};
use crate::access::TenantScope;
use crate::audit::{Audit, AuditEvent, RefusalAudit};
use crate::clock::Clock;
use crate::decision::{AuthorizeInput, Door, ToolCallAuthorizer};
use crate::decode::Limits;
use crate::envelope::RequestError;
use crate::identity::{Caller, IdentityVerifier};

/// The gRPC path of `Check`, for the audit log.
pub const CHECK_PATH: &str = "/envoy.service.auth.v3.Authorization/Check";

/// What the door needs, as [`crate::server::build`] wires it.
#[derive(Debug)]
pub struct ExtAuthzDesk {
    authorizer: Arc<ToolCallAuthorizer>,
    audit: Arc<Audit>,
    /// The identity-token verifier (the JWKS of §8): none configured, no
    /// `tools/call` passes (`401`).
    verifier: Option<Arc<dyn IdentityVerifier>>,
    clock: Arc<dyn Clock>,
    config: ExtAuthzConfig,
    limits: Limits,
}

/// The parts of an [`ExtAuthzDesk`], every one required.
#[derive(Debug)]
pub struct ExtAuthzParts {
    pub authorizer: Arc<ToolCallAuthorizer>,
    pub audit: Arc<Audit>,
    pub verifier: Option<Arc<dyn IdentityVerifier>>,
    pub clock: Arc<dyn Clock>,
    pub config: ExtAuthzConfig,
    /// The arguments' limits (`[limits]`): their depth bounds the body's.
    pub argument_limits: Limits,
}

/// One check: the request, and who asks (the proxy's connection).
#[derive(Debug, Clone)]
pub struct Check {
    pub request: HttpRequest,
    /// The transport identity of the proxy's connection.
    pub peer: String,
    /// The tenants the proxy's `ext_authz` grants let it act for.
    pub tenants: TenantScope,
}

impl ExtAuthzDesk {
    #[must_use]
    pub(crate) fn new(parts: ExtAuthzParts) -> Self {
        let ExtAuthzParts {
            authorizer,
            audit,
            verifier,
            clock,
            config,
            argument_limits,
        } = parts;
        let limits = config.body_limits(&argument_limits);
        Self {
            authorizer,
            audit,
            verifier,
            clock,
            config,
            limits,
        }
    }

    /// What the proxy does with one request.
    pub async fn check(&self, check: &Check) -> Answer {
        let req = &check.request;
        let call = match super::read(req, &self.config, &self.limits) {
            Ok(Read::Pass) => return super::pass(req),
            Ok(Read::ToolCall(call)) => call,
            Err(refusal) => return self.refuse(check, &refusal).await,
        };
        let caller = match self.principal(req, &call) {
            Ok(caller) => caller,
            Err(refusal) => return self.refuse(check, &refusal).await,
        };
        let input = AuthorizeInput {
            tool: call.tool.clone(),
            arguments: call.arguments.clone(),
            caller: Some(caller),
            call_id: req.request_id().to_owned(),
            request_id: call.request_id.clone(),
            approval_id: String::new(),
            deadline: None,
            // The pipeline reads the entity store (DESIGN §11.6).
            entities_json: String::new(),
            tool_version: String::new(),
            identity_token: req
                .identity_token(&self.config)
                .unwrap_or_default()
                .to_owned(),
            peer: check.peer.clone(),
            tenants: check.tenants.clone(),
            door: Door::Gateway,
            action: "tools/call".to_owned(),
        };
        match self.authorizer.authorize(&input).await {
            Ok(outcome) => super::answer(&outcome, &call, req),
            Err(e) => {
                let refusal = match e {
                    RequestError::TenantNotGranted(t) => {
                        Refusal::forbidden(call.id.clone(), t.to_string())
                    }
                    RequestError::Invalid(e) => Refusal::invalid(
                        call.id.clone(),
                        format!("invalid `{}`: {}", e.field, e.description),
                    ),
                };
                self.refuse(check, &refusal).await
            }
        }
    }

    /// The principal of a `tools/call`: the verified token's subject,
    /// tenant, roles and scopes, with the MCP session as the session.
    fn principal(&self, req: &HttpRequest, call: &ToolCall) -> Result<Caller, Refusal> {
        let id = || call.id.clone();
        let token = req
            .identity_token(&self.config)
            .ok_or_else(|| Refusal::unauthorized(id(), "missing_token"))?;
        let verifier = self
            .verifier
            .as_ref()
            .ok_or_else(|| Refusal::unauthorized(id(), "no_key_set"))?;
        let now = self.clock.now_ms().div_euclid(1000);
        let caller = verifier
            .verify(token, now)
            .map_err(|reason| Refusal::unauthorized(id(), reason))?;
        Ok(Caller {
            session_id: call.session_id.clone(),
            ..caller
        })
    }

    /// Records a request the door answers itself, then answers it.
    async fn refuse(&self, check: &Check, refusal: &Refusal) -> Answer {
        let event = AuditEvent::refused_request(&RefusalAudit {
            door: "ext_authz",
            endpoint: CHECK_PATH,
            peer: &check.peer,
            request_id: check.request.request_id(),
            status: refusal.status,
            reason: refusal.reason,
        });
        if self.audit.record(event).await.is_err() {
            tracing::warn!(
                reason = refusal.reason,
                "an ext_authz refusal could not be audited"
            );
        }
        Answer::Respond(refusal.response())
    }
}
