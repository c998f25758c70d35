//! A ledger record belongs to a decision (issue 18, point 2), attacked over
//! mutual TLS against the real `toolgate serve`: a compromised caller of
//! tenant acme holding only a `ledger` grant (a results worker) tries to
//! begin a key no decision allowed it, to complete another executor's
//! attempt by guessing its fencing token, and to reconcile another
//! executor's attempt with a forged result. Each attack is refused with a
//! stable code and writes nothing; the victim's own calls go on as before.
//!
//! On main at ab769e4 (no tickets, sequential tokens, reconciliation open
//! to any caller of the tenant) each of these tests fails at its first
//! attack: the begin is ACQUIRED, the guessed token completes, the forged
//! reconciliation is stored.

use std::time::{Duration, Instant};

use tonic::transport::Channel;

use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::{self, BeginOutcome, CompletionStatus, Decision, ExecutionState};

use crate::listeners::{Pki, tls_channel};
use crate::sidecar::{Sidecar, start_mtls};
use crate::support::{agent_bob, auth, request};

const REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#;
const OTHER_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":1500,"currency":"USD","reason":"late"}"#;
const REAL: &str = r#"{"refund_id":"re_real","amount_cents":2500}"#;
const FORGED: &str = r#"{"refund_id":"re_forged","amount_cents":2500}"#;
/// How many fencing tokens an attacker tries: every token a fresh
/// database's counter would have issued by now, and then some.
const GUESSES: u64 = 64;

/// The victim executor, a ledger-only worker of the same tenant (the
/// attacker) and an operator's reconciler, each with its own certificate.
struct Deployment {
    _dir: tempfile::TempDir,
    sidecar: Sidecar,
    pki: Pki,
    executor: (String, String),
    worker: (String, String),
    reconciler: (String, String),
}

impl Deployment {
    fn start(extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new("toolgate ledger tickets CA");
        let sidecar = start_mtls(
            dir.path(),
            &pki,
            &format!(
                "{extra}\n\
                 [[access]]\ncaller = \"cn:executor-acme\"\nservices = [\"authorization\", \"ledger\"]\ntenants = [\"acme\"]\n\
                 [[access]]\ncaller = \"cn:worker-acme\"\nservices = [\"ledger\"]\ntenants = [\"acme\"]\n\
                 [[access]]\ncaller = \"cn:reconciler-acme\"\nservices = [\"ledger\", \"reconcile\"]\ntenants = [\"acme\"]\n"
            ),
        );
        let executor = pki.issue("executor-acme", &[], &[], false);
        let worker = pki.issue("worker-acme", &[], &[], false);
        let reconciler = pki.issue("reconciler-acme", &[], &[], false);
        Self {
            _dir: dir,
            sidecar,
            pki,
            executor,
            worker,
            reconciler,
        }
    }

    async fn channel(&self, who: &(String, String)) -> Channel {
        tls_channel(self.sidecar.addr, &self.pki.ca_pem, Some(who))
            .await
            .unwrap()
    }

    async fn authz(&self) -> AuthorizationServiceClient<Channel> {
        AuthorizationServiceClient::new(self.channel(&self.executor).await)
    }

    async fn ledger(&self, who: &(String, String)) -> LedgerServiceClient<Channel> {
        LedgerServiceClient::new(self.channel(who).await)
    }
}

/// The victim's ALLOW decision of `arguments`.
async fn allowed(d: &Deployment, arguments: &str, request_id: &str) -> pb::AuthorizeResponse {
    let mut req = request("refund_order", arguments);
    req.request_id = request_id.into();
    let r = d.authz().await.authorize(req).await.unwrap().into_inner();
    assert_eq!(r.decision(), Decision::Allow, "{:?}", r.error);
    r
}

fn begin(
    decided: &pb::AuthorizeResponse,
    ticket: &str,
    lease_ms: u32,
) -> pb::BeginExecutionRequest {
    pb::BeginExecutionRequest {
        auth: Some(agent_bob()),
        idempotency_key: decided.idempotency_key.clone(),
        arguments_sha256: decided.arguments_sha256.clone(),
        tool: "refund_order".into(),
        lease_ms,
        execution_ticket: ticket.into(),
    }
}

fn complete(key: &str, token: u64, result: &str) -> pb::CompleteExecutionRequest {
    pb::CompleteExecutionRequest {
        auth: Some(agent_bob()),
        idempotency_key: key.into(),
        fencing_token: token,
        status: CompletionStatus::Succeeded.into(),
        result_json: result.into(),
        error: None,
    }
}

fn reconcile(key: &str, token: u64, result: &str) -> pb::ReconcileExecutionRequest {
    pb::ReconcileExecutionRequest {
        auth: Some(agent_bob()),
        idempotency_key: key.into(),
        applied: true,
        result_json: result.into(),
        fencing_token: token,
    }
}

/// The begin was REFUSED as `unauthorized` for `reason`.
#[track_caller]
fn assert_ticket_refused(r: &pb::BeginExecutionResponse, reason: &str) {
    assert_eq!(r.outcome(), BeginOutcome::Refused, "{r:?}");
    assert_eq!((r.fencing_token, r.attempt), (0, 0));
    let e = r.error.as_ref().expect("an envelope");
    assert_eq!(e.code, "unauthorized", "{e:?}");
    let details: serde_json::Value = serde_json::from_str(&e.details_json).unwrap();
    assert_eq!(details["reason"], reason, "{e:?}");
}

async fn record(
    ledger: &mut LedgerServiceClient<Channel>,
    key: &str,
) -> Result<pb::Execution, tonic::Status> {
    ledger
        .get_execution(pb::GetExecutionRequest {
            auth: Some(agent_bob()),
            idempotency_key: key.into(),
        })
        .await
        .map(|r| r.into_inner().execution.unwrap())
}

/// The worker begins the victim's allowed call without the decision's
/// ticket, with a forged one, with the ticket of another call, and as
/// another subject: each is REFUSED and nothing is written; the victim then
/// begins with its ticket and is the first, attempt 1. `BatchAuthorize`
/// hands each allowed call its own ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_the_decisions_ticket_begins_nothing() {
    let d = Deployment::start("");
    let victim = allowed(&d, REFUND, "tickets-1").await;
    let other = allowed(&d, OTHER_REFUND, "tickets-2").await;
    let mut worker = d.ledger(&d.worker).await;

    let missing = worker
        .begin_execution(begin(&victim, "", 0))
        .await
        .unwrap()
        .into_inner();
    assert_ticket_refused(&missing, "ticket_missing");
    assert!(victim.execution_ticket.starts_with("tgx1."), "{victim:?}");
    // The victim's ticket with its expiry pushed back (the MAC no longer fits).
    let mut parts: Vec<String> = victim
        .execution_ticket
        .split('.')
        .map(str::to_owned)
        .collect();
    parts[2] = (parts[2].parse::<u64>().unwrap() + 3_600_000).to_string();
    let forged = worker
        .begin_execution(begin(&victim, &parts.join("."), 0))
        .await
        .unwrap()
        .into_inner();
    assert_ticket_refused(&forged, "ticket_invalid");
    for junk in ["x", "tgx1.1.1.AAAA", "tgx1.9.99999999999999.AAAA"] {
        let r = worker
            .begin_execution(begin(&victim, junk, 0))
            .await
            .unwrap()
            .into_inner();
        assert_ticket_refused(&r, "ticket_invalid");
    }
    // A real ticket of another allowed call does not open this one.
    let borrowed = worker
        .begin_execution(begin(&victim, &other.execution_ticket, 0))
        .await
        .unwrap()
        .into_inner();
    assert_ticket_refused(&borrowed, "ticket_invalid");
    // Nor does the victim's own ticket for another subject of the tenant,
    // or for another tool.
    let mut as_mallory = begin(&victim, &victim.execution_ticket, 0);
    as_mallory.auth = Some(auth(
        "mallory",
        "acme",
        &["support_agent"],
        &["orders:refund"],
    ));
    let r = worker
        .begin_execution(as_mallory)
        .await
        .unwrap()
        .into_inner();
    assert_ticket_refused(&r, "ticket_invalid");
    let mut other_tool = begin(&victim, &victim.execution_ticket, 0);
    other_tool.tool = "send_email".into();
    let r = worker
        .begin_execution(other_tool)
        .await
        .unwrap()
        .into_inner();
    assert_ticket_refused(&r, "ticket_invalid");

    // Nothing was written: the victim's key is still unknown, and its
    // executor is the first to begin it.
    let absent = record(&mut worker, &victim.idempotency_key)
        .await
        .unwrap_err();
    assert_eq!(absent.code(), tonic::Code::NotFound, "{absent:?}");
    let mut ledger = d.ledger(&d.executor).await;
    let mine = ledger
        .begin_execution(begin(&victim, &victim.execution_ticket, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (mine.outcome(), mine.attempt),
        (BeginOutcome::Acquired, 1),
        "{mine:?}"
    );

    // A batch: each allowed call carries a ticket for itself only.
    let batch = d
        .authz()
        .await
        .batch_authorize(pb::BatchAuthorizeRequest {
            requests: vec![
                {
                    let mut r = request("refund_order", REFUND);
                    r.request_id = "tickets-batch-1".into();
                    r
                },
                {
                    let mut r = request("refund_order", OTHER_REFUND);
                    r.request_id = "tickets-batch-2".into();
                    r
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let [first, second] = [&batch.responses[0], &batch.responses[1]];
    assert!(
        first.execution_ticket.starts_with("tgx1.") && second.execution_ticket.starts_with("tgx1.")
    );
    let swapped = ledger
        .begin_execution(begin(first, &second.execution_ticket, 0))
        .await
        .unwrap()
        .into_inner();
    assert_ticket_refused(&swapped, "ticket_invalid");
    for r in [first, second] {
        let begun = ledger
            .begin_execution(begin(r, &r.execution_ticket, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(begun.outcome(), BeginOutcome::Acquired, "{begun:?}");
    }
}

/// A ticket is short-lived: past `ticket_ttl_seconds` it is refused as
/// expired and nothing is written; a new decision gives a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_ticket_begins_nothing() {
    let d = Deployment::start("[ledger]\nticket_ttl_seconds = 1\n");
    let victim = allowed(&d, REFUND, "tickets-expiry").await;
    let mut ledger = d.ledger(&d.executor).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let late = ledger
        .begin_execution(begin(&victim, &victim.execution_ticket, 0))
        .await
        .unwrap()
        .into_inner();
    assert_ticket_refused(&late, "ticket_expired");
    let absent = record(&mut ledger, &victim.idempotency_key)
        .await
        .unwrap_err();
    assert_eq!(absent.code(), tonic::Code::NotFound);
    let again = allowed(&d, REFUND, "tickets-expiry").await;
    assert_eq!(again.idempotency_key, victim.idempotency_key);
    let begun = ledger
        .begin_execution(begin(&again, &again.execution_ticket, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (begun.outcome(), begun.attempt),
        (BeginOutcome::Acquired, 1)
    );
}

/// The worker knows the victim's key and tries every small fencing token
/// with a forged result: each is `lease_lost` and changes nothing; the
/// holder's own completion then stores the real result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guessed_fencing_token_completes_nothing() {
    let d = Deployment::start("");
    let victim = allowed(&d, REFUND, "tickets-guess").await;
    let mut ledger = d.ledger(&d.executor).await;
    let held = ledger
        .begin_execution(begin(&victim, &victim.execution_ticket, 60_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.outcome(), BeginOutcome::Acquired);
    let key = victim.idempotency_key.as_str();
    let mut worker = d.ledger(&d.worker).await;
    for guess in 1..=GUESSES {
        let r = worker
            .complete_execution(complete(key, guess, FORGED))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (r.state(), r.error.as_ref().map(|e| e.code.as_str())),
            (ExecutionState::InProgress, Some("lease_lost")),
            "token {guess}"
        );
    }
    assert!(
        held.fencing_token > GUESSES && i64::try_from(held.fencing_token).is_ok(),
        "a guessable token: {}",
        held.fencing_token
    );
    let before = record(&mut worker, key).await.unwrap();
    assert_eq!(
        (before.state(), before.result_json.as_str()),
        (ExecutionState::InProgress, "")
    );

    let done = ledger
        .complete_execution(complete(key, held.fencing_token, REAL))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (done.state(), done.error),
        (ExecutionState::Succeeded, None)
    );
    let after = record(&mut worker, key).await.unwrap();
    assert_eq!(after.result_json, REAL);
}

/// The victim's attempt lost its lease (it may have run). The worker, with
/// neither the attempt's token nor a `reconcile` grant, tries to settle it
/// with a forged result: `forbidden` without a token, `lease_lost` with a
/// guessed one, and the record is untouched. The granted reconciler and
/// the holder itself may settle it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciling_needs_the_holders_token_or_a_reconcile_grant() {
    let d = Deployment::start("");
    let mut ledger = d.ledger(&d.executor).await;
    let mut worker = d.ledger(&d.worker).await;
    let victim = allowed(&d, REFUND, "tickets-reconcile").await;
    let key = victim.idempotency_key.as_str();
    let held = ledger
        .begin_execution(begin(&victim, &victim.execution_ticket, 200))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.outcome(), BeginOutcome::Acquired);
    let started = Instant::now();
    loop {
        let r = ledger
            .begin_execution(begin(&victim, &victim.execution_ticket, 200))
            .await
            .unwrap()
            .into_inner();
        if r.outcome() == BeginOutcome::ReconcileRequired {
            break;
        }
        assert_eq!(r.outcome(), BeginOutcome::InProgress, "{r:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the lease never passed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let ungranted = worker
        .reconcile_execution(reconcile(key, 0, FORGED))
        .await
        .unwrap()
        .into_inner();
    let e = ungranted.error.expect("a refusal");
    assert_eq!(e.code, "forbidden", "{e:?}");
    let details: serde_json::Value = serde_json::from_str(&e.details_json).unwrap();
    assert_eq!(details["reason"], "reconcile_not_granted");
    for guess in 1..=GUESSES {
        let r = worker
            .reconcile_execution(reconcile(key, guess, FORGED))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.error.as_ref().map(|e| e.code.as_str()),
            Some("lease_lost"),
            "token {guess}"
        );
    }
    let untouched = record(&mut worker, key).await.unwrap();
    assert_eq!(
        (untouched.state(), untouched.result_json.as_str()),
        (ExecutionState::InProgress, "")
    );

    // The operator's reconciler needs no token; the holder needs no grant.
    let mut reconciler = d.ledger(&d.reconciler).await;
    let mut not_applied = reconcile(key, 0, "");
    not_applied.applied = false;
    let settled = reconciler
        .reconcile_execution(not_applied)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (settled.state(), settled.error),
        (ExecutionState::FailedRetryable, None)
    );
    let retry = ledger
        .begin_execution(begin(&victim, &victim.execution_ticket, 200))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (retry.outcome(), retry.attempt),
        (BeginOutcome::Acquired, 2)
    );
    let mut unknown = complete(key, retry.fencing_token, "");
    unknown.status = CompletionStatus::Unknown.into();
    let unknown = ledger
        .complete_execution(unknown)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unknown.state(), ExecutionState::Unknown);
    let own = ledger
        .reconcile_execution(reconcile(key, retry.fencing_token, REAL))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((own.state(), own.error), (ExecutionState::Succeeded, None));
    assert_eq!(record(&mut worker, key).await.unwrap().result_json, REAL);
}
