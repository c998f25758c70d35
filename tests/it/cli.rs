//! The command line: `check` diagnostics with file and line, `schema`, `authorize`.

use std::path::Path;
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
    assert!(text.contains("ok: 6 tools"), "{text}");
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
