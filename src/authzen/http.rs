//! The AuthZEN endpoints over HTTP (axum), served on the gRPC listener
//! behind the same admission layer: the transport checks of the HTTPS
//! binding (method, `Content-Type`, body size, `X-Request-ID`), the whole
//! body through `decode::parse_strict`, then the pure core and the one
//! pipeline. A refused request is one `request_refused` audit event; a
//! decided one is the pipeline's own decision event.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use super::{AuthzenConfig, Batch, Entry, Refusal, Transport, decision_json};
use crate::access::{PeerIdentity, TenantScope};
use crate::audit::{Audit, AuditEvent, RefusalAudit};
use crate::decision::{AuthorizeOutcome, ToolCallAuthorizer};
use crate::decode::{self, Limits};
use crate::envelope::{ErrorCode, ExecutorError, RequestError};
use crate::identity::single_header as single;

/// The paths this door serves.
pub const METADATA_PATH: &str = "/.well-known/authzen-configuration";
pub const EVALUATION_PATH: &str = "/access/v1/evaluation";
pub const EVALUATIONS_PATH: &str = "/access/v1/evaluations";
pub const SEARCH_ACTION_PATH: &str = "/access/v1/search/action";

/// What the door needs, as [`crate::server::build`] wires it.
#[derive(Debug)]
pub struct AuthzenHttp {
    authorizer: Arc<ToolCallAuthorizer>,
    audit: Arc<Audit>,
    config: AuthzenConfig,
    /// The body's limits: the configured body size, and the arguments'
    /// depth plus the envelope's levels.
    limits: Limits,
    require_identity_token: bool,
    /// Whether the listener speaks TLS (the metadata's URL scheme).
    tls: bool,
}

/// The parts of an [`AuthzenHttp`], every one required.
#[derive(Debug)]
pub struct AuthzenParts {
    pub authorizer: Arc<ToolCallAuthorizer>,
    pub audit: Arc<Audit>,
    pub config: AuthzenConfig,
    /// The arguments' limits (`[limits]`): their depth bounds the body's.
    pub argument_limits: Limits,
    pub require_identity_token: bool,
    pub tls: bool,
}

impl AuthzenHttp {
    #[must_use]
    pub(crate) fn new(parts: AuthzenParts) -> Self {
        let AuthzenParts {
            authorizer,
            audit,
            config,
            argument_limits,
            require_identity_token,
            tls,
        } = parts;
        let limits = Limits {
            max_bytes: config.max_body_bytes,
            max_depth: argument_limits
                .max_depth
                .saturating_add(super::ENVELOPE_DEPTH),
        };
        Self {
            authorizer,
            audit,
            config,
            limits,
            require_identity_token,
            tls,
        }
    }
}

/// The routes of the door, to merge with the gRPC routes.
pub(crate) fn router(door: Arc<AuthzenHttp>) -> axum::Router {
    use axum::routing::any;
    axum::Router::new()
        .route(METADATA_PATH, any(metadata))
        .route(EVALUATION_PATH, any(evaluation))
        .route(EVALUATIONS_PATH, any(evaluations))
        .route(SEARCH_ACTION_PATH, any(search_action))
        .with_state(door)
}

/// An HTTP error of the binding: a status and a message string.
struct Refused {
    status: StatusCode,
    reason: &'static str,
    message: String,
}

impl Refused {
    fn bad_request(r: Refusal) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            reason: r.reason,
            message: r.message,
        }
    }
}

/// What the request says of itself, read once.
struct Incoming {
    request_id: Option<HeaderValue>,
    peer: String,
    tenants: TenantScope,
    identity_token: String,
    endpoint: &'static str,
}

fn incoming(door: &AuthzenHttp, req: &http::Request<Body>, endpoint: &'static str) -> Incoming {
    let headers = req.headers();
    let token = single(headers, door.config.identity_token_header.as_str()).unwrap_or_default();
    let identity_token = if door.config.identity_token_header == "authorization" {
        crate::identity::bearer(token).unwrap_or_default()
    } else {
        token
    };
    Incoming {
        request_id: single_value(headers, "x-request-id"),
        peer: req
            .extensions()
            .get::<PeerIdentity>()
            .map(ToString::to_string)
            .unwrap_or_default(),
        // None set (a wiring mistake): no tenant at all, fail closed.
        tenants: req
            .extensions()
            .get::<TenantScope>()
            .cloned()
            .unwrap_or_default(),
        identity_token: identity_token.to_owned(),
        endpoint,
    }
}

/// The one value of header `name`, `None` when absent or sent twice.
fn single_value(headers: &HeaderMap, name: &str) -> Option<HeaderValue> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => Some(v.clone()),
        _ => None,
    }
}

fn with_request_id(mut response: Response, request_id: Option<HeaderValue>) -> Response {
    if let Some(id) = request_id {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

fn json_response(value: &Value) -> Response {
    let mut response = Response::new(Body::from(value.to_string()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The answer of the admission layer to an AuthZEN request it refuses
/// (no grant, or the DNS-rebinding guard): `403` with a message string,
/// as the binding answers every refusal.
#[must_use]
pub(crate) fn forbidden(message: &str) -> Response {
    error_response(&Refused {
        status: StatusCode::FORBIDDEN,
        reason: "forbidden",
        message: message.to_owned(),
    })
}

fn error_response(refused: &Refused) -> Response {
    let mut response = Response::new(Body::from(refused.message.clone()));
    *response.status_mut() = refused.status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if refused.status == StatusCode::UNAUTHORIZED {
        // RFC 9110 §15.5.2: a 401 says how to authenticate; with no error
        // code, as RFC 6750 §3.1 asks when the request had no credentials
        // (a token that is there but invalid is the pipeline's decision).
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

impl AuthzenHttp {
    /// With `require_identity_token`, a request that brings no identity
    /// token is not evaluated: `401` (AuthZEN §12, DESIGN §11.1), before
    /// its body is read. A token that is there but invalid, or that the
    /// body disagrees with, is decided `unauthorized` by the pipeline.
    fn authenticated(&self, incoming: &Incoming) -> Result<(), Refused> {
        if self.require_identity_token && incoming.identity_token.is_empty() {
            return Err(Refused {
                status: StatusCode::UNAUTHORIZED,
                reason: "missing_identity_token",
                message: if self.config.identity_token_header == "authorization" {
                    "the request brings no identity token (send `Authorization: Bearer <token>`)"
                        .to_owned()
                } else {
                    format!(
                        "the request brings no identity token (send it in `{}`)",
                        self.config.identity_token_header
                    )
                },
            });
        }
        Ok(())
    }

    /// Records a refused request (or evaluation): one event.
    async fn audit_refusal(&self, incoming: &Incoming, refused: &Refused) {
        let request_id = incoming
            .request_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let event = AuditEvent::refused_request(&RefusalAudit {
            door: "authzen",
            endpoint: incoming.endpoint,
            peer: &incoming.peer,
            request_id,
            status: refused.status.as_u16(),
            reason: refused.reason,
        });
        if self.audit.record(event).await.is_err() {
            tracing::warn!(
                reason = refused.reason,
                "an AuthZEN refusal could not be audited"
            );
        }
    }

    /// Records a refused request, then answers it.
    async fn refuse(&self, incoming: &Incoming, refused: &Refused) -> Response {
        self.audit_refusal(incoming, refused).await;
        let mut response = error_response(refused);
        if refused.status == StatusCode::METHOD_NOT_ALLOWED {
            let allow = if incoming.endpoint == METADATA_PATH {
                "GET, HEAD"
            } else {
                "POST"
            };
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }

    /// The transport checks of a POST endpoint and the strict decoding of
    /// its body.
    async fn body(&self, req: http::Request<Body>, endpoint: &str) -> Result<Value, Refused> {
        if req.method() != Method::POST {
            return Err(Refused {
                status: StatusCode::METHOD_NOT_ALLOWED,
                reason: "method_not_allowed",
                message: format!("`{endpoint}` takes POST"),
            });
        }
        let json = single(req.headers(), "content-type")
            .and_then(|v| v.split(';').next())
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(Refused {
                status: StatusCode::BAD_REQUEST,
                reason: "content_type",
                message: "the request's `Content-Type` must be `application/json`".to_owned(),
            });
        }
        let max = self.limits.max_bytes;
        let too_large = || Refused {
            status: StatusCode::BAD_REQUEST,
            reason: "too_large",
            message: format!("the request body is over the limit of {max} bytes"),
        };
        let declared = single(req.headers(), "content-length").and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > u64::try_from(max).unwrap_or(u64::MAX)) {
            return Err(too_large());
        }
        // One byte over the limit is read, so the decoder names the size.
        let bytes = axum::body::to_bytes(req.into_body(), max.saturating_add(1))
            .await
            .map_err(|_| too_large())?;
        decode::parse_strict(&bytes, &self.limits).map_err(|e| Refused {
            status: StatusCode::BAD_REQUEST,
            reason: e.reason(),
            message: format!("the request body is not accepted: {e}"),
        })
    }

    fn transport<'a>(&self, incoming: &'a Incoming) -> Transport<'a> {
        Transport {
            peer: &incoming.peer,
            tenants: &incoming.tenants,
            identity_token: &incoming.identity_token,
            call_id: incoming
                .request_id
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
            require_identity_token: self.require_identity_token,
        }
    }

    /// One call through the pipeline.
    async fn decide(&self, entry: &Entry) -> Result<AuthorizeOutcome, Refused> {
        self.authorizer
            .authorize(&entry.input)
            .await
            .map_err(|e| self.request_refused(&e))
    }

    fn request_refused(&self, e: &RequestError) -> Refused {
        match e {
            RequestError::TenantNotGranted(t) => Refused {
                status: StatusCode::FORBIDDEN,
                reason: "tenant_not_granted",
                message: t.to_string(),
            },
            RequestError::Invalid(e) => Refused {
                status: StatusCode::BAD_REQUEST,
                reason: "invalid_request",
                message: self.executor_message(e),
            },
        }
    }

    /// An executor error in the request's own terms (`auth.subject_id` is
    /// the configured subject pointer, …).
    fn executor_message(&self, e: &ExecutorError) -> String {
        let dotted = |p: &str| super::pointer_tokens(p).join(".");
        let field = match e.field {
            "auth" | "auth.subject_id" => dotted(&self.config.subject),
            "auth.tenant_id" => dotted(&self.config.tenant),
            other => other.to_owned(),
        };
        format!("invalid `{field}`: {}", e.description)
    }

    async fn evaluation(&self, req: http::Request<Body>) -> Response {
        let incoming = incoming(self, &req, EVALUATION_PATH);
        let answer = async {
            self.authenticated(&incoming)?;
            let body = self.body(req, EVALUATION_PATH).await?;
            let entry = super::parse_evaluation(&body, &self.config, self.transport(&incoming))
                .map_err(Refused::bad_request)?;
            let outcome = self.decide(&entry).await?;
            Ok::<_, Refused>(decision_json(&outcome, &entry, &self.config))
        }
        .await;
        let response = match answer {
            Ok(v) => json_response(&v),
            Err(refused) => self.refuse(&incoming, &refused).await,
        };
        with_request_id(response, incoming.request_id)
    }

    async fn evaluations(&self, req: http::Request<Body>) -> Response {
        let incoming = incoming(self, &req, EVALUATIONS_PATH);
        let answer = async {
            self.authenticated(&incoming)?;
            let body = self.body(req, EVALUATIONS_PATH).await?;
            let batch = super::parse_evaluations(&body, &self.config, self.transport(&incoming))
                .map_err(Refused::bad_request)?;
            self.decide_batch(&incoming, batch).await
        }
        .await;
        let response = match answer {
            Ok(v) => json_response(&v),
            Err(refused) => self.refuse(&incoming, &refused).await,
        };
        with_request_id(response, incoming.request_id)
    }

    /// The entries of a batch in request order, stopping as the semantic
    /// says. Every entry that would run as a tenant the caller may not act
    /// for (or is otherwise not a request) refuses the whole batch before
    /// anything of it is decided, as `BatchAuthorize` does.
    async fn decide_batch(&self, incoming: &Incoming, batch: Batch) -> Result<Value, Refused> {
        let Batch {
            semantic,
            entries,
            single,
        } = batch;
        if single {
            let Some(Ok(entry)) = entries.into_iter().next() else {
                return Err(Refused::bad_request(Refusal::new(
                    "missing_field",
                    "the request holds no evaluation",
                )));
            };
            let outcome = self.decide(&entry).await?;
            return Ok(decision_json(&outcome, &entry, &self.config));
        }
        for entry in entries.iter().flatten() {
            self.authorizer
                .precheck(&entry.input)
                .map_err(|e| self.request_refused(&e))?;
        }
        let mut answers = Vec::with_capacity(entries.len());
        for entry in &entries {
            let answer = match entry {
                Ok(entry) => {
                    let outcome = self.decide(entry).await?;
                    decision_json(&outcome, entry, &self.config)
                }
                Err(refusal) => {
                    // Not evaluable: closed, with the error in its place
                    // (AuthZEN §7.2), and audited as a refusal.
                    self.audit_refusal(incoming, &Refused::bad_request(refusal.clone()))
                        .await;
                    json!({
                        "decision": false,
                        "context": {
                            "reason": refusal.reason,
                            "error": {"status": 400, "message": refusal.message},
                        },
                    })
                }
            };
            let decision = answer
                .get("decision")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            answers.push(answer);
            if semantic.stops_after(decision) {
                break;
            }
        }
        Ok(json!({ "evaluations": answers }))
    }

    /// Action Search: the tools the request's principal may call (DESIGN
    /// §11.4), under the same principal rule and tenant check as a
    /// decision. Nothing is decided or audited but a refusal.
    async fn search_action(&self, req: http::Request<Body>) -> Response {
        let incoming = incoming(self, &req, SEARCH_ACTION_PATH);
        let answer = async {
            self.authenticated(&incoming)?;
            let body = self.body(req, SEARCH_ACTION_PATH).await?;
            let search =
                super::parse_action_search(&body, &self.config, self.transport(&incoming))
                    .map_err(Refused::bad_request)?;
            let callable = self
                .authorizer
                .callable_tools(
                    Some(&search.caller),
                    &incoming.identity_token,
                    &incoming.tenants,
                )
                .map_err(|e| self.request_refused(&e))?
                .into_result()
                .map_err(|envelope| {
                    if envelope.code == ErrorCode::Unauthorized {
                        Refused {
                            status: StatusCode::UNAUTHORIZED,
                            reason: "unauthorized",
                            message: "the subject's identity token is missing, invalid, or disagrees with the request".to_owned(),
                        }
                    } else {
                        Refused {
                            status: StatusCode::INTERNAL_SERVER_ERROR,
                            reason: "internal_error",
                            message: "the tools this subject may call could not be computed".to_owned(),
                        }
                    }
                })?;
            let names: Vec<String> = callable.tools.iter().map(|t| t.name.clone()).collect();
            Ok::<_, Refused>(super::action_results(
                &names,
                search.offset,
                search.limit,
            ))
        }
        .await;
        let response = match answer {
            Ok(v) => json_response(&v),
            Err(refused) => self.refuse(&incoming, &refused).await,
        };
        with_request_id(response, incoming.request_id)
    }

    fn metadata(&self, req: &http::Request<Body>) -> Result<Value, Refused> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return Err(Refused {
                status: StatusCode::METHOD_NOT_ALLOWED,
                reason: "method_not_allowed",
                message: format!("`{METADATA_PATH}` takes GET"),
            });
        }
        // Never the request's `Host` or authority: that is the client's
        // text, and a cache or a rebound page would hand it to the next
        // reader as where to send its requests (DESIGN §9).
        let base = match &self.config.policy_decision_point {
            Some(pdp) => pdp.trim_end_matches('/').to_owned(),
            None => {
                let scheme = if self.tls { "https" } else { "http" };
                format!("{scheme}://{}", listener_authority(req.extensions()))
            }
        };
        Ok(super::metadata(&base, &self.config, true))
    }
}

/// The address the request reached: the listener's own (for a listener on
/// `0.0.0.0`, the interface the connection came in on). A Unix socket has
/// none to name: `localhost`, as HTTP over Unix sockets writes it.
fn listener_authority(ext: &http::Extensions) -> String {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    ext.get::<TcpConnectInfo>()
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .map(TlsConnectInfo::get_ref)
        })
        .and_then(TcpConnectInfo::local_addr)
        .map_or_else(|| "localhost".to_owned(), |a| a.to_string())
}

async fn metadata(State(door): State<Arc<AuthzenHttp>>, req: http::Request<Body>) -> Response {
    let incoming = incoming(&door, &req, METADATA_PATH);
    let mut response = match door.metadata(&req) {
        Ok(v) => json_response(&v),
        Err(refused) => door.refuse(&incoming, &refused).await,
    };
    // What it names depends on the listener and the configuration, and is
    // not to be kept by a cache between the client and here.
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    with_request_id(response, incoming.request_id)
}

async fn evaluation(State(door): State<Arc<AuthzenHttp>>, req: http::Request<Body>) -> Response {
    door.evaluation(req).await
}

async fn evaluations(State(door): State<Arc<AuthzenHttp>>, req: http::Request<Body>) -> Response {
    door.evaluations(req).await
}

async fn search_action(State(door): State<Arc<AuthzenHttp>>, req: http::Request<Body>) -> Response {
    door.search_action(req).await
}
