//! The real `toolgate serve` binary, killed with SIGKILL between the steps of
//! an approval and restarted on the same SQLite file: nothing about an
//! approval lives only in memory. The approver's tokens come from the
//! development commands (`toolgate dev keys`, `toolgate dev token`), so this
//! is also the development flow of docs/approvals.md, end to end.

use std::path::Path;

use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::sidecar::{Sidecar, toolgate};
use crate::support::{code, request};

const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
const ISSUER: &str = "toolgate-dev";
const AUDIENCE: &str = "toolgate";

/// The approval service's key set (from `toolgate dev keys`) and token rules.
fn jwks_args(dir: &Path) -> Vec<std::ffi::OsString> {
    vec![
        "--jwks-file".into(),
        dir.join("dev-jwks.json").into(),
        "--issuer".into(),
        ISSUER.into(),
        "--audience".into(),
        AUDIENCE.into(),
    ]
}

fn dev_token(dir: &Path, subject: &str, role: &str) -> String {
    let out = toolgate()
        .args(["dev", "token", "--jwks"])
        .arg(dir.join("dev-jwks.json"))
        .args(["--subject", subject, "--tenant", "acme", "--role", role])
        .args(["--issuer", ISSUER, "--audience", AUDIENCE])
        .env_remove("TOOLGATE_ISSUER")
        .env_remove("TOOLGATE_AUDIENCE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

async fn authorize(
    sidecar: &Sidecar,
    request_id: &str,
    approval_id: &str,
) -> pb::AuthorizeResponse {
    let mut client = AuthorizationServiceClient::new(sidecar.channel().await);
    let mut req = request("refund_order", BIG_REFUND);
    req.request_id = request_id.into();
    req.approval_id = approval_id.into();
    client.authorize(req).await.unwrap().into_inner()
}

async fn get(sidecar: &Sidecar, token: &str, approval_id: &str) -> pb::Approval {
    let mut approvals = ApprovalServiceClient::new(sidecar.channel().await);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_survives_kill_9_at_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let keys = toolgate()
        .args(["dev", "keys", "--out"])
        .arg(dir.path().join("dev-jwks.json"))
        .output()
        .unwrap();
    assert!(
        keys.status.success(),
        "{}",
        String::from_utf8_lossy(&keys.stderr)
    );
    let approver = dev_token(dir.path(), "dana", "support_admin");

    // 1. The call needs approval; the sidecar dies right after saying so.
    let sidecar = Sidecar::start(dir.path(), &jwks_args(dir.path()));
    let first = authorize(&sidecar, "refund-1", "").await;
    assert_eq!(first.decision(), Decision::ApprovalRequired);
    let approval_id = first.approval.as_ref().unwrap().approval_id.clone();
    sidecar.kill();

    // 2. After a restart the approval is still pending; a human approves it,
    //    and the sidecar dies right after answering.
    let sidecar = Sidecar::start(dir.path(), &jwks_args(dir.path()));
    let shown = get(&sidecar, &approver, &approval_id).await;
    assert_eq!(shown.status(), pb::ApprovalStatus::Pending);
    assert_eq!(shown.arguments_sha256, first.arguments_sha256);
    let mut approvals = ApprovalServiceClient::new(sidecar.channel().await);
    let decided = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: approver.clone(),
            approval_id: approval_id.clone(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: shown.arguments_sha256.clone(),
            reason: "refund confirmed by phone".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
    sidecar.kill();

    // 3. The decision survived: the retry is allowed and consumes the
    //    approval; the sidecar dies right after.
    let sidecar = Sidecar::start(dir.path(), &jwks_args(dir.path()));
    let approved = get(&sidecar, &approver, &approval_id).await;
    assert_eq!(approved.status(), pb::ApprovalStatus::Approved);
    assert_eq!(approved.decided_by, "dana");
    assert_eq!(approved.reason, "refund confirmed by phone");
    let allowed = authorize(&sidecar, "refund-1", &approval_id).await;
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);
    sidecar.kill();

    // 4. The consumption survived: the same operation may use it again,
    //    another operation (another request id) is not the call approved.
    let sidecar = Sidecar::start(dir.path(), &jwks_args(dir.path()));
    let again = authorize(&sidecar, "refund-1", &approval_id).await;
    assert_eq!(again.decision(), Decision::Allow, "{:?}", again.error);
    assert_eq!(again.idempotency_key, allowed.idempotency_key);
    let other = authorize(&sidecar, "refund-2", &approval_id).await;
    assert_eq!(other.decision(), Decision::Deny);
    assert_eq!(code(&other), "approval_mismatch");
    let consumed = get(&sidecar, &approver, &approval_id).await;
    assert_eq!(
        consumed.consumed_by_idempotency_key,
        allowed.idempotency_key
    );
    sidecar.kill();
}

#[test]
fn dev_keys_never_overwrites_and_is_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dev-jwks.json");
    let run = || {
        toolgate()
            .args(["dev", "keys", "--out"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let first = run();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(String::from_utf8_lossy(&first.stderr).contains("DEVELOPMENT"));
    let written = std::fs::read(&path).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let second = run();
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("never overwritten"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(std::fs::read(&path).unwrap(), written);

    let bad = toolgate()
        .args(["dev", "token", "--jwks"])
        .arg(&path)
        .args(["--subject", "", "--tenant", "acme"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(bad.stdout.is_empty());
}
