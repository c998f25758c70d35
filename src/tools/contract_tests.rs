//! Contract loading, validation and the resource id: each load rule with its exact error kind
//! and position.

use std::path::Path;

use serde_json::json;

use super::*;

const PATH: &str = "policies/tools/refund.json";

/// A valid contract; tests edit it. Line numbers matter: `name` is on line 2, `resource` on
/// line 9, `inputSchema` on line 12, its `properties` on line 15.
const REFUND: &str = r#"{
  "name": "refund_order",
  "version": "1.2.0",
  "description": "Refund an order.",
  "risk": "financial",
  "idempotent": true,
  "parallel": false,
  "timeoutMs": 5000,
  "resource": {"type": "Order", "idPointer": "/order_id"},
  "sensitive": ["/note"],
  "approvalTtlSeconds": 600, "maxAttempts": 4,
  "inputSchema": {
    "type": "object",
    "required": ["order_id", "amount_cents", "reason"],
    "properties": {
      "order_id": {"type": "string"},
      "amount_cents": {"type": "integer", "minimum": 1},
      "reason": {"enum": ["damaged", "late", "other"]},
      "requested_at": {"type": "string", "format": "date-time"},
      "note": {"type": ["string", "null"]}
    },
    "additionalProperties": false
  },
  "outputSchema": {
    "type": "object",
    "required": ["refund_id"],
    "properties": {"refund_id": {"type": "string"}}
  }
}
"#;

fn parse(text: &str) -> Result<ToolContract, ToolContractError> {
    ToolContract::parse(Path::new(PATH), text)
}

/// `REFUND` with the one occurrence of `from` replaced by `to`.
fn edit(from: &str, to: &str) -> String {
    assert_eq!(REFUND.matches(from).count(), 1, "{from:?} must occur once");
    REFUND.replace(from, to)
}

#[test]
fn valid_contract() {
    let contract = parse(REFUND).unwrap();
    assert_eq!(contract.name, "refund_order");
    assert_eq!(contract.version, "1.2.0");
    assert_eq!(contract.description, "Refund an order.");
    assert_eq!(contract.risk, Risk::Financial);
    assert!(contract.idempotent);
    assert!(!contract.parallel);
    assert_eq!(contract.timeout_ms, 5000);
    assert_eq!(
        contract.resource,
        Some(ResourceRef {
            entity_type: "Order".to_owned(),
            id_pointer: "/order_id".to_owned()
        })
    );
    assert_eq!(contract.sensitive, ["/note"]);
    assert_eq!(contract.approval_ttl_seconds, 600);
    assert_eq!(contract.max_attempts, Some(4));
    assert_eq!(
        contract.input_schema_json["required"],
        json!(["order_id", "amount_cents", "reason"])
    );
    assert_eq!(
        contract.output_schema_json.as_ref().unwrap()["required"],
        json!(["refund_id"])
    );
    let field = |name: &str, required, ty| InputField {
        name: name.to_owned(),
        required,
        ty,
    };
    assert_eq!(
        contract.input_type,
        InputType::Record(vec![
            field("amount_cents", true, InputType::Long),
            field("note", false, InputType::String),
            field("order_id", true, InputType::String),
            field("reason", true, InputType::String),
            field("requested_at", false, InputType::Datetime),
        ])
    );
    assert_eq!(contract.source_path, Path::new(PATH));
    assert_eq!(
        contract.location_of("/resource/type").to_string(),
        format!("{PATH}:9:16")
    );
    assert_eq!(contract.location_of("/nope").to_string(), PATH);
    assert_eq!(contract.offset_of("/resource"), REFUND.find("\"resource\""));
    assert_eq!(contract.offset_of("/nope"), None);
    assert_eq!(contract.source_text, REFUND);
}

#[test]
fn defaults() {
    let text = r#"{"name": "ping", "version": "1", "risk": "read", "timeoutMs": 10,
                   "inputSchema": {"type": "object"}}"#;
    let contract = parse(text).unwrap();
    assert_eq!(contract.description, "");
    assert!(!contract.idempotent);
    assert!(!contract.parallel);
    assert_eq!(contract.resource, None);
    assert!(contract.sensitive.is_empty());
    assert_eq!(contract.approval_ttl_seconds, 900);
    assert_eq!(contract.max_attempts, None);
    assert_eq!(contract.output_schema_json, None);
    assert_eq!(contract.input_type, InputType::Record(vec![]));
    assert_eq!(contract.validate_output(&json!("anything"), 20), []);
    assert_eq!(contract.resource_id(&json!({"order_id": "o-1"})), None);
}

/// Loads `text`, expecting an error whose Display is `PATH` followed by `expected`
/// (`:line:column: message`); returns it so the caller can match its kind.
fn load_error(text: &str, expected: &str) -> ToolContractError {
    let error = parse(text).unwrap_err();
    assert_eq!(error.to_string(), format!("{PATH}{expected}"));
    error
}

const ALL_FIELDS: &str = "`name`, `version`, `description`, `risk`, `idempotent`, `parallel`, \
                          `timeoutMs`, `resource`, `sensitive`, `labels`, `approvalTtlSeconds`, \
                          `maxAttempts`, `inputSchema`, `outputSchema`";

#[test]
fn every_field_of_the_format_is_accepted() {
    // REFUND uses all thirteen fields; the unknown-field message lists the same thirteen.
    let document: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(REFUND).unwrap();
    assert_eq!(document.len(), 13);
    let listed: Vec<String> = ALL_FIELDS
        .split(", ")
        .map(|field| field.trim_matches('`').to_owned())
        .collect();
    for key in document.keys() {
        assert!(listed.contains(key), "{key}");
    }
    assert!(parse(REFUND).is_ok());
}

#[test]
fn not_json() {
    let error = load_error(
        &edit("\"parallel\": false,", "\"parallel\": false,,"),
        ":7:21: invalid JSON: key must be a string",
    );
    assert!(matches!(error.kind(), ToolContractErrorKind::Syntax { .. }));
    let error = load_error("", ":1:1: invalid JSON: EOF while parsing a value");
    assert!(matches!(error.kind(), ToolContractErrorKind::Syntax { .. }));
    let error = load_error("[1]", ":1:1: a tool contract must be a JSON object");
    assert!(matches!(error.kind(), ToolContractErrorKind::NotAnObject));
}

#[test]
fn duplicate_keys_anywhere() {
    let error = load_error(
        &edit(
            "{\"type\": \"string\"},",
            "{\"type\": \"string\", \"type\": \"integer\"},",
        ),
        ":16:38: duplicate key `type`",
    );
    assert!(matches!(error.kind(), ToolContractErrorKind::DuplicateKey { key } if key == "type"));
    let error = load_error(
        &edit(
            "  \"parallel\": false,\n",
            "  \"parallel\": false,\n  \"parallel\": true,\n",
        ),
        ":8:3: duplicate key `parallel`",
    );
    assert!(
        matches!(error.kind(), ToolContractErrorKind::DuplicateKey { key } if key == "parallel")
    );
}

#[test]
fn unknown_fields() {
    let error = load_error(
        &edit("  \"version\"", "  \"foo\": 1,\n  \"version\""),
        &format!(":3:3: unknown field `foo`, expected one of {ALL_FIELDS}"),
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::UnknownField { field, expected } if field == "foo" && expected.len() == 14
    ));
    let error = load_error(
        &edit(
            "\"idPointer\": \"/order_id\"}",
            "\"idPointer\": \"/order_id\", \"tenant\": \"t\"}",
        ),
        ":9:59: unknown field `tenant`, expected one of `type`, `idPointer`",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::UnknownField { field, .. } if field == "tenant"
    ));
}

#[test]
fn missing_and_mistyped_fields() {
    let error = load_error(
        &edit("\"timeoutMs\": 5000", "\"timeoutMs\": \"5000\""),
        ":8:21: invalid type: string \"5000\", expected u64",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::InvalidField { .. }
    ));
    load_error(
        &edit("\"timeoutMs\": 5000", "\"timeoutMs\": -1"),
        ":8:17: invalid value: integer `-1`, expected u64",
    );
    load_error(
        &edit("  \"name\": \"refund_order\",\n", ""),
        ":28:1: missing field `name`",
    );
    load_error(
        &edit(
            "{\"type\": \"Order\", \"idPointer\": \"/order_id\"}",
            "{\"type\": \"Order\"}",
        ),
        ":9:31: missing field `idPointer`",
    );
    load_error(
        &edit(
            "{\"type\": \"Order\", \"idPointer\": \"/order_id\"}",
            "\"Order\"",
        ),
        ":9:21: invalid type: string \"Order\", expected a resource object with `type` and `idPointer`",
    );
}

#[test]
fn names() {
    for bad in [
        "",
        "refund order",
        "refund.order",
        "rëfund",
        &"a".repeat(65),
    ] {
        let error = load_error(
            &edit(
                "\"name\": \"refund_order\"",
                &format!("\"name\": \"{bad}\""),
            ),
            &format!(":2:3: invalid tool name `{bad}`"),
        );
        assert!(matches!(error.kind(), ToolContractErrorKind::InvalidName { name } if name == bad));
    }
    for good in ["a", "A-9_z", &"a".repeat(64)] {
        let contract = parse(&edit(
            "\"name\": \"refund_order\"",
            &format!("\"name\": \"{good}\""),
        ))
        .unwrap();
        assert_eq!(contract.name, good);
    }
}

#[test]
fn risks() {
    for risk in Risk::ALL {
        let contract = parse(&edit(
            "\"risk\": \"financial\"",
            &format!("\"risk\": \"{risk}\""),
        ))
        .unwrap();
        assert_eq!(contract.risk, risk);
    }
    assert_eq!(
        Risk::ALL.map(|risk| Risk::parse(risk.as_str())),
        Risk::ALL.map(Some)
    );
    assert_eq!(Risk::parse("Read"), None);
    assert_eq!(
        Risk::ALL.map(|risk| risk.as_str()),
        ["read", "write", "external", "financial", "destructive"]
    );
    let error = load_error(
        &edit("\"risk\": \"financial\"", "\"risk\": \"Financial\""),
        ":5:3: unknown risk `Financial`",
    );
    assert!(
        matches!(error.kind(), ToolContractErrorKind::UnknownRisk { risk } if risk == "Financial")
    );
}

#[test]
fn zero_durations() {
    let error = load_error(
        &edit("\"timeoutMs\": 5000", "\"timeoutMs\": 0"),
        ":8:3: `timeoutMs` must be at least 1",
    );
    assert!(matches!(error.kind(), ToolContractErrorKind::ZeroTimeout));
    let error = load_error(
        &edit("\"approvalTtlSeconds\": 600", "\"approvalTtlSeconds\": 0"),
        ":11:3: `approvalTtlSeconds` must be at least 1",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::ZeroApprovalTtl
    ));
    let error = load_error(
        &edit("\"maxAttempts\": 4", "\"maxAttempts\": 0"),
        ":11:30: `maxAttempts` must be at least 1",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::ZeroMaxAttempts
    ));
    let error = load_error(
        &edit("\"maxAttempts\": 4", "\"maxAttempts\": -1"),
        ":11:46: invalid value: integer `-1`, expected u32",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::InvalidField { .. }
    ));
}

#[test]
fn input_schema_must_be_an_object_schema() {
    let error = load_error(
        &edit(
            "    \"type\": \"object\",\n    \"required\": [\"order_id\"",
            "    \"type\": \"array\",\n    \"required\": [\"order_id\"",
        ),
        ":13:5: `inputSchema` must have `\"type\": \"object\"` at its top",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::NotObjectSchema
    ));
    load_error(
        &edit(
            "    \"type\": \"object\",\n    \"required\": [\"order_id\"",
            "    \"required\": [\"order_id\"",
        ),
        ":12:3: `inputSchema` must have `\"type\": \"object\"` at its top",
    );
    let text =
        r#"{"name": "t", "version": "1", "risk": "read", "timeoutMs": 1, "inputSchema": true}"#;
    load_error(
        text,
        ":1:63: `inputSchema` must have `\"type\": \"object\"` at its top",
    );
}

#[test]
fn schemas_must_be_draft_2020_12() {
    let error = load_error(
        &edit(
            "    \"type\": \"object\",\n    \"required\": [\"order_id\"",
            "    \"$schema\": \"http://json-schema.org/draft-07/schema#\",\n    \"type\": \"object\",\n    \"required\": [\"order_id\"",
        ),
        ":13:5: `inputSchema` must be JSON Schema draft 2020-12, not `http://json-schema.org/draft-07/schema#`",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::UnsupportedDialect { field: "inputSchema", uri } if uri == "http://json-schema.org/draft-07/schema#"
    ));
    let contract = parse(&edit(
        "    \"type\": \"object\",\n    \"required\": [\"order_id\"",
        "    \"$schema\": \"https://json-schema.org/draft/2020-12/schema\",\n    \"type\": \"object\",\n    \"required\": [\"order_id\"",
    ));
    assert!(contract.is_ok());
}

#[test]
fn schemas_must_compile() {
    let error = load_error(
        &edit("\"minimum\": 1", "\"minLength\": -1"),
        ":17:43: `inputSchema` is not a valid JSON Schema: -1 is less than the minimum of 0",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::InvalidSchema {
            field: "inputSchema",
            ..
        }
    ));
    let error = load_error(
        &edit("\"minimum\": 1", "\"pattern\": \"(\""),
        ":17:43: `inputSchema` is not a valid JSON Schema: \"(\" is not a \"regex\"",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::InvalidSchema { .. }
    ));
    // Nothing is fetched: a reference outside the schema is a load error.
    for reference in ["#/$defs/id", "https://example.com/id.json", "id.json"] {
        let error = parse(&edit(
            "\"order_id\": {\"type\": \"string\"}",
            &format!("\"order_id\": {{\"$ref\": \"{reference}\"}}"),
        ))
        .unwrap_err();
        assert!(
            matches!(
                error.kind(),
                ToolContractErrorKind::InvalidSchema {
                    field: "inputSchema",
                    ..
                }
            ),
            "{reference}: {error}"
        );
        assert_eq!(
            (error.location().line, error.location().column),
            (Some(12), Some(3))
        );
    }
    let error = load_error(
        &edit(
            "\"properties\": {\"refund_id\": {\"type\": \"string\"}}",
            "\"properties\": {\"refund_id\": {\"type\": \"strin\"}}",
        ),
        ":27:34: `outputSchema` is not a valid JSON Schema: \"strin\" is not valid under any of the schemas listed in the 'anyOf' keyword",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::InvalidSchema {
            field: "outputSchema",
            ..
        }
    ));
}

#[test]
fn unknown_formats_are_refused() {
    let error = load_error(
        &edit("\"format\": \"date-time\"", "\"format\": \"datetime\""),
        ":19:42: `inputSchema` uses unknown format `datetime`",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::UnknownFormat { field: "inputSchema", format } if format == "datetime"
    ));
}

#[test]
fn pointers_must_be_json_pointers() {
    let error = load_error(
        &edit(
            "\"idPointer\": \"/order_id\"",
            "\"idPointer\": \"order_id\"",
        ),
        ":9:33: `resource.idPointer` is not a valid JSON pointer: `order_id`",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::InvalidPointer { field, pointer } if field == "resource.idPointer" && pointer == "order_id"
    ));
    let error = load_error(
        &edit(
            "\"sensitive\": [\"/note\"]",
            "\"sensitive\": [\"/note\", \"/a~2\"]",
        ),
        ":10:26: `sensitive[1]` is not a valid JSON pointer: `/a~2`",
    );
    assert!(matches!(
        error.kind(),
        ToolContractErrorKind::InvalidPointer { field, pointer } if field == "sensitive[1]" && pointer == "/a~2"
    ));
}

#[test]
fn resource_id_must_be_a_required_string() {
    let cases = [
        (
            "/note",
            ResourceIdProblem::NotRequired {
                segment: "note".to_owned(),
            },
            "`note` is not listed in `required`",
        ),
        (
            "/amount_cents",
            ResourceIdProblem::NotString,
            "it does not have `\"type\": \"string\"`",
        ),
        (
            "/reason",
            ResourceIdProblem::NotString,
            "it does not have `\"type\": \"string\"`",
        ),
        (
            "/customer",
            ResourceIdProblem::NotDeclared {
                segment: "customer".to_owned(),
            },
            "`customer` is not declared in `properties`",
        ),
        (
            "/order_id/x",
            ResourceIdProblem::ParentNotObject {
                segment: "x".to_owned(),
            },
            "the schema holding `x` does not have `\"type\": \"object\"`",
        ),
        (
            "",
            ResourceIdProblem::NotString,
            "it does not have `\"type\": \"string\"`",
        ),
    ];
    for (pointer, problem, message) in cases {
        let error = load_error(
            &edit(
                "\"idPointer\": \"/order_id\"",
                &format!("\"idPointer\": \"{pointer}\""),
            ),
            &format!(
                ":9:33: `resource.idPointer` `{pointer}` is not a required string in `inputSchema`: {message}"
            ),
        );
        assert!(
            matches!(
                error.kind(),
                ToolContractErrorKind::ResourceIdNotRequiredString { pointer: p, problem: found } if p == pointer && *found == problem
            ),
            "{error:?}"
        );
    }
    let nested = r#"{"name": "t", "version": "1", "risk": "write", "timeoutMs": 1,
        "resource": {"type": "Doc", "idPointer": "/doc/a~1b"},
        "inputSchema": {"type": "object", "required": ["doc"], "properties": {
            "doc": {"type": "object", "required": ["a/b"], "properties": {"a/b": {"type": "string"}}}}}}"#;
    let contract = parse(nested).unwrap();
    assert_eq!(
        contract.resource_id(&json!({"doc": {"a/b": "d-7"}})),
        Some("d-7")
    );
}

#[test]
fn validate_input_reports_exact_violations() {
    let contract = parse(REFUND).unwrap();
    let valid = json!({"order_id": "o-1", "amount_cents": 100, "reason": "late",
                       "requested_at": "2024-01-01T10:00:00Z", "note": null});
    assert_eq!(contract.validate_input(&valid, 20), []);
    assert_eq!(contract.resource_id(&valid), Some("o-1"));

    let violations = |args: serde_json::Value, cap| {
        contract
            .validate_input(&args, cap)
            .into_iter()
            .map(|v| (v.pointer, v.keyword, v.message))
            .collect::<Vec<_>>()
    };
    let triple = |p: &str, k: &str, m: &str| (p.to_owned(), k.to_owned(), m.to_owned());
    assert_eq!(
        violations(json!({"order_id": "o-1", "reason": "late"}), 20),
        [triple(
            "",
            "required",
            "required property \"amount_cents\" is missing"
        )]
    );
    assert_eq!(
        violations(
            json!({"order_id": "o-1", "amount_cents": "100", "reason": "late"}),
            20
        ),
        [triple(
            "/amount_cents",
            "type",
            "expected integer, found string"
        )]
    );
    assert_eq!(
        violations(
            json!({"order_id": "o-1", "amount_cents": 100, "reason": "late", "is_admin": true}),
            20
        ),
        [triple(
            "",
            "additionalProperties",
            "property \"is_admin\" is not allowed"
        )]
    );
    assert_eq!(
        violations(
            json!({"order_id": "o-1", "amount_cents": 100, "reason": "late", "requested_at": "2024-13-01T10:00:00Z"}),
            20
        ),
        [triple(
            "/requested_at",
            "format",
            "string is not a valid \"date-time\""
        )]
    );
    let everything_wrong = json!({"amount_cents": 0, "reason": "bored", "note": 5,
                                  "requested_at": "now", "x": 1});
    let all = violations(everything_wrong.clone(), 20);
    assert_eq!(
        all,
        [
            triple("", "required", "required property \"order_id\" is missing"),
            triple("", "additionalProperties", "property \"x\" is not allowed"),
            triple("/amount_cents", "minimum", "number must be at least 1"),
            triple("/note", "type", "expected null or string, found integer"),
            triple(
                "/reason",
                "enum",
                "value must be one of [\"damaged\",\"late\",\"other\"]"
            ),
            triple(
                "/requested_at",
                "format",
                "string is not a valid \"date-time\""
            ),
        ]
    );
    assert_eq!(violations(everything_wrong, 3), all[..3]);
    assert_eq!(contract.resource_id(&json!({"order_id": 5})), None);
}

#[test]
fn validate_output() {
    let contract = parse(REFUND).unwrap();
    assert_eq!(
        contract.validate_output(&json!({"refund_id": "r-1"}), 20),
        []
    );
    assert_eq!(
        contract.validate_output(&json!({"refund": "r-1"}), 20),
        [Violation {
            pointer: String::new(),
            keyword: "required".to_owned(),
            message: "required property \"refund_id\" is missing".to_owned(),
        }]
    );
}

#[test]
fn errors_are_diagnostics_with_codes() {
    use miette::Diagnostic;
    let error = parse(&edit("\"risk\": \"financial\"", "\"risk\": \"yolo\"")).unwrap_err();
    assert_eq!(
        error.code().unwrap().to_string(),
        "toolgate::tools::unknown_risk"
    );
    assert!(error.help().is_some());
    let label = error.labels().unwrap().next().unwrap();
    assert_eq!(label.offset(), REFUND.find("\"risk\"").unwrap());
    assert!(error.source_code().is_some());
}

#[test]
fn shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ToolContract>();
    send_sync::<ToolContractError>();
    send_sync::<ToolRegistry>();
}
