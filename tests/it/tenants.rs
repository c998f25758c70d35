//! Callers bound to tenants (issue 18, point 1), over the real `toolgate
//! serve` with mutual TLS: an executor granted `tenants = ["globex"]` that
//! sends `tenant_id: "acme"` (or forwards an acme user's identity token) is
//! `PERMISSION_DENIED` on every door, and neither decides, begins, settles
//! nor reads anything of acme's; the executor granted `["acme"]` is served
//! as before. What was not created is read back through granted callers.

use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::listeners::{Pki, tls_channel};
use crate::sidecar::{Sidecar, start_mtls};
use crate::support::{agent_bob, auth, request, token};

const SMALL_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#;
const BIG_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#;
const GLOBEX_REFUND: &str =
    r#"{"order_id":"ord_2001","amount_cents":2500,"currency":"USD","reason":"late"}"#;

/// The message every refusal carries: it names the tenant.
const REFUSED: &str = "the caller's grants do not name tenant `acme`: it may not act for it";

/// The globex executor, the acme executor and the approval UI, each with
/// its own certificate, on one real sidecar.
struct Deployment {
    _dir: tempfile::TempDir,
    sidecar: Sidecar,
    pki: Pki,
    globex: (String, String),
    acme: (String, String),
    ui: (String, String),
}

impl Deployment {
    /// `toolgate serve` with mTLS and three grants (plus `extra` config).
    fn start(extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new("toolgate tenants CA");
        let sidecar = start_mtls(
            dir.path(),
            &pki,
            &format!(
                "{extra}\n\
                 [[access]]\ncaller = \"cn:executor-globex\"\nservices = [\"authorization\", \"ledger\"]\ntenants = [\"globex\"]\n\
                 [[access]]\ncaller = \"cn:executor-acme\"\nservices = [\"authorization\", \"ledger\"]\ntenants = [\"acme\"]\n\
                 [[access]]\ncaller = \"cn:approval-ui\"\nservices = [\"approvals\"]\n"
            ),
        );
        let globex = pki.issue("executor-globex", &[], &[], false);
        let acme = pki.issue("executor-acme", &[], &[], false);
        let ui = pki.issue("approval-ui", &[], &[], false);
        Self {
            _dir: dir,
            sidecar,
            pki,
            globex,
            acme,
            ui,
        }
    }

    async fn channel(&self, who: &(String, String)) -> Channel {
        tls_channel(self.sidecar.addr, &self.pki.ca_pem, Some(who))
            .await
            .unwrap()
    }

    /// The pending approvals acme's admin sees.
    async fn acme_pending(&self) -> Vec<pb::Approval> {
        ApprovalServiceClient::new(self.channel(&self.ui).await)
            .list_approvals(pb::ListApprovalsRequest {
                identity_token: token("dana", "acme", &["support_admin"]),
                status: pb::ApprovalStatus::Pending.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .approvals
    }
}

/// The status is the tenant refusal, naming acme.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(answer: Result<T, tonic::Status>) {
    let status = answer.expect_err("a request for acme by globex's executor was served");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), REFUSED, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "tenant_not_granted");
    assert_eq!(
        info.metadata.get("tenant").map(String::as_str),
        Some("acme")
    );
}

/// acme's admin, as globex's executor claims it.
fn acme_admin() -> pb::AuthContext {
    auth(
        "mallory",
        "acme",
        &["support_admin"],
        &["orders:read", "orders:refund"],
    )
}

fn as_acme_admin(arguments: &str, begin: bool) -> pb::AuthorizeRequest {
    pb::AuthorizeRequest {
        auth: Some(acme_admin()),
        begin_execution: begin,
        ..request("refund_order", arguments)
    }
}

/// globex's own support agent, on globex's order.
fn globex_call(begin: bool) -> pb::AuthorizeRequest {
    pb::AuthorizeRequest {
        auth: Some(pb::AuthContext {
            subject_id: "gail".into(),
            tenant_id: "globex".into(),
            ..agent_bob()
        }),
        begin_execution: begin,
        ..request("refund_order", GLOBEX_REFUND)
    }
}

fn get(auth: pb::AuthContext, key: &str) -> pb::GetExecutionRequest {
    pb::GetExecutionRequest {
        auth: Some(auth),
        idempotency_key: key.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_acts_only_for_the_tenants_its_grant_names() {
    let d = Deployment::start("");
    let globex = d.channel(&d.globex).await;
    let acme = d.channel(&d.acme).await;
    let mut globex_authz = AuthorizationServiceClient::new(globex.clone());
    let mut globex_ledger = LedgerServiceClient::new(globex);
    let mut acme_authz = AuthorizationServiceClient::new(acme.clone());
    let mut acme_ledger = LedgerServiceClient::new(acme);

    // acme's own executor decides acme's call: the victim's key.
    let victim = acme_authz
        .authorize(request("refund_order", SMALL_REFUND))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(victim.decision(), Decision::Allow, "{:?}", victim.error);
    let key = victim.idempotency_key.clone();

    // globex's executor, as acme: every door refuses.
    assert_refused(
        globex_authz
            .authorize(as_acme_admin(SMALL_REFUND, true))
            .await,
    );
    assert_refused(
        globex_authz
            .authorize(as_acme_admin(BIG_REFUND, false))
            .await,
    );
    // A batch with one acme entry is refused whole: globex's own first
    // entry is not decided either (its execution is not begun, below).
    assert_refused(
        globex_authz
            .batch_authorize(pb::BatchAuthorizeRequest {
                requests: vec![globex_call(true), as_acme_admin(BIG_REFUND, false)],
            })
            .await,
    );
    assert_refused(
        globex_ledger
            .begin_execution(pb::BeginExecutionRequest {
                auth: Some(acme_admin()),
                idempotency_key: key.clone(),
                arguments_sha256: victim.arguments_sha256.clone(),
                tool: "refund_order".into(),
                lease_ms: 0,
                // Even with the victim's own ticket.
                execution_ticket: victim.execution_ticket.clone(),
            })
            .await,
    );
    assert_refused(
        globex_ledger
            .complete_execution(pb::CompleteExecutionRequest {
                auth: Some(acme_admin()),
                idempotency_key: key.clone(),
                fencing_token: 1,
                status: pb::CompletionStatus::Succeeded.into(),
                result_json: "{}".into(),
                error: None,
            })
            .await,
    );
    assert_refused(
        globex_ledger
            .reconcile_execution(pb::ReconcileExecutionRequest {
                auth: Some(acme_admin()),
                idempotency_key: key.clone(),
                applied: true,
                result_json: "{}".into(),
                fencing_token: 0,
            })
            .await,
    );
    assert_refused(globex_ledger.get_execution(get(acme_admin(), &key)).await);

    // Nothing of acme's was created: no approval, no execution record.
    assert!(d.acme_pending().await.is_empty());
    let missing = acme_ledger
        .get_execution(get(agent_bob(), &key))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");

    // globex's executor is served for globex, and the refused batch began nothing.
    let own = globex_authz
        .authorize(globex_call(false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.decision(), Decision::Allow, "{:?}", own.error);
    let gail = globex_call(false).auth.unwrap();
    let missing = globex_ledger
        .get_execution(get(gail, &own.idempotency_key))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");

    // acme's executor is decided and recorded as before.
    let pending = acme_authz
        .authorize(as_acme_admin(BIG_REFUND, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pending.decision(),
        Decision::ApprovalRequired,
        "{:?}",
        pending.error
    );
    assert_eq!(d.acme_pending().await.len(), 1);
    let begun = acme_ledger
        .begin_execution(pb::BeginExecutionRequest {
            auth: Some(agent_bob()),
            idempotency_key: key.clone(),
            arguments_sha256: victim.arguments_sha256.clone(),
            tool: "refund_order".into(),
            lease_ms: 0,
            execution_ticket: victim.execution_ticket.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(begun.outcome(), pb::BeginOutcome::Acquired);
    let batch = acme_authz
        .batch_authorize(pb::BatchAuthorizeRequest {
            requests: vec![request("refund_order", SMALL_REFUND)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.responses.len(), 1);
    let record = acme_ledger
        .get_execution(get(agent_bob(), &key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        record.execution.unwrap().state(),
        pb::ExecutionState::InProgress
    );
}

/// With `require_identity_token`, the tenant checked is the verified
/// token's: globex's executor forwarding an acme user's token is refused,
/// even with an auth context that names no tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_token_of_another_tenant_is_refused() {
    let d = Deployment::start("require_identity_token = true");
    let forwarded = |tenant: &str| pb::AuthContext {
        subject_id: String::new(),
        tenant_id: String::new(),
        scopes: Vec::new(),
        roles: Vec::new(),
        identity_token: token("bob", tenant, &["support_agent"]),
        ..agent_bob()
    };
    let call = |tenant: &str| pb::AuthorizeRequest {
        auth: Some(forwarded(tenant)),
        ..request("refund_order", SMALL_REFUND)
    };
    let mut globex = AuthorizationServiceClient::new(d.channel(&d.globex).await);
    assert_refused(globex.authorize(call("acme")).await);
    assert_refused(
        LedgerServiceClient::new(d.channel(&d.globex).await)
            .get_execution(get(forwarded("acme"), "refund_order:none"))
            .await,
    );
    // The same token through acme's executor is decided (whatever policy says).
    let decided = AuthorizationServiceClient::new(d.channel(&d.acme).await)
        .authorize(call("acme"))
        .await;
    assert!(decided.is_ok(), "{decided:?}");
    // And globex's own user's token through globex's executor too.
    let own = globex.authorize(call("globex")).await;
    assert!(own.is_ok(), "{own:?}");
}
