use serde_json::{Value, json};

use super::*;
use crate::access::TenantScope;
use crate::decision::Door;
use crate::identity::ClaimNames;

fn transport(tenants: &TenantScope, required: bool) -> Transport<'_> {
    Transport {
        peer: "peer",
        tenants,
        identity_token: "",
        call_id: "req-1",
        require_identity_token: required,
    }
}

fn call(tool: &str, tenant: Option<&str>) -> Value {
    let mut subject = json!({"type": "identity", "id": "bob"});
    if let Some(t) = tenant {
        subject["properties"] =
            json!({"tenant": t, "roles": ["support_agent"], "scopes": "orders:read orders:refund"});
    }
    json!({
        "subject": subject,
        "action": {"name": "tools/call"},
        "resource": {"type": "tool", "id": tool, "properties": {"arguments": {"order_id": "ord_1"}}},
        "context": {"agent": "bot", "session": "s-1", "request_id": "op-1", "approval_id": "ap-1"},
    })
}

#[test]
fn one_evaluation_maps_every_field_of_the_table() {
    let any = TenantScope::Any;
    let e = parse_evaluation(
        &call("refund_order", Some("acme")),
        &AuthzenConfig::default(),
        transport(&any, false),
    )
    .unwrap();
    let i = &e.input;
    assert_eq!(i.tool, "refund_order");
    assert_eq!(i.arguments, br#"{"order_id":"ord_1"}"#);
    let c = i.caller.as_ref().unwrap();
    assert_eq!(
        (c.subject_id.as_str(), c.tenant_id.as_str()),
        ("bob", "acme")
    );
    assert_eq!(c.roles, ["support_agent"]);
    assert_eq!(c.scopes, ["orders:read", "orders:refund"]);
    assert_eq!((c.agent_id.as_str(), c.session_id.as_str()), ("bot", "s-1"));
    assert_eq!(i.request_id, "op-1");
    assert_eq!(i.approval_id, "ap-1");
    assert_eq!(i.call_id, "req-1");
    assert_eq!(i.door, Door::Gateway);
    assert_eq!(i.action, "tools/call");
    assert_eq!(i.entities_json, "");
    assert!(e.arguments_sent);
}

#[test]
fn arguments_in_context_and_none_at_all() {
    let any = TenantScope::Any;
    let mut body = call("t", Some("acme"));
    body["resource"] = json!({"type": "mcp_tool", "id": "t"});
    body["context"]["arguments"] = json!({"a": 1});
    let e = parse_evaluation(&body, &AuthzenConfig::default(), transport(&any, false)).unwrap();
    assert_eq!(e.input.arguments, br#"{"a":1}"#);
    body["context"].as_object_mut().unwrap().remove("arguments");
    let e = parse_evaluation(&body, &AuthzenConfig::default(), transport(&any, false)).unwrap();
    assert_eq!(e.input.arguments, b"{}");
    assert!(!e.arguments_sent);
    // No request id: a fresh operation each time.
    body["context"]
        .as_object_mut()
        .unwrap()
        .remove("request_id");
    let a = parse_evaluation(&body, &AuthzenConfig::default(), transport(&any, false)).unwrap();
    let b = parse_evaluation(&body, &AuthzenConfig::default(), transport(&any, false)).unwrap();
    assert!(a.input.request_id.starts_with("authzen-"));
    assert_ne!(a.input.request_id, b.input.request_id);
}

#[test]
fn a_missing_tenant_is_refused_unless_defaulted_or_from_the_token() {
    let any = TenantScope::Any;
    let body = call("t", None);
    let r = parse_evaluation(&body, &AuthzenConfig::default(), transport(&any, false)).unwrap_err();
    assert_eq!(r.reason, "no_tenant");
    assert_eq!(
        r.message,
        "the request names no tenant: send `subject.properties.tenant` (no `[authzen] default_tenant` is configured)"
    );
    let config = AuthzenConfig {
        default_tenant: Some("acme".into()),
        ..AuthzenConfig::default()
    };
    let e = parse_evaluation(&body, &config, transport(&any, false)).unwrap();
    assert_eq!(e.input.caller.unwrap().tenant_id, "acme");
    // With required tokens the token names it; the default is not used.
    let e = parse_evaluation(&body, &config, transport(&any, true)).unwrap();
    assert_eq!(e.input.caller.unwrap().tenant_id, "");
}

#[test]
fn shapes_and_types_are_checked() {
    let any = TenantScope::Any;
    let c = AuthzenConfig::default();
    let refuse = |body: Value| {
        parse_evaluation(&body, &c, transport(&any, false))
            .unwrap_err()
            .message
    };
    let mut body = call("t", Some("acme"));
    body.as_object_mut().unwrap().remove("action");
    assert_eq!(refuse(body), "`action` is required");
    let mut body = call("t", Some("acme"));
    body["subject"]["id"] = json!(7);
    assert_eq!(refuse(body), "`subject.id` must be a string");
    let mut body = call("t", Some("acme"));
    body["resource"]["type"] = json!("account");
    assert_eq!(
        refuse(body),
        "resource type `account` is not a tool (expected `tool` or `mcp_tool`)"
    );
    let mut body = call("t", Some("acme"));
    body["subject"]["properties"]["roles"] = json!("admin");
    assert_eq!(
        refuse(body),
        "`subject.properties.roles` must be an array of strings"
    );
    assert_eq!(refuse(json!([1])), "the request body must be a JSON object");
    let mut body = call("t", Some("acme"));
    body["action"]["name"] = json!("can_delete");
    assert_eq!(
        refuse(body),
        "action `can_delete` is not `tools/call` or the tool's name"
    );
    // The tool's own name is the action COAZ-MCP declared mappings use.
    let mut body = call("t", Some("acme"));
    body["action"]["name"] = json!("t");
    assert_eq!(
        parse_evaluation(&body, &c, transport(&any, false))
            .unwrap()
            .input
            .action,
        "t"
    );
}

#[test]
fn evaluations_inherit_defaults_and_read_the_semantic() {
    let any = TenantScope::Any;
    let body = json!({
        "subject": {"type": "identity", "id": "bob", "properties": {"tenant": "acme"}},
        "action": {"name": "tools/call"},
        "options": {"evaluations_semantic": "deny_on_first_deny"},
        "evaluations": [
            {"resource": {"type": "tool", "id": "a"}},
            {"resource": {"type": "document", "id": "b"}},
            {"resource": {"type": "tool", "id": "c"}, "subject": {"type": "identity", "id": "eve", "properties": {"tenant": "other"}}},
        ],
    });
    let b = parse_evaluations(&body, &AuthzenConfig::default(), transport(&any, false)).unwrap();
    assert_eq!(b.semantic, Semantic::DenyOnFirstDeny);
    assert!(!b.single);
    assert_eq!(b.entries.len(), 3);
    let first = b.entries[0].as_ref().unwrap();
    assert_eq!(first.input.tool, "a");
    assert_eq!(first.input.caller.as_ref().unwrap().subject_id, "bob");
    assert_eq!(
        b.entries[1].as_ref().unwrap_err().message,
        "evaluations[1]: resource type `document` is not a tool (expected `tool` or `mcp_tool`)"
    );
    let third = b.entries[2].as_ref().unwrap();
    assert_eq!(third.input.caller.as_ref().unwrap().tenant_id, "other");

    let mut bad = body.clone();
    bad["options"]["evaluations_semantic"] = json!("first_wins");
    assert_eq!(
        parse_evaluations(&bad, &AuthzenConfig::default(), transport(&any, false))
            .unwrap_err()
            .reason,
        "unknown_semantic"
    );
    let mut missing = body;
    missing.as_object_mut().unwrap().remove("action");
    assert_eq!(
        parse_evaluations(&missing, &AuthzenConfig::default(), transport(&any, false))
            .unwrap_err()
            .message,
        "evaluations[0]: `action` is required"
    );
}

#[test]
fn semantics_stop_where_the_spec_says() {
    assert!(!Semantic::ExecuteAll.stops_after(false));
    assert!(!Semantic::ExecuteAll.stops_after(true));
    assert!(Semantic::DenyOnFirstDeny.stops_after(false));
    assert!(!Semantic::DenyOnFirstDeny.stops_after(true));
    assert!(Semantic::PermitOnFirstPermit.stops_after(true));
    assert!(!Semantic::PermitOnFirstPermit.stops_after(false));
}

#[test]
fn pointers_must_point_below_a_part() {
    assert!(is_evaluation_pointer("/subject/properties/tenant"));
    assert!(is_evaluation_pointer("/context/a~1b"));
    assert!(!is_evaluation_pointer("/context"));
    assert!(!is_evaluation_pointer("/other/x"));
    assert!(!is_evaluation_pointer("subject/id"));
    assert!(!is_evaluation_pointer("/context/a~2"));
}

#[test]
fn the_declared_mapping_follows_the_pointers_and_claims() {
    let config = AuthzenConfig {
        tenant: "/context/tenant".into(),
        ..AuthzenConfig::default()
    };
    let claims = ClaimNames {
        tenant: "https://example.com/tenant".into(),
        ..ClaimNames::default()
    };
    assert_eq!(
        declared_mapping(&config, &claims),
        json!({"evaluation": {
            "subject": {"type": "identity", "id": "$token.sub", "properties": {
                "roles": "$token.?roles", "scopes": "$token.?scope"}},
            "action": {"name": "tools/call"},
            "resource": {"type": "tool", "id": "$params.name",
                "properties": {"arguments": "$params.?arguments"}},
            "context": {"tenant": "$token[\"https://example.com/tenant\"]", "agent": "$token.?client_id"},
        }})
    );
    let schema = mcp_input_schema(&json!({"type": "object"}), &json!({"evaluation": {}}));
    assert_eq!(
        schema,
        json!({"type": "object", "x-authzen-mapping": {"evaluation": {}}})
    );
}

/// A call as the door maps it, with `arguments_sent` and no approval named.
fn entry(arguments_sent: bool) -> Entry {
    Entry {
        input: crate::decision::AuthorizeInput::default(),
        arguments_sent,
    }
}

fn outcome(decision: crate::decision::Decision) -> crate::decision::AuthorizeOutcome {
    crate::decision::AuthorizeOutcome {
        decision,
        decision_id: "d-1".into(),
        call_id: String::new(),
        normalized_arguments: "{}".into(),
        arguments_sha256: "ab".into(),
        idempotency_key: "t:cd".into(),
        conflict_key: String::new(),
        risk: Some(crate::tools::Risk::Write),
        timeout_ms: 900,
        parallel: false,
        idempotent: false,
        approval: None,
        error: None,
        policy_version: String::new(),
        tool_version: String::new(),
        policies: Vec::new(),
        principal: None,
        budgets: Vec::new(),
        session: None,
        charged: false,
    }
}

#[test]
fn approval_outcomes_name_their_approval() {
    use crate::decision::Decision;
    use crate::envelope::{Envelope, ErrorCode};
    let config = AuthzenConfig {
        access_request_endpoint: Some("https://ar.example.com".into()),
        ..AuthzenConfig::default()
    };
    // Pending and rejected (§11.3) carry the approval in the envelope.
    for code in [ErrorCode::ApprovalPending, ErrorCode::ApprovalRejected] {
        let mut o = outcome(Decision::Deny);
        o.error = Some(Envelope::new(code, "m").with("approval_id", "ap-9"));
        let v = decision_json(&o, &entry(true), &config);
        assert_eq!(v["decision"], false);
        assert_eq!(v["context"]["reason"], code.as_str());
        assert_eq!(v["context"]["approval_id"], "ap-9");
        assert!(v["context"].get("access_request").is_none());
    }
    // Required: the approval it opened, and the requestable denial.
    let mut o = outcome(Decision::ApprovalRequired);
    o.approval = Some(("ap-1".into(), 1_767_225_600_000));
    o.error = Some(Envelope::new(ErrorCode::ApprovalRequired, "m").with("approval_id", "ap-1"));
    let v = decision_json(&o, &entry(true), &config);
    assert_eq!(v["context"]["approval_id"], "ap-1");
    assert_eq!(
        v["context"]["access_request"],
        json!({
            "endpoint": "https://ar.example.com",
            "template": "toolgate:write",
            "expires_at": "2026-01-01T00:00:00Z",
            "display": {
                "title": "Approval required",
                "description": "This call waits for a human approval: approval ap-1 is pending. Once an approver approves it, the same call is allowed.",
            },
        })
    );
    // No Access Request endpoint: the profile forbids the object.
    let v = decision_json(&o, &entry(true), &AuthzenConfig::default());
    assert!(v["context"].get("access_request").is_none());
    assert_eq!(v["context"]["approval_id"], "ap-1");
    // Allowed with the approval it named: that approval.
    let mut named = entry(true);
    named.input.approval_id = "ap-7".into();
    let v = decision_json(&outcome(Decision::Allow), &named, &config);
    assert_eq!(v["context"]["approval_id"], "ap-7");
    // Allowed: no reason at all.
    let v = decision_json(&outcome(Decision::Allow), &entry(true), &config);
    assert_eq!(
        v,
        json!({"decision": true, "context": {"evaluation_id": "d-1",
            "idempotency_key": "t:cd", "arguments_sha256": "ab", "timeout_ms": 900}})
    );
}

#[test]
fn missing_arguments_are_named_in_a_schema_violation() {
    use crate::decision::Decision;
    use crate::envelope::{Envelope, ErrorCode};
    let mut o = outcome(Decision::Deny);
    o.error = Some(Envelope::new(
        ErrorCode::SchemaViolation,
        "`query` is required",
    ));
    let sent = decision_json(&o, &entry(true), &AuthzenConfig::default());
    let unsent = decision_json(&o, &entry(false), &AuthzenConfig::default());
    let details = |v: &Value| {
        serde_json::from_str::<Value>(v["context"]["reason_user"].as_str().unwrap()).unwrap()
            ["error"]["details"]
            .clone()
    };
    assert_eq!(details(&sent), Value::Null);
    assert_eq!(details(&unsent), json!({"arguments": "not_sent"}));
}

#[test]
fn action_results_page_from_the_token() {
    let tools = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
    assert_eq!(
        action_results(&tools, 0, None),
        json!({"results": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})
    );
    assert_eq!(
        action_results(&tools, 0, Some(2)),
        json!({"page": {"next_token": page_token(2), "count": 2, "total": 3},
            "results": [{"name": "a"}, {"name": "b"}]})
    );
    assert_eq!(
        action_results(&tools, 2, Some(2)),
        json!({"page": {"next_token": "", "count": 1, "total": 3}, "results": [{"name": "c"}]})
    );
    // Past the end (the set shrank between pages): an empty last page.
    assert_eq!(
        action_results(&tools, 7, None),
        json!({"page": {"next_token": "", "count": 0, "total": 3}, "results": []})
    );
    assert_eq!(
        action_results(&tools, 0, Some(0)),
        json!({"page": {"next_token": page_token(0), "count": 0, "total": 3}, "results": []})
    );
}
