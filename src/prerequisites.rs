//! What the tests need from outside the repository, and the one rule for
//! when it is missing (a test helper, behind the `test-support` feature).
//!
//! The third-party conformance suites (`../shared/conformance/`) are read in
//! place, never copied into the repository: the folder is found through
//! `TOOLGATE_CONFORMANCE_DIR`, else next to the repository as
//! `../shared/conformance`. The PostgreSQL store tests
//! (`store::postgres`) need the server `TOOLGATE_TEST_POSTGRES` names.
//!
//! A missing prerequisite **fails** the test that needs it, naming it and
//! how to install or point to it ([`skip_or_fail`]). Only an explicit
//! `TOOLGATE_ALLOW_SKIPS=1` (which `scripts/test.sh --allow-skips` exports)
//! lets the test skip instead, and then the skip is recorded in the file
//! `TOOLGATE_SKIP_LOG` names, which the script lists at the end: the test
//! harness hides a passing test's stderr, so a skip said only there would
//! be invisible. Under `CI=true` nothing skips, whatever else is set.
//!
//! The integration binary applies the same rule through the `test-support`
//! feature (`tests/it/prerequisites.rs`).

#![allow(
    clippy::panic,
    reason = "a test helper: failing the calling test, with a message, is its job"
)]

use std::io::Write;
use std::path::{Path, PathBuf};

/// Set to `1`, lets a test whose prerequisite is missing skip (recorded)
/// instead of failing; ignored under `CI=true`.
pub const ALLOW_SKIPS_VAR: &str = "TOOLGATE_ALLOW_SKIPS";
/// The file each allowed skip is appended to, one `test<TAB>reason` line.
pub const SKIP_LOG_VAR: &str = "TOOLGATE_SKIP_LOG";

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
///
/// # Panics
/// Unless skips are allowed outside CI (that is the failure), and when the
/// skip cannot be recorded.
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

/// The folder of one suite (e.g. `"JSONTestSuite"`), or `None` when it is
/// absent and skips are allowed (the skip recorded by [`skip_or_fail`]).
///
/// # Panics
/// When the folder is absent, unless skips are allowed outside CI.
#[must_use]
pub fn suite_dir(suite: &str) -> Option<PathBuf> {
    let root = std::env::var_os("TOOLGATE_CONFORMANCE_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance"),
        PathBuf::from,
    );
    let dir = root.join(suite);
    if dir.is_dir() {
        return Some(dir);
    }
    skip_or_fail(
        &format!("the conformance suite `{}` is missing", dir.display()),
        "set TOOLGATE_CONFORMANCE_DIR to the folder that holds it \
         (by default `../shared/conformance`, beside the repository)",
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same table as `tests/it/prerequisites.rs`: the rule is one rule.
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
        let here = module_path!().trim_start_matches("toolgate::");
        assert_eq!(
            current_test(),
            format!("{here}::a_test_is_named_after_its_thread")
        );
    }
}
