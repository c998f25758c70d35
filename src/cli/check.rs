//! `toolgate check`: the policy folder loaded and validated; file:line
//! diagnostics for a person or one JSON object for a CI pipeline.

use std::path::PathBuf;
use std::process::ExitCode;

use super::report::report;
use crate::policy::{LoadErrors, PolicyEngine, SourceDiagnostic};

#[derive(clap::Args)]
pub(super) struct CheckArgs {
    #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
    policies: PathBuf,
    /// `human` (file:line:column: message, with the source) or `json`
    /// (one object with every diagnostic, for CI pipelines).
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
    /// Fail (exit 1) on Cedar validator warnings too.
    #[arg(long)]
    deny_warnings: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Human,
    Json,
}

pub(super) fn run(args: &CheckArgs) -> ExitCode {
    let loaded = PolicyEngine::load(&args.policies);
    let failed = failed(&loaded, args.deny_warnings);
    match (args.format, &loaded) {
        (Format::Json, _) => println!("{:#}", json_report(&loaded, failed)),
        (Format::Human, Ok(engine)) => {
            for w in engine.warnings() {
                println!("warning: {w}");
            }
            println!("{}", summary(engine, failed));
        }
        (Format::Human, Err(errors)) => report(errors),
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Whether the check fails: an invalid set, or warnings under `--deny-warnings`.
fn failed(loaded: &Result<PolicyEngine, LoadErrors>, deny_warnings: bool) -> bool {
    match loaded {
        Ok(engine) => deny_warnings && !engine.warnings().is_empty(),
        Err(_) => true,
    }
}

/// The last line of a human check of a valid set.
fn summary(engine: &PolicyEngine, failed: bool) -> String {
    format!(
        "{}: {} tools, {} policies, {} warning(s), policy_version {}",
        if failed { "failed" } else { "ok" },
        engine.tools().len(),
        engine.policy_count(),
        engine.warnings().len(),
        engine.version()
    )
}

/// `--format json`: one object with the counts and every diagnostic.
fn json_report(loaded: &Result<PolicyEngine, LoadErrors>, failed: bool) -> serde_json::Value {
    let (engine, diagnostics): (Option<&PolicyEngine>, Vec<SourceDiagnostic>) = match loaded {
        Ok(engine) => (Some(engine), engine.warnings().to_vec()),
        Err(errors) => {
            let mut all = errors.diagnostics();
            all.extend(errors.warnings.iter().cloned());
            (None, all)
        }
    };
    let count = |severity: &str| {
        diagnostics
            .iter()
            .filter(|d| d.severity.as_str() == severity)
            .count()
    };
    serde_json::json!({
        "ok": !failed,
        "policy_version": engine.map(PolicyEngine::version),
        "tools": engine.map(|e| e.tools().len()),
        "policies": engine.map(PolicyEngine::policy_count),
        "errors": count("error"),
        "warnings": count("warning"),
        "diagnostics": diagnostics.iter().map(|d| serde_json::json!({
            "file": d.path.display().to_string(),
            "line": d.line,
            "column": d.column,
            "severity": d.severity.as_str(),
            "code": d.code,
            "message": d.message,
            "help": d.help,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::example_policies;
    use super::*;

    #[test]
    fn the_example_set_checks_clean() {
        let loaded = PolicyEngine::load(&example_policies());
        let engine = loaded.as_ref().unwrap();
        assert!(!failed(&loaded, true));
        let json = json_report(&loaded, false);
        assert_eq!(json["ok"], true);
        assert_eq!(json["errors"], 0);
        assert_eq!(json["warnings"], 0);
        assert_eq!(json["tools"], engine.tools().len());
        assert_eq!(json["policy_version"], engine.version());
        assert_eq!(json["diagnostics"], serde_json::json!([]));
        assert!(summary(engine, false).starts_with(&format!(
            "ok: {} tools, {} policies, 0 warning(s), policy_version ",
            engine.tools().len(),
            engine.policy_count()
        )));
    }

    #[test]
    fn an_invalid_set_reports_its_error_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tools")).unwrap();
        std::fs::write(dir.path().join("bad.cedar"), "permit(\n").unwrap();
        let loaded = PolicyEngine::load(dir.path());
        assert!(failed(&loaded, false));
        let json = json_report(&loaded, true);
        assert_eq!(json["ok"], false);
        assert_eq!(json["tools"], serde_json::Value::Null);
        assert!(json["errors"].as_u64().unwrap() >= 1, "{json:#}");
        let first = &json["diagnostics"][0];
        assert_eq!(first["severity"], "error");
        assert!(
            first["file"].as_str().unwrap().ends_with("bad.cedar"),
            "{json:#}"
        );
    }
}
