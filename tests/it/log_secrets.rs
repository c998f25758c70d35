//! Secrets never reach the logs, whatever `RUST_LOG` says: the real
//! `toolgate serve` on PostgreSQL with `RUST_LOG=trace`, through the refund
//! flow (Authorize with `begin_execution`, CompleteExecution with a result)
//! and the approval flow (approval required, DecideApproval with a signed
//! identity token and a reason, the allowed retry), with one recognisable
//! secret in the arguments, the result and the reason, and an identity
//! token whose text is itself a secret. Dependencies that print statement
//! parameters (tokio-postgres) or headers and frames (h2, hyper) at debug
//! and trace are capped by `telemetry::init`.

use std::ffi::OsString;
use std::sync::{Arc, Mutex};

use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::{self, BeginOutcome, CompletionStatus, Decision, ExecutionState};

use crate::sidecar::{Kept, Sidecar, toolgate};
use crate::support::{agent_bob, example_policies, fixture, request, scratch_schema, token};

const SECRET: &str = "SECRET-4111-1111-1111-1111";

fn refund(amount: u32) -> String {
    format!(
        r#"{{"order_id":"ord_1001","amount_cents":{amount},"currency":"USD","reason":"damaged","note":"card {SECRET}"}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_stderr_or_stdout_at_rust_log_trace_on_postgres() {
    let Some(schema) = scratch_schema().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut command = toolgate();
    command
        .arg("serve")
        .arg("--policies")
        .arg(example_policies())
        .args(["--listen", "127.0.0.1:0", "--store", schema.url()])
        .args::<_, OsString>([
            "--jwks-file".into(),
            fixture("keys/jwks.json").into_os_string(),
            "--issuer".into(),
            "https://idp.test".into(),
            "--audience".into(),
            "toolgate".into(),
        ])
        .current_dir(dir.path());
    let kept: Kept = Arc::new(Mutex::new(Vec::new()));
    let sidecar = Sidecar::spawn_logged(command, "trace", Some(Arc::clone(&kept)));
    let mut client = AuthorizationServiceClient::new(sidecar.channel().await);
    let mut ledger = LedgerServiceClient::new(sidecar.channel().await);
    let mut approvals = ApprovalServiceClient::new(sidecar.channel().await);

    // Refund: decided and begun in one call, completed with a result.
    let mut small = request("refund_order", &refund(2500));
    small.request_id = "logs-small".into();
    small.begin_execution = true;
    let decided = client.authorize(small).await.unwrap().into_inner();
    assert_eq!(decided.decision(), Decision::Allow, "{:?}", decided.error);
    let begun = decided.execution.unwrap();
    assert_eq!(begun.outcome(), BeginOutcome::Acquired);
    let done = ledger
        .complete_execution(pb::CompleteExecutionRequest {
            auth: Some(agent_bob()),
            idempotency_key: decided.idempotency_key.clone(),
            fencing_token: begun.fencing_token,
            status: CompletionStatus::Succeeded.into(),
            result_json: format!(
                r#"{{"refund_id":"re_1","amount_cents":2500,"receipt":"{SECRET}"}}"#
            ),
            error: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (done.state(), done.error),
        (ExecutionState::Succeeded, None)
    );

    // Approval: required, decided by a signed token with a reason, retried.
    let big = request("refund_order", &refund(25_000));
    let first = client.authorize(big.clone()).await.unwrap().into_inner();
    assert_eq!(first.decision(), Decision::ApprovalRequired);
    let id = first.approval.unwrap().approval_id;
    let admin = token("dana", "acme", &["support_admin"]);
    let decision = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: admin.clone(),
            approval_id: id.clone(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: first.arguments_sha256.clone(),
            reason: format!("customer sent {SECRET}"),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision.error, None);
    let mut retry = big;
    retry.approval_id = id;
    let allowed = client.authorize(retry).await.unwrap().into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);
    sidecar.kill();

    // The token's signature alone is as secret as the whole token.
    let signature = admin.rsplit('.').next().unwrap().to_owned();
    let secrets = [
        ("the secret", SECRET.to_owned()),
        ("the identity token", admin),
        ("the token's signature", signature),
    ];
    let kept = kept.lock().unwrap();
    // Trace logging ran: stderr holds events below `info`.
    let below_info: Vec<String> = kept
        .iter()
        .filter(|(stream, _)| *stream == "stderr")
        .filter_map(|(_, line)| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| matches!(v["level"].as_str(), Some("DEBUG" | "TRACE")))
        .filter_map(|v| v["target"].as_str().map(str::to_owned))
        .collect();
    assert!(
        !below_info.is_empty(),
        "trace logging did not run: no DEBUG or TRACE event among {} lines",
        kept.len()
    );
    // No capped dependency logged below `info`.
    let uncapped: Vec<&String> = below_info
        .iter()
        .filter(|target| {
            toolgate::telemetry::CAPPED_TARGETS
                .iter()
                .any(|capped| *target == capped || target.starts_with(&format!("{capped}::")))
        })
        .collect();
    assert!(uncapped.is_empty(), "{uncapped:?}");
    // Only line numbers and targets are reported: the lines hold secrets.
    let mut leaks = Vec::new();
    for (n, (stream, line)) in kept.iter().enumerate() {
        for (what, secret) in &secrets {
            if line.contains(secret.as_str()) {
                let target = serde_json::from_str::<serde_json::Value>(line)
                    .ok()
                    .and_then(|v| v["target"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "(not a JSON log line)".into());
                leaks.push(format!("line {n} on {stream}, target {target}: {what}"));
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "{} leaks:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
}
