//! The AuthZEN door end to end, with nothing of ours between the MCP client
//! and toolgate's decision (issue 14's acceptance): the official MCP Python
//! SDK's client (`mcp`) calls an MCP server (FastMCP) over Streamable HTTP,
//! guarded by apparitor's FastMCP middleware, a third-party AuthZEN
//! enforcement point installed from PyPI (`clients/mcp/requirements.txt`),
//! which asks a real `toolgate serve` before every `tools/call`. The tools'
//! resources come from toolgate's entity store (a gateway sends no
//! entities); the approval is decided through `ApprovalService` with a real
//! identity token; `tools/list` is shaped by toolgate's Action Search
//! (`clients/mcp/server.py` says why not by apparitor's own probe).
//!
//! The MCP server counts what really ran (`runs.jsonl`): a refused call
//! must never reach its tool, and an approved one runs exactly once.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate::grpc::pb;
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::entity_service_client::EntityServiceClient;

use crate::prerequisites;
use crate::sidecar::Sidecar;
use crate::support::{copy_of_examples, token};

/// A customer may refund their own order (the examples let only support
/// staff refund): so a user with no roles, as an MCP user's token has, can
/// reach the large-refund approval.
const CUSTOMER_REFUNDS: &str = r#"
@id("customer-refunds-own-order")
permit (principal, action == Action::"refund_order", resource is Order)
when { context.scopes.contains("orders:refund") && resource.owner == principal };
"#;

/// Alice's order and Carol's, in tenant acme: the store is the only place
/// a gateway call finds them.
const ORDERS: &str = r#"[
 {"uid":{"type":"Order","id":"ord_1001"},"parents":[{"type":"Tenant","id":"acme"}],
  "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"alice"}},
           "status":"delivered","total_cents":50000}},
 {"uid":{"type":"Order","id":"ord_2002"},"parents":[{"type":"Tenant","id":"acme"}],
  "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"carol"}},
           "status":"delivered","total_cents":50000}}
]"#;

/// apparitor's one refusal text: it never forwards a PDP's reason to the
/// model, and its "requires human approval" refusal only escalates an
/// allow, which toolgate never answers for a call waiting on an approver.
const NOT_AUTHORIZED: &str = "tool call not authorized";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The MCP server process; killed when dropped.
struct McpServer {
    child: Child,
    url: String,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl McpServer {
    /// Starts `clients/mcp/server.py` and waits (bounded: 60 s) until its
    /// port accepts connections.
    fn start(py: &str, pdp: &str, keys: &Path, runs: &Path) -> Self {
        let port = free_port();
        let child = Command::new(py)
            .arg(mcp_dir().join("server.py"))
            .args(["--port", &port.to_string(), "--pdp", pdp])
            .arg("--public-key")
            .arg(keys.join("public.pem"))
            .arg("--runs")
            .arg(runs)
            .current_dir(mcp_dir())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "the MCP server exited before listening"
            );
            assert!(Instant::now() < deadline, "the MCP server never listened");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }
}

fn mcp_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/mcp")
}

/// One MCP client step (`clients/mcp/client.py`) as `subject` with
/// `scopes`: its one JSON line.
fn client(
    py: &str,
    server: &McpServer,
    keys: &Path,
    subject: &str,
    scopes: &[&str],
    step: &[&str],
) -> Value {
    let mut command = Command::new(py);
    command
        .arg(mcp_dir().join("client.py"))
        .args(["--url", &server.url, "--subject", subject])
        .arg("--private-key")
        .arg(keys.join("private.pem"))
        .arg("--public-key")
        .arg(keys.join("public.pem"))
        .current_dir(mcp_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1");
    for scope in scopes {
        command.args(["--scope", scope]);
    }
    let out = command.args(step).output().unwrap();
    assert!(
        out.status.success(),
        "client {step:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What the MCP server's tools really ran, in order.
fn runs(path: &Path) -> Vec<Value> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{e}"),
    }
}

fn refused(text: &str) -> Value {
    json!({"isError": true, "structured": null, "text": [text]})
}

async fn pending(
    approvals: &mut ApprovalServiceClient<tonic::transport::Channel>,
    approver: &str,
) -> Vec<pb::Approval> {
    approvals
        .list_approvals(pb::ListApprovalsRequest {
            identity_token: approver.into(),
            status: pb::ApprovalStatus::Pending as i32,
            page_size: 50,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .approvals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_authzen_pep_guards_an_mcp_server_with_toolgate_deciding() {
    let Some(py) = prerequisites::python_with_mcp_gateway() else {
        return;
    };
    let (dir, policies) = copy_of_examples();
    std::fs::write(policies.join("customer_refunds.cedar"), CUSTOMER_REFUNDS).unwrap();
    // The MCP users' tokens carry no tenant: this deployment serves acme.
    std::fs::write(
        dir.path().join("toolgate.toml"),
        "[authzen]\ndefault_tenant = \"acme\"\n",
    )
    .unwrap();
    let sidecar =
        Sidecar::start_with_policies(dir.path(), &policies, &crate::support::identity_args());
    let channel = sidecar.channel().await;

    EntityServiceClient::new(channel.clone())
        .upsert_entities(pb::UpsertEntitiesRequest {
            tenant_id: "acme".into(),
            entities_json: ORDERS.into(),
        })
        .await
        .unwrap();

    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let status = Command::new(&py)
        .arg(mcp_dir().join("keys.py"))
        .arg(&keys)
        .current_dir(mcp_dir())
        .status()
        .unwrap();
    assert!(status.success());
    let ran = dir.path().join("runs.jsonl");
    let server = McpServer::start(&py, &format!("http://{}", sidecar.addr), &keys, &ran);
    let alice = |step: &[&str]| {
        client(
            &py,
            &server,
            &keys,
            "alice",
            &["orders:read", "orders:refund"],
            step,
        )
    };

    // tools/list: what policy lets each user call. delete_account needs
    // the support_admin role, which no MCP user has; refunds need the scope.
    assert_eq!(
        alice(&["list"]),
        json!({"tools": ["get_order", "refund_order"]})
    );
    assert_eq!(
        client(&py, &server, &keys, "mallory", &["orders:read"], &["list"]),
        json!({"tools": ["get_order"]})
    );

    // Allowed: her own order, read from the entity store.
    let got = alice(&["call", "get_order", r#"{"order_id": "ord_1001"}"#]);
    assert_eq!(got["isError"], json!(false), "{got}");
    assert_eq!(got["structured"]["order_id"], json!("ord_1001"), "{got}");
    // Denied: Carol's order, and an account deletion. The model reads a
    // refusal; the tools never ran.
    assert_eq!(
        alice(&["call", "get_order", r#"{"order_id": "ord_2002"}"#]),
        refused(NOT_AUTHORIZED)
    );
    let delete = r#"{"customer_id": "cus_1", "confirm": true, "reason": "asked"}"#;
    assert_eq!(
        alice(&["call", "delete_account", delete]),
        refused(NOT_AUTHORIZED)
    );
    assert_eq!(
        runs(&ran),
        vec![json!({"tool": "get_order", "arguments": {"order_id": "ord_1001"}})]
    );

    // A refund over 100.00 needs a human: refused (toolgate opened an
    // approval), and refused again while pending, with one approval for the
    // call, not two.
    let refund = r#"{"order_id": "ord_1001", "amount_cents": 25000, "currency": "USD", "reason": "damaged"}"#;
    assert_eq!(
        alice(&["call", "refund_order", refund]),
        refused(NOT_AUTHORIZED)
    );
    assert_eq!(
        alice(&["call", "refund_order", refund]),
        refused(NOT_AUTHORIZED)
    );
    let mut approvals = ApprovalServiceClient::new(channel.clone());
    let approver = token("dana", "acme", &["support_admin"]);
    let waiting = pending(&mut approvals, &approver).await;
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let approval = &waiting[0];
    assert_eq!(
        (
            approval.tool.as_str(),
            approval.requester_subject_id.as_str()
        ),
        ("refund_order", "alice")
    );
    assert_eq!(runs(&ran).len(), 1);

    // Approved, for the hash the approver saw: the same call runs once.
    let decided = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: approver.clone(),
            approval_id: approval.approval_id.clone(),
            verdict: pb::Verdict::Approve as i32,
            arguments_sha256: approval.arguments_sha256.clone(),
            reason: "damaged in transit, photo attached".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
    let paid = alice(&["call", "refund_order", refund]);
    assert_eq!(paid["isError"], json!(false), "{paid}");
    assert_eq!(
        paid["structured"]["refund_id"],
        json!("re_ord_1001"),
        "{paid}"
    );
    // The same call again is another refund: it needs its own approval.
    assert_eq!(
        alice(&["call", "refund_order", refund]),
        refused(NOT_AUTHORIZED)
    );
    let refunds: Vec<_> = runs(&ran)
        .into_iter()
        .filter(|r| r["tool"] == json!("refund_order"))
        .collect();
    assert_eq!(
        refunds,
        vec![json!({"tool": "refund_order", "arguments": {
            "order_id": "ord_1001", "amount_cents": 25000, "currency": "USD", "reason": "damaged"
        }})]
    );
    let again = pending(&mut approvals, &approver).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0].approval_id, approval.approval_id);
    drop(server);
    drop(sidecar);
}
