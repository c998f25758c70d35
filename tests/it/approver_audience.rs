//! Issue 18 point 3, the rest, against a real `toolgate serve`:
//! approvers' tokens carry their own audience (`[identity]
//! approver_audience`), so the token an executor forwards for Authorize
//! cannot read or decide approvals; and open watches are capped per caller
//! (`[limits] max_watches_per_caller`), the others running on.
//!
//! On main at ab769e4 both fail: the config keys do not exist there (the
//! sidecar refuses to start), and without them the executor's forwarded
//! admin token lists and approves, and a caller opens watches without end.

use std::path::Path;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic_types::StatusExt as _;

use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::sidecar::Sidecar;
use crate::support::{approver_claims, auth, fixture, request, signed};

const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;

/// A token of `subject` in acme with `roles`, for the audience `aud`.
fn token_for(aud: &str, subject: &str, roles: &[&str]) -> String {
    let mut claims = approver_claims(subject, "acme", roles, 300);
    claims["aud"] = serde_json::json!(aud);
    claims["scope"] = serde_json::json!("orders:read orders:refund");
    signed(jsonwebtoken::Algorithm::ES256, Some("ec-1"), &claims)
}

/// A sidecar on `dir` with the test key set, executors' tokens required
/// (audience `toolgate`), and `extra` appended to its `toolgate.toml`.
fn sidecar(dir: &Path, extra: &str) -> Sidecar {
    std::fs::write(
        dir.join("toolgate.toml"),
        format!(
            "jwks_file = {:?}\nissuer = \"https://idp.test\"\naudience = \"toolgate\"\n\
             require_identity_token = true\n{extra}",
            fixture("keys/jwks.json")
        ),
    )
    .unwrap();
    Sidecar::start(dir, &[])
}

/// Authorize for `subject` (a support agent of acme) with its forwarded
/// `identity_token`: the refund that needs an approval.
async fn authorize(
    sidecar: &Sidecar,
    subject: &str,
    identity_token: &str,
    request_id: &str,
) -> pb::AuthorizeResponse {
    let mut req = request("refund_order", BIG_REFUND);
    let mut context = auth(subject, "acme", &["support_agent"], &[]);
    context.identity_token = identity_token.to_owned();
    req.auth = Some(context);
    req.request_id = request_id.to_owned();
    AuthorizationServiceClient::new(sidecar.channel().await)
        .authorize(req)
        .await
        .unwrap()
        .into_inner()
}

fn reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .and_then(|i| i.metadata.get("reason").cloned())
        .unwrap_or_default()
}

/// The attack: an executor holds the token a support admin's session
/// forwarded for Authorize (audience `toolgate`), and uses it on
/// ApprovalService to list bob's pending refund and approve it. With
/// `approver_audience` set, ApprovalService refuses that token on every
/// call; the admin's approval UI, whose token names the approvers'
/// audience, lists and decides; and Authorize still takes the executors'
/// tokens, never needing the approvers' audience (nor taking it alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_an_executor_forwards_cannot_read_or_decide_approvals() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(
        dir.path(),
        "[identity]\napprover_audience = \"toolgate-approvals\"\n",
    );
    let bob_forwarded = token_for("toolgate", "bob", &["support_agent"]);
    let pending = authorize(&sidecar, "bob", &bob_forwarded, "req-1").await;
    assert_eq!(
        pending.decision(),
        Decision::ApprovalRequired,
        "{pending:?}"
    );
    let approval_id = pending.approval.unwrap().approval_id;

    let mut approvals = ApprovalServiceClient::new(sidecar.channel().await);
    let forwarded_admin = token_for("toolgate", "dana", &["support_admin"]);
    let listed = approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: forwarded_admin.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(listed.code(), tonic::Code::Unauthenticated, "{listed:?}");
    assert_eq!(reason(&listed), "wrong_audience");
    let got = approvals
        .get_approval(pb::GetApprovalRequest {
            identity_token: forwarded_admin.clone(),
            approval_id: approval_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(got.code(), tonic::Code::Unauthenticated);
    let watched = approvals
        .watch_approvals(pb::WatchApprovalsRequest {
            identity_token: forwarded_admin.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(watched.code(), tonic::Code::Unauthenticated);
    assert_eq!(reason(&watched), "wrong_audience");
    let decided = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: forwarded_admin,
            approval_id: approval_id.clone(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: pending.arguments_sha256.clone(),
            reason: "looks fine".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let refusal = decided.error.expect("the forwarded token decided");
    assert_eq!(refusal.code, "unauthorized");
    assert!(
        refusal.details_json.contains("\"wrong_audience\""),
        "{refusal:?}"
    );

    // The approval UI's own token: it lists, gets and decides.
    let approver = token_for("toolgate-approvals", "dana", &["support_admin"]);
    let page = approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: approver.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = page
        .approvals
        .iter()
        .map(|a| a.approval_id.clone())
        .collect();
    assert_eq!(ids, std::slice::from_ref(&approval_id));
    let decided = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: approver.clone(),
            approval_id: approval_id.clone(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: pending.arguments_sha256.clone(),
            reason: "checked with the customer".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
    assert_eq!(
        decided.approval.unwrap().status(),
        pb::ApprovalStatus::Approved
    );

    // An approver's token is no executor's: Authorize refuses it.
    let mut as_executor = request("refund_order", BIG_REFUND);
    let mut context = auth("dana", "acme", &["support_admin"], &[]);
    context.identity_token = approver;
    as_executor.auth = Some(context);
    let refused = AuthorizationServiceClient::new(sidecar.channel().await)
        .authorize(as_executor)
        .await
        .unwrap()
        .into_inner();
    let envelope = refused
        .error
        .expect("an approver's token authorized a call");
    assert_eq!(envelope.code, "unauthorized");
    assert!(envelope.details_json.contains("\"wrong_audience\""));
}

/// Opens a watch; the status when it is refused.
async fn open_watch(
    approvals: &mut ApprovalServiceClient<Channel>,
    token: &str,
) -> Result<tonic::Streaming<pb::WatchApprovalsResponse>, tonic::Status> {
    approvals
        .watch_approvals(pb::WatchApprovalsRequest {
            identity_token: token.into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn next_created(s: &mut tonic::Streaming<pb::WatchApprovalsResponse>) -> String {
    let event = tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .event
        .unwrap();
    assert_eq!(event.kind(), pb::ApprovalEventKind::Created);
    event.approval.unwrap().approval_id
}

/// The attack: one approver (or a stolen approver token) opens watch after
/// watch until the sidecar runs out of tasks and memory. Over the cap the
/// next is RESOURCE_EXHAUSTED; the caller's open watches keep streaming,
/// another caller of the tenant still watches, and a watch whose client
/// went away frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_over_the_cap_are_refused_and_the_others_keep_running() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path(), "[limits]\nmax_watches_per_caller = 2\n");
    let dana = token_for("toolgate", "dana", &["support_admin"]);
    let erin = token_for("toolgate", "erin", &["support_agent"]);
    // Each watch on a connection of its own, as separate UIs would.
    let mut first = open_watch(
        &mut ApprovalServiceClient::new(sidecar.channel().await),
        &dana,
    )
    .await
    .unwrap();
    let second_channel = sidecar.channel().await;
    let mut second = open_watch(
        &mut ApprovalServiceClient::new(second_channel.clone()),
        &dana,
    )
    .await
    .unwrap();
    let over = open_watch(
        &mut ApprovalServiceClient::new(sidecar.channel().await),
        &dana,
    )
    .await
    .unwrap_err();
    assert_eq!(over.code(), tonic::Code::ResourceExhausted, "{over:?}");
    assert_eq!(
        over.get_details_error_info().unwrap().reason,
        "rate_limited"
    );
    let mut others = open_watch(
        &mut ApprovalServiceClient::new(sidecar.channel().await),
        &erin,
    )
    .await
    .unwrap();

    let bob = token_for("toolgate", "bob", &["support_agent"]);
    let pending = authorize(&sidecar, "bob", &bob, "req-1").await;
    let id = pending.approval.unwrap().approval_id;
    assert_eq!(next_created(&mut first).await, id);
    assert_eq!(next_created(&mut second).await, id);
    assert_eq!(next_created(&mut others).await, id);

    // The second UI goes away: its place is free again once the server
    // has seen it (bounded).
    drop(second);
    drop(second_channel);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut reopened = loop {
        match open_watch(
            &mut ApprovalServiceClient::new(sidecar.channel().await),
            &dana,
        )
        .await
        {
            Ok(stream) => break stream,
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted);
                assert!(
                    Instant::now() < deadline,
                    "the closed watch's place was never freed"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let again = authorize(&sidecar, "bob", &bob, "req-2").await;
    let id = again.approval.unwrap().approval_id;
    assert_eq!(next_created(&mut first).await, id);
    assert_eq!(next_created(&mut reopened).await, id);
}
