//! The Python executor (grpcio, stubs generated from `proto/` at test time)
//! runs the README's refund example against the real server, through the
//! execution ledger (once per operation, even after a timeout), and an
//! independent RFC 8785 implementation recomputes the idempotency key and the
//! arguments hash. A second Python client, the approver, approves the large
//! refund with a real identity token minted here (Python holds no signing key).
//! pytest collects the tests (`clients/python/test_*.py`, fixtures in its
//! `conftest.py`); its JUnit report must show every `def test_` passed.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::prerequisites;
use crate::support::{TestServer, token};

/// The `module::test_function` of every `def test_` in `clients/python`'s
/// `test_*.py` files: what pytest must collect, and pass.
fn defined_tests(dir: &Path) -> Vec<String> {
    let mut tests = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_owned();
        let Some(module) = file.strip_suffix(".py").filter(|m| m.starts_with("test_")) else {
            continue;
        };
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            if let Some(rest) = line.strip_prefix("def test_") {
                let name = rest.split('(').next().unwrap();
                tests.push(format!("{module}::test_{name}"));
            }
        }
    }
    tests.sort();
    tests
}

/// The value of the attribute `name` in a start tag's `attributes` (its
/// text after the element's name, up to `>`).
fn attribute<'a>(attributes: &'a str, name: &str) -> &'a str {
    let key = format!("{name}=\"");
    let start = attributes
        .split_inclusive(' ')
        .scan(0, |at, word| {
            let here = *at;
            *at += word.len();
            Some((here, word))
        })
        .find(|(_, word)| word.starts_with(&key))
        .map(|(at, _)| at + key.len())
        .unwrap_or_else(|| panic!("no {name} in `{attributes}`"));
    let len = attributes[start..].find('"').unwrap();
    &attributes[start..start + len]
}

/// The attributes of each element `name` in `xml`, in order.
fn elements<'a>(xml: &'a str, name: &str) -> Vec<&'a str> {
    xml.split(&format!("<{name} "))
        .skip(1)
        .map(|rest| &rest[..rest.find('>').unwrap()])
        .collect()
}

/// pytest's JUnit report: the suite's counts (tests, failures, errors,
/// skipped) and each test case as `module::function`, with whether it
/// passed (an empty element: no failure, error or skip inside).
fn junit_report(xml: &str) -> ([String; 4], Vec<(String, bool)>) {
    let suites = elements(xml, "testsuite");
    assert_eq!(suites.len(), 1, "{xml}");
    let counts =
        ["tests", "failures", "errors", "skipped"].map(|k| attribute(suites[0], k).to_owned());
    let mut cases: Vec<_> = elements(xml, "testcase")
        .into_iter()
        .map(|case| {
            let name = format!(
                "{}::{}",
                attribute(case, "classname"),
                attribute(case, "name")
            );
            (name, case.ends_with('/'))
        })
        .collect();
    cases.sort();
    (counts, cases)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_executor_runs_the_refund_example() {
    let Some(py) = prerequisites::python() else {
        return;
    };
    let server = TestServer::start().await;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tests_dir = root.join("clients/python");
    let expected = defined_tests(&tests_dir);
    assert!(
        !expected.is_empty(),
        "no `def test_` in {}",
        tests_dir.display()
    );
    let scratch = tempfile::tempdir().unwrap();
    let stubs = scratch.path().join("stubs");
    std::fs::create_dir(&stubs).unwrap();
    let junit = scratch.path().join("junit.xml");
    let addr = server.addr.to_string();
    // Tenant acme: dana may decide, erin lacks the role, bob is the requester.
    let approver = token("dana", "acme", &["support_admin"]);
    let non_approver = token("erin", "acme", &["support_agent"]);
    let requester = token("bob", "acme", &["support_admin"]);
    let args = (tests_dir.clone(), junit.clone());
    let out = tokio::task::spawn_blocking(move || {
        let (tests_dir, junit) = args;
        Command::new(py)
            .args(["-m", "pytest", "-q", "-rA"])
            .arg(format!("--junitxml={}", junit.display()))
            .arg(&tests_dir)
            .current_dir(&tests_dir)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("TOOLGATE_ADDR", addr)
            .env("TOOLGATE_PROTO_DIR", root.join("proto"))
            .env("TOOLGATE_STUB_DIR", &stubs)
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
    // Every test defined was collected and passed; none failed or skipped.
    let (counts, cases) = junit_report(&std::fs::read_to_string(&junit).unwrap());
    assert_eq!(
        counts,
        [
            expected.len().to_string(),
            "0".into(),
            "0".into(),
            "0".into()
        ],
        "{text}"
    );
    let passed: Vec<_> = expected.iter().map(|name| (name.clone(), true)).collect();
    assert_eq!(cases, passed, "{text}");
    server.stop().await;
}
