//! Envoy's external authorization door for MCP traffic (DESIGN §11.2):
//! what a proxy (Envoy, Envoy AI Gateway, Istio, agentgateway) tells of one
//! HTTP request in, the one pipeline's input out, its outcome back as what
//! the proxy does with the request.
//!
//! This core is pure: an [`HttpRequest`] (the method, the lower-case
//! headers, the body as bytes) is read ([`read`]) as a JSON-RPC message,
//! strictly decoded as a whole (§2.1). One `tools/call` becomes a
//! [`ToolCall`] for the pipeline; every other message passes, except the
//! methods `[ext_authz] denied_methods` names; what cannot be read (a batch,
//! an empty, unparsable or truncated body) is a [`Refusal`] answered with a
//! JSON-RPC error. An outcome becomes an [`Answer`] ([`answer`]): ALLOW
//! lets the request through with the `toolgate-*` headers set for the
//! upstream server and every other one the client sent removed; DENY and
//! APPROVAL_REQUIRED answer the client in the server's place with a
//! JSON-RPC tool error carrying `model_output` (status 200, the id echoed),
//! so the model reads it as the tool's answer. `desk.rs` establishes the
//! principal from the verified bearer token and runs the pipeline; the
//! gRPC service (`grpc/ext_authz.rs`) translates Envoy's `CheckRequest` and
//! `CheckResponse`.
//!
//! It must not decide anything itself: a request is let through as a tool
//! call only when the pipeline allowed it.

pub mod desk;

use serde_json::{Map, Value, json};

use crate::decision::{AuthorizeInput, AuthorizeOutcome, Decision};
use crate::decode::{self, Limits};
use crate::envelope::{Envelope, ErrorCode};

/// The headers toolgate sets for the upstream server on an allowed call.
pub const DECISION_ID_HEADER: &str = "toolgate-decision-id";
pub const IDEMPOTENCY_KEY_HEADER: &str = "toolgate-idempotency-key";
pub const ARGUMENTS_SHA256_HEADER: &str = "toolgate-arguments-sha256";
/// Every header of this prefix that the client sent is removed.
pub const HEADER_PREFIX: &str = "toolgate-";

/// The header Envoy adds to a check whose body it cut at
/// `max_request_bytes` (`allow_partial_message: true`).
pub const PARTIAL_BODY_HEADER: &str = "x-envoy-auth-partial-body";

/// The `_meta` key a client may name its business operation with.
pub const META_REQUEST_ID: &str = "toolgate/request_id";

/// Default body cap: the arguments' default cap (1 MiB) and room for the
/// JSON-RPC message around them.
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 * 1_048_576;

/// How many levels the JSON-RPC message adds above the arguments
/// (`{params: {arguments: …}}`), so the body's depth limit is the
/// arguments' plus this.
pub const ENVELOPE_DEPTH: usize = 2;

/// JSON-RPC error codes of the refusals (the first three are JSON-RPC's
/// own; the last two are in its range for server errors).
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;
pub const UNAUTHORIZED: i64 = -32001;
pub const FORBIDDEN: i64 = -32003;

/// `[ext_authz]`: what the door refuses and where it reads the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtAuthzConfig {
    /// MCP methods refused whatever the caller (e.g. `sampling/createMessage`).
    /// Empty by default: every method but `tools/call` passes.
    pub denied_methods: Vec<String>,
    /// The header carrying the user's identity token (a JWT), lower case;
    /// `authorization` takes a `Bearer` credential.
    pub identity_header: String,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
}

impl Default for ExtAuthzConfig {
    fn default() -> Self {
        Self {
            denied_methods: Vec::new(),
            identity_header: "authorization".to_owned(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

impl ExtAuthzConfig {
    /// The body's limits: the configured size, and the arguments' depth
    /// plus the JSON-RPC message's levels.
    #[must_use]
    pub fn body_limits(&self, argument_limits: &Limits) -> Limits {
        Limits {
            max_bytes: self.max_body_bytes,
            max_depth: argument_limits.max_depth.saturating_add(ENVELOPE_DEPTH),
        }
    }
}

/// One HTTP request as the proxy describes it.
#[derive(Debug, Clone, Default)]
pub struct HttpRequest {
    pub method: String,
    pub path: String,
    /// Lower-case names, as HTTP/2 and Envoy's check request carry them.
    pub headers: Vec<(String, String)>,
    /// The body as sent (`raw_body`); empty when the proxy sent none.
    pub body: Vec<u8>,
    /// Whether the proxy cut the body (`x-envoy-auth-partial-body: true`,
    /// or fewer bytes than the request's declared size).
    pub partial: bool,
}

impl HttpRequest {
    /// The value of header `name` (lower case); `None` when absent.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The request's `x-request-id` (Envoy sets one), for the call id and
    /// the audit log.
    #[must_use]
    pub fn request_id(&self) -> &str {
        self.header("x-request-id").unwrap_or_default()
    }

    /// The user's identity token from the configured header.
    #[must_use]
    pub fn identity_token(&self, config: &ExtAuthzConfig) -> Option<&str> {
        let value = self.header(&config.identity_header)?;
        let token = if config.identity_header == "authorization" {
            crate::identity::bearer(value)?
        } else {
            value.trim()
        };
        Some(token).filter(|t| !t.is_empty())
    }
}

/// What one request asks, once read.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    /// Not a `tools/call` (another method, a notification, a response, a
    /// request that is not POST): it passes.
    Pass,
    /// One `tools/call` for the pipeline.
    ToolCall(ToolCall),
}

/// One `tools/call` message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The JSON-RPC id, echoed in the answer.
    pub id: Value,
    /// `params.name`.
    pub tool: String,
    /// `params.arguments` (`{}` when absent), serialized from the strictly
    /// decoded body.
    pub arguments: Vec<u8>,
    /// The business operation (DESIGN §11.2).
    pub request_id: String,
    /// `mcp-session-id`.
    pub session_id: String,
}

/// A request the door answers itself, with a JSON-RPC error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status the client gets.
    pub status: u16,
    /// A stable snake_case reason, for the audit log.
    pub reason: &'static str,
    /// The JSON-RPC id echoed (`null` when the message has none or could
    /// not be read); boxed, to keep the refusal small.
    pub id: Box<Value>,
    /// The JSON-RPC error code.
    pub code: i64,
    /// What the client is told.
    pub message: String,
}

impl Refusal {
    fn new(
        status: u16,
        reason: &'static str,
        id: Value,
        code: i64,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            reason,
            id: Box::new(id),
            code,
            message: message.into(),
        }
    }

    /// `401`: no valid bearer token (`reason` is the token's failure).
    #[must_use]
    pub fn unauthorized(id: Value, reason: &'static str) -> Self {
        Self::new(
            401,
            reason,
            id,
            UNAUTHORIZED,
            "a tools/call needs a valid bearer token",
        )
    }

    /// `403`: the caller's grants do not cover the token's tenant.
    #[must_use]
    pub fn forbidden(id: Value, message: impl Into<String>) -> Self {
        Self::new(403, "tenant_not_granted", id, FORBIDDEN, message)
    }

    /// `400`: the pipeline refused the call as a request.
    #[must_use]
    pub fn invalid(id: Value, message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request", id, INVALID_PARAMS, message)
    }

    /// The answer to the client.
    #[must_use]
    pub fn response(&self) -> Response {
        let body = json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        });
        let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        if self.status == 401 {
            headers.push((
                "www-authenticate".to_owned(),
                r#"Bearer error="invalid_token""#.to_owned(),
            ));
        }
        Response {
            status: self.status,
            headers,
            body: body.to_string(),
        }
    }
}

/// What the proxy does with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Let it through to the upstream server, with `set` set (overwriting
    /// any value the client sent) and `remove` removed.
    Allow {
        set: Vec<(String, String)>,
        remove: Vec<String>,
    },
    /// Answer the client in the upstream server's place.
    Respond(Response),
}

/// An HTTP response the proxy sends the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

fn parse_error(reason: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::new(400, reason, Value::Null, PARSE_ERROR, message)
}

fn invalid_request(reason: &'static str, id: Value, message: impl Into<String>) -> Refusal {
    Refusal::new(400, reason, id, INVALID_REQUEST, message)
}

fn invalid_params(id: Value, message: impl Into<String>) -> Refusal {
    Refusal::new(400, "invalid_params", id, INVALID_PARAMS, message)
}

/// Reads one request (DESIGN §11.2).
///
/// # Errors
/// [`Refusal`] for a POST whose body is empty, truncated, not strictly
/// decodable within `limits`, a batch, not a JSON-RPC message, a `tools/call`
/// without an id or with malformed `params`, or a denied method.
pub fn read(req: &HttpRequest, config: &ExtAuthzConfig, limits: &Limits) -> Result<Read, Refusal> {
    if !req.method.eq_ignore_ascii_case("POST") {
        return Ok(Read::Pass);
    }
    if req.body.is_empty() {
        return Err(parse_error(
            "empty_body",
            "the request carries no body (the proxy must send it: `with_request_body`)",
        ));
    }
    if req.partial {
        return Err(parse_error(
            "truncated_body",
            "the request body was cut by the proxy: it is over the proxy's `max_request_bytes`",
        ));
    }
    let message = decode::parse_strict(&req.body, limits)
        .map_err(|e| parse_error(e.reason(), format!("the request body is not accepted: {e}")))?;
    let object = match message {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err(invalid_request(
                "batch",
                Value::Null,
                "a JSON-RPC batch is not accepted: send one message per request",
            ));
        }
        _ => {
            return Err(invalid_request(
                "not_an_object",
                Value::Null,
                "the request body is not a JSON-RPC message",
            ));
        }
    };
    let id = object.get("id").cloned().unwrap_or(Value::Null);
    misspelt(
        &object,
        &["jsonrpc", "id", "method", "params", "result", "error"],
    )?;
    let method = match object.get("method") {
        Some(Value::String(m)) => m.as_str(),
        // A response to the server's own request (sampling, elicitation).
        None if object.contains_key("result") || object.contains_key("error") => {
            return Ok(Read::Pass);
        }
        _ => {
            return Err(invalid_request(
                "no_method",
                id,
                "the JSON-RPC message has no `method` string",
            ));
        }
    };
    if config.denied_methods.iter().any(|m| m == method) {
        return Err(Refusal::new(
            403,
            "method_denied",
            id,
            FORBIDDEN,
            format!(
                "method `{}` is not allowed through this gateway",
                crate::envelope::echo(method)
            ),
        ));
    }
    if method != "tools/call" {
        return Ok(Read::Pass);
    }
    tool_call(req, &object, id).map(Read::ToolCall)
}

/// A member whose name a case-insensitive reader takes for one of `known`
/// but is not spelt as it (`Method`, `Arguments`, `paramſ`, `name\0`):
/// refused, since toolgate would read the message without it and the
/// upstream with it (a lone `Arguments` beside no `arguments` is no
/// duplicate, yet Go's `encoding/json` runs it as the arguments).
fn misspelt(object: &Map<String, Value>, known: &[&str]) -> Result<(), Refusal> {
    for key in object.keys() {
        let folded = decode::folded_key(key);
        if let Some(name) = known
            .iter()
            .find(|k| **k != key.as_str() && decode::folded_key(k) == folded)
        {
            return Err(invalid_request(
                "misspelt_member",
                Value::Null,
                format!(
                    "the member `{}` is not `{name}`: JSON-RPC member names are exact",
                    crate::envelope::echo(key)
                ),
            ));
        }
    }
    Ok(())
}

fn tool_call(
    req: &HttpRequest,
    message: &Map<String, Value>,
    id: Value,
) -> Result<ToolCall, Refusal> {
    if !matches!(id, Value::String(_) | Value::Number(_)) {
        return Err(invalid_request(
            "no_id",
            Value::Null,
            "a tools/call must carry a string or number `id`",
        ));
    }
    let Some(params) = message.get("params").and_then(Value::as_object) else {
        return Err(invalid_params(id, "`params` must be an object"));
    };
    misspelt(params, &["name", "arguments", "_meta"])?;
    let tool = match params.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => return Err(invalid_params(id, "`params.name` must name a tool")),
    };
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => b"{}".to_vec(),
        // Serialized from the strictly decoded body, so the bytes decode
        // again to the same value in the pipeline.
        Some(v) => serde_json::to_vec(v).unwrap_or_default(),
    };
    let meta_request_id = match params.get("_meta").map(|m| m.get(META_REQUEST_ID)) {
        None | Some(None | Some(Value::Null)) => None,
        Some(Some(Value::String(s))) => Some(s.clone()).filter(|s| !s.is_empty()),
        Some(Some(_)) => {
            return Err(invalid_params(
                id,
                format!("`params._meta[\"{META_REQUEST_ID}\"]` must be a string"),
            ));
        }
    };
    let session_id = req.header("mcp-session-id").unwrap_or_default().to_owned();
    let request_id = req
        .header("idempotency-key")
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .or(meta_request_id)
        .unwrap_or_else(|| session_request_id(&session_id, &id));
    Ok(ToolCall {
        id,
        tool,
        arguments,
        request_id,
        session_id,
    })
}

/// The request id derived from the MCP session and the JSON-RPC id (the
/// id as JSON text, so `1` and `"1"` differ); without a session the call is
/// its own operation.
#[must_use]
pub fn session_request_id(session_id: &str, id: &Value) -> String {
    if session_id.is_empty() {
        return AuthorizeInput::own_operation("ext-authz");
    }
    format!("mcp-session:{session_id}:{id}")
}

/// Every `toolgate-*` header the client sent but `keep`, and every one
/// spelt with underscores (`toolgate_decision_id`): a CGI, WSGI or Rack
/// upstream reads both spellings as the same `HTTP_TOOLGATE_DECISION_ID`,
/// so a client's underscored header would pass for ours. `keep` names only
/// the hyphenated headers this answer sets (which overwrite the client's).
fn forged(req: &HttpRequest, keep: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = req
        .headers
        .iter()
        .map(|(n, _)| n.to_ascii_lowercase())
        .filter(|n| n.replace('_', "-").starts_with(HEADER_PREFIX) && !keep.contains(&n.as_str()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A request that passes: through, without any `toolgate-*` header the
/// client sent (the upstream server trusts only ours).
#[must_use]
pub fn pass(req: &HttpRequest) -> Answer {
    Answer::Allow {
        set: Vec::new(),
        remove: forged(req, &[]),
    }
}

/// The answer to a decided `tools/call`: ALLOW lets it through with the
/// decision's headers; DENY and APPROVAL_REQUIRED are the tool's answer,
/// an error the model reads.
#[must_use]
pub fn answer(outcome: &AuthorizeOutcome, call: &ToolCall, req: &HttpRequest) -> Answer {
    if outcome.decision == Decision::Allow {
        let set = vec![
            (DECISION_ID_HEADER.to_owned(), outcome.decision_id.clone()),
            (
                IDEMPOTENCY_KEY_HEADER.to_owned(),
                outcome.idempotency_key.clone(),
            ),
            (
                ARGUMENTS_SHA256_HEADER.to_owned(),
                outcome.arguments_sha256.clone(),
            ),
        ];
        let keep = [
            DECISION_ID_HEADER,
            IDEMPOTENCY_KEY_HEADER,
            ARGUMENTS_SHA256_HEADER,
        ];
        return Answer::Allow {
            set,
            remove: forged(req, &keep),
        };
    }
    let text = outcome.error.as_ref().map_or_else(
        // Never reached: the pipeline gives every refusal its envelope.
        || Envelope::new(ErrorCode::InternalError, "the call was not allowed").model_output(),
        Envelope::model_output,
    );
    Answer::Respond(tool_error(&call.id, &text))
}

/// A JSON-RPC response whose `result` is a tool error with `text`.
#[must_use]
pub fn tool_error(id: &Value, text: &str) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {"content": [{"type": "text", "text": text}], "isError": true},
    });
    Response {
        status: 200,
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        body: body.to_string(),
    }
}

#[cfg(test)]
mod tests;
