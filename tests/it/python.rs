//! The Python executor (grpcio, stubs generated from `proto/` at test time)
//! runs the README's refund example against the real server, and an
//! independent RFC 8785 implementation recomputes the idempotency key.

use std::path::PathBuf;
use std::process::Command;

use crate::support::TestServer;

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
    let out = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .arg(root.join("clients/python/test_refund_example.py"))
            .env("TOOLGATE_ADDR", addr)
            .env("TOOLGATE_PROTO_DIR", root.join("proto"))
            .env("TOOLGATE_STUB_DIR", stubs.path())
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
    assert!(text.contains("5 passed, 0 failed"), "{text}");
    server.stop().await;
}
