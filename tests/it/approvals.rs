//! The approval lifecycle over real gRPC with real signed tokens.

use tonic::transport::Channel;

use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::support::{TestServer, auth, code, request, token};

const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;

async fn pending(server: &TestServer) -> pb::AuthorizeResponse {
    let mut client = server.client().await;
    let r = client
        .authorize(request("refund_order", BIG_REFUND))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::ApprovalRequired);
    r
}

async fn next(s: &mut tonic::Streaming<pb::WatchApprovalsResponse>) -> pb::ApprovalEvent {
    let wait = std::time::Duration::from_secs(10);
    tokio::time::timeout(wait, s.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .event
        .unwrap()
}

async fn decide(
    approvals: &mut ApprovalServiceClient<Channel>,
    token: &str,
    approval_id: &str,
    verdict: pb::Verdict,
    sha: &str,
) -> pb::DecideApprovalResponse {
    approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: token.into(),
            approval_id: approval_id.into(),
            verdict: verdict.into(),
            arguments_sha256: sha.into(),
            reason: "checked with the customer".into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn the_full_flow_pending_approved_allowed_once_per_operation() {
    let server = TestServer::start().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let mut client = server.client().await;
    let first = pending(&server).await;
    let approval_id = first.approval.unwrap().approval_id;
    let admin = token("dana", "acme", &["support_admin"]);

    let shown = approvals
        .get_approval(pb::GetApprovalRequest {
            identity_token: admin.clone(),
            approval_id: approval_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(shown.status(), pb::ApprovalStatus::Pending);
    assert_eq!(shown.requester_subject_id, "bob");
    assert_eq!(shown.arguments_sha256, first.arguments_sha256);

    let decided = decide(
        &mut approvals,
        &admin,
        &approval_id,
        pb::Verdict::Approve,
        &shown.arguments_sha256,
    )
    .await;
    assert_eq!(decided.error, None);
    let decided = decided.approval.unwrap();
    assert_eq!(decided.status(), pb::ApprovalStatus::Approved);
    assert_eq!(decided.decided_by, "dana");

    let mut retry = request("refund_order", BIG_REFUND);
    retry.approval_id.clone_from(&approval_id);
    assert_eq!(
        client
            .authorize(retry.clone())
            .await
            .unwrap()
            .into_inner()
            .decision(),
        Decision::Allow
    );
    assert_eq!(
        client
            .authorize(retry.clone())
            .await
            .unwrap()
            .into_inner()
            .decision(),
        Decision::Allow
    );
    let mut other = retry.clone();
    other.request_id = "req-other".into();
    assert_eq!(
        code(&client.authorize(other).await.unwrap().into_inner()),
        "approval_consumed"
    );

    // The first decision wins; a second is refused.
    let again = decide(
        &mut approvals,
        &admin,
        &approval_id,
        pb::Verdict::Reject,
        &shown.arguments_sha256,
    )
    .await;
    assert_eq!(again.error.unwrap().code, "approval_already_decided");
    server.stop().await;
}

#[tokio::test]
async fn approvers_are_authorized_by_policy_and_bound_to_the_hash_shown() {
    let server = TestServer::start().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let first = pending(&server).await;
    let id = first.approval.unwrap().approval_id;
    let sha = first.arguments_sha256;

    let self_approval = decide(
        &mut approvals,
        &token("bob", "acme", &["support_admin"]),
        &id,
        pb::Verdict::Approve,
        &sha,
    )
    .await;
    let e = self_approval.error.unwrap();
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("forbidden", "nobody may approve their own request")
    );

    let no_role = decide(
        &mut approvals,
        &token("erin", "acme", &["support_agent"]),
        &id,
        pb::Verdict::Approve,
        &sha,
    )
    .await;
    assert_eq!(no_role.error.unwrap().code, "forbidden");

    // Another tenant's approver cannot even find it.
    let foreign = decide(
        &mut approvals,
        &token("gina", "globex", &["support_admin"]),
        &id,
        pb::Verdict::Approve,
        &sha,
    )
    .await;
    assert_eq!(foreign.error.unwrap().code, "approval_not_found");

    let wrong_hash = decide(
        &mut approvals,
        &token("dana", "acme", &["support_admin"]),
        &id,
        pb::Verdict::Approve,
        &"0".repeat(64),
    )
    .await;
    assert_eq!(wrong_hash.error.unwrap().code, "approval_mismatch");

    let rejected = decide(
        &mut approvals,
        &token("dana", "acme", &["support_admin"]),
        &id,
        pb::Verdict::Reject,
        &sha,
    )
    .await;
    assert_eq!(
        rejected.approval.unwrap().status(),
        pb::ApprovalStatus::Rejected
    );
    let mut client = server.client().await;
    let mut retry = request("refund_order", BIG_REFUND);
    retry.approval_id = id;
    assert_eq!(
        code(&client.authorize(retry).await.unwrap().into_inner()),
        "approval_rejected"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_first_of_sixteen_concurrent_decisions_wins() {
    let server = TestServer::start().await;
    let first = pending(&server).await;
    let id = first.approval.unwrap().approval_id;
    let sha = first.arguments_sha256;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let channel = server.channel().await;
        let (id, sha) = (id.clone(), sha.clone());
        tasks.push(tokio::spawn(async move {
            let mut approvals = ApprovalServiceClient::new(channel);
            let verdict = if i % 2 == 0 {
                pb::Verdict::Approve
            } else {
                pb::Verdict::Reject
            };
            decide(
                &mut approvals,
                &token(&format!("admin{i}"), "acme", &["support_admin"]),
                &id,
                verdict,
                &sha,
            )
            .await
        }));
    }
    let mut won = 0;
    let mut refused = 0;
    for t in tasks {
        let r = t.await.unwrap();
        match r.error {
            None => won += 1,
            Some(e) => {
                assert_eq!(e.code, "approval_already_decided");
                refused += 1;
            }
        }
    }
    assert_eq!((won, refused), (1, 15));
    server.stop().await;
}

#[tokio::test]
async fn listing_is_scoped_to_the_tenant_and_paginated() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for i in 0..5 {
        let mut req = request("refund_order", BIG_REFUND);
        req.request_id = format!("req-{i}");
        assert_eq!(
            client.authorize(req).await.unwrap().into_inner().decision(),
            Decision::ApprovalRequired
        );
    }
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let admin = token("dana", "acme", &["support_admin"]);
    let mut seen = Vec::new();
    let mut page_token = String::new();
    for _ in 0..10 {
        let page = approvals
            .list_approvals(pb::ListApprovalsRequest {
                identity_token: admin.clone(),
                status: pb::ApprovalStatus::Pending.into(),
                page_size: 2,
                page_token: page_token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.approvals.len() <= 2);
        seen.extend(page.approvals.into_iter().map(|a| a.request_id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    seen.sort();
    assert_eq!(seen, vec!["req-0", "req-1", "req-2", "req-3", "req-4"]);
    let other = approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: token("gina", "globex", &["support_admin"]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(other.approvals.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn the_watch_stream_receives_created_and_decided_events() {
    let server = TestServer::start().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let admin = token("dana", "acme", &["support_admin"]);
    let mut stream = approvals
        .watch_approvals(pb::WatchApprovalsRequest {
            identity_token: admin.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    // Another tenant's approval must not appear on this stream.
    let mut client = server.client().await;
    let mut foreign = request(
        "refund_order",
        r#"{"order_id":"ord_2001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#,
    );
    foreign.auth = Some(auth(
        "gus",
        "globex",
        &["support_agent"],
        &["orders:refund"],
    ));
    let _ = client.authorize(foreign).await.unwrap();
    let first = pending(&server).await;
    let id = first.approval.unwrap().approval_id;
    let wait = std::time::Duration::from_secs(10);
    let created = tokio::time::timeout(wait, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .event
        .unwrap();
    assert_eq!(created.kind(), pb::ApprovalEventKind::Created);
    assert_eq!(created.approval.unwrap().approval_id, id);
    let _ = decide(
        &mut approvals,
        &admin,
        &id,
        pb::Verdict::Approve,
        &first.arguments_sha256,
    )
    .await;
    let decided = tokio::time::timeout(wait, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .event
        .unwrap();
    assert_eq!(decided.kind(), pb::ApprovalEventKind::Decided);
    // An open watch does not hold up a graceful shutdown (`stop` is bounded):
    // the stream ends with UNAVAILABLE, so the UI watches again elsewhere.
    server.stop().await;
    let end = tokio::time::timeout(wait, stream.message()).await.unwrap();
    assert_eq!(end.unwrap_err().code(), tonic::Code::Unavailable);
    drop((approvals, client));
}

#[tokio::test]
async fn approvals_expire_on_the_clock_and_are_announced() {
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let clock = toolgate::clock::ManualClock::new(now);
    let server = TestServer::start_with_clock(clock.clone()).await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    // The test clock runs hours ahead: the token must outlive it.
    let admin = crate::support::token_valid_for("dana", "acme", &["support_admin"], 86_400);
    let mut stream = approvals
        .watch_approvals(pb::WatchApprovalsRequest {
            identity_token: admin.clone(),
        })
        .await
        .unwrap()
        .into_inner();

    // A pending approval expires after the pending TTL (default 1 h).
    let first = pending(&server).await;
    let id = first.approval.unwrap().approval_id;
    assert_eq!(
        next(&mut stream).await.kind(),
        pb::ApprovalEventKind::Created
    );
    clock.advance(3_600_001);
    let expired = next(&mut stream).await;
    assert_eq!(expired.kind(), pb::ApprovalEventKind::Expired);
    assert_eq!(expired.approval.unwrap().approval_id, id);
    let mut client = server.client().await;
    let mut retry = request("refund_order", BIG_REFUND);
    retry.approval_id.clone_from(&id);
    assert_eq!(
        code(&client.authorize(retry).await.unwrap().into_inner()),
        "approval_expired"
    );

    // A granted one expires after the contract's approvalTtlSeconds (900 s).
    let mut again = request("refund_order", BIG_REFUND);
    again.request_id = "req-2".into();
    let second = client.authorize(again.clone()).await.unwrap().into_inner();
    let id2 = second.approval.unwrap().approval_id;
    assert_eq!(
        next(&mut stream).await.kind(),
        pb::ApprovalEventKind::Created
    );
    let d = decide(
        &mut approvals,
        &admin,
        &id2,
        pb::Verdict::Approve,
        &second.arguments_sha256,
    )
    .await;
    assert!(d.error.is_none(), "{d:?}");
    assert_eq!(
        next(&mut stream).await.kind(),
        pb::ApprovalEventKind::Decided
    );
    clock.advance(900_001);
    assert_eq!(
        next(&mut stream).await.kind(),
        pb::ApprovalEventKind::Expired
    );
    again.approval_id = id2;
    assert_eq!(
        code(&client.authorize(again).await.unwrap().into_inner()),
        "approval_expired"
    );
    drop(stream);
    drop(approvals);
    drop(client);
    server.stop().await;
}
