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
            "windowSeconds": 86400, "measure": {"pointer": "/amount_cents", "decimals": 2}, "limit": 50000}"#;
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
            decimals: 2,
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
        (
            "refunds",
            r#"{"name": "refunds", "tools": ["refund_order"], "windowSeconds": 1, "limit": 1, "measure": {"pointer": "/amount_cents", "decimals": 19}}"#,
            "`measure.decimals` must be from 0 to 18",
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

#[test]
fn a_measure_that_is_no_non_negative_integer_is_refused_and_a_sum_past_a_long_overflows() {
    let text = r#"{"name": "refunds_daily", "tools": ["refund_order"], "windowSeconds": 60,
                   "measure": {"pointer": "/amount_cents"}, "limit": 100}"#;
    let budget = load("refunds_daily", text).unwrap();
    let args = |v: serde_json::Value| serde_json::json!({"amount_cents": v});
    assert_eq!(amount(&budget, &args(serde_json::json!(250))), Ok(250));
    assert_eq!(amount(&budget, &args(serde_json::json!(250.0))), Ok(250));
    let negative = amount(&budget, &args(serde_json::json!(-1))).unwrap_err();
    assert_eq!(
        (negative.reason(), negative.budget(), negative.pointer()),
        ("negative_measure", "refunds_daily", Some("/amount_cents"))
    );
    for v in [
        serde_json::json!(2.5),
        serde_json::json!(1e300),
        serde_json::json!("5"),
    ] {
        assert_eq!(
            amount(&budget, &args(v)).unwrap_err().reason(),
            "measure_not_an_integer"
        );
    }
    let counted = load(
        "emails_hourly",
        r#"{"name": "emails_hourly", "tools": ["send_email"], "windowSeconds": 60, "limit": 3}"#,
    )
    .unwrap();
    assert_eq!(amount(&counted, &serde_json::json!({})), Ok(1));

    let meter = Meter {
        key: BudgetKey {
            budget: "refunds_daily".into(),
            key: "k".into(),
            window_ms: 60_000,
        },
        this_call: 10,
        limit: 100,
    };
    let usage = |used| Usage {
        used,
        version: 1,
        charged: false,
    };
    assert_eq!(
        seen(std::slice::from_ref(&meter), &[usage(Some(90))]).unwrap(),
        [Seen {
            name: "refunds_daily".into(),
            used: 90,
            this_call: 10,
            limit: 100
        }]
    );
    for used in [None, Some(i64::MAX - 9)] {
        assert_eq!(
            seen(std::slice::from_ref(&meter), &[usage(used)]).unwrap_err(),
            MeterRefusal::Overflow {
                budget: "refunds_daily".into()
            }
        );
    }
    // A retry holding its charge is not charged again.
    let held = Usage {
        used: Some(0),
        version: 4,
        charged: true,
    };
    assert!(charges(std::slice::from_ref(&meter), &[held]).is_empty());
    assert_eq!(
        charges(std::slice::from_ref(&meter), &[usage(Some(0))]),
        [Charge {
            key: meter.key.clone(),
            amount: 10,
            seen_version: 1
        }]
    );
}

#[test]
fn keys_name_their_parts_so_no_two_keys_share_a_text() {
    let text = r#"{"name": "refunds_daily", "tools": ["refund_order"], "per": ["agent", "resource"],
                   "windowSeconds": 60, "measure": {"pointer": "/amount_cents"}, "limit": 100}"#;
    let budget = load("refunds_daily", text).unwrap();
    let tools = tools();
    let tool = tools.get("refund_order").unwrap();
    let caller = crate::identity::Caller {
        subject_id: "bob".into(),
        tenant_id: "acme".into(),
        scopes: Vec::new(),
        roles: Vec::new(),
        agent_id: "a\",\"b".into(),
        session_id: String::new(),
    };
    let args = serde_json::json!({"order_id": "ord_1", "amount_cents": 1});
    assert_eq!(
        key_text(&budget, &caller, tool, &args),
        r#"["tenant","acme","agent","a\",\"b","resource","ord_1"]"#
    );
}

#[test]
fn an_approval_shows_the_budgets_its_call_takes_past_their_limit() {
    use crate::approvals::ApprovalWhy;
    let text = r#"{"name": "refunds_daily", "tools": ["refund_order"], "per": ["agent"],
            "windowSeconds": 86400, "measure": {"pointer": "/amount_cents", "decimals": 2}, "limit": 50000}"#;
    let rate = r#"{"name": "emails_hourly", "tools": ["send_email"], "windowSeconds": 3600, "limit": 200}"#;
    let all = Budgets::new(
        vec![
            load("emails_hourly", rate).unwrap(),
            load("refunds_daily", text).unwrap(),
        ],
        &tools(),
    );
    let seen = |name: &str, used: i64, this_call: i64, limit: i64| Seen {
        name: name.into(),
        used,
        this_call,
        limit,
    };
    // At the limit is not past it; one over is; a sum past i64 is.
    let why = ApprovalWhy::of_call(
        Some("the agent's refunds today would exceed 500.00".into()),
        &[
            seen("emails_hourly", 199, 1, 200),
            seen("refunds_daily", 60_000, 2_000, 50_000),
        ],
        &all,
    );
    assert_eq!(why, ApprovalWhy::example());
    let over = ApprovalWhy::of_call(None, &[seen("emails_hourly", i64::MAX, 1, i64::MAX)], &all);
    assert_eq!(over.budgets.len(), 1);
    assert_eq!(
        (over.budgets[0].decimals, over.budgets[0].window_seconds),
        (0, 3_600)
    );
    assert_eq!(ApprovalWhy::from_stored(&why.to_stored()).unwrap(), why);
    assert_eq!(ApprovalWhy::default().to_stored(), "{}");
    assert!(ApprovalWhy::from_stored(r#"{"because": 1}"#).is_err());
}
