use std::path::{Path, PathBuf};

use super::*;

fn tools() -> ToolRegistry {
    ToolRegistry::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/tools")).unwrap()
}

fn path(name: &str) -> PathBuf {
    PathBuf::from(format!("policies/budgets/{name}.json"))
}

fn load(name: &str, text: &str) -> Result<Budget, String> {
    parse(&path(name), text, &tools()).map_err(|e| e.message)
}

/// The example tools `keep` holds, by name.
fn tools_where(keep: impl Fn(&ToolContract) -> bool) -> Vec<String> {
    tools()
        .iter()
        .filter(|t| keep(t))
        .map(|t| t.name.clone())
        .collect()
}

#[test]
fn a_daily_refund_budget_per_agent_loads() {
    let text = r#"{"name": "refunds_daily", "tools": ["refund_order"], "per": ["agent"],
            "windowSeconds": 86400, "measure": {"pointer": "/amount_cents"}, "limit": 50000}"#;
    let budget = load("refunds_daily", text).unwrap();
    assert_eq!(
        budget,
        Budget {
            name: "refunds_daily".into(),
            tools: ["refund_order".to_owned()].into(),
            risks: BTreeSet::new(),
            per: vec![KeyPart::Agent],
            window: Duration::from_secs(86_400),
            measure: Measure::Pointer("/amount_cents".into()),
            limit: 50_000,
            source_path: path("refunds_daily"),
            source_text: text.to_owned(),
        }
    );
    assert_eq!(tools_where(|t| budget.counts(t)), ["refund_order"]);
}

#[test]
fn a_rate_by_risk_counts_every_tool_of_that_risk() {
    let budget = load(
        "external_hourly",
        r#"{"name": "external_hourly", "risks": ["external"], "per": ["subject", "session"],
            "windowSeconds": 3600, "limit": 200}"#,
    )
    .unwrap();
    assert_eq!(budget.measure, Measure::Count);
    let external = tools_where(|t| t.risk == Risk::External);
    assert!(!external.is_empty());
    assert_eq!(tools_where(|t| budget.counts(t)), external);
}

/// Every rule, each with the exact message a team reads.
#[test]
fn a_broken_budget_says_which_rule_it_breaks() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "Refunds",
            r#"{"name": "Refunds", "tools": ["refund_order"], "windowSeconds": 1, "limit": 1}"#,
            "name `Refunds` must match ^[a-z][a-z0-9_]{0,63}$",
        ),
        (
            "other",
            r#"{"name": "refunds", "tools": ["refund_order"], "windowSeconds": 1, "limit": 1}"#,
            "a budget named `refunds` belongs in refunds.json",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "windowSeconds": 1, "limit": 1}"#,
            "counts nothing: give `tools`, `risks` or both",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "tools": ["refund"], "windowSeconds": 1, "limit": 1}"#,
            "`tools` names `refund`, which no contract defines",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "tools": ["refund_order", "refund_order"], "windowSeconds": 1, "limit": 1}"#,
            "`tools` names `refund_order` twice",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "risks": ["money"], "windowSeconds": 1, "limit": 1}"#,
            "`risks` names `money`: read, write, external, financial or destructive",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "risks": ["financial"], "per": ["agent", "agent"], "windowSeconds": 1, "limit": 1}"#,
            "`per` names agent twice",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "risks": ["financial"], "windowSeconds": 0, "limit": 1}"#,
            "`windowSeconds` must be from 1 to 31622400",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "risks": ["financial"], "windowSeconds": 31622401, "limit": 1}"#,
            "`windowSeconds` must be from 1 to 31622400",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "risks": ["financial"], "windowSeconds": 1, "limit": -1}"#,
            "`limit` must not be negative",
        ),
        // `currency` is a required string, `note` an optional string.
        (
            "refunds",
            r#"{"name": "refunds", "tools": ["refund_order"], "windowSeconds": 1, "limit": 1, "measure": {"pointer": "/currency"}}"#,
            "`measure.pointer` `/currency` must name a required integer of every tool the budget counts; `refund_order`'s input schema does not make it one",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "tools": ["refund_order"], "windowSeconds": 1, "limit": 1, "measure": {"pointer": "/missing"}}"#,
            "`measure.pointer` `/missing` must name a required integer of every tool the budget counts; `refund_order`'s input schema does not make it one",
        ),
        (
            "refunds",
            r#"{"name": "refunds", "tools": ["refund_order"], "windowSeconds": 1, "limit": 1, "measure": {"pointer": ""}}"#,
            "`measure.pointer` `` must name a required integer of every tool the budget counts; `refund_order`'s input schema does not make it one",
        ),
        // Counting by risk: every tool of it must have the integer.
        (
            "spend",
            r#"{"name": "spend", "tools": ["refund_order"], "risks": ["destructive"], "windowSeconds": 1, "limit": 1, "measure": {"pointer": "/amount_cents"}}"#,
            "`measure.pointer` `/amount_cents` must name a required integer of every tool the budget counts; `delete_account`'s input schema does not make it one",
        ),
    ];
    for (name, text, message) in cases {
        assert_eq!(load(name, text).unwrap_err(), *message, "{text}");
    }
}

#[test]
fn unknown_fields_duplicate_keys_and_wrong_types_are_refused() {
    for (text, starts) in [
        (
            r#"{"name": "refunds", "risks": ["financial"], "windowSeconds": 1, "limit": 1, "cap": 2}"#,
            "not a budget: unknown field `cap`",
        ),
        (
            r#"{"name": "refunds", "name": "refunds", "risks": ["financial"], "windowSeconds": 1, "limit": 1}"#,
            "not a valid JSON document:",
        ),
        (
            r#"{"name": "refunds", "risks": ["financial"], "windowSeconds": 1, "limit": 1.5}"#,
            "not a budget: invalid type",
        ),
        (
            r#"{"name": "refunds", "risks": ["financial"], "per": ["tenant"], "windowSeconds": 1, "limit": 1}"#,
            "not a budget: unknown variant `tenant`",
        ),
        (
            r#"{"name": "refunds", "risks": ["financial"], "windowSeconds": 1, "limit": 1, "measure": {"pointer": "/amount_cents", "scale": 2}}"#,
            "not a budget: unknown field `scale`",
        ),
    ] {
        let message = load("refunds", text).unwrap_err();
        assert!(message.starts_with(starts), "{text}: {message}");
    }
}

#[test]
fn names() {
    for ok in ["a", "refunds_daily", "x9", &format!("a{}", "b".repeat(63))] {
        assert!(is_name(ok), "{ok}");
    }
    for bad in [
        "",
        "9a",
        "_a",
        "Refunds",
        "a-b",
        "a b",
        &format!("a{}", "b".repeat(64)),
    ] {
        assert!(!is_name(bad), "{bad}");
    }
}

#[test]
fn a_folder_loads_in_name_order_and_a_missing_one_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(load_dir(&dir.path().join("budgets"), &tools()).unwrap(), []);
    for name in ["b_rate", "a_rate"] {
        std::fs::write(
            dir.path().join(format!("{name}.json")),
            format!(
                r#"{{"name": "{name}", "risks": ["write"], "windowSeconds": 60, "limit": 10}}"#
            ),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join(".hidden.json"), "not json").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not json").unwrap();
    let names: Vec<String> = load_dir(dir.path(), &tools())
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["a_rate", "b_rate"]);
    std::fs::write(dir.path().join("c.json"), "{").unwrap();
    let e = load_dir(dir.path(), &tools()).unwrap_err();
    assert_eq!(e.path, dir.path().join("c.json"));
}
