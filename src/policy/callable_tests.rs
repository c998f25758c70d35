//! Tools a principal may call (DESIGN §11.4): exact on the example
//! policies (a witness call for every tool shown, the reason for every tool
//! hidden), and sound against full evaluation over generated principals,
//! resources, entity attributes, arguments and policy sets.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

use super::{HiddenReason, PolicyDecision, PolicyEngine, ToolCall, ToolReach};
use crate::identity::Caller;

pub(super) fn examples() -> PolicyEngine {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    PolicyEngine::load(&dir).unwrap()
}

pub(super) fn caller(
    subject: &str,
    tenant: &str,
    roles: &[&str],
    scopes: &[&str],
    agent: &str,
) -> Caller {
    Caller {
        subject_id: subject.into(),
        tenant_id: tenant.into(),
        scopes: scopes.iter().map(ToString::to_string).collect(),
        roles: roles.iter().map(ToString::to_string).collect(),
        agent_id: agent.into(),
        session_id: String::new(),
    }
}

fn shown(engine: &PolicyEngine, caller: &Caller) -> Vec<String> {
    engine
        .callable_tools(caller)
        .unwrap()
        .iter()
        .map(|t| t.name.clone())
        .collect()
}

pub(super) fn order(id: &str, tenant: &str, owner: &str, total_cents: i64) -> Value {
    json!({"uid": {"type": "Order", "id": id}, "parents": [{"type": "Tenant", "id": tenant}],
           "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": tenant}},
                     "owner": {"__entity": {"type": "User", "id": owner}},
                     "status": "delivered", "total_cents": total_cents}})
}

fn customer(id: &str, tenant: &str, user: &str, email_verified: bool) -> Value {
    json!({"uid": {"type": "Customer", "id": id}, "parents": [{"type": "Tenant", "id": tenant}],
           "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": tenant}},
                     "user": {"__entity": {"type": "User", "id": user}},
                     "email_verified": email_verified}})
}

/// The full policy decision of one call, arguments validated first as the
/// pipeline validates them.
fn decide(
    engine: &PolicyEngine,
    caller: &Caller,
    tool: &str,
    arguments: &Value,
    entities: &Value,
) -> PolicyDecision {
    let tool = engine.tools().get(tool).unwrap();
    assert!(
        tool.validate_input(arguments, 5).is_empty(),
        "{} {arguments}",
        tool.name
    );
    engine
        .decide_tool_call(&ToolCall {
            caller,
            tool,
            arguments,
            entities: Some(entities),
            approved: false,
            budgets: &engine.unspent_budgets(&tool.name),
            session: None,
        })
        .unwrap()
}

/// A call that proves a tool shown to `who` can be allowed (or needs an
/// approval): its arguments and the executor's entities.
fn witness(tool: &str, who: &Caller) -> (Value, Value) {
    let t = who.tenant_id.as_str();
    let me = who.subject_id.as_str();
    match tool {
        "get_order" => (
            json!({"order_id": "ord_1"}),
            json!([order("ord_1", t, me, 50_000)]),
        ),
        "refund_order" => (
            json!({"order_id": "ord_1", "amount_cents": 500, "currency": "USD", "reason": "late"}),
            json!([order("ord_1", t, "alice", 50_000)]),
        ),
        "search_docs" => (json!({"query": "refund policy"}), json!([])),
        "send_email" => (
            json!({"customer_id": "cus_1", "subject": "Hello", "body": "Your refund is on its way."}),
            json!([customer("cus_1", t, "alice", true)]),
        ),
        "update_preferences" => (
            json!({"customer_id": "cus_1", "newsletter": false}),
            json!([customer("cus_1", t, me, true)]),
        ),
        "delete_account" => (
            json!({"customer_id": "cus_1", "confirm": true, "reason": "asked to"}),
            json!([customer("cus_1", t, "alice", true)]),
        ),
        other => panic!("no witness for {other}"),
    }
}

/// Every scope the example policies ask for.
const ALL_SCOPES: &[&str] = &[
    "orders:read",
    "orders:refund",
    "customers:write",
    "email:send",
    "accounts:delete",
    "docs:read",
];

const ALL_TOOLS: &[&str] = &[
    "delete_account",
    "get_order",
    "refund_order",
    "search_docs",
    "send_email",
    "update_preferences",
];

/// On the example policies, every tool shown has a call the policies allow
/// (or answer approval-required), and every tool hidden has the reason it
/// cannot be: no permit can hold for this principal. The witness calls of
/// the hidden tools, made by this principal, are denied.
#[test]
fn the_examples_show_exactly_what_a_call_can_be_allowed_for() {
    let engine = examples();
    // (principal, the tools shown, and the answer of each shown tool's witness)
    let cases: Vec<(Caller, Vec<(&str, &str)>)> = vec![
        (
            caller("bob", "acme", &["support_agent"], &["orders:refund"], ""),
            vec![("refund_order", "allow")],
        ),
        (
            caller("carol", "acme", &["support_admin"], ALL_SCOPES, ""),
            vec![
                ("delete_account", "approval_required"),
                ("get_order", "allow"),
                ("refund_order", "allow"),
                ("search_docs", "allow"),
                ("send_email", "allow"),
                ("update_preferences", "allow"),
            ],
        ),
        (
            caller(
                "dave",
                "globex",
                &[],
                &[
                    "orders:read",
                    "customers:write",
                    "docs:read",
                    "orders:refund",
                ],
                "",
            ),
            vec![
                ("get_order", "allow"),
                ("search_docs", "allow"),
                ("update_preferences", "allow"),
            ],
        ),
        (
            caller("erin", "acme", &["support_agent"], &["accounts:delete"], ""),
            vec![],
        ),
        (caller("frank", "acme", &[], &[], ""), vec![]),
    ];
    for (who, expected) in cases {
        let names: Vec<&str> = expected.iter().map(|(t, _)| *t).collect();
        assert_eq!(shown(&engine, &who), names, "{}", who.subject_id);
        for (tool, answer) in &expected {
            assert_eq!(
                engine.tool_reach(&who, tool).unwrap(),
                Some(ToolReach::Callable)
            );
            let (args, entities) = witness(tool, &who);
            let decision = decide(&engine, &who, tool, &args, &entities);
            let got = match decision {
                PolicyDecision::Allow { .. } => "allow",
                PolicyDecision::ApprovalRequired { .. } => "approval_required",
                other => panic!("{} {tool}: {other:?}", who.subject_id),
            };
            assert_eq!(got, *answer, "{} {tool}", who.subject_id);
        }
        for tool in ALL_TOOLS.iter().filter(|t| !names.contains(t)) {
            // Every permit of the tool needs a scope or role this principal lacks.
            assert_eq!(
                engine.tool_reach(&who, tool).unwrap(),
                Some(ToolReach::Hidden(HiddenReason::NoPermit)),
                "{} {tool}",
                who.subject_id
            );
            let (args, entities) = witness(tool, &who);
            assert!(
                matches!(
                    decide(&engine, &who, tool, &args, &entities),
                    PolicyDecision::Deny { .. }
                ),
                "{} {tool}",
                who.subject_id
            );
        }
    }
    assert_eq!(
        engine
            .tool_reach(&caller("bob", "acme", &[], &[], ""), "nope")
            .unwrap(),
        None
    );
}

/// What the example policies settle whoever asks: nothing, every tool's
/// permits look at the caller's scopes.
#[test]
fn every_example_tool_depends_on_the_principal() {
    let engine = examples();
    let settled: Vec<Option<bool>> = engine.callable.tools.iter().map(|q| q.settled).collect();
    assert_eq!(settled, vec![None; 7]);
}

fn with_policy(text: &str) -> PolicyEngine {
    replacing("extra.cedar", text)
}

/// The examples with `file` (re)written to `text`.
fn replacing(file: &str, text: &str) -> PolicyEngine {
    let (_tmp, dir) = crate::policy::test_support::examples();
    std::fs::write(dir.join(file), text).unwrap();
    PolicyEngine::load(&dir).unwrap()
}

/// A forbid that holds whatever the call hides every tool, and names itself.
#[test]
fn an_unconditional_forbid_hides_and_is_the_reason() {
    let engine = with_policy(
        r#"@id("quarantine")
@reason("this agent is quarantined")
forbid (principal, action in [Action::"risk:read", Action::"risk:write", Action::"risk:external",
                             Action::"risk:financial", Action::"risk:destructive"], resource)
when { context.agent == "quarantined" };
"#,
    );
    let admin = |agent: &str| caller("carol", "acme", &["support_admin"], ALL_SCOPES, agent);
    assert_eq!(shown(&engine, &admin("quarantined")), Vec::<String>::new());
    for tool in ALL_TOOLS {
        assert_eq!(
            engine.tool_reach(&admin("quarantined"), tool).unwrap(),
            Some(ToolReach::Hidden(HiddenReason::Forbidden {
                policies: vec!["quarantine".into()]
            }))
        );
    }
    assert_eq!(shown(&engine, &admin("helper")), ALL_TOOLS);
}

/// A policy that fails whatever the call makes every call a `policy_error`:
/// hidden, with the policy named; the same policy without the failure is a
/// forbid that holds.
#[test]
fn a_policy_that_always_fails_hides_the_tool() {
    let engine = with_policy(
        r#"@id("overflows-with-roles")
forbid (principal, action == Action::"search_docs", resource)
when { if principal.roles.contains("support_admin") then 9223372036854775807 + 1 > 0 else true };
"#,
    );
    let with_role = caller("carol", "acme", &["support_admin"], &["docs:read"], "");
    assert_eq!(
        engine.tool_reach(&with_role, "search_docs").unwrap(),
        Some(ToolReach::Hidden(HiddenReason::Errors {
            policies: vec!["overflows-with-roles".into()]
        }))
    );
    let (args, entities) = witness("search_docs", &with_role);
    assert_eq!(
        decide(&engine, &with_role, "search_docs", &args, &entities),
        PolicyDecision::Errored {
            policies: vec!["overflows-with-roles".into()]
        }
    );
    let no_role = caller("dave", "acme", &[], &["docs:read"], "");
    assert_eq!(
        engine.tool_reach(&no_role, "search_docs").unwrap(),
        Some(ToolReach::Hidden(HiddenReason::Forbidden {
            policies: vec!["overflows-with-roles".into()]
        }))
    );
}

/// What holds whoever asks is settled once per load: a tool nobody can
/// call, and a tool everyone can.
#[test]
fn what_does_not_depend_on_the_principal_is_settled_at_load() {
    // The search is open to all: no policy on it looks at the caller.
    let engine = replacing(
        "docs.cedar",
        r#"@id("docs-for-all")
permit (principal, action == Action::"search_docs", resource);

@id("no-emails")
forbid (principal, action == Action::"send_email", resource);
"#,
    );
    let settled: Vec<(String, Option<bool>)> = engine
        .callable
        .tools
        .iter()
        .map(|q| (q.tool.name.clone(), q.settled))
        .collect();
    assert_eq!(
        settled,
        vec![
            ("delete_account".into(), None),
            ("get_order".into(), None),
            ("read_secret".into(), None),
            ("refund_order".into(), None),
            ("search_docs".into(), Some(true)),
            ("send_email".into(), Some(false)),
            ("update_preferences".into(), None),
        ]
    );
    let nobody = caller("frank", "acme", &[], &[], "");
    assert_eq!(shown(&engine, &nobody), ["search_docs"]);
    // A residual permit keeps a tool open: with the scope's permit back,
    // the search depends on the caller again (a permit could still fail).
    let engine = with_policy(
        r#"@id("docs-for-all")
permit (principal, action == Action::"search_docs", resource);
"#,
    );
    let search = engine
        .callable
        .tools
        .iter()
        .find(|q| q.tool.name == "search_docs");
    assert_eq!(search.map(|q| q.settled), Some(None));
    assert_eq!(shown(&engine, &nobody), ["search_docs"]);
    assert_eq!(
        engine.tool_reach(&nobody, "send_email").unwrap(),
        Some(ToolReach::Hidden(HiddenReason::NoPermit))
    );
}

// ---- soundness against full evaluation ----

/// Policies over the example schema and tools: each a scope and a
/// condition that validate together.
const SCOPED: &[(&str, &[&str])] = &[
    (
        r#"action == Action::"refund_order", resource is Order"#,
        &[
            "context.input.amount_cents > 5000",
            "context.input.amount_cents > resource.total_cents",
            "context.input.currency == \"EUR\"",
            "resource.owner == principal",
            "resource.status == \"delivered\"",
            // Overflows for amounts of 808 and more: an error that depends on the arguments.
            "context.input.amount_cents + 9223372036854775000 > 0",
        ],
    ),
    (
        r#"action == Action::"get_order", resource is Order"#,
        &[
            "resource.owner == principal",
            "resource.tenant == principal.tenant",
        ],
    ),
    (
        r#"action, resource is Customer"#,
        &[
            "resource.email_verified",
            "resource.user == principal",
            "resource.tenant == principal.tenant",
        ],
    ),
    (
        r#"action == Action::"search_docs", resource"#,
        &[
            "context.input.query == \"x\"",
            "context.input has limit && context.input.limit > 5",
        ],
    ),
    (
        r#"action == Action::"update_preferences", resource is Customer"#,
        &["context.input has newsletter && context.input.newsletter"],
    ),
    (r#"action in Action::"risk:destructive", resource"#, &[]),
    (r#"action in Action::"risk:read", resource"#, &[]),
    (
        r#"action in [Action::"risk:read", Action::"risk:write", Action::"risk:external", Action::"risk:financial", Action::"risk:destructive"], resource"#,
        &[],
    ),
];

/// Conditions every action validates.
const ANY: &[&str] = &[
    "true",
    "principal.roles.contains(\"agent\")",
    "principal.roles.contains(\"admin\")",
    "context.scopes.contains(\"a\")",
    "context.scopes.contains(\"b\")",
    "context.agent == \"bot\"",
    "context.approved",
    "!context.approved",
    "context.risk == \"read\"",
    "principal.tenant == Tenant::\"acme\"",
    // Read the action: tools alike in all else are no longer one class.
    "action == Action::\"get_order\"",
    "action in Action::\"risk:read\"",
    // Entities only the executor supplies: unknown when listing.
    "Order::\"ord_1\".total_cents > 10000",
    "Customer::\"cus_1\".email_verified",
];

fn policy() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        0..SCOPED.len(),
        any::<prop::sample::Index>(),
        prop::sample::select(ANY),
        any::<bool>(),
    )
        .prop_map(|(permit, s, pick, any_cond, use_scoped)| {
            let (scope, conds) = SCOPED[s];
            let cond = if use_scoped && !conds.is_empty() {
                format!("{} && {any_cond}", conds[pick.index(conds.len())])
            } else {
                any_cond.to_owned()
            };
            let effect = if permit { "permit" } else { "forbid" };
            format!("{effect} (principal, {scope}) when {{ {cond} }};")
        })
}

/// One generated call: who asks, the executor's entities, the arguments of
/// every tool.
#[derive(Debug, Clone)]
struct Case {
    caller: Caller,
    entities: Value,
    arguments: Vec<(&'static str, Value)>,
}

fn subset(all: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
    prop::sample::subsequence(all, 0..=all.len())
        .prop_map(|v| v.into_iter().map(ToOwned::to_owned).collect())
}

fn case() -> impl Strategy<Value = Case> {
    let who = (
        prop::sample::select(&["alice", "bob"][..]),
        prop::sample::select(&["acme", "globex"][..]),
        subset(&["agent", "admin", "support_agent", "support_admin"]),
        subset(&[
            "a",
            "b",
            "orders:read",
            "orders:refund",
            "docs:read",
            "customers:write",
            "email:send",
            "accounts:delete",
        ]),
        prop::sample::select(&["", "bot"][..]),
    );
    let resources = (
        prop::sample::select(&["acme", "globex"][..]),
        prop::sample::select(&["alice", "bob"][..]),
        prop::sample::select(&["delivered", "lost"][..]),
        0i64..20_000,
        prop::sample::select(&["acme", "globex"][..]),
        prop::sample::select(&["alice", "bob"][..]),
        any::<bool>(),
    );
    let arguments = (
        1i64..20_000,
        prop::sample::select(&["USD", "EUR"][..]),
        prop::sample::select(&["x", "y"][..]),
        prop::option::of(1i64..=20),
        prop::option::of(any::<bool>()),
    );
    (who, resources, arguments).prop_map(
        |(
            (subject, tenant, roles, scopes, agent),
            (o_tenant, owner, status, total, c_tenant, user, verified),
            (amount, currency, query, limit, newsletter),
        )| {
            let mut o = order("ord_1", o_tenant, owner, total);
            o["attrs"]["status"] = json!(status);
            let mut search = json!({"query": query});
            if let Some(l) = limit {
                search["limit"] = json!(l);
            }
            let mut prefs = json!({"customer_id": "cus_1"});
            if let Some(n) = newsletter {
                prefs["newsletter"] = json!(n);
            }
            Case {
                caller: Caller {
                    subject_id: subject.into(),
                    tenant_id: tenant.into(),
                    scopes,
                    roles,
                    agent_id: agent.into(),
                    session_id: String::new(),
                },
                entities: json!([o, customer("cus_1", c_tenant, user, verified)]),
                arguments: vec![
                    ("delete_account", json!({"customer_id": "cus_1", "confirm": true, "reason": "r"})),
                    ("get_order", json!({"order_id": "ord_1"})),
                    ("find_order", json!({"order_id": "ord_1"})),
                    ("refund_order", json!({"order_id": "ord_1", "amount_cents": amount, "currency": currency, "reason": "late"})),
                    ("search_docs", search),
                    ("send_email", json!({"customer_id": "cus_1", "subject": "s", "body": "b"})),
                    ("update_preferences", prefs),
                ],
            }
        },
    )
}

/// How often each side of the property was exercised.
#[derive(Debug, Default)]
struct Seen {
    /// Calls allowed or approval-required (each checked to be shown).
    reachable: usize,
    /// Calls of hidden tools (each checked to be denied or errored).
    hidden: usize,
}

/// The property for one policy set and one case: a call the full
/// evaluation allows or answers approval-required is of a tool shown; a
/// tool hidden is never allowed; the list follows the per-tool answer.
fn check(engine: &PolicyEngine, case: &Case, seen: &RefCell<Seen>) -> Result<(), TestCaseError> {
    let shown: BTreeSet<String> = engine
        .callable_tools(&case.caller)
        .unwrap()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    for (tool, args) in &case.arguments {
        if engine.tools().get(tool).is_none() {
            continue;
        }
        let reach = engine.tool_reach(&case.caller, tool).unwrap();
        prop_assert_eq!(
            shown.contains(*tool),
            reach == Some(ToolReach::Callable),
            "list and answer differ for {}",
            tool
        );
        let decision = decide(engine, &case.caller, tool, args, &case.entities);
        match decision {
            PolicyDecision::Allow { .. } | PolicyDecision::ApprovalRequired { .. } => {
                seen.borrow_mut().reachable += 1;
                prop_assert!(shown.contains(*tool), "{} hidden but {:?}", tool, decision);
            }
            PolicyDecision::Deny { .. } | PolicyDecision::Errored { .. } => {
                if !shown.contains(*tool) {
                    seen.borrow_mut().hidden += 1;
                }
            }
        }
    }
    Ok(())
}

/// Sound on the example policies: over generated principals, resources,
/// entity attributes and arguments.
#[test]
fn sound_on_the_examples() {
    let engine = examples();
    let seen = RefCell::new(Seen::default());
    let mut runner = TestRunner::new(Config::with_cases(400));
    runner
        .run(&case(), |case| check(&engine, &case, &seen))
        .unwrap();
    let seen = seen.into_inner();
    assert!(seen.reachable > 100 && seen.hidden > 100, "{seen:?}");
}

/// The examples with `find_order`, a second tool like `get_order` (read, on
/// an `Order`), and the `.cedar` files replaced by `policies`.
fn with_find_order(dir: &Path, policies: &str) -> PolicyEngine {
    for f in std::fs::read_dir(dir).unwrap() {
        let path = f.unwrap().path();
        if path.extension().is_some_and(|e| e == "cedar") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let get_order = std::fs::read_to_string(dir.join("tools/get_order.json")).unwrap();
    std::fs::write(
        dir.join("tools/find_order.json"),
        get_order.replace("\"get_order\"", "\"find_order\""),
    )
    .unwrap();
    std::fs::write(dir.join("generated.cedar"), policies).unwrap();
    PolicyEngine::load(dir).unwrap_or_else(|e| panic!("{policies}: {:?}", e.diagnostics()))
}

fn class_of(engine: &PolicyEngine, tool: &str) -> usize {
    let query = engine.callable.tools.iter().find(|q| q.tool.name == tool);
    query.unwrap().class
}

/// Tools alike (one slice, resource type and risk, no policy reading the
/// action) are evaluated once per caller; a policy reading the action
/// tells them apart.
#[test]
fn tools_alike_are_one_class() {
    let (_tmp, dir) = crate::policy::test_support::examples();
    let reading = r#"permit (principal, action in Action::"risk:read", resource is Order)
when { context.scopes.contains("orders:read") };
"#;
    let engine = with_find_order(&dir, reading);
    assert_eq!(
        class_of(&engine, "get_order"),
        class_of(&engine, "find_order")
    );
    assert_ne!(
        class_of(&engine, "get_order"),
        class_of(&engine, "refund_order")
    );
    let reader = caller("alice", "acme", &[], &["orders:read"], "");
    assert_eq!(shown(&engine, &reader), ["find_order", "get_order"]);
    assert_eq!(
        shown(&engine, &caller("zoe", "acme", &[], &[], "")),
        Vec::<String>::new()
    );

    let engine = with_find_order(
        &dir,
        &format!(
            "{reading}forbid (principal, action in Action::\"risk:read\", resource)\n\
             when {{ action == Action::\"get_order\" }};\n"
        ),
    );
    assert_ne!(
        class_of(&engine, "get_order"),
        class_of(&engine, "find_order")
    );
    assert_eq!(shown(&engine, &reader), ["find_order"]);
    assert_eq!(
        engine.tool_reach(&reader, "get_order").unwrap(),
        Some(ToolReach::Hidden(HiddenReason::Forbidden {
            policies: vec!["generated.cedar#1".into()]
        }))
    );
}

/// Sound on generated policy sets over the example schema and tools (and
/// `find_order`, a second read tool on an `Order`), permits and forbids on
/// the principal, the resource, its entities, the arguments, the action
/// and the approval, some failing for some arguments.
#[test]
fn sound_on_generated_policies() {
    let (_tmp, dir) = crate::policy::test_support::examples();
    let seen = RefCell::new(Seen::default());
    let mut runner = TestRunner::new(Config::with_cases(128));
    let strategy = (
        prop::collection::vec(policy(), 1..10),
        prop::collection::vec(case(), 1..6),
    );
    runner
        .run(&strategy, |(policies, cases)| {
            let engine = with_find_order(&dir, &policies.join("\n"));
            for case in &cases {
                check(&engine, case, &seen)?;
            }
            Ok(())
        })
        .unwrap();
    let seen = seen.into_inner();
    assert!(seen.reachable > 50 && seen.hidden > 50, "{seen:?}");
}
