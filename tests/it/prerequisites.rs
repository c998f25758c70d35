//! What the integration tests need from the machine, and the one rule for
//! when it is missing: the PostgreSQL test server (`TOOLGATE_TEST_POSTGRES`,
//! probed by `support::postgres_or_skip`), a Python with the client's
//! packages (`TOOLGATE_PYTHON`), Node.js with `clients/node`'s packages
//! (`TOOLGATE_NODE`).
//!
//! A missing prerequisite **fails** the test that needs it, naming it and
//! how to install or point to it ([`skip_or_fail`]). Only an explicit
//! `TOOLGATE_ALLOW_SKIPS=1` (which `scripts/test.sh --allow-skips` exports)
//! lets the test skip instead, and then the skip is recorded in the file
//! `TOOLGATE_SKIP_LOG` names, which the script lists at the end: the test
//! harness hides a passing test's stderr. Under `CI=true` nothing skips,
//! whatever else is set. The lib's unit tests keep the same rule in
//! `src/conformance.rs`; the tests of both pin it.

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// Set to `1`, lets a test whose prerequisite is missing skip (recorded)
/// instead of failing; ignored under `CI=true`.
const ALLOW_SKIPS_VAR: &str = "TOOLGATE_ALLOW_SKIPS";
/// The file each allowed skip is appended to, one `test<TAB>reason` line.
const SKIP_LOG_VAR: &str = "TOOLGATE_SKIP_LOG";

/// What a test does when a prerequisite is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// `CI=true`: the test fails; CI never skips, even when skips are allowed.
    Ci,
    /// `TOOLGATE_ALLOW_SKIPS=1` outside CI: the test skips, recorded.
    AllowSkips,
    /// Otherwise: the test fails, saying how to allow skips.
    Strict,
}

/// The rule for the values of `CI` and `TOOLGATE_ALLOW_SKIPS`.
fn rule(ci: Option<&str>, allow_skips: Option<&str>) -> Rule {
    if ci == Some("true") {
        Rule::Ci
    } else if allow_skips == Some("1") {
        Rule::AllowSkips
    } else {
        Rule::Strict
    }
}

/// Fails the calling test, naming what is `missing` and `how` to install or
/// point to it; or, when skips are allowed outside CI, records the skip and
/// returns, and the caller returns early.
pub fn skip_or_fail(missing: &str, how: &str) {
    let test = current_test();
    let ci = std::env::var("CI").ok();
    let allow = std::env::var(ALLOW_SKIPS_VAR).ok();
    match rule(ci.as_deref(), allow.as_deref()) {
        Rule::Ci => panic!(
            "{test}: {missing}; {how} (CI=true: CI never skips a test, even with {ALLOW_SKIPS_VAR}=1)"
        ),
        Rule::Strict => panic!(
            "{test}: {missing}; {how}, or skip the tests that need it with \
             `./scripts/test.sh --allow-skips` ({ALLOW_SKIPS_VAR}=1)"
        ),
        Rule::AllowSkips => {
            let reason = format!("{missing}; {how}");
            if let Some(log) = std::env::var_os(SKIP_LOG_VAR)
                && let Err(e) = record_skip(Path::new(&log), &test, &reason)
            {
                panic!("{test}: cannot record its skip in {SKIP_LOG_VAR}: {e}");
            }
            eprintln!("\n!!! SKIPPED {test}: {reason} !!!\n");
        }
    }
}

/// The running test's name: libtest names each test's thread after it.
fn current_test() -> String {
    std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("a test")
        .to_owned()
}

/// Appends `test<TAB>reason` as one line, in one write, so concurrent tests
/// and processes never interleave their lines.
fn record_skip(log: &Path, test: &str, reason: &str) -> std::io::Result<()> {
    let line = format!("{test}\t{}\n", reason.replace(['\t', '\n'], " "));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?
        .write_all(line.as_bytes())
}

/// The PostgreSQL test server did not let us create a schema: fails the
/// test, or records its skip where skips are allowed.
pub fn postgres_unreachable(error: &dyn std::fmt::Display) {
    skip_or_fail(
        &format!(
            "no PostgreSQL test server ({error}) at TOOLGATE_TEST_POSTGRES \
             (default `postgres://postgres@127.0.0.1:5432/test`)"
        ),
        "start it, or set TOOLGATE_TEST_POSTGRES to a server where this user \
         may create schemas and roles",
    );
}

/// The Python interpreter with `grpcio`, `grpcio-tools`, `rfc8785` and
/// `pytest` (`clients/python/requirements.txt`): `TOOLGATE_PYTHON` (set by
/// `scripts/test.sh` to its virtualenv), else `python3`. `None` only when it
/// lacks them and skips are allowed.
pub fn python() -> Option<String> {
    let py = std::env::var("TOOLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import grpc, grpc_tools, rfc8785, pytest"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(py);
    }
    skip_or_fail(
        &format!("`{py}` lacks grpcio, grpcio-tools, rfc8785 or pytest"),
        "run ./scripts/test.sh (it installs clients/python/requirements.txt into .venv), \
         or set TOOLGATE_PYTHON to a Python that has them",
    );
    None
}

/// `node` (or `TOOLGATE_NODE`) with `clients/node`'s npm packages installed
/// in `client_dir`. `None` only when either is missing and skips are allowed.
pub fn node(client_dir: &Path) -> Option<String> {
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
    skip_or_fail(
        &format!("`{node}` (Node.js 20 or later) or the npm packages of clients/node are missing"),
        "install Node.js 20 or later and run ./scripts/test.sh (it runs `npm ci` in clients/node), \
         or set TOOLGATE_NODE",
    );
    None
}

/// The same table as `src/conformance.rs`: the rule is one rule.
#[test]
fn ci_never_skips_and_only_an_explicit_allow_skips_does() {
    assert_eq!(rule(Some("true"), Some("1")), Rule::Ci);
    assert_eq!(rule(Some("true"), None), Rule::Ci);
    assert_eq!(rule(None, Some("1")), Rule::AllowSkips);
    assert_eq!(rule(Some("false"), Some("1")), Rule::AllowSkips);
    assert_eq!(rule(None, None), Rule::Strict);
    assert_eq!(rule(None, Some("0")), Rule::Strict);
    assert_eq!(rule(None, Some("yes")), Rule::Strict);
    assert_eq!(rule(None, Some("")), Rule::Strict);
}

#[test]
fn each_skip_is_one_line_appended_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("skips");
    record_skip(&log, "a::first", "no server\tat all\nreally").unwrap();
    record_skip(&log, "b::second", "no folder").unwrap();
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "a::first\tno server at all really\nb::second\tno folder\n"
    );
}

#[test]
fn a_test_is_named_after_its_thread() {
    assert_eq!(
        current_test(),
        "prerequisites::a_test_is_named_after_its_thread"
    );
}
