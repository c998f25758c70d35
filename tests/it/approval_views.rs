//! Who may read approvals (issue 18 point 3): `ListApprovals`,
//! `GetApproval` and `WatchApprovals` answer only what Cedar's
//! `view_approval` lets the token's caller view, over a real server with
//! real signed tokens. The example policy: `support_admin` and
//! `support_agent` of the tenant view its approvals, a requester its own.

use tonic::transport::Channel;
use tonic_types::StatusExt as _;

use toolgate::decision::AuthorizerConfig;
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::support::{TestServer, auth, copy_of_examples, request, series, token, token_valid_for};

const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;

/// A pending refund approval requested by `subject` of `acme` (a support
/// agent as the executor says); its id.
async fn pending_of(server: &TestServer, subject: &str) -> String {
    let mut req = request("refund_order", BIG_REFUND);
    req.auth = Some(auth(
        subject,
        "acme",
        &["support_agent"],
        &["orders:refund"],
    ));
    req.request_id = format!("req-{subject}");
    let r = server
        .client()
        .await
        .authorize(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.decision(), Decision::ApprovalRequired);
    r.approval.unwrap().approval_id
}

/// The ids a token lists in `acme`, every page.
async fn listed(approvals: &mut ApprovalServiceClient<Channel>, token: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut page_token = String::new();
    for _ in 0..20 {
        let page = approvals
            .list_approvals(pb::ListApprovalsRequest {
                identity_token: token.into(),
                page_size: 1,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        ids.extend(page.approvals.into_iter().map(|a| a.approval_id));
        if page.next_page_token.is_empty() {
            ids.sort();
            return ids;
        }
        page_token = page.next_page_token;
    }
    panic!("the listing did not end within 20 pages");
}

/// `GetApproval`'s refusal: its status code, `ErrorInfo` reason and message.
async fn get_refused(
    approvals: &mut ApprovalServiceClient<Channel>,
    token: &str,
    approval_id: &str,
) -> (tonic::Code, String, String) {
    let e = approvals
        .get_approval(pb::GetApprovalRequest {
            identity_token: token.into(),
            approval_id: approval_id.into(),
        })
        .await
        .unwrap_err();
    let reason = e.get_error_details().error_info().unwrap().reason.clone();
    (e.code(), reason, e.message().to_owned())
}

async fn get_ok(
    approvals: &mut ApprovalServiceClient<Channel>,
    token: &str,
    approval_id: &str,
) -> pb::Approval {
    approvals
        .get_approval(pb::GetApprovalRequest {
            identity_token: token.into(),
            approval_id: approval_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap()
}

async fn watch(
    approvals: &mut ApprovalServiceClient<Channel>,
    token: &str,
) -> tonic::Streaming<pb::WatchApprovalsResponse> {
    approvals
        .watch_approvals(pb::WatchApprovalsRequest {
            identity_token: token.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The next event's kind and approval id, within 10 s.
async fn next(
    s: &mut tonic::Streaming<pb::WatchApprovalsResponse>,
) -> (pb::ApprovalEventKind, String) {
    let wait = std::time::Duration::from_secs(10);
    let event = tokio::time::timeout(wait, s.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .event
        .unwrap();
    (event.kind(), event.approval.unwrap().approval_id)
}

const REFUSED: &str = "this caller may not view this approval";

/// The attack: a valid token of the tenant without a viewing role reads
/// another subject's approvals. On main before `view_approval` it listed,
/// got and watched them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_a_viewing_role_reads_no_other_subjects_approvals() {
    let server = TestServer::start().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let mallory = token("mallory", "acme", &["customer"]);
    let mut stream = watch(&mut approvals, &mallory).await;
    let bobs = pending_of(&server, "bob").await;

    assert_eq!(listed(&mut approvals, &mallory).await, Vec::<String>::new());
    assert_eq!(
        get_refused(&mut approvals, &mallory, &bobs).await,
        (
            tonic::Code::PermissionDenied,
            "forbidden".to_owned(),
            REFUSED.to_owned()
        )
    );
    // The watch skipped bob's approval: the first event it streams is
    // mallory's own request, made after bob's.
    let own = pending_of(&server, "mallory").await;
    assert_eq!(
        next(&mut stream).await,
        (pb::ApprovalEventKind::Created, own.clone())
    );
    assert_eq!(listed(&mut approvals, &mallory).await, vec![own]);
    // Each approval withheld is counted: bob's on the list (twice), the
    // get, the watch.
    let text = server.metrics_endpoint().scrape().await;
    let refused = |call: &str| {
        series(
            &text,
            &format!(
                "toolgate_approval_views_refused_total{{operation=\"{call}\",outcome=\"forbidden\"}}"
            ),
        )
    };
    assert_eq!(
        (refused("list"), refused("get"), refused("watch")),
        (2, 1, 1)
    );
    drop(stream);
    server.stop().await;
}

/// An admin and a support agent of the tenant view every approval of it;
/// an admin of another tenant none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn support_roles_of_the_tenant_view_every_approval() {
    let server = TestServer::start().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let admin = token("dana", "acme", &["support_admin"]);
    let agent = token("erin", "acme", &["support_agent"]);
    let mut admin_stream = watch(&mut approvals, &admin).await;
    let bobs = pending_of(&server, "bob").await;
    let carols = pending_of(&server, "carol").await;
    let mut both = vec![bobs.clone(), carols.clone()];
    both.sort();
    assert_eq!(listed(&mut approvals, &admin).await, both);
    assert_eq!(listed(&mut approvals, &agent).await, both);
    assert_eq!(
        get_ok(&mut approvals, &admin, &carols)
            .await
            .requester_subject_id,
        "carol"
    );
    assert_eq!(
        get_ok(&mut approvals, &agent, &bobs)
            .await
            .requester_subject_id,
        "bob"
    );
    assert_eq!(
        next(&mut admin_stream).await,
        (pb::ApprovalEventKind::Created, bobs.clone())
    );
    assert_eq!(
        next(&mut admin_stream).await,
        (pb::ApprovalEventKind::Created, carols)
    );
    // Another tenant's admin: its own tenant's listing (empty), and acme's
    // approval is not found in its tenant.
    let gina = token("gina", "globex", &["support_admin"]);
    assert_eq!(listed(&mut approvals, &gina).await, Vec::<String>::new());
    let (code, reason, _) = get_refused(&mut approvals, &gina, &bobs).await;
    assert_eq!(
        (code, reason.as_str()),
        (tonic::Code::NotFound, "approval_not_found")
    );
    drop(admin_stream);
    server.stop().await;
}

/// A requester's token without a support role (an agent's own UI) lists,
/// gets and watches its own requests, and nobody else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requester_views_only_its_own_approvals() {
    let server = TestServer::start().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let bob = token("bob", "acme", &[]);
    let mut stream = watch(&mut approvals, &bob).await;
    let carols = pending_of(&server, "carol").await;
    let bobs = pending_of(&server, "bob").await;
    assert_eq!(listed(&mut approvals, &bob).await, vec![bobs.clone()]);
    assert_eq!(
        get_ok(&mut approvals, &bob, &bobs)
            .await
            .requester_subject_id,
        "bob"
    );
    assert_eq!(
        get_refused(&mut approvals, &bob, &carols).await,
        (
            tonic::Code::PermissionDenied,
            "forbidden".to_owned(),
            REFUSED.to_owned()
        )
    );
    assert_eq!(
        next(&mut stream).await,
        (pb::ApprovalEventKind::Created, bobs.clone())
    );
    // Carol's approval decided: not on bob's stream; his own, decided, is.
    for (id, sha) in [
        (&carols, sha_of(&mut approvals, &carols).await),
        (&bobs, sha_of(&mut approvals, &bobs).await),
    ] {
        let decided = approvals
            .decide_approval(pb::DecideApprovalRequest {
                identity_token: token("dana", "acme", &["support_admin"]),
                approval_id: id.clone(),
                verdict: pb::Verdict::Reject.into(),
                arguments_sha256: sha,
                reason: "no".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(decided.error, None);
    }
    assert_eq!(
        next(&mut stream).await,
        (pb::ApprovalEventKind::Decided, bobs)
    );
    drop(stream);
    server.stop().await;
}

async fn sha_of(approvals: &mut ApprovalServiceClient<Channel>, id: &str) -> String {
    get_ok(approvals, &token("dana", "acme", &["support_admin"]), id)
        .await
        .arguments_sha256
}

/// Fail closed: policies without a `view_approval` permit let nobody view,
/// not even an admin or the requester.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_view_policy_nobody_views() {
    let (_dir, policies) = copy_of_examples();
    let path = policies.join("approvals.cedar");
    let text = std::fs::read_to_string(&path).unwrap();
    let cut = text.find("@id(\"support-views-approvals\")").unwrap();
    std::fs::write(&path, &text[..cut]).unwrap();
    let server = TestServer::start_with(&policies, AuthorizerConfig::default()).await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let bobs = pending_of(&server, "bob").await;
    for who in [
        token("dana", "acme", &["support_admin"]),
        token("bob", "acme", &["support_agent"]),
    ] {
        assert_eq!(listed(&mut approvals, &who).await, Vec::<String>::new());
        assert_eq!(
            get_refused(&mut approvals, &who, &bobs).await,
            (
                tonic::Code::PermissionDenied,
                "forbidden".to_owned(),
                REFUSED.to_owned()
            )
        );
    }
    server.stop().await;
}

/// A watch ends within seconds of its token's expiry (UNAUTHENTICATED),
/// not at the verifier's leeway (5 s in the tests) or never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_token_expires() {
    let server = TestServer::start().await;
    let mut approvals = ApprovalServiceClient::new(server.channel().await);
    let short = token_valid_for("dana", "acme", &["support_admin"], 2);
    let started = std::time::Instant::now();
    let mut stream = watch(&mut approvals, &short).await;
    let wait = std::time::Duration::from_secs(10);
    let end = tokio::time::timeout(wait, stream.message()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(end.unwrap_err().code(), tonic::Code::Unauthenticated);
    assert!(took <= std::time::Duration::from_secs(3), "{took:?}");
    assert!(took >= std::time::Duration::from_millis(900), "{took:?}");
    drop(stream);
    server.stop().await;
}

/// A watch's task ends when its client goes away, with no event needed to
/// find the stream closed: the open-watch gauge goes back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_client_goes_away() {
    let server = TestServer::start().await;
    let metrics = server.metrics_endpoint();
    let open = |text: &str| series(text, "toolgate_approval_watches");
    let channel = server.channel().await;
    let mut approvals = ApprovalServiceClient::new(channel);
    let stream = watch(&mut approvals, &token("dana", "acme", &["support_admin"])).await;
    assert_eq!(open(&metrics.scrape().await), 1);
    drop((stream, approvals));
    let mut now = 1;
    for _ in 0..100 {
        now = open(&metrics.scrape().await);
        if now == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(now, 0, "the watch's task outlived its stream");
    server.stop().await;
}
