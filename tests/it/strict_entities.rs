//! Issue 18.11: `entities_json` is decoded as strictly as the arguments, and
//! `BatchAuthorize` refuses a batch with an executor error in any entry
//! before any entry of it is decided.

use tonic_types::StatusExt as _;

use toolgate::decision::DEFAULT_MAX_ENTITIES_BYTES;
use toolgate::grpc::pb::{self, approval_service_client::ApprovalServiceClient};

use crate::support::{TestServer, bad_request_field, entities, request, token};

const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;

/// The reason of the `BadRequest` violation on `entities_json`.
fn entities_violation(status: &tonic::Status) -> String {
    assert_eq!(bad_request_field(status), "entities_json");
    let details = status.get_error_details();
    let bad = details.bad_request().expect("BadRequest details");
    bad.field_violations.first().unwrap().description.clone()
}

#[tokio::test]
async fn a_duplicate_key_in_entities_is_invalid_argument_not_a_decision() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let alice = r#""owner":{"__entity":{"type":"User","id":"alice"}}"#;
    let text = entities();
    assert!(text.contains(alice), "{text}");
    // The order's owner twice: alice, then bob (the caller). A last-wins
    // parser would decide bob's call as the owner's.
    let twice = format!(r#"{alice},"owner":{{"__entity":{{"type":"User","id":"bob"}}}}"#);
    let mut req = request("get_order", r#"{"order_id":"ord_1001"}"#);
    req.entities_json = text.replacen(alice, &twice, 1);
    let status = client.authorize(req).await.unwrap_err();
    let reason = entities_violation(&status);
    assert!(reason.contains("duplicate_key"), "{reason}");

    // Two `uid`s in one entity.
    let mut req = request("get_order", r#"{"order_id":"ord_1001"}"#);
    req.entities_json = text.replacen(
        r#""uid":{"type":"Order","id":"ord_1001"}"#,
        r#""uid":{"type":"Order","id":"ord_2001"},"uid":{"type":"Order","id":"ord_1001"}"#,
        1,
    );
    let status = client.authorize(req).await.unwrap_err();
    assert!(entities_violation(&status).contains("duplicate_key"));
    server.stop().await;
}

#[tokio::test]
async fn entities_over_the_limit_are_invalid_argument() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    // A valid array, one byte over the cap (whitespace is JSON).
    let text = entities();
    let padding = DEFAULT_MAX_ENTITIES_BYTES + 1 - text.len();
    let mut req = request("get_order", r#"{"order_id":"ord_1001"}"#);
    req.entities_json = format!("{text}{}", " ".repeat(padding));
    assert_eq!(req.entities_json.len(), DEFAULT_MAX_ENTITIES_BYTES + 1);
    let status = client.authorize(req).await.unwrap_err();
    let reason = entities_violation(&status);
    assert!(reason.contains("too_large"), "{reason}");

    // At the cap, it is decided.
    let mut req = request("get_order", r#"{"order_id":"ord_1001"}"#);
    req.entities_json = format!("{text}{}", " ".repeat(padding - 1));
    let r = client.authorize(req).await.unwrap().into_inner();
    assert_eq!(r.decision(), pb::Decision::Allow, "{r:?}");

    // Deeper than `limits.max_depth`.
    let mut req = request("get_order", r#"{"order_id":"ord_1001"}"#);
    req.entities_json = format!("[{}{}]", "[".repeat(70), "]".repeat(70));
    let status = client.authorize(req).await.unwrap_err();
    let reason = entities_violation(&status);
    assert!(reason.contains("too_deep"), "{reason}");
    server.stop().await;
}

#[tokio::test]
async fn a_batch_with_one_executor_error_is_refused_with_nothing_decided() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut big = request("refund_order", BIG_REFUND);
    big.request_id = "req-big".into();
    let mut no_request_id = request(
        "refund_order",
        r#"{"order_id":"ord_1001","amount_cents":1000,"currency":"USD","reason":"late"}"#,
    );
    no_request_id.request_id = String::new();
    let requests = vec![
        big.clone(),
        request("get_order", r#"{"order_id":"ord_1001"}"#),
        no_request_id,
    ];
    let status = client
        .batch_authorize(pb::BatchAuthorizeRequest { requests })
        .await
        .unwrap_err();
    assert_eq!(bad_request_field(&status), "request_id");

    // A bad `entities_json` in a later entry refuses the batch too.
    let mut bad_entities = request("get_order", r#"{"order_id":"ord_1001"}"#);
    bad_entities.entities_json = r#"[{"uid":1,"uid":2}]"#.into();
    let status = client
        .batch_authorize(pb::BatchAuthorizeRequest {
            requests: vec![big.clone(), bad_entities],
        })
        .await
        .unwrap_err();
    assert_eq!(bad_request_field(&status), "entities_json");

    // A batch past 128 calls (one model turn) is refused whole, its large
    // refund undecided; 128 is the most.
    let status = client
        .batch_authorize(pb::BatchAuthorizeRequest {
            requests: std::iter::once(big.clone())
                .chain(std::iter::repeat_n(
                    request("get_order", r#"{"order_id":"ord_1001"}"#),
                    128,
                ))
                .collect(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(bad_request_field(&status), "requests");
    let most = client
        .batch_authorize(pb::BatchAuthorizeRequest {
            requests: vec![request("get_order", r#"{"order_id":"ord_1001"}"#); 128],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(most.responses.len(), 128);

    // No approval was created for the large refund.
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let listed = approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: token("dana", "acme", &["support_admin"]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.approvals.is_empty(), "{:?}", listed.approvals);

    // The same large refund alone is decided, and does create one.
    let r = client.authorize(big).await.unwrap().into_inner();
    assert_eq!(r.decision(), pb::Decision::ApprovalRequired, "{r:?}");
    let listed = approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: token("dana", "acme", &["support_admin"]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.approvals.len(), 1);
    server.stop().await;
}
