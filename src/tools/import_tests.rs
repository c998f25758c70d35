//! `tools import`'s rules: MCP's annotation defaults → risk (every combination), reading a
//! `tools/list` page, refused names, the skeleton's exact text, and re-imports.

use std::path::Path;

use serde_json::{Value, json};

use super::import::{
    Change, Hints, ImportError, McpTool, ToolsPage, ensure_unique, plan_contract, read_page,
    risk_from_hints,
};
use super::{Risk, ToolContract};

const T: Option<bool> = Some(true);
const F: Option<bool> = Some(false);
const A: Option<bool> = None;

/// `readOnlyHint`, `destructiveHint`, `openWorldHint`, and the risk they give.
type RiskCase = (Option<bool>, Option<bool>, Option<bool>, Risk);

/// Every combination of `readOnlyHint`, `destructiveHint`, `openWorldHint` (true, false,
/// absent) and the risk MCP's defaults give it.
const RISKS: [RiskCase; 27] = [
    (T, T, T, Risk::Read),
    (T, T, F, Risk::Read),
    (T, T, A, Risk::Read),
    (T, F, T, Risk::Read),
    (T, F, F, Risk::Read),
    (T, F, A, Risk::Read),
    (T, A, T, Risk::Read),
    (T, A, F, Risk::Read),
    (T, A, A, Risk::Read),
    (F, T, T, Risk::Destructive),
    (F, T, F, Risk::Destructive),
    (F, T, A, Risk::Destructive),
    (F, F, T, Risk::External),
    (F, F, F, Risk::Write),
    (F, F, A, Risk::External),
    (F, A, T, Risk::Destructive),
    (F, A, F, Risk::Destructive),
    (F, A, A, Risk::Destructive),
    (A, T, T, Risk::Destructive),
    (A, T, F, Risk::Destructive),
    (A, T, A, Risk::Destructive),
    (A, F, T, Risk::External),
    (A, F, F, Risk::Write),
    (A, F, A, Risk::External),
    (A, A, T, Risk::Destructive),
    (A, A, F, Risk::Destructive),
    (A, A, A, Risk::Destructive),
];

/// The annotations object of a hint triple (absent hints left out) plus `idempotentHint`.
fn annotations(
    read_only: Option<bool>,
    destructive: Option<bool>,
    open_world: Option<bool>,
    idempotent: Option<bool>,
) -> Value {
    let mut object = serde_json::Map::new();
    for (key, hint) in [
        ("readOnlyHint", read_only),
        ("destructiveHint", destructive),
        ("openWorldHint", open_world),
        ("idempotentHint", idempotent),
    ] {
        if let Some(hint) = hint {
            object.insert(key.to_owned(), Value::Bool(hint));
        }
    }
    Value::Object(object)
}

fn page(value: Value) -> ToolsPage {
    read_page(&value).unwrap()
}

fn one_tool(tool: Value) -> McpTool {
    let mut tools = page(json!({ "tools": [tool] })).tools;
    assert_eq!(tools.len(), 1);
    tools.remove(0)
}

#[test]
fn every_hint_combination_has_mcps_risk() {
    for (read_only, destructive, open_world, risk) in RISKS {
        let hints = Hints {
            read_only,
            destructive,
            idempotent: None,
            open_world,
        };
        assert_eq!(risk_from_hints(&hints), risk, "{hints:?}");
        // The same through a tools/list page and the written contract, with each
        // idempotentHint: `idempotent` is the hint, false when absent.
        for (idempotent, expected) in [(T, true), (F, false), (A, false)] {
            let tool = one_tool(json!({
                "name": "t",
                "inputSchema": { "type": "object" },
                "annotations": annotations(read_only, destructive, open_world, idempotent),
            }));
            let plan = plan_contract(&tool, None, "tools/t.json");
            let written: Value = serde_json::from_str(&plan.text).unwrap();
            assert_eq!(written["risk"], json!(risk.as_str()), "{hints:?}");
            assert_eq!(written["idempotent"], json!(expected), "{idempotent:?}");
            assert_eq!(plan.risk, risk);
        }
    }
}

#[test]
fn a_tool_without_annotations_is_destructive_and_not_idempotent() {
    let tool = one_tool(json!({ "name": "t", "inputSchema": { "type": "object" } }));
    assert_eq!(tool.hints, Hints::default());
    assert_eq!(risk_from_hints(&tool.hints), Risk::Destructive);
}

const SEARCH: &str = r#"{
  "name": "search",
  "title": "Search",
  "description": "Search the docs.",
  "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
  "outputSchema": {"type": "object", "properties": {"hits": {"type": "integer"}}},
  "annotations": {"readOnlyHint": true, "title": "ignored"},
  "_meta": {"x": 1}
}"#;

/// The skeleton of [`SEARCH`], byte for byte.
const SEARCH_CONTRACT: &str = r#"{
  "name": "search",
  "version": "1.0.0",
  "description": "Search the docs.",
  "risk": "read",
  "idempotent": false,
  "parallel": false,
  "timeoutMs": 30000,
  "resource": null,
  "inputSchema": {
    "type": "object",
    "properties": {
      "q": {
        "type": "string"
      }
    },
    "required": [
      "q"
    ]
  },
  "outputSchema": {
    "type": "object",
    "properties": {
      "hits": {
        "type": "integer"
      }
    }
  }
}
"#;

fn search() -> McpTool {
    one_tool(serde_json::from_str(SEARCH).unwrap())
}

#[test]
fn a_skeleton_is_exact_and_loads_as_a_contract_without_resource() {
    let plan = plan_contract(&search(), None, "tools/search.json");
    assert_eq!(plan.text, SEARCH_CONTRACT);
    assert_eq!(plan.change, Change::Create);
    assert!(!plan.has_resource);
    let contract = ToolContract::parse(Path::new("tools/search.json"), &plan.text).unwrap();
    assert_eq!(contract.name, "search");
    assert_eq!(contract.risk, Risk::Read);
    assert_eq!(contract.resource, None);
    assert_eq!(contract.timeout_ms, 30_000);
    assert!(contract.output_schema_json.is_some());
}

#[test]
fn a_tool_without_description_or_output_schema_has_neither() {
    let tool = one_tool(json!({
        "name": "ping",
        "inputSchema": { "type": "object" },
        "annotations": { "readOnlyHint": false, "destructiveHint": false, "openWorldHint": false },
    }));
    let plan = plan_contract(&tool, None, "tools/ping.json");
    assert_eq!(
        plan.text,
        "{\n  \"name\": \"ping\",\n  \"version\": \"1.0.0\",\n  \"risk\": \"write\",\n  \
         \"idempotent\": false,\n  \"parallel\": false,\n  \"timeoutMs\": 30000,\n  \
         \"resource\": null,\n  \"inputSchema\": {\n    \"type\": \"object\"\n  }\n}\n"
    );
}

#[test]
fn the_same_import_again_is_unchanged() {
    let plan = plan_contract(&search(), Some(SEARCH_CONTRACT), "tools/search.json");
    assert_eq!(plan.change, Change::Unchanged);
    assert_eq!(plan.text, SEARCH_CONTRACT);
}

/// The author filled in the resource, a timeout, a version and sensitive pointers, and laid
/// the file out their own way: a re-import of the same tool keeps all of it.
const AUTHORED: &str = r#"{
  "name": "search", "version": "2.1.0", "description": "Search the docs.",
  "risk": "read", "idempotent": false, "parallel": true, "timeoutMs": 1500,
  "resource": {"type": "Index", "idPointer": "/q"},
  "sensitive": ["/q"],
  "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
  "outputSchema": {"type": "object", "properties": {"hits": {"type": "integer"}}}
}
"#;

#[test]
fn the_authors_fields_survive_a_reimport() {
    let plan = plan_contract(&search(), Some(AUTHORED), "tools/search.json");
    assert_eq!(plan.change, Change::Unchanged);
    assert!(plan.has_resource);
}

#[test]
fn a_changed_schema_is_a_diff_that_keeps_the_authors_fields() {
    let mut tool = search();
    tool.input_schema = json!({
        "type": "object",
        "properties": { "q": { "type": "string", "maxLength": 100 } },
        "required": ["q"],
    });
    let plan = plan_contract(&tool, Some(AUTHORED), "tools/search.json");
    let Change::Update { diff } = &plan.change else {
        panic!("{:?}", plan.change);
    };
    let written: Value = serde_json::from_str(&plan.text).unwrap();
    assert_eq!(written["version"], json!("2.1.0"));
    assert_eq!(written["parallel"], json!(true));
    assert_eq!(written["timeoutMs"], json!(1500));
    assert_eq!(
        written["resource"],
        json!({"type": "Index", "idPointer": "/q"})
    );
    assert_eq!(written["sensitive"], json!(["/q"]));
    assert_eq!(
        written["inputSchema"]["properties"]["q"]["maxLength"],
        json!(100)
    );
    assert!(
        diff.starts_with("--- a/tools/search.json\n+++ b/tools/search.json\n@@ "),
        "{diff}"
    );
    assert!(diff.contains("\n+        \"maxLength\": 100\n"), "{diff}");
    assert!(
        diff.contains("\n-  \"inputSchema\": {\"type\": \"object\", \"properties\""),
        "{diff}"
    );
    ToolContract::parse(Path::new("tools/search.json"), &plan.text).unwrap();
}

#[test]
fn a_changed_annotation_changes_the_risk() {
    let mut tool = search();
    tool.hints.read_only = None;
    let plan = plan_contract(&tool, Some(SEARCH_CONTRACT), "tools/search.json");
    let Change::Update { diff } = &plan.change else {
        panic!("{:?}", plan.change);
    };
    assert_eq!(
        diff,
        "--- a/tools/search.json\n+++ b/tools/search.json\n@@ -2,7 +2,7 @@\n   \
         \"name\": \"search\",\n   \"version\": \"1.0.0\",\n   \
         \"description\": \"Search the docs.\",\n-  \"risk\": \"read\",\n+  \
         \"risk\": \"destructive\",\n   \"idempotent\": false,\n   \"parallel\": false,\n   \
         \"timeoutMs\": 30000,\n"
    );
}

#[test]
fn an_existing_file_that_is_not_a_contract_object_is_replaced_by_the_skeleton() {
    for existing in ["not json", "[1]", "{\"name\": \"a\", \"name\": \"b\"}"] {
        let plan = plan_contract(&search(), Some(existing), "tools/search.json");
        assert_eq!(plan.text, SEARCH_CONTRACT, "{existing}");
        assert!(
            matches!(plan.change, Change::Update { .. }),
            "{existing}: {:?}",
            plan.change
        );
    }
}

#[test]
fn a_json_rpc_response_and_its_result_read_alike() {
    let result = json!({
        "tools": [{ "name": "a", "inputSchema": { "type": "object" } }],
        "nextCursor": "page-2",
    });
    let response = json!({ "jsonrpc": "2.0", "id": 1, "result": result.clone() });
    let from_result = page(result);
    assert_eq!(from_result.next_cursor.as_deref(), Some("page-2"));
    assert_eq!(from_result.tools.len(), 1);
    assert_eq!(page(response), from_result);
}

#[test]
fn a_json_rpc_error_is_the_servers_error() {
    let error = read_page(&json!({
        "jsonrpc": "2.0", "id": 1, "error": { "code": -32601, "message": "Method not found" },
    }))
    .unwrap_err();
    assert_eq!(
        error,
        ImportError::ServerError {
            code: -32601,
            message: "Method not found".to_owned()
        }
    );
    assert_eq!(error.code(), "mcp_server_error");
}

#[test]
fn what_is_not_a_tools_list_is_refused() {
    let cases = [
        (json!([]), "the document is not a JSON object"),
        (json!({}), "`tools` is missing or not an array"),
        (json!({ "tools": {} }), "`tools` is missing or not an array"),
        (
            json!({ "tools": [], "nextCursor": 2 }),
            "`nextCursor` is not a string",
        ),
        (
            json!({ "jsonrpc": "1.0", "result": { "tools": [] } }),
            "`jsonrpc` is not \"2.0\"",
        ),
        (
            json!({ "jsonrpc": "2.0", "id": 1 }),
            "the JSON-RPC response has no `result` object",
        ),
    ];
    for (value, reason) in cases {
        let error = read_page(&value).unwrap_err();
        assert_eq!(error, ImportError::NotAToolsList { reason }, "{value}");
        assert_eq!(error.code(), "not_a_tools_list");
    }
}

#[test]
fn ill_typed_tools_are_refused_naming_the_field() {
    let cases = [
        (json!(1), "tools[]", "an object"),
        (json!({ "inputSchema": {} }), "name", "a string"),
        (json!({ "name": "a" }), "inputSchema", "an object"),
        (
            json!({ "name": "a", "inputSchema": true }),
            "inputSchema",
            "an object",
        ),
        (
            json!({ "name": "a", "inputSchema": {}, "description": 1 }),
            "description",
            "a string",
        ),
        (
            json!({ "name": "a", "inputSchema": {}, "outputSchema": [] }),
            "outputSchema",
            "an object",
        ),
        (
            json!({ "name": "a", "inputSchema": {}, "annotations": [] }),
            "annotations",
            "an object",
        ),
        (
            json!({ "name": "a", "inputSchema": {}, "annotations": { "readOnlyHint": "yes" } }),
            "readOnlyHint",
            "a boolean",
        ),
    ];
    for (tool, field, expected) in cases {
        let error = read_page(&json!({ "tools": [{ "name": "ok", "inputSchema": {} }, tool] }))
            .unwrap_err();
        assert_eq!(
            error,
            ImportError::InvalidTool {
                index: 1,
                field,
                expected
            }
        );
        assert_eq!(error.code(), "invalid_tool");
    }
}

#[test]
fn names_toolgate_cannot_use_or_that_leave_the_folder_are_refused() {
    let long = "a".repeat(65);
    for name in [
        "",
        "../escape",
        "a/b",
        "a\\b",
        "..",
        "files.read",
        "with space",
        "é",
        long.as_str(),
    ] {
        let error =
            read_page(&json!({ "tools": [{ "name": name, "inputSchema": {} }] })).unwrap_err();
        assert_eq!(
            error,
            ImportError::InvalidToolName {
                name: name.to_owned()
            }
        );
        assert_eq!(error.code(), "invalid_tool_name");
    }
    assert_eq!(
        page(json!({ "tools": [{ "name": "a".repeat(64), "inputSchema": {} }] }))
            .tools
            .len(),
        1
    );
}

#[test]
fn a_name_listed_twice_is_refused() {
    let tools = page(json!({ "tools": [
        { "name": "a", "inputSchema": {} },
        { "name": "b", "inputSchema": {} },
        { "name": "a", "inputSchema": {} },
    ] }))
    .tools;
    let error = ensure_unique(&tools).unwrap_err();
    assert_eq!(
        error,
        ImportError::DuplicateTool {
            name: "a".to_owned()
        }
    );
    assert_eq!(error.code(), "duplicate_tool");
    assert_eq!(ensure_unique(&tools[..2]), Ok(()));
}
