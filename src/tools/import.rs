//! Contract skeletons from an MCP `tools/list` result (DESIGN §11.5): the rules of
//! `toolgate tools import`, without its IO.
//!
//! Owns how a `tools/list` page is read (the `result` object, or a whole JSON-RPC response),
//! which MCP tool names are refused, the risk a tool's annotations give under MCP's own
//! defaults ([`risk_from_hints`]), the skeleton of a contract, how a re-import keeps what the
//! author wrote, and the diff of a changed contract. Must not read or write files, talk to an
//! MCP server or print: `mcp` does the IO and `main` the printing.
//!
//! A skeleton carries what MCP says (`name`, `description`, `risk`, `idempotent`,
//! `inputSchema`, `outputSchema`) and placeholders for what only the author knows:
//! `"version": "1.0.0"`, `"parallel": false`, `"timeoutMs": 30000` and `"resource": null`.
//! `"resource": null` loads as a tool without a resource (its resource is then the tool's own
//! `Tool` entity), so an imported folder passes `toolgate check` as it is; the `null` is
//! there to be seen and replaced by `{"type": …, "idPointer": …}` when the tool acts on one.
//! On a re-import, the author's fields (every field MCP does not define: `version`,
//! `parallel`, `timeoutMs`, `resource`, `sensitive`, `approvalTtlSeconds`, `maxAttempts`)
//! are taken from the existing contract, so only what the server changed shows as a change.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::contract::{CONTRACT_FIELDS, Risk, is_valid_name};
use super::source;

/// The `annotations` of an MCP tool that decide its contract; `None` is a hint the tool does
/// not give (MCP's default applies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hints {
    /// `readOnlyHint` (default `false`).
    pub read_only: Option<bool>,
    /// `destructiveHint` (default `true`).
    pub destructive: Option<bool>,
    /// `idempotentHint` (default `false`).
    pub idempotent: Option<bool>,
    /// `openWorldHint` (default `true`).
    pub open_world: Option<bool>,
}

/// The risk of a tool with `hints`, MCP's defaults applied: `readOnlyHint` true is `read`;
/// otherwise `destructiveHint` (true by default) is `destructive`; otherwise `openWorldHint`
/// (true by default) is `external`; otherwise `write`. A tool that says nothing is
/// `destructive`, as MCP treats it.
#[must_use]
pub fn risk_from_hints(hints: &Hints) -> Risk {
    if hints.read_only == Some(true) {
        Risk::Read
    } else if hints.destructive.unwrap_or(true) {
        Risk::Destructive
    } else if hints.open_world.unwrap_or(true) {
        Risk::External
    } else {
        Risk::Write
    }
}

/// One tool of a `tools/list` result, checked: its name is a valid toolgate tool name.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// `^[A-Za-z0-9_-]{1,64}$`, so `<name>.json` stays in the tools folder.
    pub name: String,
    /// `description`, when given.
    pub description: Option<String>,
    /// `inputSchema` as given (an object).
    pub input_schema: Value,
    /// `outputSchema` as given (an object), when given.
    pub output_schema: Option<Value>,
    /// The hints of `annotations`.
    pub hints: Hints,
}

/// One page of a `tools/list` result.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolsPage {
    /// The page's tools, in order.
    pub tools: Vec<McpTool>,
    /// `nextCursor`: more tools follow when the list is asked again with it.
    pub next_cursor: Option<String>,
}

/// Why a `tools/list` result cannot be imported. Messages quote names with escapes, never
/// raw.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImportError {
    /// The JSON is neither a `tools/list` result (`{"tools": [...]}`) nor a JSON-RPC response
    /// holding one.
    #[error("not an MCP tools/list result: {reason}")]
    NotAToolsList { reason: &'static str },
    /// A JSON-RPC error response.
    #[error("the MCP server answered tools/list with error {code}: {message:?}")]
    ServerError { code: i64, message: String },
    /// A tool entry lacks a field or has one of the wrong type.
    #[error("tool #{index} of the list: `{field}` must be {expected}")]
    InvalidTool {
        index: usize,
        field: &'static str,
        expected: &'static str,
    },
    /// A tool name toolgate cannot use (its contract file name and Cedar action id).
    #[error(
        "tool name {name:?} is not a valid toolgate tool name (`^[A-Za-z0-9_-]{{1,64}}$`); \
         nothing was imported"
    )]
    InvalidToolName { name: String },
    /// Two tools of the list have one name.
    #[error("tool name {name:?} is listed twice")]
    DuplicateTool { name: String },
}

impl ImportError {
    /// Stable machine-readable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotAToolsList { .. } => "not_a_tools_list",
            Self::ServerError { .. } => "mcp_server_error",
            Self::InvalidTool { .. } => "invalid_tool",
            Self::InvalidToolName { .. } => "invalid_tool_name",
            Self::DuplicateTool { .. } => "duplicate_tool",
        }
    }
}

/// Reads one page: `value` is the `result` of `tools/list` (`{"tools": [...], "nextCursor":
/// …}`) or a whole JSON-RPC response (`{"jsonrpc": "2.0", "id": …, "result": {...}}`; an
/// `error` response is [`ImportError::ServerError`]). Members MCP may add (`_meta`, `title`,
/// `icons`, …) are ignored; those read here must have their MCP types.
///
/// # Errors
/// [`ImportError`] for anything that is not a well-typed page, or a tool name toolgate
/// refuses.
pub fn read_page(value: &Value) -> Result<ToolsPage, ImportError> {
    let Value::Object(object) = value else {
        return Err(ImportError::NotAToolsList {
            reason: "the document is not a JSON object",
        });
    };
    let result = if object.contains_key("jsonrpc") {
        rpc_result(object)?
    } else {
        object
    };
    let Some(Value::Array(entries)) = result.get("tools") else {
        return Err(ImportError::NotAToolsList {
            reason: "`tools` is missing or not an array",
        });
    };
    let next_cursor = match result.get("nextCursor") {
        None | Some(Value::Null) => None,
        Some(Value::String(cursor)) => Some(cursor.clone()),
        Some(_) => {
            return Err(ImportError::NotAToolsList {
                reason: "`nextCursor` is not a string",
            });
        }
    };
    let tools = entries
        .iter()
        .enumerate()
        .map(|(index, entry)| read_tool(index, entry))
        .collect::<Result<_, _>>()?;
    Ok(ToolsPage { tools, next_cursor })
}

fn rpc_result(response: &Map<String, Value>) -> Result<&Map<String, Value>, ImportError> {
    if response.get("jsonrpc") != Some(&Value::from("2.0")) {
        return Err(ImportError::NotAToolsList {
            reason: "`jsonrpc` is not \"2.0\"",
        });
    }
    if let Some(error) = response.get("error") {
        return Err(ImportError::ServerError {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        });
    }
    match response.get("result") {
        Some(Value::Object(result)) => Ok(result),
        _ => Err(ImportError::NotAToolsList {
            reason: "the JSON-RPC response has no `result` object",
        }),
    }
}

fn read_tool(index: usize, entry: &Value) -> Result<McpTool, ImportError> {
    let invalid = |field, expected| ImportError::InvalidTool {
        index,
        field,
        expected,
    };
    let Value::Object(tool) = entry else {
        return Err(invalid("tools[]", "an object"));
    };
    let Some(Value::String(name)) = tool.get("name") else {
        return Err(invalid("name", "a string"));
    };
    if !is_valid_name(name) {
        return Err(ImportError::InvalidToolName { name: name.clone() });
    }
    let description = match tool.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => return Err(invalid("description", "a string")),
    };
    let input_schema = match tool.get("inputSchema") {
        Some(schema @ Value::Object(_)) => schema.clone(),
        _ => return Err(invalid("inputSchema", "an object")),
    };
    let output_schema = match tool.get("outputSchema") {
        None | Some(Value::Null) => None,
        Some(schema @ Value::Object(_)) => Some(schema.clone()),
        Some(_) => return Err(invalid("outputSchema", "an object")),
    };
    let hints = match tool.get("annotations") {
        None | Some(Value::Null) => Hints::default(),
        Some(Value::Object(annotations)) => {
            let hint = |field: &'static str| match annotations.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(value)) => Ok(Some(*value)),
                Some(_) => Err(invalid(field, "a boolean")),
            };
            Hints {
                read_only: hint("readOnlyHint")?,
                destructive: hint("destructiveHint")?,
                idempotent: hint("idempotentHint")?,
                open_world: hint("openWorldHint")?,
            }
        }
        Some(_) => return Err(invalid("annotations", "an object")),
    };
    Ok(McpTool {
        name: name.clone(),
        description,
        input_schema,
        output_schema,
        hints,
    })
}

/// Refuses a list that names one tool twice (possibly on different pages).
///
/// # Errors
/// [`ImportError::DuplicateTool`] with the first repeated name.
pub fn ensure_unique(tools: &[McpTool]) -> Result<(), ImportError> {
    let mut seen = HashSet::new();
    match tools.iter().find(|tool| !seen.insert(tool.name.as_str())) {
        Some(tool) => Err(ImportError::DuplicateTool {
            name: tool.name.clone(),
        }),
        None => Ok(()),
    }
}

/// The fields MCP defines; a re-import replaces them. Every other contract field is the
/// author's.
const MCP_FIELDS: [&str; 6] = [
    "name",
    "description",
    "risk",
    "idempotent",
    "inputSchema",
    "outputSchema",
];

/// The skeleton's value of each author's field a new contract gets.
fn placeholder(field: &str) -> Option<Value> {
    match field {
        "version" => Some(Value::from("1.0.0")),
        "parallel" => Some(Value::Bool(false)),
        "timeoutMs" => Some(Value::from(30_000)),
        "resource" => Some(Value::Null),
        _ => None,
    }
}

/// What importing one tool does to its contract file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// No contract file yet: written.
    Create,
    /// The existing contract already says this (compared as JSON, so the author's layout
    /// stays): left alone.
    Unchanged,
    /// The existing contract says something else: `diff` from it to `text`, written only
    /// when forced.
    Update { diff: String },
}

/// The contract one tool should have, and how it compares with the existing one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractPlan {
    /// The tool's name; its file is `<name>.json`.
    pub name: String,
    /// The contract's text, as it would be written.
    pub text: String,
    /// Against the existing contract.
    pub change: Change,
    /// The risk written.
    pub risk: Risk,
    /// Whether the contract names a resource (only an author's existing one can).
    pub has_resource: bool,
}

/// The contract for `tool`, given the text of its existing contract file (`None` when there
/// is none). `label` names that file in the diff (`a/<label>`, `b/<label>`).
///
/// The existing contract's own fields are kept when it is a JSON object without duplicate keys;
/// otherwise the skeleton replaces it whole, shown in the diff.
#[must_use]
pub fn plan_contract(tool: &McpTool, existing: Option<&str>, label: &str) -> ContractPlan {
    // Read as the contract loader reads a contract: serde_json, then duplicate keys refused.
    let previous = existing.and_then(|text| match serde_json::from_str(text) {
        Ok(Value::Object(fields)) if source::first_duplicate_key(text).is_none() => Some(fields),
        _ => None,
    });
    let risk = risk_from_hints(&tool.hints);
    let fields = contract_fields(tool, risk, previous.as_ref());
    let text = render(&fields);
    let change = match (existing, &previous) {
        (None, _) => Change::Create,
        (Some(_), Some(previous)) if *previous == fields => Change::Unchanged,
        (Some(old), _) => Change::Update {
            diff: similar::TextDiff::from_lines(old, text.as_str())
                .unified_diff()
                .context_radius(3)
                .header(&format!("a/{label}"), &format!("b/{label}"))
                .to_string(),
        },
    };
    let has_resource = fields
        .get("resource")
        .is_some_and(|resource| !resource.is_null());
    ContractPlan {
        name: tool.name.clone(),
        text,
        change,
        risk,
        has_resource,
    }
}

/// The contract's fields in the contract's own order: MCP's from `tool`, the author's from
/// `previous` or the placeholders.
fn contract_fields(
    tool: &McpTool,
    risk: Risk,
    previous: Option<&Map<String, Value>>,
) -> Map<String, Value> {
    let mut fields = Map::new();
    for &field in CONTRACT_FIELDS {
        let value = if MCP_FIELDS.contains(&field) {
            match field {
                "name" => Some(Value::from(tool.name.as_str())),
                "description" => tool.description.as_deref().map(Value::from),
                "risk" => Some(Value::from(risk.as_str())),
                "idempotent" => Some(Value::Bool(tool.hints.idempotent.unwrap_or(false))),
                "inputSchema" => Some(tool.input_schema.clone()),
                _ => tool.output_schema.clone(),
            }
        } else {
            match previous {
                Some(previous) => previous.get(field).cloned(),
                None => placeholder(field),
            }
        };
        if let Some(value) = value {
            fields.insert(field.to_owned(), value);
        }
    }
    fields
}

/// `fields` as a contract file: one member per line at the top, in the contract's field
/// order, each value pretty-printed, ending with a newline.
fn render(fields: &Map<String, Value>) -> String {
    let members: Vec<String> = CONTRACT_FIELDS
        .iter()
        .filter_map(|&key| {
            let value = fields.get(key)?;
            let value = format!("{value:#}").replace('\n', "\n  ");
            Some(format!("  {}: {value}", Value::from(key)))
        })
        .collect();
    format!("{{\n{}\n}}\n", members.join(",\n"))
}
