//! The Envoy ext_authz door (DESIGN §11.2) over real gRPC on loopback,
//! against the sidecar `TestServer` builds as `toolgate serve` does, with
//! `CheckRequest`s shaped as Envoy's ext_authz HTTP filter sends them
//! (`with_request_body` with `pack_as_bytes`): the attributes of the
//! downstream connection, the HTTP request with its pseudo-headers and
//! every header in lower case, the body as `raw_body`. Every row of the
//! door: a `tools/call` allowed (the `toolgate-*` headers set, forged ones
//! removed), denied and waiting for an approval (a JSON-RPC tool error with
//! `model_output`, status 200, the id echoed); other methods pass; denied
//! methods, batches, bodies that are empty, unparsable, truncated, with
//! duplicate keys, lone surrogates or over the limit are refused with a
//! JSON-RPC error; no valid bearer token is `401`; the request id from
//! `idempotency-key`, `_meta` or the session and JSON-RPC id; an approval
//! end to end through the real `ApprovalService`; the `ext_authz` grant.

use envoy_types::ext_authz::v3::pb::{CheckRequest, CheckResponse, HttpResponse};
use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, attribute_context};
use serde_json::{Value, json};
use tonic::transport::Channel;

use toolgate::access::{AccessPolicy, CallerPattern, Grant, ServiceName, TenantScope};
use toolgate::config::Config;
use toolgate::decode::{Limits, canonical_json, idempotency_key, parse_strict, sha256_hex};
use toolgate::grpc::pb;
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::entity_service_client::EntityServiceClient;

use crate::support::{TestServer, approver_claims, signed, token};

/// Alice's order and Carol's, in tenant acme: the store is the only place
/// a gateway call finds them (DESIGN §11.6).
pub(crate) const ORDERS: &str = r#"[
 {"uid":{"type":"Order","id":"ord_1001"},"parents":[{"type":"Tenant","id":"acme"}],
  "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"alice"}},
           "status":"delivered","total_cents":50000}},
 {"uid":{"type":"Order","id":"ord_2002"},"parents":[{"type":"Tenant","id":"acme"}],
  "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"carol"}},
           "status":"delivered","total_cents":50000}}
]"#;

pub(crate) const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;

/// The bearer token of an MCP user: bob, support agent of acme, with the
/// scopes to read orders and refund them.
pub(crate) fn bob() -> String {
    user("bob", &["support_agent"], "orders:read orders:refund")
}

/// The bearer token of a user of acme with `roles` and `scope`.
pub(crate) fn user(subject: &str, roles: &[&str], scope: &str) -> String {
    let mut claims = approver_claims(subject, "acme", roles, 300);
    claims["scope"] = json!(scope);
    signed(jsonwebtoken::Algorithm::ES256, Some("ec-1"), &claims)
}

async fn server(edit: impl FnOnce(&mut Config)) -> TestServer {
    let server = TestServer::start_setup(edit).await;
    EntityServiceClient::new(server.channel().await)
        .upsert_entities(pb::UpsertEntitiesRequest {
            tenant_id: "acme".into(),
            entities_json: ORDERS.into(),
        })
        .await
        .unwrap();
    server
}

async fn client(server: &TestServer) -> AuthorizationClient<Channel> {
    AuthorizationClient::new(server.channel().await)
}

fn socket(ip: &str, port: u32) -> Option<attribute_context::Peer> {
    Some(attribute_context::Peer {
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: ip.into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
                ..SocketAddress::default()
            })),
        }),
        ..attribute_context::Peer::default()
    })
}

/// The `CheckRequest` Envoy's ext_authz filter sends for `method path`
/// with `headers` (the client's, lower case) and `body` (`raw_body`, as
/// `pack_as_bytes` sends it; Envoy fills `size` from `content-length`).
pub(crate) fn envoy_check(method: &str, headers: &[(&str, &str)], body: &[u8]) -> CheckRequest {
    let mut all: Vec<(String, String)> = vec![
        (":authority".into(), "mcp.example.test".into()),
        (":method".into(), method.into()),
        (":path".into(), "/mcp".into()),
        (":scheme".into(), "http".into()),
        ("x-forwarded-proto".into(), "http".into()),
        (
            "x-request-id".into(),
            "2f1c5e86-7d1e-4f57-9a0e-3c3f1b1f5a11".into(),
        ),
        ("user-agent".into(), "python-httpx/0.28.1".into()),
        (
            "accept".into(),
            "application/json, text/event-stream".into(),
        ),
    ];
    if method == "POST" {
        all.push(("content-type".into(), "application/json".into()));
        all.push(("content-length".into(), body.len().to_string()));
    }
    all.extend(
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let http = attribute_context::HttpRequest {
        id: "16108523459328547218".into(),
        method: method.into(),
        headers: all.into_iter().collect(),
        path: "/mcp".into(),
        host: "mcp.example.test".into(),
        scheme: "http".into(),
        size: if method == "POST" {
            i64::try_from(body.len()).unwrap()
        } else {
            -1
        },
        protocol: "HTTP/1.1".into(),
        raw_body: body.to_vec(),
        ..attribute_context::HttpRequest::default()
    };
    CheckRequest {
        attributes: Some(AttributeContext {
            source: socket("127.0.0.1", 53318),
            destination: socket("127.0.0.1", 10000),
            request: Some(attribute_context::Request {
                time: Some(envoy_types::pb::google::protobuf::Timestamp {
                    seconds: 1_796_000_000,
                    nanos: 0,
                }),
                http: Some(http),
            }),
            ..AttributeContext::default()
        }),
    }
}

/// A `tools/call` message.
pub(crate) fn tools_call(id: Value, tool: &str, arguments: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
    )
    .into_bytes()
}

/// What the proxy is told, in plain terms.
#[derive(Debug, PartialEq)]
pub(crate) enum Told {
    Allow {
        set: Vec<(String, String)>,
        remove: Vec<String>,
    },
    Respond {
        grpc: i32,
        status: i32,
        headers: Vec<(String, String)>,
        body: Value,
    },
}

pub(crate) fn told(r: CheckResponse) -> Told {
    let code = r.status.unwrap().code;
    match r.http_response.unwrap() {
        HttpResponse::OkResponse(ok) => {
            assert_eq!(code, 0);
            Told::Allow {
                set: ok
                    .headers
                    .into_iter()
                    .map(|h| {
                        // Overwrite what the client sent, never append.
                        assert_eq!(h.append_action, 2, "{h:?}");
                        let h = h.header.unwrap();
                        (h.key, h.value)
                    })
                    .collect(),
                remove: ok.headers_to_remove,
            }
        }
        HttpResponse::DeniedResponse(denied) => Told::Respond {
            grpc: code,
            status: denied.status.unwrap().code,
            headers: denied
                .headers
                .into_iter()
                .map(|h| {
                    let h = h.header.unwrap();
                    (h.key, h.value)
                })
                .collect(),
            body: serde_json::from_str(&denied.body).unwrap(),
        },
        other => panic!("{other:?}"),
    }
}

pub(crate) async fn check(client: &mut AuthorizationClient<Channel>, req: CheckRequest) -> Told {
    told(client.check(req).await.unwrap().into_inner())
}

const PERMISSION_DENIED: i32 = 7;
const UNAUTHENTICATED: i32 = 16;

fn json_ct() -> Vec<(String, String)> {
    vec![("content-type".into(), "application/json".into())]
}

/// The JSON-RPC error answer of a refusal.
pub(crate) fn rpc_error(status: i32, id: Value, code: i64, message: &str) -> Told {
    let mut headers = json_ct();
    let grpc = if status == 401 {
        headers.push((
            "www-authenticate".into(),
            r#"Bearer error="invalid_token""#.into(),
        ));
        UNAUTHENTICATED
    } else {
        PERMISSION_DENIED
    };
    Told::Respond {
        grpc,
        status,
        headers,
        body: json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
    }
}

/// The tool error the model reads: its text, parsed.
pub(crate) fn tool_error(told: &Told, id: &Value) -> Value {
    let Told::Respond {
        grpc,
        status,
        headers,
        body,
    } = told
    else {
        panic!("not a refusal: {told:?}");
    };
    assert_eq!(
        (*grpc, *status, headers),
        (PERMISSION_DENIED, 200, &json_ct())
    );
    assert_eq!(body["jsonrpc"], json!("2.0"));
    assert_eq!(&body["id"], id);
    assert_eq!(body["result"]["isError"], json!(true), "{body}");
    assert_eq!(body["result"]["content"][0]["type"], json!("text"));
    serde_json::from_str(body["result"]["content"][0]["text"].as_str().unwrap()).unwrap()
}

pub(crate) fn set_header<'a>(told: &'a Told, name: &str) -> &'a str {
    let Told::Allow { set, .. } = told else {
        panic!("not allowed: {told:?}");
    };
    set.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap()
}

pub(crate) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn an_allowed_tools_call_gets_the_decision_headers_and_loses_forged_ones() {
    let server = server(|_| {}).await;
    let mut c = client(&server).await;
    let auth = bearer(&bob());
    let arguments = r#"{"order_id": "ord_1001"}"#;
    let answer = check(
        &mut c,
        envoy_check(
            "POST",
            &[
                ("authorization", &auth),
                ("mcp-session-id", "sess-9"),
                ("toolgate-decision-id", "forged"),
                ("toolgate-approved", "yes"),
            ],
            &tools_call(json!(3), "get_order", arguments),
        ),
    )
    .await;
    let canonical =
        canonical_json(&parse_strict(arguments.as_bytes(), &Limits::default()).unwrap()).unwrap();
    let sha = sha256_hex(canonical.as_bytes());
    let key = idempotency_key(
        "get_order",
        "mcp-session:sess-9:3",
        "bob",
        "acme",
        &canonical,
    );
    let Told::Allow { set, remove } = &answer else {
        panic!("{answer:?}");
    };
    let decision_id = set_header(&answer, "toolgate-decision-id").to_owned();
    assert!(!decision_id.is_empty() && decision_id != "forged");
    assert_eq!(
        set,
        &vec![
            ("toolgate-decision-id".to_owned(), decision_id),
            ("toolgate-idempotency-key".to_owned(), key),
            ("toolgate-arguments-sha256".to_owned(), sha),
        ]
    );
    // The one it overwrites stays; every other forged one goes.
    assert_eq!(remove, &vec!["toolgate-approved".to_owned()]);
}

#[tokio::test]
async fn a_denied_tools_call_is_the_tools_error_with_model_output() {
    let server = server(|_| {}).await;
    let mut c = client(&server).await;
    let auth = bearer(&bob());
    // Alice, a customer, may read her own orders, not Carol's.
    let alice = bearer(&user("alice", &[], "orders:read"));
    let answer = check(
        &mut c,
        envoy_check(
            "POST",
            &[("authorization", &alice)],
            &tools_call(json!("req-a"), "get_order", r#"{"order_id":"ord_2002"}"#),
        ),
    )
    .await;
    let output = tool_error(&answer, &json!("req-a"));
    assert_eq!(output["error"]["code"], json!("forbidden"), "{output}");
    // An order that is not in the store is `resource_not_found`.
    let answer = check(
        &mut c,
        envoy_check(
            "POST",
            &[("authorization", &auth)],
            &tools_call(json!(11), "get_order", r#"{"order_id":"ord_9999"}"#),
        ),
    )
    .await;
    let output = tool_error(&answer, &json!(11));
    assert_eq!(
        output["error"]["code"],
        json!("resource_not_found"),
        "{output}"
    );
    // Arguments that break the tool's schema: the model is told how.
    let answer = check(
        &mut c,
        envoy_check(
            "POST",
            &[("authorization", &auth)],
            &tools_call(json!(12), "get_order", r#"{"order_id":"nope"}"#),
        ),
    )
    .await;
    assert_eq!(
        tool_error(&answer, &json!(12))["error"]["code"],
        json!("schema_violation")
    );
}

#[tokio::test]
async fn an_approval_is_asked_for_decided_and_the_same_call_then_allowed_once() {
    let server = server(|_| {}).await;
    let mut c = client(&server).await;
    let auth = bearer(&bob());
    let call = |id: i64| {
        envoy_check(
            "POST",
            &[("authorization", &auth), ("mcp-session-id", "sess-1")],
            &tools_call(json!(id), "refund_order", BIG_REFUND),
        )
    };
    // Refused: an approval is opened.
    let first = tool_error(&check(&mut c, call(1)).await, &json!(1));
    assert_eq!(
        first["error"]["code"],
        json!("approval_required"),
        "{first}"
    );
    let approval_id = first["error"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Asked again (another JSON-RPC id: another request id): the same
    // approval, pending.
    let again = tool_error(&check(&mut c, call(2)).await, &json!(2));
    assert_eq!(again["error"]["code"], json!("approval_pending"), "{again}");
    assert_eq!(again["error"]["details"]["approval_id"], json!(approval_id));

    // Approved by a human through ApprovalService, for the hash shown.
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let approver = token("dana", "acme", &["support_admin"]);
    let shown = approvals
        .get_approval(pb::GetApprovalRequest {
            identity_token: approver.clone(),
            approval_id: approval_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(
        (shown.tool.as_str(), shown.requester_subject_id.as_str()),
        ("refund_order", "bob")
    );
    let decided = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: approver,
            approval_id: approval_id.clone(),
            verdict: pb::Verdict::Approve as i32,
            arguments_sha256: shown.arguments_sha256.clone(),
            reason: "damaged in transit".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);

    // The same call now runs: once.
    let allowed = check(&mut c, call(3)).await;
    assert_eq!(
        set_header(&allowed, "toolgate-arguments-sha256"),
        shown.arguments_sha256
    );
    let next = tool_error(&check(&mut c, call(4)).await, &json!(4));
    assert_eq!(next["error"]["code"], json!("approval_required"), "{next}");
    assert_ne!(next["error"]["details"]["approval_id"], json!(approval_id));
}

#[tokio::test]
async fn other_methods_and_verbs_pass_without_forged_headers() {
    let server = server(|_| {}).await;
    let mut c = client(&server).await;
    let forged = [("toolgate-decision-id", "forged")];
    for body in [
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":"s-1","result":{"content":[]}}"#,
    ] {
        // No bearer token is needed for what is not a tools/call.
        assert_eq!(
            check(&mut c, envoy_check("POST", &forged, body.as_bytes())).await,
            Told::Allow {
                set: vec![],
                remove: vec!["toolgate-decision-id".into()],
            },
            "{body}"
        );
    }
    for verb in ["GET", "DELETE"] {
        assert_eq!(
            check(&mut c, envoy_check(verb, &forged, b"")).await,
            Told::Allow {
                set: vec![],
                remove: vec!["toolgate-decision-id".into()],
            },
        );
    }
}

#[tokio::test]
async fn configured_methods_are_denied() {
    let server = server(|c| {
        c.ext_authz.denied_methods = vec!["prompts/get".into()];
    })
    .await;
    let mut c = client(&server).await;
    let body = br#"{"jsonrpc":"2.0","id":5,"method":"prompts/get","params":{"name":"p"}}"#;
    assert_eq!(
        check(&mut c, envoy_check("POST", &[], body)).await,
        rpc_error(
            403,
            json!(5),
            -32003,
            "method `prompts/get` is not allowed through this gateway"
        )
    );
    // Others still pass.
    let list = br#"{"jsonrpc":"2.0","id":6,"method":"tools/list"}"#;
    assert!(matches!(
        check(&mut c, envoy_check("POST", &[], list)).await,
        Told::Allow { .. }
    ));
}

#[tokio::test]
async fn batches_and_bodies_that_cannot_be_read_are_refused_with_a_json_rpc_error() {
    let server = server(|_| {}).await;
    let mut c = client(&server).await;
    let auth = bearer(&bob());
    let one = tools_call(json!(1), "get_order", r#"{"order_id":"ord_1001"}"#);
    let mut batch = b"[".to_vec();
    batch.extend_from_slice(&one);
    batch.push(b']');
    assert_eq!(
        check(
            &mut c,
            envoy_check("POST", &[("authorization", &auth)], &batch)
        )
        .await,
        rpc_error(
            400,
            Value::Null,
            -32600,
            "a JSON-RPC batch is not accepted: send one message per request"
        )
    );
    // No body: Envoy was not told to send it.
    let mut missing = envoy_check("POST", &[("authorization", &auth)], b"");
    declare_size(&mut missing, one.len());
    let empty = rpc_error(
        400,
        Value::Null,
        -32700,
        "the request carries no body (the proxy must send it: `with_request_body`)",
    );
    assert_eq!(check(&mut c, missing).await, empty);
    assert_eq!(
        check(
            &mut c,
            envoy_check("POST", &[("authorization", &auth)], b"")
        )
        .await,
        empty
    );
    // Cut by Envoy at max_request_bytes (allow_partial_message: true): it
    // says so in a header, and sends fewer bytes than content-length.
    let cut = &one[..20];
    let mut partial = envoy_check(
        "POST",
        &[
            ("authorization", &auth),
            ("x-envoy-auth-partial-body", "true"),
        ],
        cut,
    );
    declare_size(&mut partial, one.len());
    let truncated = rpc_error(
        400,
        Value::Null,
        -32700,
        "the request body was cut by the proxy: it is over the proxy's `max_request_bytes`",
    );
    assert_eq!(check(&mut c, partial.clone()).await, truncated);
    // Even when the prefix happens to parse, the header alone refuses it.
    let mut whole_but_flagged = envoy_check(
        "POST",
        &[
            ("authorization", &auth),
            ("x-envoy-auth-partial-body", "true"),
        ],
        &one,
    );
    assert_eq!(check(&mut c, whole_but_flagged.clone()).await, truncated);
    whole_but_flagged = envoy_check("POST", &[("authorization", &auth)], &one);
    assert!(matches!(
        check(&mut c, whole_but_flagged).await,
        Told::Allow { .. }
    ));
    // Not JSON at all.
    let not_json = b"tools/call get_order";
    let e = parse_strict(not_json, &Limits::default()).unwrap_err();
    assert_eq!(
        check(
            &mut c,
            envoy_check("POST", &[("authorization", &auth)], not_json)
        )
        .await,
        rpc_error(
            400,
            Value::Null,
            -32700,
            &format!("the request body is not accepted: {e}")
        )
    );
}

#[tokio::test]
async fn the_strict_decoding_and_limit_cases_are_refused_through_this_door_too() {
    let server = server(|c| c.ext_authz.max_body_bytes = 4096).await;
    let mut c = client(&server).await;
    let auth = bearer(&bob());
    let body_limits = Limits {
        max_bytes: 4096,
        max_depth: Limits::default().max_depth + 2,
    };
    let huge = format!(r#"{{"order_id":"ord_1001","note":"{}"}}"#, "x".repeat(5000));
    let deep = format!("{}1{}", "[".repeat(80), "]".repeat(80));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "a duplicate key in the arguments",
            tools_call(json!(1), "get_order", r#"{"order_id":"ord_1001","order_id":"ord_2002"}"#),
        ),
        (
            "a duplicate key in the message",
            br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"get_order","arguments":{}}}"#.to_vec(),
        ),
        (
            "a lone surrogate",
            tools_call(json!(1), "get_order", r#"{"order_id":"ord_\ud800"}"#),
        ),
        ("over the size limit", tools_call(json!(1), "get_order", &huge)),
        (
            "over the depth limit",
            tools_call(json!(1), "get_order", &format!(r#"{{"order_id":{deep}}}"#)),
        ),
        (
            "a number out of range",
            tools_call(json!(1), "refund_order", r#"{"amount_cents":1e400}"#),
        ),
    ];
    for (what, body) in cases {
        let e = parse_strict(&body, &body_limits).unwrap_err();
        assert_eq!(
            check(
                &mut c,
                envoy_check("POST", &[("authorization", &auth)], &body)
            )
            .await,
            rpc_error(
                400,
                Value::Null,
                -32700,
                &format!("the request body is not accepted: {e}")
            ),
            "{what}"
        );
    }
}

#[tokio::test]
async fn a_tools_call_without_a_valid_bearer_token_is_401() {
    let server = server(|_| {}).await;
    let mut c = client(&server).await;
    let call = tools_call(json!(9), "get_order", r#"{"order_id":"ord_1001"}"#);
    let mut expired = approver_claims("bob", "acme", &["support_agent"], 0);
    expired["exp"] = json!(1_000_000);
    let mut foreign = approver_claims("bob", "acme", &["support_agent"], 300);
    foreign["iss"] = json!("https://elsewhere.test");
    let expired = bearer(&signed(
        jsonwebtoken::Algorithm::ES256,
        Some("ec-1"),
        &expired,
    ));
    let foreign = bearer(&signed(
        jsonwebtoken::Algorithm::ES256,
        Some("ec-1"),
        &foreign,
    ));
    let basic = format!("Basic {}", bob());
    let unauthorized = rpc_error(
        401,
        json!(9),
        -32001,
        "a tools/call needs a valid bearer token",
    );
    for headers in [
        vec![],
        vec![("authorization", expired.as_str())],
        vec![("authorization", foreign.as_str())],
        vec![("authorization", basic.as_str())],
        vec![("authorization", "Bearer not.a.jwt")],
    ] {
        assert_eq!(
            check(&mut c, envoy_check("POST", &headers, &call)).await,
            unauthorized,
            "{headers:?}"
        );
    }
}

#[tokio::test]
async fn the_request_id_is_the_idempotency_key_header_else_meta_else_session_and_id() {
    let server = server(|_| {}).await;
    let mut c = client(&server).await;
    let auth = bearer(&bob());
    let arguments = r#"{"order_id":"ord_1001"}"#;
    let key = |request_id: &str| idempotency_key("get_order", request_id, "bob", "acme", arguments);
    let with_meta = |id: i64, op: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_order","arguments":{arguments},"_meta":{{"toolgate/request_id":"{op}"}}}}}}"#
        )
        .into_bytes()
    };
    let plain = |id: i64| tools_call(json!(id), "get_order", arguments);
    let auth = auth.as_str();
    // The header wins over _meta and the session.
    assert_eq!(
        idempotency_key_of(
            &mut c,
            auth,
            &[("idempotency-key", "op-7"), ("mcp-session-id", "s")],
            with_meta(1, "m-1")
        )
        .await,
        key("op-7")
    );
    // Then _meta.
    assert_eq!(
        idempotency_key_of(
            &mut c,
            auth,
            &[("mcp-session-id", "s")],
            with_meta(2, "m-1")
        )
        .await,
        key("m-1")
    );
    // Then the session and the JSON-RPC id.
    assert_eq!(
        idempotency_key_of(&mut c, auth, &[("mcp-session-id", "s")], plain(3)).await,
        key("mcp-session:s:3")
    );
    // Neither: each call its own operation.
    let a = idempotency_key_of(&mut c, auth, &[], plain(3)).await;
    let b = idempotency_key_of(&mut c, auth, &[], plain(3)).await;
    assert_ne!(a, b);
    assert_ne!(a, key("mcp-session:s:3"));
}

#[tokio::test]
async fn the_door_is_its_own_grant_and_its_tenants_are_checked() {
    let grant = |services: &[ServiceName], tenants: &[&str]| Grant {
        caller: CallerPattern::Any,
        services: services.iter().copied().collect(),
        tenants: TenantScope::of(tenants.iter().copied()),
    };
    let call = tools_call(json!(1), "get_order", r#"{"order_id":"ord_1001"}"#);
    let auth = bearer(&bob());
    // Granted entities (to load the orders) and authorization, not ext_authz.
    let closed = server(|c| {
        c.access = AccessPolicy::Grants(vec![grant(
            &[ServiceName::Authorization, ServiceName::Entities],
            &["acme"],
        )]);
    })
    .await;
    let status = client(&closed)
        .await
        .check(envoy_check("POST", &[("authorization", &auth)], &call))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    // Granted ext_authz for globex only: bob of acme is refused.
    let other = server(|c| {
        c.access = AccessPolicy::Grants(vec![
            grant(&[ServiceName::ExtAuthz], &["globex"]),
            grant(&[ServiceName::Entities], &["acme"]),
        ]);
    })
    .await;
    let Told::Respond { status, body, .. } = check(
        &mut client(&other).await,
        envoy_check("POST", &[("authorization", &auth)], &call),
    )
    .await
    else {
        panic!("allowed");
    };
    assert_eq!(status, 403);
    assert_eq!(body["error"]["code"], json!(-32003), "{body}");
    assert_eq!(body["id"], json!(1));
}

/// The `toolgate-idempotency-key` an allowed call of `body` gets.
async fn idempotency_key_of(
    c: &mut AuthorizationClient<Channel>,
    auth: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> String {
    let mut all = vec![("authorization", auth)];
    all.extend_from_slice(headers);
    let told = check(c, envoy_check("POST", &all, &body)).await;
    set_header(&told, "toolgate-idempotency-key").to_owned()
}

/// Server reflection lists the service with every file it depends on: a
/// generic client (grpcurl, from PyPI) lists it, describes `CheckRequest`
/// and calls `Check` knowing nothing but what reflection told it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_finds_check_through_reflection_alone_and_calls_it() {
    let Some(grpcurl) = crate::prerequisites::grpcurl() else {
        return;
    };
    let server = server(|_| {}).await;
    let addr = server.addr.to_string();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&grpcurl)
            .args(["-plaintext", "-max-time", "20"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "grpcurl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let listed = run(&[&addr, "list"]);
    assert!(
        listed
            .lines()
            .any(|l| l == "envoy.service.auth.v3.Authorization"),
        "{listed}"
    );
    assert_eq!(
        run(&[&addr, "list", "envoy.service.auth.v3.Authorization"]).trim(),
        "envoy.service.auth.v3.Authorization.Check"
    );
    let described = run(&[&addr, "describe", "envoy.service.auth.v3.CheckRequest"]);
    assert!(
        described.starts_with("envoy.service.auth.v3.CheckRequest is a message:"),
        "{described}"
    );
    assert!(
        described.contains(".envoy.service.auth.v3.AttributeContext attributes = 1"),
        "{described}"
    );
    // Every type below it resolves too (grpcurl fetches the files it needs).
    let http = run(&[
        &addr,
        "describe",
        "envoy.service.auth.v3.AttributeContext.HttpRequest",
    ]);
    assert!(http.contains("bytes raw_body = 12"), "{http}");
    // A call built from reflection alone: a tools/list passes.
    use base64::Engine as _;
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let request = json!({"attributes": {"request": {"http": {
        "method": "POST", "path": "/mcp",
        "headers": {"content-type": "application/json", "toolgate-x": "forged"},
        "rawBody": base64::engine::general_purpose::STANDARD.encode(body),
    }}}});
    let answer: Value = serde_json::from_str(&run(&[
        "-d",
        &request.to_string(),
        &addr,
        "envoy.service.auth.v3.Authorization/Check",
    ]))
    .unwrap();
    assert_eq!(
        answer,
        json!({"status": {}, "okResponse": {"headersToRemove": ["toolgate-x"]}})
    );
}

/// Says the request's body is `size` bytes (`content-length` and `size`),
/// whatever was sent of it.
fn declare_size(req: &mut CheckRequest, size: usize) {
    let http = req
        .attributes
        .as_mut()
        .and_then(|a| a.request.as_mut())
        .and_then(|r| r.http.as_mut())
        .unwrap();
    http.size = i64::try_from(size).unwrap();
    http.headers
        .insert("content-length".into(), size.to_string());
}
