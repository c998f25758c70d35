//! The Node.js clients (`clients/node/`) against the real server: the
//! executor (@grpc/grpc-js + @grpc/proto-loader on `proto/`, no code
//! generation) runs the refund flow through a human's approval and through
//! the execution ledger (a retry gets the stored result and never refunds
//! twice; a lost answer is reconciled), and a real
//! gRPC-Web client (Connect) decides an approval as a browser UI would, on
//! the same listener, after a CORS preflight. `scripts/test.sh` installs the
//! npm dependencies (`npm ci`).

use std::path::PathBuf;
use std::process::Command;

use crate::support::{TestServer, token};

const WEB_ORIGIN: &str = "https://approvals.acme.test";

/// `node` (or `TOOLGATE_NODE`) with the client's dependencies installed.
fn node(client_dir: &std::path::Path) -> Option<String> {
    let node = std::env::var("TOOLGATE_NODE").unwrap_or_else(|_| "node".into());
    let runs = Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let installed = client_dir.join("node_modules/@grpc/grpc-js").is_dir()
        && client_dir
            .join("node_modules/@connectrpc/connect-node")
            .is_dir();
    if runs && installed {
        return Some(node);
    }
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    assert!(
        !in_ci,
        "`{node}` or the npm dependencies of clients/node are missing; CI must run the Node.js tests (scripts/test.sh runs `npm ci`)"
    );
    eprintln!(
        "\n!!! SKIPPED: `{node}` or clients/node/node_modules missing; run scripts/test.sh (npm ci) !!!\n"
    );
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_clients_run_the_refund_flow_and_grpc_web() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let client_dir = root.join("clients/node");
    let Some(node) = node(&client_dir) else {
        return;
    };
    let server = TestServer::start_setup(|c| c.cors_origins = vec![WEB_ORIGIN.to_owned()]).await;
    let dir = tempfile::tempdir().unwrap();
    let descriptors = dir.path().join("toolgate.binpb");
    std::fs::write(&descriptors, toolgate::grpc::pb::FILE_DESCRIPTOR_SET).unwrap();
    let addr = server.addr.to_string();
    let approver = token("dana", "acme", &["support_admin"]);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(node)
            .args(["--test", "test/refund.test.js", "test/grpc_web.test.js"])
            .current_dir(&client_dir)
            .env("TOOLGATE_ADDR", addr)
            .env("TOOLGATE_PROTO_DIR", root.join("proto"))
            .env("TOOLGATE_TEST_APPROVER_TOKEN", approver)
            .env("TOOLGATE_TEST_DESCRIPTOR_SET", &descriptors)
            .env("TOOLGATE_TEST_WEB_ORIGIN", WEB_ORIGIN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("# pass 8"), "{text}");
    assert!(text.contains("# fail 0"), "{text}");
    server.stop().await;
}
