//! The Python executor and SDK (the `toolgate` package of `clients/python`,
//! installed from a clean copy of the tree, its stubs generated from
//! `proto/` by its build hook) against a real `toolgate serve`. The refund
//! example runs through the execution ledger (once per operation, even
//! after a timeout), and an
//! independent RFC 8785 implementation recomputes the idempotency key and the
//! arguments hash. A second Python client, the approver, approves the large
//! refund with a real identity token minted here (Python holds no signing key).
//! pytest collects the tests (`clients/python/test_*.py`, fixtures in its
//! `conftest.py`); its JUnit report must show every `def test_` passed.

use std::path::{Path, PathBuf};
use std::process::Command;

use toolgate::config::ListenAddr;

use crate::listeners::Pki;
use crate::prerequisites;
use crate::sidecar::Sidecar;
use crate::support::identity_args;
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

/// Copies `src` to `dst` as a clone has it: no build output, no caches,
/// no installed packages.
pub(crate) fn copy_clean(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if [
            "build",
            "dist",
            "__pycache__",
            ".pytest_cache",
            "node_modules",
        ]
        .contains(&name.as_ref())
            || name.ends_with(".egg-info")
        {
            continue;
        }
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_clean(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), to).unwrap();
        }
    }
}

/// Installs the toolgate package (`clients/python`, its stubs generated
/// from `proto/` by its build hook) from a clean copy of the tree into
/// `site`, with the build dependencies already in `py`'s environment: no
/// registry, and the source tree is left as it was.
fn install_package(py: &str, root: &Path, scratch: &Path, site: &Path) {
    let clone = scratch.join("clone");
    copy_clean(&root.join("clients/python"), &clone.join("clients/python"));
    copy_clean(&root.join("proto"), &clone.join("proto"));
    let out = Command::new(py)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args([
            "--no-build-isolation",
            "--no-index",
            "--no-deps",
            "--target",
        ])
        .arg(site)
        .arg(clone.join("clients/python"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pip install clients/python: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every `def test_` of `clients/python` passes under pytest, against a
/// real `toolgate serve` (the example policies, the test key set): the
/// refund example on the raw protocol, and the SDK (`toolgate` package):
/// the shared conformance cases, `Gate.run` once across a retry, a timeout,
/// a killed executor process and a concurrent duplicate, an approval granted
/// by a second client, the OpenAI Agents SDK and LangChain adapters, and the
/// package built from a clean tree and run from a fresh virtualenv.
#[test]
fn the_python_executor_runs_the_refund_example() {
    let Some(py) = prerequisites::python() else {
        return;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let Some(wheelhouse) = prerequisites::python_wheelhouse(&root) else {
        return;
    };
    let tests_dir = root.join("clients/python");
    let expected = defined_tests(&tests_dir);
    assert!(
        !expected.is_empty(),
        "no `def test_` in {}",
        tests_dir.display()
    );
    let scratch = tempfile::tempdir().unwrap();
    let site = scratch.path().join("site");
    install_package(&py, &root, scratch.path(), &site);
    let store = tempfile::tempdir().unwrap();
    // The SDK tests refund more than the example's 500.00 a day.
    let (_policies, policies) =
        crate::support::examples_with_refund_budget(crate::support::GENEROUS);
    let server = Sidecar::start_with_policies(store.path(), &policies, &identity_args());
    let junit = scratch.path().join("junit.xml");
    // Tenant acme: dana may decide, erin lacks the role, bob is the requester.
    let approver = token("dana", "acme", &["support_admin"]);
    let non_approver = token("erin", "acme", &["support_agent"]);
    let requester = token("bob", "acme", &["support_admin"]);
    let out = Command::new(py)
        .args(["-m", "pytest", "-q", "-rA"])
        .arg(format!("--junitxml={}", junit.display()))
        .arg(&tests_dir)
        .current_dir(&tests_dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONPATH", &site)
        .env("TOOLGATE_ADDR", server.addr.to_string())
        .env("TOOLGATE_REPO", &root)
        .env("TOOLGATE_WHEELHOUSE", &wheelhouse)
        .env("TOOLGATE_APPROVER_TOKEN", approver)
        .env("TOOLGATE_NON_APPROVER_TOKEN", non_approver)
        .env("TOOLGATE_REQUESTER_TOKEN", requester)
        .output()
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
    server.kill();
}

/// `Gate`'s channels (`clients/python/transport_check.py`): mutual TLS to a
/// listener that requires client certificates (the name checked overridden
/// to the certificate's `localhost`), refused without a client certificate
/// or without TLS, and a Unix socket named as gRPC names it (`unix:/path`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_connects_over_mutual_tls_and_a_unix_socket() {
    let Some(py) = prerequisites::python() else {
        return;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let scratch = tempfile::tempdir().unwrap();
    let site = scratch.path().join("site");
    install_package(&py, &root, scratch.path(), &site);
    let pki = Pki::new("toolgate test CA");
    let tls = pki.server_files(scratch.path());
    let (cert, key) = pki.issue("executor", &[], &["spiffe://acme/executor"], false);
    let (cert_file, key_file) = (
        scratch.path().join("exec.pem"),
        scratch.path().join("exec.key"),
    );
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let ca_file = tls.client_ca.clone().unwrap();
    let tls_server = TestServer::start_setup(|c| c.tls = Some(tls)).await;
    let socket = scratch.path().join("toolgate.sock");
    let unix_server =
        TestServer::start_setup(|c| c.listen = ListenAddr::Unix(socket.clone())).await;
    let mut check = Command::new(py);
    check
        .arg(root.join("clients/python/transport_check.py"))
        .arg(tls_server.addr.to_string())
        .args([&ca_file, &cert_file, &key_file, &socket])
        .current_dir(scratch.path())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONPATH", &site);
    let out = tokio::task::spawn_blocking(move || check.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "mtls: allow\n\
         tls without a client certificate: UNAVAILABLE\n\
         plaintext to a TLS listener: UNAVAILABLE\n\
         unix: allow\n",
        "{stderr}"
    );
    tls_server.stop().await;
    unix_server.stop().await;
}
