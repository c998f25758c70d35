//! The command line: `check` diagnostics with file and line, `schema`, `authorize`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::{copy_of_examples, example_policies};

fn toolgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .output()
        .unwrap()
}

fn check(dir: &Path) -> (i32, String) {
    let out = toolgate(&["check", "--policies", dir.to_str().unwrap()]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap(), text)
}

#[test]
fn check_accepts_the_example_policies() {
    let (code, text) = check(&example_policies());
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ok: 7 tools"), "{text}");
}

#[test]
fn check_reports_the_file_and_line_of_a_broken_policy() {
    let (_tmp, dir) = copy_of_examples();
    let path = dir.join("orders.cedar");
    let text = std::fs::read_to_string(&path).unwrap();
    // Line 4 of orders.cedar is the first `permit (`: break its scope.
    assert!(text.lines().nth(3).unwrap().starts_with("permit ("));
    let broken = text.replacen(
        "permit (principal, action == Action::\"get_order\"",
        "permit (principal, action === Action::\"get_order\"",
        1,
    );
    std::fs::write(&path, broken).unwrap();
    let (code, out) = check(&dir);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{}:4:", path.display())), "{out}");
}

#[test]
fn check_reports_a_type_error_found_by_strict_validation() {
    let (_tmp, dir) = copy_of_examples();
    let path = dir.join("docs.cedar");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(
            "context.scopes.contains(\"docs:read\")",
            "context.input.limit == \"five\"",
        ),
    )
    .unwrap();
    let (code, out) = check(&dir);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{}:5:", path.display())), "{out}");
}

#[test]
fn check_reports_an_unknown_tool_field() {
    let (_tmp, dir) = copy_of_examples();
    let path = dir.join("tools/search_docs.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replacen(
            "\"parallel\": true,",
            "\"parallel\": true,\n  \"retries\": 3,",
            1,
        ),
    )
    .unwrap();
    let (code, out) = check(&dir);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("search_docs.json:8:"), "{out}");
    assert!(out.contains("retries"), "{out}");
}

#[test]
fn check_reports_a_resource_type_the_schema_lacks() {
    let (_tmp, dir) = copy_of_examples();
    let path = dir.join("tools/get_order.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("\"type\": \"Order\"", "\"type\": \"Invoice\""),
    )
    .unwrap();
    let (code, out) = check(&dir);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("get_order.json:9:"), "{out}");
    assert!(out.contains("`Invoice`"), "{out}");
}

#[test]
fn schema_prints_the_combined_schema() {
    let out = toolgate(&["schema", "--policies", example_policies().to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("entity User in [Tenant] { tenant: Tenant, roles: Set<String> };"),
        "{text}"
    );
    assert!(
        text.contains("action \"refund_order\" in [Action::\"risk:financial\"]"),
        "{text}"
    );
    assert!(text.contains("\"amount_cents\": Long"), "{text}");
    assert!(text.contains("entity Order in [Tenant]"), "{text}");
}

#[test]
fn authorize_decides_one_call_without_a_server() {
    let tmp = tempfile::tempdir().unwrap();
    let entities = tmp.path().join("entities.json");
    std::fs::write(&entities, crate::support::entities()).unwrap();
    let policies = example_policies();
    let base = [
        "authorize",
        "--policies",
        policies.to_str().unwrap(),
        "--tool",
        "refund_order",
        "--subject",
        "bob",
        "--tenant",
        "acme",
        "--role",
        "support_agent",
        "--scope",
        "orders:refund",
        "--request-id",
        "req-1",
        "--entities",
        entities.to_str().unwrap(),
        "--args",
    ];
    let run = |args: &str| {
        let mut all: Vec<&str> = base.to_vec();
        all.push(args);
        let out = toolgate(&all);
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"));
        (out.status.code().unwrap(), json)
    };
    let (code, json) =
        run(r#"{"order_id":"ord_1001","amount_cents":500,"currency":"USD","reason":"late"}"#);
    assert_eq!((code, json["decision"].as_str()), (0, Some("allow")));
    assert_eq!(
        json["policies"],
        serde_json::json!(["support-refunds-orders"])
    );
    let (code, json) =
        run(r#"{"order_id":"ord_1001","amount_cents":50000,"currency":"USD","reason":"late"}"#);
    assert_eq!(
        (code, json["decision"].as_str()),
        (3, Some("approval_required"))
    );
    assert_eq!(
        json["policies"],
        serde_json::json!(["large-refund-needs-approval"])
    );
    let (code, json) =
        run(r#"{"order_id":"ord_1001","amount_cents":50001,"currency":"USD","reason":"late"}"#);
    assert_eq!((code, json["code"].as_str()), (2, Some("forbidden")));
}

fn policy_test(args: &[&str]) -> (i32, String) {
    let mut all = vec!["test"];
    all.extend_from_slice(args);
    let out = toolgate(&all);
    assert!(out.stderr.is_empty() || out.status.code() != Some(0));
    (
        out.status.code().unwrap(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The summary line's two counts.
fn summary(out: &str) -> (usize, usize) {
    let last = out.lines().last().unwrap();
    let (passed, failed) = last.split_once(" passed, ").unwrap();
    let failed = failed.strip_suffix(" failed").unwrap();
    (passed.parse().unwrap(), failed.parse().unwrap())
}

#[test]
fn test_passes_the_examples_and_covers_every_example_policy() {
    let dir = example_policies();
    let (code, out) = policy_test(&[dir.to_str().unwrap(), "--require-coverage"]);
    assert_eq!(code, 0, "{out}");
    let (passed, failed) = summary(&out);
    assert!(passed > 0 && failed == 0, "{out}");
    // Every @id of the examples determined at least one passing case.
    let engine = toolgate::policy::PolicyEngine::load(&dir).unwrap();
    let n = engine.policy_ids().len();
    assert!(n >= 17, "{n}");
    assert!(
        out.contains(&format!(
            "coverage: {n}/{n} policies determined a passing case\n"
        )),
        "{out}"
    );
}

#[test]
fn test_lists_a_failing_case_with_a_diff_and_exits_non_zero() {
    let (_tmp, dir) = copy_of_examples();
    let (_, before) = policy_test(&["--policies", dir.to_str().unwrap()]);
    let (total, _) = summary(&before);
    // A policy edit that changes one decision the cases pin down.
    let orders = dir.join("orders.cedar");
    let text = std::fs::read_to_string(&orders).unwrap();
    std::fs::write(
        &orders,
        text.replace("amount_cents > 10000", "amount_cents > 30000"),
    )
    .unwrap();
    let (code, out) = policy_test(&["--policies", dir.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    let cases = dir.join("tests/orders.json");
    let line = std::fs::read_to_string(&cases)
        .unwrap()
        .lines()
        .position(|l| l.contains("\"name\": \"a refund over 100.00 waits for a human\""))
        .unwrap();
    let expected = format!(
        "FAIL {}:{}: a refund over 100.00 waits for a human\n  - decision: approval_required\n  + decision: allow\n  - code: `approval_required`\n  + code: (none)\n  - policies: [large-refund-needs-approval]\n  + policies: [support-refunds-orders]\n",
        cases.display(),
        line // the case's `{` is on the line before its name
    );
    assert!(out.contains(&expected), "{expected}\nnot in:\n{out}");
    assert_eq!(out.matches("FAIL ").count(), 1, "{out}");
    assert_eq!(summary(&out), (total - 1, 1), "{out}");
}

#[test]
fn test_refuses_a_malformed_case_file_with_its_line() {
    let (_tmp, dir) = copy_of_examples();
    let bad = dir.join("tests/zz-bad.json");
    std::fs::write(
        &bad,
        "{\"cases\": [\n  {\"name\": \"x\", \"tool\": \"get_order\", \"arguments\": \"{}\",\n   \"auth\": {\"subject_id\": \"a\", \"tenant_id\": \"t\"}, \"expected\": {}}]}\n",
    )
    .unwrap();
    let (code, out) = policy_test(&[dir.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "error: {}:3:60: unknown field `expected`",
            bad.display()
        )),
        "{out}"
    );
    // The other files still ran, and all passed.
    assert_eq!(summary(&out).1, 0, "{out}");
}

#[test]
fn test_names_the_policies_no_case_covers() {
    let (_tmp, dir) = copy_of_examples();
    std::fs::remove_file(dir.join("tests/docs.json")).unwrap();
    let (code, out) = policy_test(&[dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("; never: search-docs\n"), "{out}");
    let (code, out) = policy_test(&[dir.to_str().unwrap(), "--require-coverage"]);
    assert_eq!(code, 1, "{out}");
}

#[test]
fn check_reports_validator_warnings_and_json_diagnostics() {
    let (_tmp, dir) = copy_of_examples();
    let docs = dir.join("docs.cedar");
    let text = std::fs::read_to_string(&docs).unwrap();
    std::fs::write(
        &docs,
        format!("{text}\n@id(\"never\")\npermit (principal, action == Action::\"search_docs\", resource)\nwhen {{ false }};\n"),
    )
    .unwrap();
    let message = "for policy `never`, policy is impossible: the policy expression evaluates to false for all valid requests";
    // Human: shown, and only --deny-warnings fails on it.
    let (code, out) = check(&dir);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("warning: {}:7:1: {message}", docs.display())),
        "{out}"
    );
    let run = |args: &[&str]| {
        let mut all = vec![
            "check",
            "--policies",
            dir.to_str().unwrap(),
            "--format",
            "json",
        ];
        all.extend_from_slice(args);
        let out = toolgate(&all);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code().unwrap(), json)
    };
    let warning = serde_json::json!({
        "file": docs.display().to_string(), "line": 7, "column": 1, "severity": "warning",
        "code": "cedar::validation_warning", "message": message, "help": null
    });
    let (code, json) = run(&[]);
    assert_eq!(code, 0);
    assert_eq!(json["ok"], true);
    assert_eq!(json["diagnostics"], serde_json::json!([warning]));
    let (code, json) = run(&["--deny-warnings"]);
    assert_eq!((code, &json["ok"]), (1, &serde_json::json!(false)));

    // An error: machine-readable, with the file, line, column and kind.
    let orders = dir.join("orders.cedar");
    let text = std::fs::read_to_string(&orders).unwrap();
    std::fs::write(&orders, text.replacen("action ==", "action ===", 1)).unwrap();
    let (code, json) = run(&[]);
    assert_eq!(code, 1);
    assert_eq!(json["ok"], false);
    assert_eq!(json["policy_version"], serde_json::Value::Null);
    assert_eq!(
        json["diagnostics"],
        serde_json::json!([{
            "file": orders.display().to_string(), "line": 4, "column": 29, "severity": "error",
            "code": "cedar::parse", "message": "unexpected token `=`", "help": null
        }])
    );
}

/// `check-config` loads the shipped example; a misspelt `TOOLGATE_*`
/// variable is refused like a misspelt key, and a bad value names its key.
#[test]
fn check_config_loads_the_example_and_refuses_unknown_variables() {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("toolgate.example.toml");
    let run = |vars: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        cmd.args(["check-config", "--config"]).arg(&example);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = run(&[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.starts_with(
            "ok: listen Tcp(\"0.0.0.0:50051\"), 4 access grant(s), dns-rebinding guard off,"
        ),
        "{text}"
    );
    let (code, text) = run(&[("TOOLGATE_METRICS_LISTN", "127.0.0.1:1")]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("invalid TOOLGATE_* environment"), "{text}");
    assert!(text.contains("unknown field `metrics_listn`"), "{text}");
    let (code, text) = run(&[("TOOLGATE_SHUTDOWN__GRACE_MS", "soon")]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("grace_ms"), "{text}");
}

/// README.md is page one: at most 16 KiB; guides go to `docs/`.
#[test]
fn the_readme_is_page_one() {
    let readme = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let size = std::fs::metadata(&readme).unwrap().len();
    assert!(
        size <= 16 * 1024,
        "README.md is {size} bytes, over 16 KiB: move a guide to docs/"
    );
}

/// ARCHITECTURE.md stays a map (issue 34: about 12 KB at most); the long
/// form is docs/internals.md.
#[test]
fn the_architecture_is_a_map() {
    let map = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    let size = std::fs::metadata(&map).unwrap().len();
    assert!(
        size <= 12 * 1024,
        "ARCHITECTURE.md is {size} bytes, over 12 KiB: move the detail to docs/internals.md"
    );
}
