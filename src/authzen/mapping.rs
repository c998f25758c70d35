//! The COAZ-MCP declared mapping (`x-authzen-mapping`) each tool publishes:
//! the default `tools/call` mapping plus what toolgate needs (the
//! arguments, the tenant, roles and scopes claims), written at the
//! pointers `[authzen]` configures, so that a PEP that enforces it sends
//! exactly what this door reads.

use serde_json::{Map, Value, json};

use super::{AuthzenConfig, pointer_tokens};
use crate::identity::ClaimNames;

/// A CEL selection of `claim` on `token`: field notation for an identifier,
/// index notation otherwise (`token["https://example.com/tenant"]`);
/// `optional` uses CEL optional selection (`.?`, `[?…]`), which omits the
/// field when the claim is absent.
fn claim(name: &str, optional: bool) -> String {
    let identifier = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (identifier, optional) {
        (true, false) => format!("$token.{name}"),
        (true, true) => format!("$token.?{name}"),
        (false, opt) => {
            let quoted = Value::from(name).to_string();
            format!("$token[{}{quoted}]", if opt { "?" } else { "" })
        }
    }
}

/// Sets `value` at `pointer` in `root`, creating objects on the way.
fn put(root: &mut Map<String, Value>, pointer: &str, value: Value) {
    let tokens = pointer_tokens(pointer);
    let Some((last, path)) = tokens.split_last() else {
        return;
    };
    let mut here = root;
    for t in path {
        let next = here
            .entry(t.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !next.is_object() {
            *next = Value::Object(Map::new());
        }
        let Value::Object(inner) = next else { return };
        here = inner;
    }
    here.insert(last.clone(), value);
}

/// The declared mapping (an `evaluation` envelope) for a tool: subject
/// `{type: "identity", id: $token.<subject claim>}` with the tenant, roles
/// and scopes claims, `context.agent` from `client_id`, action
/// `tools/call`, resource `{type: "tool", id: $params.name}` with the
/// arguments, each at its configured pointer.
#[must_use]
pub fn declared_mapping(config: &AuthzenConfig, claims: &ClaimNames) -> Value {
    let tool_type = config
        .tool_types
        .first()
        .map_or("tool", String::as_str)
        .to_owned();
    let mut e = Map::new();
    put(&mut e, "/subject/type", "identity".into());
    put(&mut e, "/action/name", "tools/call".into());
    put(&mut e, "/resource/type", tool_type.into());
    put(&mut e, "/resource/id", "$params.name".into());
    put(
        &mut e,
        &config.subject,
        claim(&claims.subject, false).into(),
    );
    put(&mut e, &config.tenant, claim(&claims.tenant, false).into());
    put(&mut e, &config.roles, claim(&claims.roles, true).into());
    put(&mut e, &config.scopes, claim(&claims.scope, true).into());
    put(&mut e, &config.agent, "$token.?client_id".into());
    if let Some(arguments) = config.arguments.first() {
        put(&mut e, arguments, "$params.?arguments".into());
    }
    json!({ "evaluation": e })
}

/// A tool's MCP `inputSchema` with its declared mapping in it, as an MCP
/// server publishes it in `tools/list`.
#[must_use]
pub fn mcp_input_schema(input_schema: &Value, mapping: &Value) -> Value {
    let mut schema = input_schema.as_object().cloned().unwrap_or_default();
    schema.insert("x-authzen-mapping".into(), mapping.clone());
    Value::Object(schema)
}
