//! Locating the third-party conformance suites (`../shared/conformance/`) for tests.
//!
//! The suites are read in place, never copied into the repository. The folder
//! is found through `TOOLGATE_CONFORMANCE_DIR`, else next to the repository as
//! `../shared/conformance`. Where it is absent the calling test says so loudly
//! and returns early; under `CI=true` its absence is a failure.

use std::path::PathBuf;

/// The folder of one suite (e.g. `"JSONTestSuite"`), or `None` after a loud
/// notice when the conformance folder is absent outside CI.
///
/// # Panics
/// Under `CI=true` when the folder is absent: CI must never skip conformance.
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
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    assert!(
        !in_ci,
        "conformance suite `{}` not found (set TOOLGATE_CONFORMANCE_DIR); CI must not skip it",
        dir.display()
    );
    eprintln!(
        "\n!!! SKIPPED: conformance suite `{}` not found; set TOOLGATE_CONFORMANCE_DIR to run it !!!\n",
        dir.display()
    );
    None
}
