//! The Python executor (grpcio, stubs generated from `proto/` at test time)
//! runs the README's refund example against the real server, through the
//! execution ledger (once per operation, even after a timeout), and an
//! independent RFC 8785 implementation recomputes the idempotency key and the
//! arguments hash. A second Python client, the approver, approves the large
//! refund with a real identity token minted here (Python holds no signing key).

use std::path::PathBuf;
use std::process::Command;

use crate::support::{TestServer, token};

/// The Python interpreter with `grpcio`, `grpcio-tools` and `rfc8785`:
/// `TOOLGATE_PYTHON` (set by `scripts/test.sh`), else `python3`.
fn python() -> Option<String> {
    let py = std::env::var("TOOLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import grpc, grpc_tools, rfc8785"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(py);
    }
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    assert!(
        !in_ci,
        "`{py}` lacks grpcio, grpcio-tools or rfc8785; CI must run the Python executor test (scripts/test.sh installs them)"
    );
    eprintln!(
        "\n!!! SKIPPED: `{py}` lacks grpcio/grpcio-tools/rfc8785; run scripts/test.sh to install them !!!\n"
    );
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_executor_runs_the_refund_example() {
    let Some(py) = python() else { return };
    let server = TestServer::start().await;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let stubs = tempfile::tempdir().unwrap();
    let addr = server.addr.to_string();
    // Tenant acme: dana may decide, erin lacks the role, bob is the requester.
    let approver = token("dana", "acme", &["support_admin"]);
    let non_approver = token("erin", "acme", &["support_agent"]);
    let requester = token("bob", "acme", &["support_admin"]);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .arg(root.join("clients/python/test_refund_example.py"))
            .env("TOOLGATE_ADDR", addr)
            .env("TOOLGATE_PROTO_DIR", root.join("proto"))
            .env("TOOLGATE_STUB_DIR", stubs.path())
            .env("TOOLGATE_APPROVER_TOKEN", approver)
            .env("TOOLGATE_NON_APPROVER_TOKEN", non_approver)
            .env("TOOLGATE_REQUESTER_TOKEN", requester)
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
    assert!(text.contains("10 passed, 0 failed"), "{text}");
    server.stop().await;
}
