use serde_json::json;

use super::*;

fn post(body: &str, headers: &[(&str, &str)]) -> HttpRequest {
    HttpRequest {
        method: "POST".into(),
        path: "/mcp".into(),
        headers: headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        body: body.as_bytes().to_vec(),
        partial: false,
    }
}

fn limits() -> Limits {
    ExtAuthzConfig::default().body_limits(&Limits::default())
}

fn read_one(req: &HttpRequest) -> Result<Read, Refusal> {
    read(req, &ExtAuthzConfig::default(), &limits())
}

fn call(req: &HttpRequest) -> ToolCall {
    match read_one(req) {
        Ok(Read::ToolCall(c)) => c,
        other => panic!("{other:?}"),
    }
}

const CALL: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_order","arguments":{"order_id":"o1"}}}"#;

#[test]
fn a_tools_call_reads_as_its_tool_and_arguments() {
    let c = call(&post(CALL, &[("mcp-session-id", "s1")]));
    assert_eq!(c.tool, "get_order");
    assert_eq!(c.arguments, br#"{"order_id":"o1"}"#);
    assert_eq!(c.id, json!(7));
    assert_eq!(c.session_id, "s1");
    assert_eq!(c.request_id, "mcp-session:s1:7");
}

#[test]
fn the_request_id_is_the_header_else_meta_else_session_and_id() {
    let meta = r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"t","_meta":{"toolgate/request_id":"op-9"}}}"#;
    let both = post(meta, &[("idempotency-key", "k-1"), ("mcp-session-id", "s")]);
    assert_eq!(call(&both).request_id, "k-1");
    assert_eq!(
        call(&post(meta, &[("mcp-session-id", "s")])).request_id,
        "op-9"
    );
    let plain = r#"{"jsonrpc":"2.0","id":"7","method":"tools/call","params":{"name":"t"}}"#;
    // The id as JSON text: "7" and 7 are different calls.
    assert_eq!(
        call(&post(plain, &[("mcp-session-id", "s")])).request_id,
        "mcp-session:s:\"7\""
    );
    // No session: each call its own operation.
    let a = call(&post(plain, &[])).request_id;
    let b = call(&post(plain, &[])).request_id;
    assert!(a.starts_with("ext-authz-"), "{a}");
    assert_ne!(a, b);
    let wrong = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"toolgate/request_id":5}}}"#;
    assert_eq!(
        read_one(&post(wrong, &[])).unwrap_err().code,
        INVALID_PARAMS
    );
}

#[test]
fn absent_arguments_are_an_empty_object() {
    let c = call(&post(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
        &[],
    ));
    assert_eq!(c.arguments, b"{}");
}

#[test]
fn other_methods_and_other_verbs_pass() {
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
    ] {
        assert_eq!(read_one(&post(body, &[])), Ok(Read::Pass), "{body}");
    }
    let get = HttpRequest {
        method: "GET".into(),
        ..HttpRequest::default()
    };
    assert_eq!(read_one(&get), Ok(Read::Pass));
}

#[test]
fn refusals_carry_their_status_code_and_reason() {
    let cases: [(HttpRequest, u16, &str, i64); 7] = [
        (post("", &[]), 400, "empty_body", PARSE_ERROR),
        (
            post("{\"jsonrpc\":", &[]),
            400,
            "unexpected_end",
            PARSE_ERROR,
        ),
        (
            post(&format!("[{CALL}]"), &[]),
            400,
            "batch",
            INVALID_REQUEST,
        ),
        (
            post(r#"{"id":1,"id":2,"method":"tools/list"}"#, &[]),
            400,
            "duplicate_key",
            PARSE_ERROR,
        ),
        (
            post(
                r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"t"}}"#,
                &[],
            ),
            400,
            "no_id",
            INVALID_REQUEST,
        ),
        (
            post(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
                &[],
            ),
            400,
            "invalid_params",
            INVALID_PARAMS,
        ),
        (
            HttpRequest {
                partial: true,
                ..post(CALL, &[])
            },
            400,
            "truncated_body",
            PARSE_ERROR,
        ),
    ];
    for (req, status, reason, code) in cases {
        let r = read_one(&req).unwrap_err();
        assert_eq!(
            (r.status, r.reason, r.code),
            (status, reason, code),
            "{r:?}"
        );
    }
}

#[test]
fn a_denied_method_is_refused_with_its_id() {
    let config = ExtAuthzConfig {
        denied_methods: vec!["sampling/createMessage".into()],
        ..ExtAuthzConfig::default()
    };
    let req = post(
        r#"{"jsonrpc":"2.0","id":4,"method":"sampling/createMessage"}"#,
        &[],
    );
    let r = read(&req, &config, &limits()).unwrap_err();
    assert_eq!(
        (r.status, r.reason, &*r.id),
        (403, "method_denied", &json!(4))
    );
    let body: Value = serde_json::from_str(&r.response().body).unwrap();
    assert_eq!(
        body,
        json!({"jsonrpc": "2.0", "id": 4, "error": {
            "code": FORBIDDEN,
            "message": "method `sampling/createMessage` is not allowed through this gateway"
        }})
    );
}

#[test]
fn the_bearer_token_is_read_from_the_configured_header() {
    let config = ExtAuthzConfig::default();
    let req = post(CALL, &[("authorization", "Bearer abc")]);
    assert_eq!(req.identity_token(&config), Some("abc"));
    assert_eq!(
        post(CALL, &[("authorization", "Basic abc")]).identity_token(&config),
        None
    );
    let moved = ExtAuthzConfig {
        identity_header: "x-forwarded-access-token".into(),
        ..config
    };
    let req = post(CALL, &[("x-forwarded-access-token", "xyz")]);
    assert_eq!(req.identity_token(&moved), Some("xyz"));
}

#[test]
fn a_401_says_bearer_invalid_token() {
    let r = Refusal::unauthorized(json!(7), "expired").response();
    assert_eq!(r.status, 401);
    assert!(r.headers.contains(&(
        "www-authenticate".to_owned(),
        r#"Bearer error="invalid_token""#.to_owned()
    )));
}

#[test]
fn a_pass_removes_every_toolgate_header_the_client_sent() {
    let req = post(
        CALL,
        &[
            ("toolgate-decision-id", "forged"),
            ("toolgate-x", "y"),
            ("Toolgate_Decision_Id", "forged"),
            ("toolgate_idempotency-key", "forged"),
            ("toolgatex", "not ours"),
            ("accept", "*/*"),
        ],
    );
    assert_eq!(
        pass(&req),
        Answer::Allow {
            set: vec![],
            remove: vec![
                "toolgate-decision-id".into(),
                "toolgate-x".into(),
                "toolgate_decision_id".into(),
                "toolgate_idempotency-key".into(),
            ],
        }
    );
}

#[test]
fn a_tool_error_echoes_the_id_with_the_text() {
    let r = tool_error(&json!("abc"), "{\"error\":{}}");
    assert_eq!(r.status, 200);
    let body: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        body,
        json!({"jsonrpc": "2.0", "id": "abc", "result": {
            "content": [{"type": "text", "text": "{\"error\":{}}"}], "isError": true
        }})
    );
}

/// A member a case-insensitive reader takes for an envelope member, but not
/// spelt as it, is refused even alone (no duplicate): toolgate would read
/// the message without it, Go's `encoding/json` with it. Found by the
/// `differential_envelope` fuzz target.
#[test]
fn a_misspelt_envelope_member_is_refused_even_alone() {
    let cases = [
        // A tools/call whose arguments only Go sees.
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_order","Arguments":{"order_id":"o2"}}}"#,
            "the member `Arguments` is not `arguments`: JSON-RPC member names are exact",
        ),
        // A "response" that passes unchecked here and is a tools/call there.
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{},"Method":"tools/call","params":{"name":"delete_account"}}"#,
            "the member `Method` is not `method`: JSON-RPC member names are exact",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","param\u017f":{"name":"x"}}"#,
            "the member `param\u{17f}` is not `params`: JSON-RPC member names are exact",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_order","_META":{}}}"#,
            "the member `_META` is not `_meta`: JSON-RPC member names are exact",
        ),
    ];
    let config = ExtAuthzConfig::default();
    for (body, message) in cases {
        let r = read(&post(body, &[]), &config, &limits()).unwrap_err();
        assert_eq!(
            (r.status, r.reason, r.message.as_str()),
            (400, "misspelt_member", message),
            "{body}"
        );
    }
}
