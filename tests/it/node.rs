//! The TypeScript SDK (`clients/node/`, `@toolgate/client`) against a real
//! `toolgate serve` (the example policies, approver tokens from
//! `tests/it/fixtures/keys`, gRPC-Web allowed for one origin): `npm pack`
//! builds and packs it, then `node --test` runs its tests: the shared
//! conformance cases (`clients/conformance/cases.json`), `Gate.run`
//! exactly once across a retry, a lost answer and a timeout (reconcile), a
//! lost lease, a killed executor process resumed by a second one and a
//! concurrent duplicate; the approval flow with a second client approving;
//! gRPC-Web (Connect's browser transport) and CORS; the Vercel AI SDK and
//! OpenAI Agents SDK adapters through the frameworks' own test models; and
//! the packed tarball installed into a fresh project, where the example
//! runs and a TypeScript consumer type-checks. `scripts/test.sh` installs
//! the npm packages (`npm ci`).

use std::path::{Path, PathBuf};
use std::process::Command;

use std::collections::BTreeSet;

use toolgate::access::{AccessPolicy, CallerPattern, Grant, ServiceName, TenantScope};
use toolgate::config::ListenAddr;

use crate::listeners::Pki;
use crate::prerequisites;
use crate::sidecar::Sidecar;
use crate::support::{TestServer, identity_args, token};

const WEB_ORIGIN: &str = "https://approvals.acme.test";

/// The test files `node --test` runs, in `clients/node`.
const TEST_FILES: [&str; 7] = [
    "test/conformance.test.js",
    "test/transport.test.js",
    "test/run.test.js",
    "test/approval.test.js",
    "test/grpc_web.test.js",
    "test/adapters.test.js",
    "test/pack.test.js",
];

/// How many top-level `test(` the test files define.
fn defined_tests(client_dir: &Path, files: &[&str]) -> usize {
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(client_dir.join(file)).unwrap();
            text.lines().filter(|l| l.starts_with("test(")).count()
        })
        .sum()
}

/// The shared conformance cases, `cases` and `sdk_semantics`: each runs as
/// one subtest.
fn conformance_cases(root: &Path) -> (PathBuf, usize) {
    let path = root.join("clients/conformance/cases.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the shared cases {}: {e}", path.display()));
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap();
    let n = cases["cases"].as_array().map_or(0, Vec::len);
    assert!(n > 0, "no cases in {}", path.display());
    let semantics = cases["sdk_semantics"]["cases"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(
        semantics > 0,
        "no sdk_semantics cases in {}",
        path.display()
    );
    let n = n + semantics;
    (path, n)
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

/// `npm pack` in `client_dir` (its `prepack` builds `dist/` from `src/`
/// and `proto/`): the tarball, in `into`.
fn pack(client_dir: &Path, into: &Path) -> PathBuf {
    let npm = std::env::var("TOOLGATE_NPM").unwrap_or_else(|_| "npm".into());
    let out = Command::new(&npm)
        .args(["pack", "--loglevel=error", "--pack-destination"])
        .arg(into)
        .current_dir(client_dir)
        .output()
        .unwrap_or_else(|e| panic!("`{npm} pack`: {e}"));
    assert!(
        out.status.success(),
        "npm pack: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let name = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap()
        .trim()
        .to_owned();
    let tarball = into.join(name);
    assert!(tarball.is_file(), "{}", tarball.display());
    tarball
}

/// `npm ci && npm pack`, as docs/sdks.md says, in a clean copy of
/// `clients/node` and `proto/` (no node_modules, no build output): `npm pack`
/// alone fails naming the missing dev dependency and the command to run;
/// after `npm ci` (from npm's cache when it has the packages) it packs.
#[test]
fn npm_pack_works_on_a_fresh_clone_as_documented() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let client_dir = root.join("clients/node");
    if prerequisites::node(&client_dir).is_none() {
        return;
    }
    let npm = std::env::var("TOOLGATE_NPM").unwrap_or_else(|_| "npm".into());
    let clone = tempfile::tempdir().unwrap();
    let fresh = clone.path().join("clients/node");
    crate::python::copy_clean(&client_dir, &fresh);
    crate::python::copy_clean(&root.join("proto"), &clone.path().join("proto"));
    for built in ["src/generated", "proto", "src/descriptors.generated.ts"] {
        let path = fresh.join(built);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else if path.exists() {
            std::fs::remove_file(&path).unwrap();
        }
    }
    let npm_in = |args: &[&str]| {
        Command::new(&npm)
            .args(args)
            .args(["--loglevel=error"])
            .current_dir(&fresh)
            .output()
            .unwrap_or_else(|e| panic!("`{npm} {args:?}`: {e}"))
    };
    let refused = npm_in(&["pack", "--dry-run"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "npm pack without npm ci: {said}");
    assert!(
        said.contains("build: the dev dependency `protobufjs` is not installed")
            && said.contains("run `npm ci` in"),
        "{said}"
    );
    let ci = npm_in(&["ci", "--no-audit", "--no-fund", "--prefer-offline"]);
    assert!(
        ci.status.success(),
        "npm ci: {}",
        String::from_utf8_lossy(&ci.stderr)
    );
    let tarball = pack(&fresh, clone.path());
    assert_eq!(
        tarball.file_name().and_then(|n| n.to_str()),
        Some("toolgate-client-0.1.0.tgz")
    );
}

/// The other listeners, in process: a Unix socket whose peer uid, and an
/// mTLS listener whose executor certificate, are granted authorization and
/// the ledger. Their certificates are written in `dir`.
async fn transport_servers(dir: &Path) -> (TestServer, TestServer) {
    let socket = dir.join("toolgate.sock");
    let uid = my_uid(dir);
    let unix = TestServer::start_setup(|c| {
        c.listen = ListenAddr::Unix(socket.clone());
        c.access = AccessPolicy::Grants(vec![grant(&format!("uid:{uid}"))]);
    })
    .await;
    let pki = Pki::new("toolgate test CA");
    let tls = pki.server_files(dir);
    let (cert, key) = pki.issue("executor", &[], &["spiffe://acme/executor"], false);
    std::fs::write(dir.join("executor.pem"), cert).unwrap();
    std::fs::write(dir.join("executor.key"), key).unwrap();
    let mtls = TestServer::start_setup(|c| {
        c.access = AccessPolicy::Grants(vec![grant("san:spiffe://acme/executor")]);
        c.tls = Some(tls);
    })
    .await;
    (unix, mtls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_against_a_real_sidecar() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let client_dir = root.join("clients/node");
    let Some(node) = prerequisites::node(&client_dir) else {
        return;
    };
    let (cases_path, cases) = conformance_cases(&root);
    let expected = defined_tests(&client_dir, &TEST_FILES) + cases;

    let dir = tempfile::tempdir().unwrap();
    // The binary reads toolgate.toml from its working folder.
    std::fs::write(
        dir.path().join("toolgate.toml"),
        format!("[grpc_web]\nallowed_origins = [\"{WEB_ORIGIN}\"]\n"),
    )
    .unwrap();
    // The SDK tests refund more than the example's 500.00 a day.
    let (_policies, policies) =
        crate::support::examples_with_refund_budget(crate::support::GENEROUS);
    let sidecar = Sidecar::start_with_policies(dir.path(), &policies, &identity_args());
    let (unix, mtls) = transport_servers(dir.path()).await;
    let addr = sidecar.addr.to_string();
    let tls_addr = format!("localhost:{}", mtls.addr.port());
    let dir_path = dir.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        let tarball = pack(&client_dir, &dir_path);
        Command::new(node)
            .args(["--test", "--test-reporter=tap"])
            .args(TEST_FILES)
            .current_dir(&client_dir)
            .env("TOOLGATE_ADDR", addr)
            .env(
                "TOOLGATE_TEST_APPROVER_TOKEN",
                token("dana", "acme", &["support_admin"]),
            )
            // bob, the requester of the approvals the tests ask for: he may not decide them.
            .env(
                "TOOLGATE_TEST_REQUESTER_TOKEN",
                token("bob", "acme", &["support_admin"]),
            )
            .env("TOOLGATE_TEST_WEB_ORIGIN", WEB_ORIGIN)
            .env("TOOLGATE_CONFORMANCE_CASES", &cases_path)
            .env("TOOLGATE_TEST_PACKAGE", &tarball)
            .env("TOOLGATE_TEST_UNIX", dir_path.join("toolgate.sock"))
            .env("TOOLGATE_TEST_TLS_ADDR", tls_addr)
            .env("TOOLGATE_TEST_TLS_DIR", &dir_path)
            .env_remove("TOOLGATE_PROTO_DIR")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    all_passed(&out, expected);
    unix.stop().await;
    mtls.stop().await;
    sidecar.kill();
}

/// `node --test` succeeded, and exactly `expected` tests ran and passed;
/// none failed, was cancelled or skipped.
fn all_passed(out: &std::process::Output, expected: usize) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let n = Some(expected as u64);
    assert_eq!(
        tap_summary(
            &text,
            &["tests", "pass", "fail", "cancelled", "skipped", "todo"]
        ),
        [n, n, Some(0), Some(0), Some(0), Some(0)],
        "{text}"
    );
}

fn grant(caller: &str) -> Grant {
    Grant {
        caller: CallerPattern::parse(caller).unwrap(),
        services: BTreeSet::from([ServiceName::Authorization, ServiceName::Ledger]),
        tenants: TenantScope::Any,
    }
}

/// This process's uid, from a file it creates.
fn my_uid(dir: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    let probe = dir.join("uid-probe");
    std::fs::write(&probe, b"").unwrap();
    std::fs::metadata(&probe).unwrap().uid()
}
