//! AuthZEN request bodies (already strictly decoded) → pipeline inputs.

use serde_json::{Map, Value};

use super::AuthzenConfig;
use crate::access::TenantScope;
use crate::decision::{AuthorizeInput, Door};
use crate::identity::Caller;

/// What the HTTP request itself says, beyond its body.
#[derive(Debug, Clone, Copy)]
pub struct Transport<'a> {
    /// The transport identity of the connection, for the audit log.
    pub peer: &'a str,
    /// The tenants the caller's `authzen` grants let it act for.
    pub tenants: &'a TenantScope,
    /// The user's identity token from the configured header (empty if none).
    pub identity_token: &'a str,
    /// The PEP's `X-Request-ID`, kept as the call id (never in a key).
    pub call_id: &'a str,
    /// Whether the principal must come from a verified identity token.
    pub require_identity_token: bool,
}

/// A request (or one evaluation of it) that cannot be evaluated: a `400`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// A stable snake_case reason, for the audit log.
    pub reason: &'static str,
    /// What the PEP is told: lowercase, its own text in backticks.
    pub message: String,
}

impl Refusal {
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    fn within(self, index: usize) -> Self {
        Self {
            reason: self.reason,
            message: format!("evaluations[{index}]: {}", self.message),
        }
    }
}

/// One evaluation as the pipeline takes it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub input: AuthorizeInput,
    /// Whether the request carried the arguments at all (none sent is `{}`).
    pub arguments_sent: bool,
}

/// `options.evaluations_semantic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Semantic {
    ExecuteAll,
    DenyOnFirstDeny,
    PermitOnFirstPermit,
}

impl Semantic {
    /// Whether the answer `decision` ends the evaluations here.
    #[must_use]
    pub const fn stops_after(self, decision: bool) -> bool {
        match self {
            Self::ExecuteAll => false,
            Self::DenyOnFirstDeny => !decision,
            Self::PermitOnFirstPermit => decision,
        }
    }
}

/// An `/access/v1/evaluations` request.
#[derive(Debug, Clone)]
pub struct Batch {
    pub semantic: Semantic,
    /// Each evaluation in request order: a call to decide, or why that one
    /// cannot be evaluated (answered `decision: false` in its place).
    pub entries: Vec<Result<Entry, Refusal>>,
    /// No `evaluations` array (or an empty one): the request is a single
    /// evaluation and is answered as `/access/v1/evaluation` answers.
    pub single: bool,
}

/// The parts of an evaluation, which `/access/v1/evaluations` defaults.
const PARTS: [&str; 4] = ["subject", "action", "resource", "context"];

/// One Access Evaluation request.
///
/// # Errors
/// [`Refusal`] when the body is not an evaluation (a required part missing
/// or mistyped) or cannot be mapped to a tool call (not a tool, no tenant, a
/// mapped field of the wrong type).
pub fn parse_evaluation(
    body: &Value,
    config: &AuthzenConfig,
    transport: Transport<'_>,
) -> Result<Entry, Refusal> {
    let Some(object) = body.as_object() else {
        return Err(not_an_object("the request body"));
    };
    check_shape(object)?;
    map(body, config, transport)
}

/// One Access Evaluations request: the top-level parts are the defaults of
/// each entry (an entry's own part replaces the default whole).
///
/// # Errors
/// [`Refusal`] for the whole request: not an object, `evaluations` or
/// `options` mistyped, an unknown semantic, too many entries, or an entry
/// that, with the defaults, misses or mistypes a required part. An entry
/// that is well formed but cannot be mapped to a tool call is refused in
/// its place ([`Batch::entries`]).
pub fn parse_evaluations(
    body: &Value,
    config: &AuthzenConfig,
    transport: Transport<'_>,
) -> Result<Batch, Refusal> {
    let Some(object) = body.as_object() else {
        return Err(not_an_object("the request body"));
    };
    let semantic = semantic(object)?;
    let entries = match object.get("evaluations") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(entries)) => entries.iter().collect(),
        Some(_) => return Err(wrong_type("evaluations", "an array")),
    };
    if entries.is_empty() {
        let entry = parse_evaluation(body, config, transport)?;
        return Ok(Batch {
            semantic,
            entries: vec![Ok(entry)],
            single: true,
        });
    }
    if entries.len() > config.max_evaluations {
        return Err(Refusal::new(
            "too_many_evaluations",
            format!(
                "`evaluations` holds {} entries, over the limit of {}",
                entries.len(),
                config.max_evaluations
            ),
        ));
    }
    let mut merged = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let Some(own) = entry.as_object() else {
            return Err(not_an_object(&format!("`evaluations[{i}]`")));
        };
        let mut one = Map::new();
        for part in PARTS {
            if let Some(v) = own.get(part).or_else(|| object.get(part)) {
                one.insert(part.to_owned(), v.clone());
            }
        }
        check_shape(&one).map_err(|r| r.within(i))?;
        merged.push(Value::Object(one));
    }
    let entries = merged
        .iter()
        .enumerate()
        .map(|(i, e)| map(e, config, transport).map_err(|r| r.within(i)))
        .collect();
    Ok(Batch {
        semantic,
        entries,
        single: false,
    })
}

fn semantic(object: &Map<String, Value>) -> Result<Semantic, Refusal> {
    let options = match object.get("options") {
        None | Some(Value::Null) => return Ok(Semantic::ExecuteAll),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(wrong_type("options", "an object")),
    };
    match options.get("evaluations_semantic") {
        None | Some(Value::Null) => Ok(Semantic::ExecuteAll),
        Some(Value::String(s)) => match s.as_str() {
            "execute_all" => Ok(Semantic::ExecuteAll),
            "deny_on_first_deny" => Ok(Semantic::DenyOnFirstDeny),
            "permit_on_first_permit" => Ok(Semantic::PermitOnFirstPermit),
            other => Err(Refusal::new(
                "unknown_semantic",
                format!(
                    "`options.evaluations_semantic` `{}` is none of `execute_all`, `deny_on_first_deny`, `permit_on_first_permit`",
                    crate::envelope::echo(other)
                ),
            )),
        },
        Some(_) => Err(wrong_type("options.evaluations_semantic", "a string")),
    }
}

fn not_an_object(what: &str) -> Refusal {
    Refusal::new("not_an_object", format!("{what} must be a JSON object"))
}

fn wrong_type(field: &str, expected: &str) -> Refusal {
    Refusal::new("wrong_type", format!("`{field}` must be {expected}"))
}

fn missing(field: &str) -> Refusal {
    Refusal::new("missing_field", format!("`{field}` is required"))
}

/// The information model's required members and types (AuthZEN §5): what
/// the spec's request schema requires, checked by hand.
fn check_shape(e: &Map<String, Value>) -> Result<(), Refusal> {
    for (part, members) in [
        ("subject", &["type", "id"][..]),
        ("resource", &["type", "id"][..]),
        ("action", &["name"][..]),
    ] {
        let Some(value) = e.get(part) else {
            return Err(missing(part));
        };
        let Some(object) = value.as_object() else {
            return Err(wrong_type(part, "an object"));
        };
        for m in members {
            match object.get(*m) {
                None => return Err(missing(&format!("{part}.{m}"))),
                Some(Value::String(_)) => {}
                Some(_) => return Err(wrong_type(&format!("{part}.{m}"), "a string")),
            }
        }
        if let Some(p) = object.get("properties")
            && !p.is_object()
        {
            return Err(wrong_type(&format!("{part}.properties"), "an object"));
        }
    }
    if let Some(c) = e.get("context")
        && !c.is_object()
    {
        return Err(wrong_type("context", "an object"));
    }
    Ok(())
}

/// The dotted name of a pointer, for messages (`/subject/properties/tenant`
/// is `subject.properties.tenant`).
fn dotted(pointer: &str) -> String {
    super::pointer_tokens(pointer).join(".")
}

/// The string at `pointer`: `None` when absent or null.
fn string_at(e: &Value, pointer: &str) -> Result<Option<String>, Refusal> {
    match e.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(wrong_type(&dotted(pointer), "a string")),
    }
}

/// The strings at `pointer`: an array of strings or, when `spaced`, also
/// one space-separated string (OAuth's `scope`).
fn strings_at(e: &Value, pointer: &str, spaced: bool) -> Result<Vec<String>, Refusal> {
    let expected = if spaced {
        "an array of strings or a space-separated string"
    } else {
        "an array of strings"
    };
    match e.pointer(pointer) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) if spaced => Ok(s.split_whitespace().map(str::to_owned).collect()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| wrong_type(&dotted(pointer), expected))
            })
            .collect(),
        Some(_) => Err(wrong_type(&dotted(pointer), expected)),
    }
}

/// The principal a request names, at the configured pointers: its
/// subject, tenant (else `default_tenant`; with required identity tokens
/// the token names it), roles, scopes, agent and session.
fn principal(e: &Value, config: &AuthzenConfig, t: Transport<'_>) -> Result<Caller, Refusal> {
    let subject_id = string_at(e, &config.subject)?.unwrap_or_default();
    let tenant = string_at(e, &config.tenant)?.filter(|s| !s.is_empty());
    let tenant_id = match (tenant, t.require_identity_token) {
        (Some(t), _) => t,
        // The verified token names the tenant.
        (None, true) => String::new(),
        (None, false) => config.default_tenant.clone().ok_or_else(|| {
            Refusal::new(
                "no_tenant",
                format!(
                    "the request names no tenant: send `{}` (no `[authzen] default_tenant` is configured)",
                    dotted(&config.tenant)
                ),
            )
        })?,
    };
    Ok(Caller {
        subject_id,
        tenant_id,
        roles: strings_at(e, &config.roles, false)?,
        scopes: strings_at(e, &config.scopes, true)?,
        agent_id: string_at(e, &config.agent)?.unwrap_or_default(),
        session_id: string_at(e, &config.session)?.unwrap_or_default(),
    })
}

/// An Action Search request (AuthZEN §8.6): whose tools, and which page.
#[derive(Debug, Clone)]
pub struct ActionSearch {
    pub caller: Caller,
    /// The first result to answer (from the page token).
    pub offset: usize,
    /// The most results to answer (`page.limit`).
    pub limit: Option<usize>,
}

/// The page token of the results from `offset` on: opaque to the PEP.
#[must_use]
pub fn page_token(offset: usize) -> String {
    format!("tools-from-{offset}")
}

/// One Action Search request: `subject` and `resource` required (any
/// resource, e.g. `{type: "mcp_server", id: …}`: the answer is the tools),
/// `context` and `page` optional.
///
/// # Errors
/// [`Refusal`] when the body is not an Action Search request, names no
/// tenant, or carries a page token toolgate did not issue.
pub fn parse_action_search(
    body: &Value,
    config: &AuthzenConfig,
    transport: Transport<'_>,
) -> Result<ActionSearch, Refusal> {
    let Some(object) = body.as_object() else {
        return Err(not_an_object("the request body"));
    };
    let mut shape = object.clone();
    // The action is what is searched for: any stands in for the check.
    shape.insert("action".into(), serde_json::json!({"name": ""}));
    check_shape(&shape)?;
    let (offset, limit) = match object.get("page") {
        None | Some(Value::Null) => (0, None),
        Some(Value::Object(page)) => {
            let offset = match page.get("token") {
                None | Some(Value::Null) => 0,
                Some(Value::String(t)) if t.is_empty() => 0,
                Some(Value::String(t)) => t
                    .strip_prefix("tools-from-")
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| {
                        Refusal::new(
                            "bad_page_token",
                            "`page.token` is not a token toolgate issued",
                        )
                    })?,
                Some(_) => return Err(wrong_type("page.token", "a string")),
            };
            let limit = match page.get("limit") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    v.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| wrong_type("page.limit", "a non-negative integer"))?,
                ),
            };
            (offset, limit)
        }
        Some(_) => return Err(wrong_type("page", "an object")),
    };
    Ok(ActionSearch {
        caller: principal(body, config, transport)?,
        offset,
        limit,
    })
}

/// §11.1's mapping of one well-formed evaluation.
fn map(e: &Value, config: &AuthzenConfig, t: Transport<'_>) -> Result<Entry, Refusal> {
    let resource_type = e
        .pointer("/resource/type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !config.tool_types.iter().any(|k| k == resource_type) {
        let expected = config
            .tool_types
            .iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(Refusal::new(
            "not_a_tool",
            format!(
                "resource type `{}` is not a tool (expected {expected})",
                crate::envelope::echo(resource_type)
            ),
        ));
    }
    let tool = e
        .pointer("/resource/id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if tool.is_empty() {
        return Err(Refusal::new("empty_tool", "`resource.id` must name a tool"));
    }
    let action = e
        .pointer("/action/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    // The one question this door answers is whether the tool may be
    // called: another action on a tool is not answered as if it were.
    if action != "tools/call" && action != tool {
        return Err(Refusal::new(
            "not_a_tool_call",
            format!(
                "action `{}` is not `tools/call` or the tool's name",
                crate::envelope::echo(&action)
            ),
        ));
    }

    let sent = config
        .arguments
        .iter()
        .find_map(|p| e.pointer(p).filter(|v| !v.is_null()));
    let arguments_sent = sent.is_some();
    let arguments = match sent {
        // The arguments are serialized from the strictly decoded body, so
        // their bytes decode again to the same value in the pipeline.
        Some(v) => serde_json::to_vec(v).unwrap_or_default(),
        None => b"{}".to_vec(),
    };

    let caller = principal(e, config, t)?;
    let mut request_id = None;
    for p in &config.request_id {
        if let Some(id) = string_at(e, p)?.filter(|s| !s.is_empty()) {
            request_id = Some(id);
            break;
        }
    }
    // Neither sent: the call is its own operation.
    let request_id = request_id.unwrap_or_else(|| AuthorizeInput::own_operation("authzen"));
    let approval_id = string_at(e, &config.approval_id)?.unwrap_or_default();

    Ok(Entry {
        input: AuthorizeInput {
            tool,
            arguments,
            caller: Some(caller),
            call_id: t.call_id.to_owned(),
            request_id,
            approval_id,
            deadline: None,
            // The pipeline reads the entity store (DESIGN §11.6).
            entities_json: String::new(),
            tool_version: String::new(),
            identity_token: t.identity_token.to_owned(),
            peer: t.peer.to_owned(),
            tenants: t.tenants.clone(),
            door: Door::Gateway,
            action,
        },
        arguments_sent,
    })
}
