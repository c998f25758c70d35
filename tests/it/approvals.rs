//! The approval lifecycle over real gRPC with real signed tokens.

use tonic::transport::Channel;

use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::support::{
    Backend, TestServer, agent_bob, auth, both_backends, code, details, request, token,
};

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

async fn the_full_flow_pending_approved_allowed_once_per_operation(backend: Backend) {
    let server = TestServer::start_on(backend).await;
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

    let decided = approve(&server, &approval_id, &shown.arguments_sha256).await;
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
    // Another operation is another request id: not the call approved.
    let mut other = retry.clone();
    other.request_id = "req-other".into();
    assert_eq!(
        code(&client.authorize(other).await.unwrap().into_inner()),
        "approval_mismatch"
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

async fn approvers_are_authorized_by_policy_and_bound_to_the_hash_shown(backend: Backend) {
    let server = TestServer::start_on(backend).await;
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

async fn the_first_of_sixteen_concurrent_decisions_wins(backend: Backend) {
    let server = TestServer::start_on(backend).await;
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

async fn listing_is_scoped_to_the_tenant_and_paginated(backend: Backend) {
    let server = TestServer::start_on(backend).await;
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

async fn the_watch_stream_receives_created_and_decided_events(backend: Backend) {
    let server = TestServer::start_on(backend).await;
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

/// The pending approvals of tenant `acme`, as its admin lists them.
async fn pending_count(approvals: &mut ApprovalServiceClient<Channel>) -> usize {
    approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: token("dana", "acme", &["support_admin"]),
            status: pb::ApprovalStatus::Pending.into(),
            page_size: 100,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .approvals
        .len()
}

/// At most 3 pending approvals per subject: bob's 4th distinct call is
/// refused `rate_limited` and requests nothing; the same call again still
/// gets its approval; another subject of the tenant is served; once one of
/// bob's is decided, bob may request again.
async fn a_subject_cannot_flood_approvers_past_its_pending_cap(backend: Backend) {
    let server = TestServer::configured(
        backend,
        std::sync::Arc::new(toolgate::clock::SystemClock),
        |c| {
            c.authorizer.pending_limits.per_subject = 3;
        },
    )
    .await;
    let mut client = server.client().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let call = |i: usize| {
        let mut req = request("refund_order", BIG_REFUND);
        req.request_id = format!("req-{i}");
        req
    };
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = client.authorize(call(i)).await.unwrap().into_inner();
        assert_eq!(r.decision(), Decision::ApprovalRequired);
        ids.push(r.approval.unwrap().approval_id);
    }
    let refused = client.authorize(call(3)).await.unwrap().into_inner();
    assert_eq!(refused.decision(), Decision::Deny);
    assert_eq!(code(&refused), "rate_limited");
    assert_eq!(details(&refused)["limit"], "pending_approvals_per_subject");
    assert!(refused.approval.is_none());
    assert_eq!(pending_count(&mut approvals).await, 3);

    // The same call again is its pending approval, not a new one.
    let again = client.authorize(call(1)).await.unwrap().into_inner();
    assert_eq!(again.decision(), Decision::ApprovalRequired);
    assert_eq!(again.approval.unwrap().approval_id, ids[1]);

    // Another subject of the same tenant is served.
    let mut carol = call(0);
    carol.auth = Some(pb::AuthContext {
        subject_id: "carol".into(),
        ..agent_bob()
    });
    let served = client.authorize(carol).await.unwrap().into_inner();
    assert_eq!(served.decision(), Decision::ApprovalRequired);
    assert_eq!(pending_count(&mut approvals).await, 4);

    let admin = token("dana", "acme", &["support_admin"]);
    let decided = decide(
        &mut approvals,
        &admin,
        &ids[0],
        pb::Verdict::Reject,
        &refused.arguments_sha256,
    )
    .await;
    assert_eq!(decided.error, None);
    let after = client.authorize(call(3)).await.unwrap().into_inner();
    assert_eq!(after.decision(), Decision::ApprovalRequired);
    assert_eq!(pending_count(&mut approvals).await, 4);
    server.stop().await;
}

async fn approvals_expire_on_the_clock_and_are_announced(backend: Backend) {
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let clock = toolgate::clock::ManualClock::new(now);
    let server = TestServer::start_with_clock_on(backend, clock.clone()).await;
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

/// Every way an identity token can fail, over real gRPC: each is
/// `unauthorized` with its reason, on every RPC, and never a decision.
#[tokio::test]
async fn every_token_failure_is_unauthorized_and_decides_nothing() {
    use crate::support::{approver_claims, signed, signed_with, unix_now};
    use base64::Engine as _;
    use jsonwebtoken::{Algorithm, EncodingKey};
    use tonic_types::StatusExt as _;

    let server = TestServer::start().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let first = pending(&server).await;
    let id = first.approval.unwrap().approval_id;
    let sha = first.arguments_sha256;

    let good = || approver_claims("dana", "acme", &["support_admin"], 300);
    let with = |key: &str, value: serde_json::Value| {
        let mut c = good();
        c[key] = value;
        c
    };
    let without = |key: &str| {
        let mut c = good();
        c.as_object_mut().unwrap().remove(key);
        c
    };
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let valid = signed(Algorithm::ES256, Some("ec-1"), &good());
    let parts: Vec<&str> = valid.split('.').collect();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64(&with("roles", serde_json::json!(["support_admin", "root"]))),
        parts[2]
    );
    let alg_none = format!(
        "{}.{}.",
        b64(&serde_json::json!({"alg": "none", "kid": "ec-1"})),
        b64(&good())
    );
    let unlisted = EncodingKey::from_rsa_pem(
        &std::fs::read(crate::support::fixture("keys/rsa-unlisted.pem")).unwrap(),
    )
    .unwrap();
    let rsa_public_as_secret = EncodingKey::from_secret(
        &std::fs::read(crate::support::fixture("keys/rsa.pub.pem")).unwrap(),
    )
    .unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("no token", String::new(), "malformed"),
        ("not a JWT", "not.a.jwt".into(), "malformed"),
        (
            "expired",
            signed(
                Algorithm::ES256,
                Some("ec-1"),
                &with("exp", (unix_now() - 3600).into()),
            ),
            "expired",
        ),
        (
            "not yet valid",
            signed(
                Algorithm::ES256,
                Some("ec-1"),
                &with("nbf", (unix_now() + 3600).into()),
            ),
            "not_yet_valid",
        ),
        (
            "wrong issuer",
            signed(
                Algorithm::ES256,
                Some("ec-1"),
                &with("iss", "https://evil.test".into()),
            ),
            "wrong_issuer",
        ),
        (
            "wrong audience",
            signed(
                Algorithm::ES256,
                Some("ec-1"),
                &with("aud", "another-service".into()),
            ),
            "wrong_audience",
        ),
        (
            "no audience",
            signed(Algorithm::ES256, Some("ec-1"), &without("aud")),
            "missing_claim",
        ),
        (
            "signed by a key outside the key set",
            signed_with(Algorithm::RS256, Some("rsa-1"), &good(), &unlisted),
            "bad_signature",
        ),
        ("tampered payload", tampered, "bad_signature"),
        (
            "unknown key id",
            signed(Algorithm::ES256, Some("ec-9"), &good()),
            "unknown_key",
        ),
        ("alg none", alg_none, "unsupported_algorithm"),
        (
            "HS256 keyed with the RSA public key",
            signed_with(
                Algorithm::HS256,
                Some("rsa-1"),
                &good(),
                &rsa_public_as_secret,
            ),
            "wrong_algorithm",
        ),
        (
            "no tenant claim",
            signed(Algorithm::ES256, Some("ec-1"), &without("tenant")),
            "missing_claim",
        ),
        (
            "roles not an array",
            signed(
                Algorithm::ES256,
                Some("ec-1"),
                &with("roles", "support_admin".into()),
            ),
            "invalid_claim",
        ),
    ];
    for (name, token, reason) in &cases {
        let e = approvals
            .get_approval(pb::GetApprovalRequest {
                identity_token: token.clone(),
                approval_id: id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{name}");
        let details = e.get_error_details();
        let info = details.error_info().unwrap();
        assert_eq!(
            (
                info.reason.as_str(),
                info.metadata.get("reason").map(String::as_str)
            ),
            ("unauthorized", Some(*reason)),
            "{name}"
        );
        assert!(
            !e.message().contains(token.as_str()) || token.is_empty(),
            "{name}"
        );

        let list = approvals
            .list_approvals(pb::ListApprovalsRequest {
                identity_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(list.code(), tonic::Code::Unauthenticated, "{name}");
        let watch = approvals
            .watch_approvals(pb::WatchApprovalsRequest {
                identity_token: token.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(watch.code(), tonic::Code::Unauthenticated, "{name}");

        let d = decide(&mut approvals, token, &id, pb::Verdict::Approve, &sha).await;
        assert!(d.approval.is_none(), "{name}");
        let e = d.error.unwrap();
        let details: serde_json::Value = serde_json::from_str(&e.details_json).unwrap();
        assert_eq!(
            (
                e.code.as_str(),
                e.resolution.as_str(),
                details["reason"].as_str()
            ),
            ("unauthorized", "reauthenticate", Some(*reason)),
            "{name}"
        );
    }

    // Nothing was decided; each algorithm's genuine token still works.
    for (alg, kid) in [
        (Algorithm::RS256, "rsa-1"),
        (Algorithm::ES256, "ec-1"),
        (Algorithm::EdDSA, "ed-1"),
        (Algorithm::HS256, "hs-1"),
    ] {
        let shown = approvals
            .get_approval(pb::GetApprovalRequest {
                identity_token: signed(alg, Some(kid), &good()),
                approval_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .approval
            .unwrap();
        assert_eq!(shown.status(), pb::ApprovalStatus::Pending, "{alg:?}");
    }
    server.stop().await;
}

/// Approvers see the arguments with the contract's `sensitive` pointers
/// redacted, in GetApproval, ListApprovals and the watch stream alike; the
/// hash they sign off is still that of the real arguments.
#[tokio::test]
async fn display_arguments_redact_the_sensitive_pointers() {
    let (dir, policies) = crate::support::copy_of_examples();
    let contract = policies.join("tools/refund_order.json");
    let mut refund: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&contract).unwrap()).unwrap();
    refund["sensitive"] = serde_json::json!(["/note"]);
    std::fs::write(&contract, refund.to_string()).unwrap();
    let server = TestServer::start_with(&policies, Default::default()).await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let admin = token("dana", "acme", &["support_admin"]);
    let mut stream = approvals
        .watch_approvals(pb::WatchApprovalsRequest {
            identity_token: admin.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let args = r#"{"note":"card 4111 1111 1111 1111","order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
    let first = server
        .client()
        .await
        .authorize(request("refund_order", args))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.decision(), Decision::ApprovalRequired);
    let id = first.approval.unwrap().approval_id;
    let expected = r#"{"amount_cents":25000,"currency":"USD","note":"[REDACTED]","order_id":"ord_1001","reason":"damaged"}"#;

    let shown = approvals
        .get_approval(pb::GetApprovalRequest {
            identity_token: admin.clone(),
            approval_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(shown.display_arguments, expected);
    assert_eq!(shown.arguments_sha256, first.arguments_sha256);
    assert_eq!(
        first.arguments_sha256,
        toolgate::decode::sha256_hex(first.normalized_arguments.as_bytes())
    );
    let listed = approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: admin.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.approvals.len(), 1);
    assert_eq!(listed.approvals[0].display_arguments, expected);
    let created = next(&mut stream).await;
    assert_eq!(created.approval.unwrap().display_arguments, expected);

    // Nothing the approval service returns holds the secret.
    let all = format!("{shown:?}{listed:?}");
    assert!(!all.contains("4111"), "{all}");
    server.stop().await;
    drop(dir);
}

/// The approval, read by an approver: its status and consuming key.
async fn state(server: &TestServer, approval_id: &str) -> (pb::ApprovalStatus, String) {
    let a = ApprovalServiceClient::new(server.channel().await)
        .get_approval(pb::GetApprovalRequest {
            identity_token: token("dana", "acme", &["support_admin"]),
            approval_id: approval_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    (a.status(), a.consumed_by_idempotency_key)
}

/// dana (a `support_admin` of acme) approves, having been shown `sha`.
async fn approve(server: &TestServer, approval_id: &str, sha: &str) -> pb::Approval {
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let admin = token("dana", "acme", &["support_admin"]);
    let decided = decide(
        &mut approvals,
        &admin,
        approval_id,
        pb::Verdict::Approve,
        sha,
    )
    .await;
    assert_eq!(decided.error, None);
    decided.approval.unwrap()
}

/// Asks for an approval of `BIG_REFUND` under `req-1` and grants it.
async fn approved(server: &TestServer) -> String {
    let first = pending(server).await;
    let approval_id = first.approval.unwrap().approval_id;
    approve(server, &approval_id, &first.arguments_sha256).await;
    approval_id
}

/// `call` presents the approval for another call: DENY with
/// `approval_mismatch`, and the approval stays APPROVED and unconsumed.
async fn refused_unconsumed(server: &TestServer, call: pb::AuthorizeRequest, approval_id: &str) {
    let mut client = server.client().await;
    let refused = client.authorize(call).await.unwrap().into_inner();
    assert_eq!(
        (refused.decision(), code(&refused)),
        (Decision::Deny, "approval_mismatch")
    );
    assert_eq!(
        state(server, approval_id).await,
        (pb::ApprovalStatus::Approved, String::new())
    );
}

/// DESIGN §4: an approval granted for request R1 presented with R2 is
/// refused (`approval_mismatch`) and not consumed; R1 is still allowed.
/// Asking again under R2 is another call: its own pending approval.
async fn an_approval_is_bound_to_its_request_id(backend: Backend) {
    let server = TestServer::start_on(backend).await;
    let mut client = server.client().await;
    let approval_id = approved(&server).await;

    let mut stolen = request("refund_order", BIG_REFUND);
    stolen.request_id = "req-2".into();
    stolen.approval_id.clone_from(&approval_id);
    refused_unconsumed(&server, stolen, &approval_id).await;

    let mut own = request("refund_order", BIG_REFUND);
    own.approval_id.clone_from(&approval_id);
    let allowed = client.authorize(own).await.unwrap().into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);
    assert_eq!(
        state(&server, &approval_id).await,
        (pb::ApprovalStatus::Approved, allowed.idempotency_key)
    );

    let mut r2 = request("refund_order", BIG_REFUND);
    r2.request_id = "req-2".into();
    let asked = client.authorize(r2).await.unwrap().into_inner();
    assert_eq!(asked.decision(), Decision::ApprovalRequired);
    assert_ne!(asked.approval.unwrap().approval_id, approval_id);
    server.stop().await;
}

/// Waits (at most 5 s) until the live contract of `refund_order` has
/// `version`.
async fn refund_version_is(server: &TestServer, version: &str) {
    let start = std::time::Instant::now();
    loop {
        let tools = server
            .client()
            .await
            .list_tools(pb::ListToolsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .tools;
        if tools
            .iter()
            .any(|t| t.name == "refund_order" && t.version == version)
        {
            return;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "refund_order {version} not live within 5 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// DESIGN §4: an approval granted for tool version 1.2.0 is refused
/// (`approval_mismatch`) once the contract is 1.3.0, and not consumed; back
/// on 1.2.0 the approved call is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_bound_to_its_tool_version() {
    let (_dir, policies) = crate::support::copy_of_examples();
    let contract = policies.join("tools/refund_order.json");
    let original = std::fs::read_to_string(&contract).unwrap();
    assert!(original.contains(r#""version": "1.2.0""#));
    let server = TestServer::start_reloading(&policies).await;
    let mut client = server.client().await;
    let approval_id = approved(&server).await;
    let mut with_approval = request("refund_order", BIG_REFUND);
    with_approval.approval_id.clone_from(&approval_id);

    let edit = |text: &str| {
        // Through a rename, so no reload reads half a file.
        let tmp = contract.with_extension("tmp-edit");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &contract).unwrap();
    };
    edit(&original.replace(r#""version": "1.2.0""#, r#""version": "1.3.0""#));
    refund_version_is(&server, "1.3.0").await;
    refused_unconsumed(&server, with_approval.clone(), &approval_id).await;

    edit(&original);
    refund_version_is(&server, "1.2.0").await;
    let allowed = client.authorize(with_approval).await.unwrap().into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);
    server.stop().await;
}

both_backends!(
    the_full_flow_pending_approved_allowed_once_per_operation,
    an_approval_is_bound_to_its_request_id,
    approvers_are_authorized_by_policy_and_bound_to_the_hash_shown,
    the_first_of_sixteen_concurrent_decisions_wins,
    listing_is_scoped_to_the_tenant_and_paginated,
    the_watch_stream_receives_created_and_decided_events,
    approvals_expire_on_the_clock_and_are_announced,
    a_subject_cannot_flood_approvers_past_its_pending_cap,
);
