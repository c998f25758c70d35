//! The Node.js clients (`clients/node/`) against the real server: the
//! executor (@grpc/grpc-js + @grpc/proto-loader on `proto/`, no code
//! generation) runs the refund flow through a human's approval and through
//! the execution ledger (a retry gets the stored result and never refunds
//! twice; a lost answer is reconciled), and a real
//! gRPC-Web client (Connect) decides an approval as a browser UI would, on
//! the same listener, after a CORS preflight. `scripts/test.sh` installs the
//! npm dependencies (`npm ci`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::prerequisites;
use crate::support::{TestServer, token};

const WEB_ORIGIN: &str = "https://approvals.acme.test";

/// The test files `node --test` runs, in `clients/node`.
const TEST_FILES: [&str; 2] = ["test/refund.test.js", "test/grpc_web.test.js"];

/// How many top-level `test(` the test files define: what must pass.
fn defined_tests(client_dir: &Path) -> usize {
    TEST_FILES
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(client_dir.join(file)).unwrap();
            text.lines().filter(|l| l.starts_with("test(")).count()
        })
        .sum()
}

/// The counts of the TAP summary (`# pass 8`, …) in the order asked.
fn tap_summary(tap: &str, keys: &[&str]) -> Vec<Option<u64>> {
    keys.iter()
        .map(|key| {
            let prefix = format!("# {key} ");
            tap.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|n| n.trim().parse().ok())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_clients_run_the_refund_flow_and_grpc_web() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let client_dir = root.join("clients/node");
    let Some(node) = prerequisites::node(&client_dir) else {
        return;
    };
    let expected = defined_tests(&client_dir);
    assert!(expected > 0, "no `test(` in {TEST_FILES:?}");
    let server = TestServer::start_setup(|c| c.cors_origins = vec![WEB_ORIGIN.to_owned()]).await;
    let dir = tempfile::tempdir().unwrap();
    let descriptors = dir.path().join("toolgate.binpb");
    std::fs::write(&descriptors, toolgate::grpc::pb::FILE_DESCRIPTOR_SET).unwrap();
    let addr = server.addr.to_string();
    let approver = token("dana", "acme", &["support_admin"]);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(node)
            .args(["--test", "--test-reporter=tap"])
            .args(TEST_FILES)
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
    // Every test defined ran and passed; none failed, was cancelled or skipped.
    let n = Some(expected as u64);
    assert_eq!(
        tap_summary(
            &text,
            &["tests", "pass", "fail", "cancelled", "skipped", "todo"]
        ),
        [n, n, Some(0), Some(0), Some(0), Some(0)],
        "{text}"
    );
    server.stop().await;
}
