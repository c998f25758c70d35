//! Every code the decision path can return, over real gRPC, each asserting
//! the exact decision, code and details.

use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tonic::Code;
use tonic_types::StatusExt;

use toolgate::decision::AuthorizerConfig;
use toolgate::decode::Limits;
use toolgate::grpc::pb::{self, Decision};

use crate::support::{TestServer, auth, bad_request_field, code, details, fixture, request};

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

#[tokio::test]
async fn an_allowed_read_carries_canonical_arguments_hashes_and_keys() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .authorize(request("get_order", r#"{ "order_id" : "ord_1001" }"#))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::Allow, "{r:?}");
    assert_eq!(r.error, None);
    assert_eq!(r.model_output, "");
    assert_eq!(r.call_id, "call-1");
    assert_eq!(r.normalized_arguments, r#"{"order_id":"ord_1001"}"#);
    assert_eq!(r.arguments_sha256, sha256_hex(r#"{"order_id":"ord_1001"}"#));
    let key_source = r#"{"arguments":{"order_id":"ord_1001"},"request_id":"req-1","subject_id":"bob","tenant_id":"acme","tool_name":"get_order"}"#;
    assert_eq!(
        r.idempotency_key,
        format!("get_order:{}", sha256_hex(key_source))
    );
    assert_eq!(r.conflict_key, "acme:Order:ord_1001");
    assert_eq!(r.risk(), pb::RiskLevel::Read);
    assert_eq!(r.timeout_ms, 2000);
    assert!(r.parallel && r.idempotent);
    assert_eq!(r.tool_version, "1.0.0");
    assert_eq!(r.policy_version.len(), 64);
    assert!(!r.decision_id.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_tool_without_resource_gets_a_tool_conflict_key() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .authorize(request(
            "search_docs",
            r#"{"query":"refund policy","limit":5}"#,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::Allow, "{r:?}");
    assert_eq!(r.conflict_key, "acme:Tool:search_docs");
    server.stop().await;
}

#[tokio::test]
async fn malformed_json_is_invalid_json_with_the_byte_position() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .authorize(request("get_order", r#"{"order_id":"ord_1001",}"#))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::Deny);
    assert_eq!(code(&r), "invalid_json");
    let d = details(&r);
    assert_eq!(d["position"], 23);
    let e = r.error.as_ref().unwrap();
    assert_eq!(
        (e.category.as_str(), e.retryable, e.resolution.as_str()),
        ("arguments", false, "repair_arguments")
    );
    let model: serde_json::Value = serde_json::from_str(&r.model_output).unwrap();
    assert_eq!(model["error"]["code"], "invalid_json");
    server.stop().await;
}

#[tokio::test]
async fn duplicate_keys_are_rejected_with_their_pointer() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let args = r#"{"order_id":"ord_1001","amount_cents":100,"currency":"USD","reason":"late","amount_cents":999999}"#;
    let r = client
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r), "invalid_json");
    let d = details(&r);
    assert_eq!(d["reason"], "duplicate_key");
    assert_eq!(d["pointer"], "/amount_cents");
    server.stop().await;
}

#[tokio::test]
async fn limits_and_number_range_are_invalid_arguments() {
    let config = AuthorizerConfig {
        limits: Limits {
            max_bytes: 256,
            max_depth: 4,
        },
        ..AuthorizerConfig::default()
    };
    let server = TestServer::start_with(&crate::support::example_policies(), config).await;
    let mut client = server.client().await;
    let cases = [
        (r#"["ord_1001"]"#.to_owned(), "not_an_object"),
        (r#"{"a":{"b":{"c":{"d":{}}}}}"#.to_owned(), "too_deep"),
        (format!(r#"{{"query":"{}"}}"#, "x".repeat(300)), "too_large"),
        (
            r#"{"query":"q","limit":9007199254740993}"#.to_owned(),
            "number_out_of_range",
        ),
        (
            r#"{"query":"q","limit":1e400}"#.to_owned(),
            "number_out_of_range",
        ),
    ];
    for (args, reason) in cases {
        let r = client
            .authorize(request("search_docs", &args))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.decision(), Decision::Deny);
        assert_eq!(code(&r), "invalid_arguments", "{args}");
        assert_eq!(details(&r)["reason"], reason, "{args}");
    }
    server.stop().await;
}

#[tokio::test]
async fn unknown_tools_and_stale_versions_are_tool_not_found() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .authorize(request("drop_database", "{}"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r), "tool_not_found");
    assert_eq!(r.error.as_ref().unwrap().resolution, "refresh_tools");
    let mut stale = request("get_order", r#"{"order_id":"ord_1001"}"#);
    stale.tool_version = "0.9.0".into();
    let r = client.authorize(stale).await.unwrap().into_inner();
    assert_eq!(code(&r), "tool_not_found");
    assert_eq!(details(&r)["reason"], "version_mismatch");
    server.stop().await;
}

#[tokio::test]
async fn schema_violations_list_every_error_and_never_coerce() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let args = r#"{"order_id":"ord_1001","amount_cents":"100","currency":"JPY","reason":"late","is_admin":true}"#;
    let r = client
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::Deny);
    assert_eq!(code(&r), "schema_violation");
    let violations = details(&r)["violations"].as_array().unwrap().clone();
    let mut got: Vec<(String, String)> = violations
        .iter()
        .map(|v| {
            (
                v["pointer"].as_str().unwrap().to_owned(),
                v["keyword"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (String::new(), "additionalProperties".to_owned()),
            ("/amount_cents".to_owned(), "type".to_owned()),
            ("/currency".to_owned(), "enum".to_owned()),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn an_invalid_date_time_is_a_violation() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let args = r#"{"customer_id":"cus_alice","subject":"Hi","body":"Hello","send_at":"2026-13-01T00:00:00Z"}"#;
    let r = client
        .authorize(request("send_email", args))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r), "schema_violation");
    assert_eq!(details(&r)["violations"][0]["keyword"], "format");
    assert_eq!(details(&r)["violations"][0]["pointer"], "/send_at");
    server.stop().await;
}

#[tokio::test]
async fn a_forbid_with_a_reason_is_forbidden_with_that_reason_only() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let args = r#"{"order_id":"ord_1001","amount_cents":60000,"currency":"USD","reason":"late"}"#;
    let r = client
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::Deny);
    assert_eq!(code(&r), "forbidden");
    let e = r.error.as_ref().unwrap();
    assert_eq!(e.message, "a refund cannot exceed the order total");
    // Policy ids go to the audit log, never to the model.
    assert!(
        !r.model_output.contains("refund-within-order-total"),
        "{}",
        r.model_output
    );
    assert!(!e.details_json.contains("refund-within-order-total"));
    server.stop().await;
}

#[tokio::test]
async fn cross_tenant_access_is_forbidden() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .authorize(request("get_order", r#"{"order_id":"ord_2001"}"#))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::Deny);
    assert_eq!(code(&r), "forbidden");
    assert_eq!(
        r.error.as_ref().unwrap().message,
        "the resource belongs to another tenant"
    );
    server.stop().await;
}

#[tokio::test]
async fn no_permit_is_forbidden_with_a_generic_message() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut req = request("get_order", r#"{"order_id":"ord_1001"}"#);
    req.auth = Some(auth("mallory", "acme", &["customer"], &["orders:read"]));
    let r = client.authorize(req).await.unwrap().into_inner();
    assert_eq!(code(&r), "forbidden");
    assert_eq!(
        r.error.as_ref().unwrap().message,
        "the call is not permitted by policy"
    );
    // The owner may read their own order.
    let mut own = request("get_order", r#"{"order_id":"ord_1001"}"#);
    own.auth = Some(auth("alice", "acme", &["customer"], &["orders:read"]));
    assert_eq!(
        client.authorize(own).await.unwrap().into_inner().decision(),
        Decision::Allow
    );
    server.stop().await;
}

#[tokio::test]
async fn model_supplied_privilege_fields_are_schema_violations() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .authorize(request(
            "get_order",
            r#"{"order_id":"ord_1001","tenant_id":"globex","is_admin":true}"#,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r), "schema_violation");
    server.stop().await;
}

#[tokio::test]
async fn a_missing_resource_entity_is_resource_not_found() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .authorize(request("get_order", r#"{"order_id":"ord_9999"}"#))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::Deny);
    assert_eq!(code(&r), "resource_not_found");
    assert_eq!(details(&r)["resource"], r#"Order::"ord_9999""#);
    server.stop().await;
}

#[tokio::test]
async fn an_erroring_policy_fails_closed_even_when_a_permit_matches() {
    let server =
        TestServer::start_with(&fixture("policies-erroring"), AuthorizerConfig::default()).await;
    let mut client = server.client().await;
    let mut req = request("compute", r#"{"n":1}"#);
    req.entities_json = String::new();
    let r = client.authorize(req.clone()).await.unwrap().into_inner();
    assert_eq!(r.decision(), Decision::Deny);
    assert_eq!(code(&r), "policy_error");
    assert!(!r.error.as_ref().unwrap().expose_to_model);
    // Without the overflow the permit stands.
    req.arguments = br#"{"n":0,"ratio":0.25}"#.to_vec();
    let r = client.authorize(req.clone()).await.unwrap().into_inner();
    assert_eq!(r.decision(), Decision::Allow, "{r:?}");
    // A number Cedar's decimal cannot hold exactly is refused, never rounded.
    req.arguments = br#"{"n":0,"ratio":0.123456}"#.to_vec();
    let r = client.authorize(req).await.unwrap().into_inner();
    assert_eq!(code(&r), "invalid_arguments");
    assert_eq!(details(&r)["reason"], "number_not_representable");
    assert_eq!(details(&r)["pointer"], "/ratio");
    server.stop().await;
}

#[tokio::test]
async fn a_large_refund_requires_approval_and_the_same_call_gets_the_same_approval() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let args =
        r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
    let first = client
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.decision(), Decision::ApprovalRequired, "{first:?}");
    assert_eq!(code(&first), "approval_required");
    let approval = first.approval.clone().unwrap();
    assert!(!approval.approval_id.is_empty());
    assert!(approval.expires_at.unwrap().seconds > 0);
    assert_eq!(
        details(&first)["approval_id"],
        approval.approval_id.as_str()
    );
    // Reordered keys are the same call: same hash, same pending approval.
    let reordered =
        r#"{"reason":"damaged","currency":"USD","amount_cents":25000,"order_id":"ord_1001"}"#;
    let again = client
        .authorize(request("refund_order", reordered))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.arguments_sha256, first.arguments_sha256);
    assert_eq!(again.approval.unwrap().approval_id, approval.approval_id);
    // A new business operation is a new approval.
    let mut other = request("refund_order", args);
    other.request_id = "req-2".into();
    let other = client.authorize(other).await.unwrap().into_inner();
    assert_ne!(other.approval.unwrap().approval_id, approval.approval_id);
    // A small refund needs no approval.
    let small = r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#;
    assert_eq!(
        client
            .authorize(request("refund_order", small))
            .await
            .unwrap()
            .into_inner()
            .decision(),
        Decision::Allow
    );
    server.stop().await;
}

#[tokio::test]
async fn presented_approvals_are_checked_against_the_call() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let args =
        r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
    let first = client
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner();
    let approval_id = first.approval.unwrap().approval_id;

    let mut unknown = request("refund_order", args);
    unknown.approval_id = "no-such-approval".into();
    assert_eq!(
        code(&client.authorize(unknown).await.unwrap().into_inner()),
        "approval_not_found"
    );

    let mut pending = request("refund_order", args);
    pending.approval_id.clone_from(&approval_id);
    let r = client.authorize(pending).await.unwrap().into_inner();
    assert_eq!(code(&r), "approval_pending");
    assert!(r.error.as_ref().unwrap().retryable);

    let tampered =
        r#"{"order_id":"ord_1001","amount_cents":25001,"currency":"USD","reason":"damaged"}"#;
    let mut mismatch = request("refund_order", tampered);
    mismatch.approval_id.clone_from(&approval_id);
    assert_eq!(
        code(&client.authorize(mismatch).await.unwrap().into_inner()),
        "approval_mismatch"
    );

    // Another tenant cannot even see it.
    let mut foreign = request("refund_order", args);
    foreign.auth = Some(auth(
        "bob",
        "globex",
        &["support_agent"],
        &["orders:refund"],
    ));
    foreign.approval_id = approval_id;
    assert_eq!(
        code(&client.authorize(foreign).await.unwrap().into_inner()),
        "approval_not_found"
    );
    server.stop().await;
}

#[tokio::test]
async fn destructive_tools_always_wait_for_a_human() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut req = request(
        "delete_account",
        r#"{"customer_id":"cus_alice","confirm":true,"reason":"customer asked"}"#,
    );
    req.auth = Some(auth(
        "dana",
        "acme",
        &["support_admin"],
        &["accounts:delete"],
    ));
    let r = client.authorize(req).await.unwrap().into_inner();
    assert_eq!(r.decision(), Decision::ApprovalRequired, "{r:?}");
    assert!(!r.parallel);
    server.stop().await;
}

#[tokio::test]
async fn an_unverified_address_gets_no_email() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .authorize(request(
            "send_email",
            r#"{"customer_id":"cus_carol","subject":"Hi","body":"Hello"}"#,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r), "forbidden");
    assert_eq!(
        r.error.as_ref().unwrap().message,
        "the customer's email address is not verified"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_passed_deadline_is_deadline_exhausted_with_keys_kept() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut req = request("get_order", r#"{"order_id":"ord_1001"}"#);
    req.deadline = Some(prost_types::Timestamp::from(
        SystemTime::now() - Duration::from_secs(1),
    ));
    let r = client.authorize(req).await.unwrap().into_inner();
    assert_eq!(r.decision(), Decision::Deny);
    assert_eq!(code(&r), "deadline_exhausted");
    let e = r.error.as_ref().unwrap();
    assert!(e.retryable);
    assert_eq!(e.resolution, "retry_same_key");
    assert!(
        !r.idempotency_key.is_empty(),
        "retrying with the same key needs the key"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_time_budget_follows_the_request_deadline_and_the_grpc_deadline() {
    let config = AuthorizerConfig {
        deadline_margin: Duration::from_millis(500),
        ..AuthorizerConfig::default()
    };
    let server = TestServer::start_with(&crate::support::example_policies(), config).await;
    let mut client = server.client().await;
    let mut req = request("get_order", r#"{"order_id":"ord_1001"}"#);
    req.deadline = Some(prost_types::Timestamp::from(
        SystemTime::now() + Duration::from_millis(1500),
    ));
    let r = client.authorize(req).await.unwrap().into_inner();
    assert_eq!(r.decision(), Decision::Allow);
    assert!(r.timeout_ms <= 1000 && r.timeout_ms > 0, "{}", r.timeout_ms);

    // The gRPC deadline alone: 30 s leaves the tool's own 2 s limit.
    let mut grpc = tonic::Request::new(request("get_order", r#"{"order_id":"ord_1001"}"#));
    grpc.set_timeout(Duration::from_secs(30));
    assert_eq!(
        client
            .authorize(grpc)
            .await
            .unwrap()
            .into_inner()
            .timeout_ms,
        2000
    );

    // A gRPC deadline shorter than the margin leaves nothing.
    let mut short = tonic::Request::new(request("get_order", r#"{"order_id":"ord_1001"}"#));
    short.set_timeout(Duration::from_millis(400));
    let r = client.authorize(short).await.unwrap().into_inner();
    assert_eq!(code(&r), "deadline_exhausted");
    server.stop().await;
}

#[tokio::test]
async fn executor_mistakes_are_invalid_argument_with_bad_request_details() {
    let server = TestServer::start().await;
    let mut client = server.client().await;

    let mut no_auth = request("get_order", r#"{"order_id":"ord_1001"}"#);
    no_auth.auth = None;
    assert_eq!(
        bad_request_field(&client.authorize(no_auth).await.unwrap_err()),
        "auth"
    );

    let mut no_tenant = request("get_order", r#"{"order_id":"ord_1001"}"#);
    no_tenant.auth = Some(auth("bob", "", &[], &[]));
    assert_eq!(
        bad_request_field(&client.authorize(no_tenant).await.unwrap_err()),
        "auth.tenant_id"
    );

    let no_tool = request("", "{}");
    assert_eq!(
        bad_request_field(&client.authorize(no_tool).await.unwrap_err()),
        "tool"
    );

    let mut no_request_id = request(
        "refund_order",
        r#"{"order_id":"ord_1001","amount_cents":100,"currency":"USD","reason":"late"}"#,
    );
    no_request_id.request_id = String::new();
    assert_eq!(
        bad_request_field(&client.authorize(no_request_id).await.unwrap_err()),
        "request_id"
    );

    // A read needs no request id.
    let mut read = request("get_order", r#"{"order_id":"ord_1001"}"#);
    read.request_id = String::new();
    assert_eq!(
        client
            .authorize(read)
            .await
            .unwrap()
            .into_inner()
            .decision(),
        Decision::Allow
    );

    let mut bad_entities = request("get_order", r#"{"order_id":"ord_1001"}"#);
    bad_entities.entities_json = "{not json".into();
    assert_eq!(
        bad_request_field(&client.authorize(bad_entities).await.unwrap_err()),
        "entities_json"
    );

    let mut wrong_shape = request("get_order", r#"{"order_id":"ord_1001"}"#);
    wrong_shape.entities_json =
        r#"[{"uid":{"type":"Order","id":"ord_1001"},"attrs":{"total_cents":"lots"},"parents":[]}]"#
            .into();
    assert_eq!(
        bad_request_field(&client.authorize(wrong_shape).await.unwrap_err()),
        "entities_json"
    );

    let mut forged_principal = request("get_order", r#"{"order_id":"ord_1001"}"#);
    forged_principal.entities_json = r#"[{"uid":{"type":"User","id":"bob"},"attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"roles":["support_admin"]},"parents":[]}]"#.into();
    assert_eq!(
        bad_request_field(&client.authorize(forged_principal).await.unwrap_err()),
        "entities_json"
    );
    server.stop().await;
}

#[tokio::test]
async fn batch_authorize_answers_in_order_and_schedules_waves() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let small = r#"{"order_id":"ord_1001","amount_cents":1000,"currency":"USD","reason":"late"}"#;
    let mut second_refund = request("refund_order", small);
    second_refund.request_id = "req-2".into();
    let requests = vec![
        request("get_order", r#"{"order_id":"ord_1001"}"#),
        request("refund_order", small),
        request("search_docs", r#"{"query":"x"}"#),
        second_refund,
        request("get_order", r#"{"order_id":"ord_2001"}"#),
    ];
    let r = client
        .batch_authorize(pb::BatchAuthorizeRequest { requests })
        .await
        .unwrap()
        .into_inner();
    let decisions: Vec<Decision> = r
        .responses
        .iter()
        .map(pb::AuthorizeResponse::decision)
        .collect();
    assert_eq!(
        decisions,
        vec![
            Decision::Allow,
            Decision::Allow,
            Decision::Allow,
            Decision::Allow,
            Decision::Deny
        ]
    );
    let waves: Vec<Vec<u32>> = r.waves.iter().map(|w| w.call_indexes.clone()).collect();
    assert_eq!(waves, vec![vec![0, 2], vec![1], vec![3]]);
    server.stop().await;
}

#[tokio::test]
async fn list_tools_is_in_name_order_with_schemas() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = r.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "delete_account",
            "get_order",
            "read_secret",
            "refund_order",
            "search_docs",
            "send_email",
            "update_preferences"
        ]
    );
    let refund = r.tools.iter().find(|t| t.name == "refund_order").unwrap();
    assert_eq!(refund.risk(), pb::RiskLevel::Financial);
    assert_eq!(refund.timeout_ms, 10000);
    let schema: serde_json::Value = serde_json::from_str(&refund.input_schema_json).unwrap();
    assert_eq!(schema["required"][1], "amount_cents");
    assert!(!refund.output_schema_json.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn validate_result_checks_the_output_schema() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let ok = client
        .validate_result(pb::ValidateResultRequest {
            tool: "refund_order".into(),
            result_json: r#"{"refund_id":"re_1","amount_cents":100}"#.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ok.valid && ok.error.is_none());
    let bad = client
        .validate_result(pb::ValidateResultRequest {
            tool: "refund_order".into(),
            result_json: r#"{"refund_id":"re_1"}"#.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!bad.valid);
    let e = bad.error.unwrap();
    assert_eq!(e.code, "output_invalid");
    let d: serde_json::Value = serde_json::from_str(&e.details_json).unwrap();
    assert_eq!(d["violations"][0]["keyword"], "required");
    server.stop().await;
}

#[tokio::test]
async fn health_serves_and_reflection_lists_the_services() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let server = TestServer::start().await;
    let mut health = HealthClient::new(server.channel().await);
    for service in [
        "",
        "toolgate.v1.AuthorizationService",
        "toolgate.v1.ApprovalService",
        "toolgate.v1.LedgerService",
        "toolgate.v1.EntityService",
    ] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service}");
    }

    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(server.channel().await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let msg = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("{msg:?}")
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert!(
        names.contains(&"toolgate.v1.AuthorizationService".to_owned()),
        "{names:?}"
    );
    for service in ["toolgate.v1.LedgerService", "toolgate.v1.EntityService"] {
        assert!(names.contains(&service.to_owned()), "{names:?}");
    }
    server.stop().await;
}

/// Sets an approval's state in the server's SQLite file, as a decision
/// through `ApprovalService` would.
fn set_approval(server: &TestServer, approval_id: &str, status: &str, expires_at_ms: i64) {
    let conn = rusqlite::Connection::open(&server.db_path).unwrap();
    let n = conn
        .execute(
            "UPDATE approvals SET status = ?1, expires_at = ?2, decided_by = 'dana' WHERE approval_id = ?3",
            rusqlite::params![status, expires_at_ms, approval_id],
        )
        .unwrap();
    assert_eq!(n, 1);
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_granted_approval_allows_exactly_its_call_for_one_operation() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let args =
        r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
    let first = client
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner();
    let approval_id = first.approval.unwrap().approval_id;
    set_approval(&server, &approval_id, "APPROVED", now_ms() + 600_000);

    let mut with_approval = request("refund_order", args);
    with_approval.approval_id.clone_from(&approval_id);
    let allowed = client
        .authorize(with_approval.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{allowed:?}");
    assert_eq!(allowed.idempotency_key, first.idempotency_key);
    // A retry of the same operation (same key) may use it again.
    assert_eq!(
        client
            .authorize(with_approval.clone())
            .await
            .unwrap()
            .into_inner()
            .decision(),
        Decision::Allow
    );
    // Another operation (another request id) may not: not the call approved.
    let mut other = with_approval.clone();
    other.request_id = "req-other".into();
    assert_eq!(
        code(&client.authorize(other).await.unwrap().into_inner()),
        "approval_mismatch"
    );
    // Changing one argument after approval is refused.
    let mut changed = request(
        "refund_order",
        r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"EUR","reason":"damaged"}"#,
    );
    changed.approval_id = approval_id;
    assert_eq!(
        code(&client.authorize(changed).await.unwrap().into_inner()),
        "approval_mismatch"
    );
    server.stop().await;
}

#[tokio::test]
async fn rejected_and_expired_approvals_are_refused() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let args =
        r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
    let approval_id = client
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap()
        .approval_id;
    let mut with_approval = request("refund_order", args);
    with_approval.approval_id.clone_from(&approval_id);

    set_approval(&server, &approval_id, "REJECTED", now_ms() + 600_000);
    assert_eq!(
        code(
            &client
                .authorize(with_approval.clone())
                .await
                .unwrap()
                .into_inner()
        ),
        "approval_rejected"
    );
    set_approval(&server, &approval_id, "APPROVED", now_ms() - 1);
    assert_eq!(
        code(
            &client
                .authorize(with_approval.clone())
                .await
                .unwrap()
                .into_inner()
        ),
        "approval_expired"
    );
    set_approval(&server, &approval_id, "EXPIRED", now_ms() - 1);
    let r = client.authorize(with_approval).await.unwrap().into_inner();
    assert_eq!(code(&r), "approval_expired");
    assert_eq!(r.error.unwrap().resolution, "request_new_approval");
    server.stop().await;
}

#[tokio::test]
async fn a_store_failure_denies_with_a_retryable_internal_error() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    rusqlite::Connection::open(&server.db_path)
        .unwrap()
        .execute_batch("DROP TABLE approvals")
        .unwrap();
    let args =
        r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
    let r = client
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::Deny);
    assert_eq!(code(&r), "internal_error");
    let e = r.error.unwrap();
    assert!(e.retryable);
    assert!(
        !e.message.contains("approvals") && !e.message.to_lowercase().contains("sql"),
        "{}",
        e.message
    );
    server.stop().await;
}

#[tokio::test]
async fn a_bad_identity_token_is_refused_by_the_approval_service() {
    let server = TestServer::start().await;
    let mut approvals =
        pb::approval_service_client::ApprovalServiceClient::new(server.channel().await);
    let e = approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: "anything".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(
        e.get_error_details().error_info().unwrap().reason,
        "unauthorized"
    );
    let r = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: "anything".into(),
            approval_id: "a".into(),
            verdict: pb::Verdict::Approve.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.error.unwrap().code, "unauthorized");
    assert!(r.approval.is_none());
    server.stop().await;
}
