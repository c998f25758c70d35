//! What is recorded: the refund flow (allowed refund, refund needing a
//! human, the human's approval, the approved retry) with a recognisable
//! secret in the model's free-text `note` and real identity tokens for the
//! executor (`require_identity_token`) and the approver. The audit file
//! then holds exactly one event per decision and approval decision, with
//! every field a security team asks for — and neither the secret nor a
//! token. Also: rate limits, the executor's token rules, and the metrics
//! endpoint counting exactly what happened.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use toolgate::audit::{AuditConfig, AuditSink};
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::support::{
    Setup, TestServer, agent_bob, code, details, request, signed, token, unix_now,
};

const SECRET: &str = "SECRET-4111-1111-1111-1111";

fn refund(amount: u32) -> String {
    format!(
        r#"{{"order_id":"ord_1001","amount_cents":{amount},"currency":"USD","reason":"damaged","note":"card {SECRET}"}}"#
    )
}

/// bob's identity token as the executor's end user: what the principal comes from.
fn executor_token(subject: &str) -> String {
    let claims = serde_json::json!({
        "sub": subject, "tenant": "acme", "roles": ["support_agent"],
        "scope": "orders:read orders:refund", "iss": "https://idp.test", "aud": "toolgate",
        "exp": unix_now() + 300});
    signed(jsonwebtoken::Algorithm::ES256, Some("ec-1"), &claims)
}

/// An auth context that carries only the token, agent and session: the
/// principal's fields come from the token.
fn token_auth(token: &str) -> pb::AuthContext {
    pb::AuthContext {
        identity_token: token.to_owned(),
        agent_id: "support-bot".into(),
        session_id: "sess-9".into(),
        ..pb::AuthContext::default()
    }
}

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_has_one_event_per_decision_and_no_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    let server = TestServer::start_setup(Setup {
        audit: Some(AuditConfig {
            sink: AuditSink::File(audit_path.clone()),
            ..AuditConfig::default()
        }),
        require_identity_token: true,
        ..Setup::default()
    })
    .await;
    let mut client = server.client().await;
    let bob = executor_token("bob");
    let approver = token("dana", "acme", &["support_admin"]);

    // 1. A small refund: allowed, the principal from the token.
    let mut small = request("refund_order", &refund(2500));
    small.auth = Some(token_auth(&bob));
    small.request_id = "refund-small".into();
    small.call_id = "call-small".into();
    let allowed = client.authorize(small).await.unwrap().into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);

    // 2. A large one: a human must approve.
    let mut big = request("refund_order", &refund(25000));
    big.auth = Some(token_auth(&bob));
    big.request_id = "refund-big".into();
    big.call_id = "call-big".into();
    let required = client.authorize(big.clone()).await.unwrap().into_inner();
    assert_eq!(required.decision(), Decision::ApprovalRequired);
    let approval_id = required.approval.as_ref().unwrap().approval_id.clone();

    // 3. The human approves.
    let decided = ApprovalServiceClient::new(server.channel().await)
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: approver.clone(),
            approval_id: approval_id.clone(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: required.arguments_sha256.clone(),
            reason: "confirmed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);

    // 4. The retry with the approval is allowed.
    big.approval_id = approval_id.clone();
    big.call_id = "call-big-2".into();
    let retried = client.authorize(big).await.unwrap().into_inner();
    assert_eq!(retried.decision(), Decision::Allow, "{:?}", retried.error);

    assert!(server.audit.flush(Duration::from_secs(5)).await);
    let text = std::fs::read_to_string(&audit_path).unwrap();
    assert!(
        !text.contains(SECRET),
        "the model's secret reached the audit log"
    );
    assert!(
        !text.contains("card "),
        "argument text reached the audit log"
    );
    for t in [&bob, &approver] {
        let signature = t.rsplit('.').next().unwrap();
        assert!(!text.contains(signature), "a token reached the audit log");
    }
    let events = audit_lines(&audit_path);
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["decision", "decision", "approval_decision", "decision"],
        "{text}"
    );

    let fields = [
        "time",
        "decision_id",
        "request_id",
        "call_id",
        "tool",
        "tool_version",
        "policy_version",
        "tenant",
        "subject",
        "agent",
        "session",
        "peer",
        "idempotency_key",
        "arguments_sha256",
        "decision",
        "code",
        "policies",
        "approval_id",
        "latency_us",
    ];
    for (event, answer, call_id, request_id) in [
        (&events[0], &allowed, "call-small", "refund-small"),
        (&events[1], &required, "call-big", "refund-big"),
        (&events[3], &retried, "call-big-2", "refund-big"),
    ] {
        let keys: Vec<&str> = event
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected = fields.to_vec();
        expected.push("event");
        expected.sort_unstable();
        let mut keys_sorted = keys.clone();
        keys_sorted.sort_unstable();
        assert_eq!(keys_sorted, expected, "{event}");
        assert_eq!(event["decision_id"], answer.decision_id);
        assert_eq!(event["call_id"], call_id);
        assert_eq!(event["request_id"], request_id);
        assert_eq!(event["tool"], "refund_order");
        assert_eq!(event["tool_version"], "1.2.0");
        assert_eq!(event["policy_version"], answer.policy_version);
        // The principal is the token's, though no auth field named it.
        assert_eq!(
            (&event["tenant"], &event["subject"]),
            (&Value::from("acme"), &Value::from("bob"))
        );
        assert_eq!(
            (&event["agent"], &event["session"]),
            (&Value::from("support-bot"), &Value::from("sess-9"))
        );
        assert_eq!(event["idempotency_key"], answer.idempotency_key);
        assert_eq!(event["arguments_sha256"], answer.arguments_sha256);
        assert!(event["latency_us"].as_u64().is_some(), "{event}");
        assert!(!event["policies"].as_array().unwrap().is_empty(), "{event}");
    }
    assert_eq!(events[0]["decision"], "allow");
    assert_eq!(events[0]["code"], "");
    assert_eq!(events[0]["approval_id"], "");
    assert_eq!(events[1]["decision"], "approval_required");
    assert_eq!(events[1]["code"], "approval_required");
    assert_eq!(events[1]["approval_id"], approval_id);
    assert_eq!(events[3]["decision"], "allow");
    assert_eq!(events[3]["approval_id"], approval_id);

    let approval = &events[2];
    assert_eq!(approval["approval_id"], approval_id);
    assert_eq!(approval["outcome"], "approved");
    assert_eq!(approval["verdict"], "approve");
    assert_eq!(
        (&approval["tenant"], &approval["subject"]),
        (&Value::from("acme"), &Value::from("dana"))
    );
    assert_eq!(approval["requester"], "bob");
    assert_eq!(approval["tool"], "refund_order");
    assert_eq!(approval["arguments_sha256"], required.arguments_sha256);
    assert_eq!(approval["request_id"], "refund-big");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_required_tokens_the_principal_comes_from_the_token() {
    let server = TestServer::start_setup(Setup {
        require_identity_token: true,
        ..Setup::default()
    })
    .await;
    let mut client = server.client().await;
    let small = refund(2500);
    let ask = |auth: pb::AuthContext| {
        let mut r = request("refund_order", &small);
        r.auth = Some(auth);
        r
    };
    let bob = executor_token("bob");

    // Fields that agree with the token are fine.
    let mut agreeing = agent_bob();
    agreeing.identity_token = bob.clone();
    agreeing.scopes = vec!["orders:refund".into(), "orders:read".into()];
    let ok = client.authorize(ask(agreeing)).await.unwrap().into_inner();
    assert_eq!(ok.decision(), Decision::Allow, "{:?}", ok.error);

    let mut no_token = agent_bob();
    no_token.identity_token = String::new();
    let mut other_subject = token_auth(&bob);
    other_subject.subject_id = "alice".into();
    let mut other_tenant = token_auth(&bob);
    other_tenant.tenant_id = "globex".into();
    let mut more_roles = token_auth(&bob);
    more_roles.roles = vec!["support_admin".into()];
    let expired = {
        let claims = serde_json::json!({"sub": "bob", "tenant": "acme", "roles": [], "scope": "",
            "iss": "https://idp.test", "aud": "toolgate", "exp": unix_now() - 3600});
        token_auth(&signed(
            jsonwebtoken::Algorithm::ES256,
            Some("ec-1"),
            &claims,
        ))
    };
    for (auth, reason) in [
        (no_token, "missing_token"),
        (other_subject, "subject_mismatch"),
        (other_tenant, "tenant_mismatch"),
        (more_roles, "roles_mismatch"),
        (expired, "expired"),
    ] {
        let r = client.authorize(ask(auth)).await.unwrap().into_inner();
        assert_eq!(r.decision(), Decision::Deny, "{reason}");
        assert_eq!(code(&r), "unauthorized", "{reason}");
        assert_eq!(details(&r)["reason"], reason);
        assert_eq!(r.error.as_ref().unwrap().resolution, "reauthenticate");
        assert!(!r.model_output.contains(&bob), "{}", r.model_output);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_answer_rate_limited_with_retry_after() {
    use std::num::NonZeroU32;
    use toolgate::ratelimit::{Limit, RateLimitConfig};
    let nz = |n| NonZeroU32::new(n).unwrap();
    let server = TestServer::start_setup(Setup {
        rate_limits: RateLimitConfig {
            tenant: Some(Limit {
                calls: nz(1000),
                period: Duration::from_secs(1),
                burst: nz(1000),
            }),
            tools: [(
                "refund_order".to_owned(),
                Limit {
                    calls: nz(1),
                    period: Duration::from_secs(60),
                    burst: nz(2),
                },
            )]
            .into(),
        },
        ..Setup::default()
    })
    .await;
    let mut client = server.client().await;
    let small = refund(2500);
    for _ in 0..2 {
        let r = client
            .authorize(request("refund_order", &small))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.decision(), Decision::Allow, "{:?}", r.error);
    }
    let limited = client
        .authorize(request("refund_order", &small))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(limited.decision(), Decision::Deny);
    let envelope = limited.error.as_ref().unwrap();
    assert_eq!(
        (
            envelope.code.as_str(),
            envelope.category.as_str(),
            envelope.retryable,
            envelope.resolution.as_str()
        ),
        ("rate_limited", "rate_limit", true, "retry_same_key")
    );
    let d = details(&limited);
    assert_eq!(d["scope"], "tool");
    let wait = d["retry_after_ms"].as_u64().unwrap();
    // One token refills every 60 s; a few ms have passed since the burst.
    assert!((59_000..=60_000).contains(&wait), "{wait}");
    // Other tools of the tenant are not limited.
    let read = client
        .authorize(request("get_order", r#"{"order_id":"ord_1001"}"#))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.decision(), Decision::Allow, "{:?}", read.error);
    assert!(
        server
            .metrics
            .encode()
            .contains("toolgate_rate_limited_total{scope=\"tool\"} 1"),
        "{}",
        server.metrics.encode()
    );
    server.stop().await;
}

/// `GET /metrics` over HTTP/1.1 on a plain socket.
async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut body))
        .await
        .unwrap()
        .unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("application/openmetrics-text"), "{body}");
    body
}

/// The value of one exact series line, 0 when absent.
fn series(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_counts_exactly_what_happened() {
    let server = TestServer::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let endpoint = tokio::spawn(toolgate::metrics::serve(
        listener,
        std::sync::Arc::clone(&server.metrics),
        async {
            let _ = stopped.await;
        },
    ));
    let allow = r#"toolgate_decisions_total{tool="refund_order",decision="allow",code=""}"#;
    let violation =
        r#"toolgate_decisions_total{tool="refund_order",decision="deny",code="schema_violation"}"#;
    let unknown =
        r#"toolgate_decisions_total{tool="unknown",decision="deny",code="tool_not_found"}"#;
    let pending = r#"toolgate_approvals_total{state="pending"}"#;
    let latency = r#"toolgate_decision_duration_seconds_count{decision="allow"}"#;
    let before = scrape(addr).await;

    let mut client = server.client().await;
    for i in 0..3 {
        let mut r = request("refund_order", &refund(2500));
        r.request_id = format!("m-{i}");
        assert_eq!(
            client.authorize(r).await.unwrap().into_inner().decision(),
            Decision::Allow
        );
    }
    for _ in 0..2 {
        let r = client
            .authorize(request(
                "refund_order",
                r#"{"order_id":"ord_1001","amount_cents":"2500","currency":"USD","reason":"late"}"#,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(&r), "schema_violation");
    }
    // A tool name the model made up is counted under `unknown`, not as a new series.
    let made_up = client
        .authorize(request("transfer_all_funds_to_attacker", "{}"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&made_up), "tool_not_found");
    let big = client
        .authorize(request("refund_order", &refund(25000)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(big.decision(), Decision::ApprovalRequired);

    let after = scrape(addr).await;
    assert_eq!(series(&after, allow) - series(&before, allow), 3, "{after}");
    assert_eq!(
        series(&after, violation) - series(&before, violation),
        2,
        "{after}"
    );
    assert_eq!(
        series(&after, unknown) - series(&before, unknown),
        1,
        "{after}"
    );
    assert_eq!(
        series(&after, pending) - series(&before, pending),
        1,
        "{after}"
    );
    assert_eq!(
        series(&after, latency) - series(&before, latency),
        3,
        "{after}"
    );
    assert!(!after.contains("transfer_all_funds"), "{after}");
    let _ = stop.send(());
    endpoint.await.unwrap().unwrap();
    server.stop().await;
}
