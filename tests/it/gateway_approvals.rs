//! Approvals through a gateway (DESIGN §11.3), driven through the real
//! decision pipeline as `server::build` wires it, with `Door::Gateway` (the
//! door a gateway's transport would set), and decided by a human through
//! the real `ApprovalService` over gRPC with signed tokens.
//!
//! A gateway call names no approval and seldom the same request id twice:
//! it finds the approval of its call minus the request id — waits on a
//! pending one, runs once on an approved one, is told of a rejection —
//! while the executor door keeps DESIGN §4's binding.

use serde_json::Value;
use toolgate::access::TenantScope;
use toolgate::audit::{AuditConfig, AuditSink};
use toolgate::clock::{ManualClock, SystemClock};
use toolgate::decision::{AuthorizeInput, AuthorizeOutcome, Decision, Door};
use toolgate::grpc::pb;
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::identity::Caller;

use crate::support::{
    Backend, TestServer, both_backends, entities, series, token, token_valid_for,
};

const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;

/// A principal of the example with every scope a refund needs.
fn caller(subject: &str, tenant: &str) -> Caller {
    Caller {
        subject_id: subject.into(),
        tenant_id: tenant.into(),
        scopes: vec!["orders:read".into(), "orders:refund".into()],
        roles: vec!["support_agent".into()],
        agent_id: "mcp-client".into(),
        session_id: "mcp-session-1".into(),
    }
}

/// A gateway's `refund_order` call by `who` under `request_id`.
fn through_gateway(who: &Caller, request_id: &str, arguments: &str) -> AuthorizeInput {
    AuthorizeInput {
        tool: "refund_order".into(),
        arguments: arguments.as_bytes().to_vec(),
        caller: Some(who.clone()),
        call_id: format!("call-{request_id}"),
        request_id: request_id.into(),
        entities_json: entities(),
        peer: "gateway-under-test".into(),
        tenants: TenantScope::Any,
        door: Door::Gateway,
        ..AuthorizeInput::default()
    }
}

async fn decide(server: &TestServer, input: &AuthorizeInput) -> AuthorizeOutcome {
    server.authorizer.authorize(input).await.unwrap()
}

/// bob's gateway call of `BIG_REFUND` under `request_id`.
async fn bob(server: &TestServer, request_id: &str) -> AuthorizeOutcome {
    decide(
        server,
        &through_gateway(&caller("bob", "acme"), request_id, BIG_REFUND),
    )
    .await
}

fn code(o: &AuthorizeOutcome) -> &str {
    o.error.as_ref().map_or("", |e| e.code.as_str())
}

fn approval_id(o: &AuthorizeOutcome) -> String {
    o.approval.as_ref().map(|a| a.0.clone()).unwrap_or_default()
}

/// The model's view of a refusal, parsed.
fn model_output(o: &AuthorizeOutcome) -> Value {
    serde_json::from_str(&o.error.as_ref().unwrap().model_output()).unwrap()
}

/// APPROVAL_REQUIRED with a new approval (not one of `known`), named in
/// the envelope and the outcome alike; its id.
fn requested(o: &AuthorizeOutcome, known: &[&str]) -> String {
    assert_eq!(
        (o.decision, code(o)),
        (Decision::ApprovalRequired, "approval_required"),
        "{:?}",
        o.error
    );
    let id = approval_id(o);
    assert_eq!(
        o.error.as_ref().unwrap().details["approval_id"],
        id.as_str()
    );
    assert!(!known.contains(&id.as_str()), "{id} is not new");
    id
}

/// The call waits on `id`: `approval_pending`, the same id to the model.
fn waits_on(o: &AuthorizeOutcome, id: &str) {
    assert_eq!(
        (o.decision, code(o), approval_id(o).as_str()),
        (Decision::Deny, "approval_pending", id)
    );
    let shown = model_output(o);
    assert_eq!(shown["error"]["details"]["approval_id"], id);
    assert_eq!(shown["error"]["resolution"], "await_approval");
    assert_eq!(shown["error"]["retryable"], true);
}

/// An approver's verdict on `id`, through the real approval service.
async fn verdict(
    server: &TestServer,
    approver_token: &str,
    id: &str,
    sha: &str,
    approve: bool,
    reason: &str,
) -> pb::Approval {
    let verdict = if approve {
        pb::Verdict::Approve
    } else {
        pb::Verdict::Reject
    };
    let decided = ApprovalServiceClient::new(server.channel().await)
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: approver_token.into(),
            approval_id: id.into(),
            verdict: verdict.into(),
            arguments_sha256: sha.into(),
            reason: reason.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
    decided.approval.unwrap()
}

/// dana (a `support_admin` of acme) approves `id`, shown `sha`.
async fn approve(server: &TestServer, id: &str, sha: &str) {
    let dana = token("dana", "acme", &["support_admin"]);
    let a = verdict(server, &dana, id, sha, true, "checked with the customer").await;
    assert_eq!(a.status(), pb::ApprovalStatus::Approved);
}

/// The approval as an approver reads it: status and consuming key.
async fn state(
    server: &TestServer,
    id: &str,
    approver_token: &str,
) -> (pb::ApprovalStatus, String) {
    let a = ApprovalServiceClient::new(server.channel().await)
        .get_approval(pb::GetApprovalRequest {
            identity_token: approver_token.into(),
            approval_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    (a.status(), a.consumed_by_idempotency_key)
}

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &Value| e["event"] == "decision")
        .collect()
}

/// The whole flow: requested once (A), pending for the next call with the
/// same id, approved by a human, then the same call runs once; a repeat of
/// it (same request id, same key: headers the gateway's client controls) is
/// `approval_consumed`, since no ledger stands between a gateway's allow
/// and the tool (DESIGN §11.3); the next operation needs a new approval.
/// Audit events name A; metrics count as for an executor.
async fn a_gateway_call_waits_for_its_approval_and_runs_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    let server = TestServer::configured(backend, std::sync::Arc::new(SystemClock), |c| {
        c.audit = AuditConfig {
            sink: AuditSink::File(audit_path.clone()),
            ..AuditConfig::default()
        };
    })
    .await;
    let first = bob(&server, "gw-1").await;
    let a = requested(&first, &[]);
    assert_eq!(
        model_output(&first)["error"]["details"]["approval_id"],
        a.as_str()
    );

    let again = bob(&server, "gw-2").await;
    waits_on(&again, &a);
    // Not a second approval, whatever the request id (the first's too).
    waits_on(&bob(&server, "gw-1").await, &a);

    approve(&server, &a, &first.arguments_sha256).await;
    let runs = bob(&server, "gw-3").await;
    assert_eq!(
        (runs.decision, runs.error.as_ref(), approval_id(&runs)),
        (Decision::Allow, None, a.clone())
    );
    assert_eq!(runs.arguments_sha256, first.arguments_sha256);
    assert_eq!(runs.policies, vec!["support-refunds-orders".to_owned()]);
    let dana = token("dana", "acme", &["support_admin"]);
    assert_eq!(
        state(&server, &a, &dana).await,
        (pb::ApprovalStatus::Approved, runs.idempotency_key.clone())
    );

    // The same request again (the same key): the approval allowed one.
    let repeat = bob(&server, "gw-3").await;
    assert_eq!(
        (
            repeat.decision,
            code(&repeat),
            approval_id(&repeat),
            repeat.idempotency_key.as_str()
        ),
        (
            Decision::Deny,
            "approval_consumed",
            a.clone(),
            runs.idempotency_key.as_str()
        )
    );
    assert_eq!(
        model_output(&repeat)["error"]["details"]["reason"],
        "single_use"
    );
    // Another operation of the same call needs an approval of its own.
    let next = bob(&server, "gw-4").await;
    let b = requested(&next, &[&a]);
    waits_on(&bob(&server, "gw-3b").await, &b);

    let metrics = server.metrics.encode();
    assert_eq!(
        series(&metrics, r#"toolgate_approvals_total{state="pending"}"#),
        2
    );
    assert_eq!(
        series(&metrics, r#"toolgate_approvals_total{state="consumed"}"#),
        1
    );
    assert_eq!(
        series(
            &metrics,
            r#"toolgate_decisions_total{tool="refund_order",decision="allow",code=""}"#
        ),
        1
    );
    assert_eq!(
        series(
            &metrics,
            r#"toolgate_decisions_total{tool="refund_order",decision="deny",code="approval_consumed"}"#
        ),
        1
    );
    assert_eq!(
        series(
            &metrics,
            r#"toolgate_decisions_total{tool="refund_order",decision="deny",code="approval_pending"}"#
        ),
        3
    );
    server.stop().await;

    let events = audit_lines(&audit_path);
    let seen: Vec<(&str, &str, &str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["request_id"].as_str().unwrap(),
                e["decision"].as_str().unwrap(),
                e["code"].as_str().unwrap(),
                e["approval_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("gw-1", "approval_required", "approval_required", a.as_str()),
            ("gw-2", "deny", "approval_pending", a.as_str()),
            ("gw-1", "deny", "approval_pending", a.as_str()),
            ("gw-3", "allow", "", a.as_str()),
            ("gw-3", "deny", "approval_consumed", a.as_str()),
            ("gw-4", "approval_required", "approval_required", b.as_str()),
            ("gw-3b", "deny", "approval_pending", b.as_str()),
        ]
    );
}

/// A rejection reaches the model: `approval_rejected` with the approver's
/// reason, flattened to one line and cut to 200 characters, for as long as
/// the rejected approval has not expired (the pending TTL, 1 h); then a
/// new approval is requested. An approved approval past its TTL (900 s)
/// and a pending one past its TTL are ignored.
async fn rejections_reach_the_model_and_expired_approvals_are_ignored(backend: Backend) {
    let now = i64::try_from(crate::support::unix_now() * 1000).unwrap();
    let clock = ManualClock::new(now);
    let server = TestServer::start_with_clock_on(backend, clock.clone()).await;
    // The test clock runs hours ahead: the token must outlive it.
    let dana = token_valid_for("dana", "acme", &["support_admin"], 86_400);

    let first = bob(&server, "gw-1").await;
    let a = requested(&first, &[]);
    let reason = format!(
        "no:\nrefunds this large need a ticket\u{7} {}",
        "x".repeat(300)
    );
    let rejected = verdict(&server, &dana, &a, &first.arguments_sha256, false, &reason).await;
    assert_eq!(rejected.status(), pb::ApprovalStatus::Rejected);

    let told = bob(&server, "gw-2").await;
    assert_eq!(
        (told.decision, code(&told), approval_id(&told)),
        (Decision::Deny, "approval_rejected", a.clone())
    );
    let shown = model_output(&told);
    let expected: String = format!("no: refunds this large need a ticket  {}", "x".repeat(300))
        .chars()
        .take(200)
        .chain(['…'])
        .collect();
    assert_eq!(
        shown["error"]["details"]["approver_reason"],
        expected.as_str()
    );
    assert_eq!(shown["error"]["details"]["approval_id"], a.as_str());
    assert_eq!(shown["error"]["resolution"], "request_new_approval");

    // The rejection holds until A's own expiry (created + 1 h).
    clock.advance(3_599_000);
    assert_eq!(code(&bob(&server, "gw-3").await), "approval_rejected");
    clock.advance(1_000);
    let after = bob(&server, "gw-4").await;
    let b = requested(&after, &[&a]);

    // An approved one past its TTL is not used: a new one is requested.
    approve_with(&server, &dana, &b, &after.arguments_sha256).await;
    clock.advance(900_001);
    let late = bob(&server, "gw-5").await;
    let c = requested(&late, &[&a, &b]);
    assert_eq!(state(&server, &b, &dana).await.1, "");

    // A pending one past its TTL is not waited on.
    clock.advance(3_600_001);
    let d = requested(&bob(&server, "gw-6").await, &[&a, &b, &c]);
    waits_on(&bob(&server, "gw-7").await, &d);
    server.stop().await;
}

async fn approve_with(server: &TestServer, approver_token: &str, id: &str, sha: &str) {
    let a = verdict(server, approver_token, id, sha, true, "ok").await;
    assert_eq!(a.status(), pb::ApprovalStatus::Approved);
}

/// Two gateway calls at once, one approved approval: exactly one runs on
/// it; the other requests a new approval (16 rounds, each its own amount,
/// so its own call).
async fn one_approval_runs_one_of_two_racing_gateway_calls(backend: Backend) {
    let server = TestServer::start_on(backend).await;
    let who = caller("bob", "acme");
    for round in 0..16 {
        let refund = refund_of(20_000 + round);
        let first = decide(
            &server,
            &through_gateway(&who, &format!("r{round}-0"), &refund),
        )
        .await;
        let a = requested(&first, &[]);
        approve(&server, &a, &first.arguments_sha256).await;
        let one = through_gateway(&who, &format!("r{round}-1"), &refund);
        let two = through_gateway(&who, &format!("r{round}-2"), &refund);
        let (x, y) = tokio::join!(decide(&server, &one), decide(&server, &two));
        let (winner, loser) = if x.decision == Decision::Allow {
            (x, y)
        } else {
            (y, x)
        };
        assert_eq!(
            (winner.decision, approval_id(&winner)),
            (Decision::Allow, a.clone()),
            "round {round}"
        );
        requested(&loser, &[&a]);
    }
    server.stop().await;
}

fn refund_of(amount_cents: u32) -> String {
    format!(
        r#"{{"order_id":"ord_1001","amount_cents":{amount_cents},"currency":"USD","reason":"damaged"}}"#
    )
}

/// An approved approval of bob's call is not used, waited on or refused
/// for another subject, another tenant's call or other arguments: each
/// gets an approval of its own, and bob's is still there for bob.
async fn a_gateway_approval_serves_only_its_own_call(backend: Backend) {
    let server = TestServer::start_on(backend).await;
    let first = bob(&server, "gw-1").await;
    let a = requested(&first, &[]);
    approve(&server, &a, &first.arguments_sha256).await;

    let alice = decide(
        &server,
        &through_gateway(&caller("alice", "acme"), "gw-2", BIG_REFUND),
    )
    .await;
    assert_eq!(alice.arguments_sha256, first.arguments_sha256);
    let by_alice = requested(&alice, &[&a]);
    let more = decide(
        &server,
        &through_gateway(&caller("bob", "acme"), "gw-3", &refund_of(25_001)),
    )
    .await;
    let other_args = requested(&more, &[&a, &by_alice]);
    let globex =
        r#"{"order_id":"ord_2001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
    let gina = decide(
        &server,
        &through_gateway(&caller("gina", "globex"), "gw-4", globex),
    )
    .await;
    requested(&gina, &[&a, &by_alice, &other_args]);

    let dana = token("dana", "acme", &["support_admin"]);
    assert_eq!(
        state(&server, &a, &dana).await,
        (pb::ApprovalStatus::Approved, String::new())
    );
    let runs = bob(&server, "gw-5").await;
    assert_eq!((runs.decision, approval_id(&runs)), (Decision::Allow, a));
    server.stop().await;
}

/// The executor door keeps DESIGN §4: an approval a gateway call requested
/// (request id gw-1) is refused to an executor presenting it under another
/// request id (`approval_mismatch`, not consumed), and an executor call
/// naming none requests its own; a gateway call that names it is checked
/// by the binding minus the request id, and allowed.
async fn the_executor_door_keeps_its_request_id_binding(backend: Backend) {
    let server = TestServer::start_on(backend).await;
    let who = caller("bob", "acme");
    let first = bob(&server, "gw-1").await;
    let a = requested(&first, &[]);
    approve(&server, &a, &first.arguments_sha256).await;

    let executor = |request_id: &str, approval: &str| AuthorizeInput {
        door: Door::Executor,
        approval_id: approval.into(),
        ..through_gateway(&who, request_id, BIG_REFUND)
    };
    let refused = decide(&server, &executor("ex-1", &a)).await;
    assert_eq!(
        (refused.decision, code(&refused)),
        (Decision::Deny, "approval_mismatch")
    );
    let own = decide(&server, &executor("ex-1", "")).await;
    let e = requested(&own, &[&a]);
    // The executor's own call again: the same pending approval, as §4 says.
    assert_eq!(
        approval_id(&decide(&server, &executor("ex-1", "")).await),
        e
    );
    let dana = token("dana", "acme", &["support_admin"]);
    assert_eq!(
        state(&server, &a, &dana).await,
        (pb::ApprovalStatus::Approved, String::new())
    );

    // A gateway call naming A under another request id: allowed on it.
    let named = AuthorizeInput {
        approval_id: a.clone(),
        ..through_gateway(&who, "gw-2", BIG_REFUND)
    };
    let runs = decide(&server, &named).await;
    assert_eq!(
        (runs.decision, runs.error.as_ref()),
        (Decision::Allow, None)
    );
    // Another operation naming it: consumed by the first.
    let later = AuthorizeInput {
        approval_id: a.clone(),
        ..through_gateway(&who, "gw-3", BIG_REFUND)
    };
    assert_eq!(code(&decide(&server, &later).await), "approval_consumed");
    // Other arguments naming it: another call.
    let changed = AuthorizeInput {
        approval_id: a.clone(),
        ..through_gateway(&who, "gw-2", &refund_of(25_001))
    };
    assert_eq!(code(&decide(&server, &changed).await), "approval_mismatch");
    assert_eq!(
        state(&server, &a, &dana).await,
        (pb::ApprovalStatus::Approved, runs.idempotency_key)
    );
    server.stop().await;
}

/// Waits (at most 5 s) until the live `refund_order` contract is at
/// `version` with `risk`.
async fn refund_contract_is(server: &TestServer, version: &str, risk: toolgate::tools::Risk) {
    let start = std::time::Instant::now();
    loop {
        let engine = server.authorizer.engine();
        if engine
            .tools()
            .get("refund_order")
            .is_some_and(|t| t.version == version && t.risk == risk)
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

/// An approval is bound to the tool version and risk it was granted for:
/// once the contract is 1.3.0, or `destructive`, the gateway call requests
/// a new approval and the granted one is left unconsumed; back on the
/// original contract the call runs on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_approval_is_bound_to_its_tool_version_and_risk() {
    use toolgate::tools::Risk;
    let (_dir, policies) = crate::support::copy_of_examples();
    let contract = policies.join("tools/refund_order.json");
    let original = std::fs::read_to_string(&contract).unwrap();
    assert!(original.contains(r#""version": "1.2.0""#));
    assert!(original.contains(r#""risk": "financial""#));
    let server = TestServer::start_reloading(&policies).await;
    let first = bob(&server, "gw-1").await;
    let a = requested(&first, &[]);
    approve(&server, &a, &first.arguments_sha256).await;
    let edit = |text: &str| {
        // Through a rename, so no reload reads half a file.
        let tmp = contract.with_extension("tmp-edit");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &contract).unwrap();
    };

    edit(&original.replace(r#""version": "1.2.0""#, r#""version": "1.3.0""#));
    refund_contract_is(&server, "1.3.0", Risk::Financial).await;
    let v13 = requested(&bob(&server, "gw-2").await, &[&a]);

    edit(&original.replace(r#""risk": "financial""#, r#""risk": "destructive""#));
    refund_contract_is(&server, "1.2.0", Risk::Destructive).await;
    requested(&bob(&server, "gw-3").await, &[&a, &v13]);

    let dana = token("dana", "acme", &["support_admin"]);
    assert_eq!(
        state(&server, &a, &dana).await,
        (pb::ApprovalStatus::Approved, String::new())
    );
    edit(&original);
    refund_contract_is(&server, "1.2.0", Risk::Financial).await;
    let runs = bob(&server, "gw-4").await;
    assert_eq!((runs.decision, approval_id(&runs)), (Decision::Allow, a));
    server.stop().await;
}

both_backends!(
    a_gateway_call_waits_for_its_approval_and_runs_once,
    rejections_reach_the_model_and_expired_approvals_are_ignored,
    one_approval_runs_one_of_two_racing_gateway_calls,
    a_gateway_approval_serves_only_its_own_call,
    the_executor_door_keeps_its_request_id_binding,
);

/// A gateway call past the daily refund budget (DESIGN §13.1) waits for a
/// human; once approved it is allowed and charged on the budget as it
/// stands then, so the next call sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_call_over_its_budget_is_charged_once_approved() {
    let server = TestServer::start().await;
    let bob_at = caller("bob", "acme");
    let refund = |cents: u32| {
        format!(
            r#"{{"order_id":"ord_1001","amount_cents":{cents},"currency":"USD","reason":"late"}}"#
        )
    };
    for i in 0..5 {
        let o = decide(
            &server,
            &through_gateway(&bob_at, &format!("r{i}"), &refund(10_000)),
        )
        .await;
        assert_eq!(o.decision, Decision::Allow, "{i}: {:?}", o.error);
    }
    let over = decide(&server, &through_gateway(&bob_at, "r5", &refund(5_000))).await;
    assert_eq!(
        over.decision,
        Decision::ApprovalRequired,
        "{:?}",
        over.error
    );
    assert_eq!(over.policies, ["refunds-daily-budget"]);
    approve(&server, &approval_id(&over), &over.arguments_sha256).await;
    // The gateway's retry: another JSON-RPC id, the same call.
    let approved = decide(
        &server,
        &through_gateway(&bob_at, "r5-again", &refund(5_000)),
    )
    .await;
    assert_eq!(approved.decision, Decision::Allow, "{:?}", approved.error);
    assert_eq!(
        approved.budgets,
        [toolgate::budgets::Seen {
            name: "refunds_daily".into(),
            used: 50_000,
            this_call: 5_000,
            limit: 50_000,
        }]
    );
    assert!(approved.charged);
    let next = decide(&server, &through_gateway(&bob_at, "r6", &refund(1))).await;
    assert_eq!(next.decision, Decision::ApprovalRequired);
    assert_eq!(next.budgets[0].used, 55_000);
    server.stop().await;
}
