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
use toolgate::audit::{AuditConfig, AuditSink};
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::support::{
    TestServer, agent_bob, code, details, request, series, signed, token, unix_now,
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

/// A server auditing to a file, with the principal from executors' tokens;
/// the folder holding the file lives as long as the first value.
async fn audited_server() -> (tempfile::TempDir, std::path::PathBuf, TestServer) {
    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    let server = TestServer::start_setup(|c| {
        c.audit = AuditConfig {
            sink: AuditSink::File(audit_path.clone()),
            ..AuditConfig::default()
        };
        c.require_identity_token = true;
    })
    .await;
    (dir, audit_path, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_has_one_event_per_decision_and_no_secrets() {
    let (_dir, audit_path, server) = audited_server().await;
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
        "door",
        "action",
        "budgets",
        "charged",
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
    let server = TestServer::start_setup(|c| c.require_identity_token = true).await;
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
    let server = TestServer::start_setup(|c| {
        c.rate_limits = RateLimitConfig {
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
        };
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_counts_exactly_what_happened() {
    let server = TestServer::start().await;
    let endpoint = server.metrics_endpoint();
    let allow = r#"toolgate_decisions_total{tool="refund_order",decision="allow",code=""}"#;
    let violation =
        r#"toolgate_decisions_total{tool="refund_order",decision="deny",code="schema_violation"}"#;
    let unknown =
        r#"toolgate_decisions_total{tool="unknown",decision="deny",code="tool_not_found"}"#;
    let pending = r#"toolgate_approvals_total{state="pending"}"#;
    let latency = r#"toolgate_decision_duration_seconds_count{decision="allow"}"#;
    let before = endpoint.scrape().await;

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

    let after = endpoint.scrape().await;
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
    server.stop().await;
}

/// The series of one ledger count.
fn ledger_series(operation: &str, tool: &str, outcome: &str, state: &str) -> String {
    format!(
        "toolgate_ledger_transitions_total{{operation=\"{operation}\",tool=\"{tool}\",outcome=\"{outcome}\",state=\"{state}\"}}"
    )
}

/// The ledger, audited and counted transition by transition, with the
/// principal from the executor's identity token: an operation begun by
/// `Authorize` with `begin_execution`, completed with a result holding a
/// secret, retried (COMPLETED, nothing runs twice) and completed again with
/// a stale token; a second operation that ends UNKNOWN with an executor
/// error holding the secret and is reconciled; a begin without a token; a
/// reconciliation of a key nobody has. The audit file holds exactly one
/// event per call with the fields below and never a result, an executor's
/// message, the secret or a token; the metrics endpoint counts each by
/// tool, outcome and state, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ledger_transition_is_audited_and_counted() {
    use toolgate::grpc::pb::{BeginOutcome, CompletionStatus, ExecutionState};
    let (_dir, audit_path, server) = audited_server().await;
    let endpoint = server.metrics_endpoint();
    let before = endpoint.scrape().await;
    let mut client = server.client().await;
    let mut ledger = server.ledger().await;
    let bob = executor_token("bob");
    let result = format!(r#"{{"refund_id":"re_1","amount_cents":2500,"receipt":"{SECRET}"}}"#);

    // A: decided and begun in one call.
    let mut a = request("refund_order", &refund(2500));
    a.auth = Some(token_auth(&bob));
    a.request_id = "ledger-a".into();
    a.begin_execution = true;
    let decided = client.authorize(a).await.unwrap().into_inner();
    assert_eq!(decided.decision(), Decision::Allow, "{:?}", decided.error);
    let begun = decided.execution.clone().unwrap();
    assert_eq!(
        (begun.outcome(), begun.attempt),
        (BeginOutcome::Acquired, 1)
    );
    let key_a = decided.idempotency_key.clone();
    let complete = |key: &str, token: u64, status: CompletionStatus, result: &str| {
        pb::CompleteExecutionRequest {
            auth: Some(token_auth(&bob)),
            idempotency_key: key.to_owned(),
            fencing_token: token,
            status: status.into(),
            result_json: result.to_owned(),
            error: None,
        }
    };
    let done = ledger
        .complete_execution(complete(
            &key_a,
            begun.fencing_token,
            CompletionStatus::Succeeded,
            &result,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.state(), ExecutionState::Succeeded, "{:?}", done.error);
    let begin_a = pb::BeginExecutionRequest {
        auth: Some(token_auth(&bob)),
        idempotency_key: key_a.clone(),
        arguments_sha256: decided.arguments_sha256.clone(),
        tool: "refund_order".into(),
        lease_ms: 0,
        execution_ticket: decided.execution_ticket.clone(),
    };
    let retried = ledger
        .begin_execution(begin_a.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried.outcome(), BeginOutcome::Completed);
    let stale = ledger
        .complete_execution(complete(
            &key_a,
            begun.fencing_token + 1000,
            CompletionStatus::Succeeded,
            &result,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stale.error.unwrap().code, "lease_lost");

    // B: decided, then begun on the LedgerService; the executor times out
    // (its error names the secret), then reconciles: it was applied.
    let mut b = request("refund_order", &refund(3000));
    b.auth = Some(token_auth(&bob));
    b.request_id = "ledger-b".into();
    let decided_b = client.authorize(b).await.unwrap().into_inner();
    assert_eq!(decided_b.decision(), Decision::Allow);
    let key_b = decided_b.idempotency_key.clone();
    let begun_b = ledger
        .begin_execution(pb::BeginExecutionRequest {
            idempotency_key: key_b.clone(),
            arguments_sha256: decided_b.arguments_sha256.clone(),
            execution_ticket: decided_b.execution_ticket.clone(),
            ..begin_a.clone()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(begun_b.outcome(), BeginOutcome::Acquired);
    let mut unknown = complete(&key_b, begun_b.fencing_token, CompletionStatus::Unknown, "");
    unknown.error = Some(pb::ErrorEnvelope {
        code: "gateway_timeout".into(),
        message: format!("card {SECRET} timed out at the processor"),
        ..pb::ErrorEnvelope::default()
    });
    let unknown = ledger
        .complete_execution(unknown)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unknown.state(), ExecutionState::Unknown);
    let reconciled = ledger
        .reconcile_execution(pb::ReconcileExecutionRequest {
            auth: Some(token_auth(&bob)),
            idempotency_key: key_b.clone(),
            applied: true,
            result_json: result.clone(),
            fencing_token: begun_b.fencing_token,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reconciled.state(), ExecutionState::Succeeded);
    // The records are the token's tenant's: readable with the token…
    let record = ledger
        .get_execution(pb::GetExecutionRequest {
            auth: Some(token_auth(&bob)),
            idempotency_key: key_b.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.execution.unwrap().state(), ExecutionState::Succeeded);
    // …and by nobody without one.
    let mut no_token = agent_bob();
    no_token.identity_token = String::new();
    let refused_get = ledger
        .get_execution(pb::GetExecutionRequest {
            auth: Some(no_token.clone()),
            idempotency_key: key_b.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused_get.code(), tonic::Code::Unauthenticated);

    // C: a begin without a token is refused; D: a reconciliation of a key
    // nobody has.
    let refused = ledger
        .begin_execution(pb::BeginExecutionRequest {
            auth: Some(no_token),
            ..begin_a.clone()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (refused.outcome(), refused.error.unwrap().code.as_str()),
        (BeginOutcome::Refused, "unauthorized")
    );
    let missing = ledger
        .reconcile_execution(pb::ReconcileExecutionRequest {
            auth: Some(token_auth(&bob)),
            idempotency_key: "refund_order:nobody".into(),
            applied: false,
            result_json: String::new(),
            fencing_token: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    assert!(server.audit.flush(Duration::from_secs(5)).await);
    let text = std::fs::read_to_string(&audit_path).unwrap();
    for leak in [SECRET, "re_1", "timed out", "gateway_timeout\"", "receipt"] {
        assert!(
            !text.contains(leak),
            "`{leak}` reached the audit log:\n{text}"
        );
    }
    let signature = bob.rsplit('.').next().unwrap();
    assert!(!text.contains(signature), "a token reached the audit log");
    // Nor a fencing token (the holder's secret), nor an execution ticket.
    for secret in [begun.fencing_token, begun_b.fencing_token] {
        assert!(
            !text.contains(&secret.to_string()),
            "a fencing token reached the audit log"
        );
    }
    let ticket_mac = decided.execution_ticket.rsplit('.').next().unwrap();
    assert!(
        !ticket_mac.is_empty() && !text.contains(ticket_mac),
        "a ticket reached the audit log"
    );
    let events = audit_lines(&audit_path);
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap(),
                e["operation"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("decision", ""),
            ("ledger", "begin"),
            ("ledger", "complete"),
            ("ledger", "begin"),
            ("ledger", "complete"),
            ("decision", ""),
            ("ledger", "begin"),
            ("ledger", "complete"),
            ("ledger", "reconcile"),
            ("ledger", "begin"),
            ("ledger", "reconcile"),
        ],
        "{text}"
    );
    let mut fields = vec![
        "time",
        "event",
        "operation",
        "decision_id",
        "tenant",
        "subject",
        "agent",
        "session",
        "peer",
        "idempotency_key",
        "arguments_sha256",
        "tool",
        "tool_version",
        "policy_version",
        "reported",
        "outcome",
        "state",
        "code",
        "attempt",
        "latency_us",
    ];
    fields.sort_unstable();
    let sha_a = decided.arguments_sha256.as_str();
    let sha_b = decided_b.arguments_sha256.as_str();
    let (t_a, t_b) = (begun.fencing_token, begun_b.fencing_token);
    let row = |decision_id: &str,
               key: &str,
               sha: &str,
               (reported, outcome, state, code): (&str, &str, &str, &str),
               (token, attempt): (u64, u32)| {
        // The token the call carried is named only to say it is not logged.
        let _ = token;
        serde_json::json!({
            "decision_id": decision_id, "idempotency_key": key, "arguments_sha256": sha,
            "reported": reported, "outcome": outcome, "state": state, "code": code,
            "attempt": attempt,
        })
    };
    let (a, b) = (key_a.as_str(), key_b.as_str());
    let expected = [
        (
            1,
            row(
                &decided.decision_id,
                a,
                sha_a,
                ("", "acquired", "IN_PROGRESS", ""),
                (t_a, 1),
            ),
        ),
        (
            2,
            row("", a, sha_a, ("succeeded", "ok", "SUCCEEDED", ""), (t_a, 1)),
        ),
        (
            3,
            row("", a, sha_a, ("", "completed", "SUCCEEDED", ""), (0, 1)),
        ),
        (
            4,
            row(
                "",
                a,
                sha_a,
                ("succeeded", "lease_lost", "SUCCEEDED", "lease_lost"),
                (t_a + 1000, 1),
            ),
        ),
        (
            6,
            row("", b, sha_b, ("", "acquired", "IN_PROGRESS", ""), (t_b, 1)),
        ),
        (
            7,
            row(
                "",
                b,
                sha_b,
                ("unknown", "timeout_unknown", "UNKNOWN", "timeout_unknown"),
                (t_b, 1),
            ),
        ),
        (
            8,
            row("", b, sha_b, ("applied", "ok", "SUCCEEDED", ""), (0, 1)),
        ),
        (
            9,
            row("", a, sha_a, ("", "refused", "", "unauthorized"), (0, 0)),
        ),
        (
            10,
            row(
                "",
                "refund_order:nobody",
                "",
                ("not_applied", "not_found", "", ""),
                (0, 0),
            ),
        ),
    ];
    for (i, want) in expected {
        let e = &events[i];
        let mut keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, fields, "{e}");
        for (field, value) in want.as_object().unwrap() {
            assert_eq!(&e[field], value, "{field} of {e}");
        }
        assert_eq!(e["policy_version"], decided.policy_version, "{e}");
        assert!(e["latency_us"].as_u64().is_some(), "{e}");
        // The principal is the token's; without a token there is none.
        let who = if i == 9 {
            ("", "", "")
        } else {
            ("acme", "bob", "support-bot")
        };
        assert_eq!(
            (&e["tenant"], &e["subject"], &e["agent"]),
            (
                &Value::from(who.0),
                &Value::from(who.1),
                &Value::from(who.2)
            ),
            "{e}"
        );
        let (tool, version) = if i == 10 {
            ("", "")
        } else {
            ("refund_order", "1.2.0")
        };
        assert_eq!(
            (&e["tool"], &e["tool_version"]),
            (&Value::from(tool), &Value::from(version)),
            "{e}"
        );
    }
    assert_eq!(events[0]["decision_id"], decided.decision_id);

    let after = endpoint.scrape().await;
    for ((operation, tool, outcome, state), n) in [
        (("begin", "refund_order", "acquired", "IN_PROGRESS"), 2),
        (("begin", "refund_order", "completed", "SUCCEEDED"), 1),
        (("begin", "refund_order", "refused", ""), 1),
        (("complete", "refund_order", "ok", "SUCCEEDED"), 1),
        (("complete", "refund_order", "lease_lost", "SUCCEEDED"), 1),
        (
            ("complete", "refund_order", "timeout_unknown", "UNKNOWN"),
            1,
        ),
        (("reconcile", "refund_order", "ok", "SUCCEEDED"), 1),
        (("reconcile", "unknown", "not_found", ""), 1),
    ] {
        let name = ledger_series(operation, tool, outcome, state);
        assert_eq!(
            series(&after, &name) - series(&before, &name),
            n,
            "{name}\n{after}"
        );
    }
    let total: u64 = after
        .lines()
        .filter(|l| l.starts_with("toolgate_ledger_transitions_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 9, "one count per ledger call:\n{after}");
    server.stop().await;
}

/// The real `toolgate serve`, wired by `server::build` from its command
/// line and `toolgate.toml`, audits each kind of event through that wiring:
/// a decision, an approval decision, and a ledger begin and completion each
/// leave exactly their line in the configured file, in order. A builder
/// that left the audit out of any desk (or gave one a log of its own)
/// fails here, not only in the in-process tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_sidecar_audits_every_kind_of_event_through_its_wiring() {
    use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
    use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
    use toolgate::grpc::pb::{BeginOutcome, CompletionStatus, ExecutionState};

    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    std::fs::write(
        dir.path().join("toolgate.toml"),
        format!(
            "jwks_file = {:?}\nissuer = \"https://idp.test\"\naudience = \"toolgate\"\n\
             [audit]\nsink = \"file:{}\"\n",
            crate::support::fixture("keys/jwks.json")
                .display()
                .to_string(),
            audit_path.display()
        ),
    )
    .unwrap();
    let mut sidecar = crate::sidecar::Sidecar::start(dir.path(), &[]);
    let channel = sidecar.channel().await;
    let mut client = AuthorizationServiceClient::new(channel.clone());

    // A decision that needs a human, the human's approval, and the same
    // call again, begun in the ledger and completed.
    let mut big = request("refund_order", &refund(25000));
    big.request_id = "served-big".into();
    let required = client.authorize(big.clone()).await.unwrap().into_inner();
    assert_eq!(
        required.decision(),
        Decision::ApprovalRequired,
        "{required:?}"
    );
    let approval_id = required.approval.unwrap().approval_id;
    let decided = ApprovalServiceClient::new(channel.clone())
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: token("dana", "acme", &["support_admin"]),
            approval_id: approval_id.clone(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: required.arguments_sha256.clone(),
            reason: "confirmed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
    big.approval_id = approval_id.clone();
    big.begin_execution = true;
    let allowed = client.authorize(big).await.unwrap().into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);
    let begun = allowed.execution.unwrap();
    assert_eq!(begun.outcome(), BeginOutcome::Acquired);
    let done = LedgerServiceClient::new(channel)
        .complete_execution(pb::CompleteExecutionRequest {
            auth: Some(agent_bob()),
            idempotency_key: allowed.idempotency_key.clone(),
            fencing_token: begun.fencing_token,
            status: CompletionStatus::Succeeded.into(),
            result_json: r#"{"refund_id":"re_9","amount_cents":25000}"#.into(),
            error: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.state(), ExecutionState::Succeeded, "{:?}", done.error);

    // SIGTERM: the sidecar writes out its audit log before it exits.
    sidecar.signal("TERM");
    assert!(sidecar.wait_exit(Duration::from_secs(30)).success());
    let events = audit_lines(&audit_path);
    let seen: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            let event = e["event"].as_str().unwrap();
            let what = match event {
                "decision" => &e["decision"],
                "approval_decision" => &e["outcome"],
                _ => &e["operation"],
            };
            (event, what.as_str().unwrap())
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("decision", "approval_required"),
            ("approval_decision", "approved"),
            ("decision", "allow"),
            ("ledger", "begin"),
            ("ledger", "complete"),
        ],
        "{events:#?}"
    );
    assert_eq!(events[1]["approval_id"], approval_id);
    assert_eq!(events[2]["idempotency_key"], allowed.idempotency_key);
    assert_eq!(events[3]["idempotency_key"], allowed.idempotency_key);
    assert_eq!(events[4]["state"], "SUCCEEDED");
}
