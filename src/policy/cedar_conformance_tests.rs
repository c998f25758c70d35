//! The Cedar project's own integration tests (`cedar-integration-tests`,
//! format in its PROVENANCE.md), run through toolgate's evaluation layer
//! ([`super::plain`], which slices and evaluates exactly as a decision
//! does): every request's decision, determining policies and errors.

use std::fs;
use std::path::Path;

use serde_json::Value;

use super::plain::PlainCedar;
use crate::prerequisites::suite_dir;

/// The hand-written tests kept in the suite (PROVENANCE.md): a file that
/// goes missing must fail the run, not shrink it.
const REQUESTS: usize = 74;
const ALLOWS: usize = 38;
const FILES: usize = 22;

fn read_json(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

#[test]
fn cedar_integration_tests_decide_as_cedar_says() {
    let Some(root) = suite_dir("cedar-integration-tests") else {
        return;
    };
    let mut cases: Vec<_> = fs::read_dir(root.join("tests"))
        .unwrap()
        .flat_map(|d| fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    cases.sort();

    let (mut requests, mut allows) = (0, 0);
    let mut failures = Vec::new();
    for case in &cases {
        let name = case.strip_prefix(&root).unwrap().display().to_string();
        let spec = read_json(case);
        let text = |key: &str| {
            let path = root.join(spec[key].as_str().unwrap());
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let entities = read_json(&root.join(spec["entities"].as_str().unwrap()));
        let set = PlainCedar::new(&text("schema"), &text("policies"), &entities)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let should_validate = spec["shouldValidate"].as_bool().unwrap();
        assert_eq!(
            set.validation_errors().is_empty(),
            should_validate,
            "{name}: validation errors {:?}",
            set.validation_errors()
        );
        for request in spec["requests"].as_array().unwrap() {
            requests += 1;
            let description = request["description"].as_str().unwrap_or("");
            let validate = request
                .get("validateRequest")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let answer = set
                .evaluate(
                    &request["principal"],
                    &request["action"],
                    &request["resource"],
                    &request["context"],
                    validate,
                )
                .unwrap_or_else(|e| panic!("{name}: {description}: {e}"));
            let expected_allow = match request["decision"].as_str().unwrap() {
                "allow" | "Allow" => true,
                "deny" | "Deny" => false,
                other => panic!("{name}: unknown decision `{other}`"),
            };
            allows += usize::from(expected_allow);
            let expected = (
                expected_allow,
                ids(&request["reason"]),
                ids(&request["errors"]),
            );
            let actual = (answer.allowed, answer.reasons, answer.errors);
            if expected != actual {
                failures.push(format!(
                    "{name}: {description}\n  expected (allow, reasons, errors) {expected:?}\n  actual                             {actual:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        (cases.len(), requests, allows),
        (FILES, REQUESTS, ALLOWS),
        "the kept suite is 22 files, 74 requests, 38 of them allowed"
    );
}
