//! Decisions as the policy set grows: generated deployments of 1,000 tools
//! with 20, 1,000 and 10,000 policies. For each size: the time to load and
//! validate the folder, the resident memory after loading, and the p50/p99
//! of one in-process decision (the whole pipeline, `ToolCallAuthorizer`)
//! over calls spread across all tools, and the p50 of listing the tools a
//! caller may call (`callable_tools`, DESIGN §11.4). Policy slicing should keep the
//! 10,000-policy latency within 2× of the 20-policy one.
//!
//! Run: `cargo bench --bench policy_scale` (optionally `-- <sizes…>`, e.g.
//! `-- 10000` for a memory figure of that size alone).

#![expect(
    clippy::indexing_slicing,
    reason = "benchmark code: every index is taken modulo the slice's length"
)]

#[allow(
    dead_code,
    reason = "the sidecar launcher is for the benches that serve"
)]
mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use toolgate::access::TenantScope;
use toolgate::decision::{AuthorizeInput, Decision};
use toolgate::envelope::Checked;
use toolgate::identity::Caller;

const TOOLS: usize = 1_000;
const RISKS: [&str; 5] = ["read", "write", "external", "financial", "destructive"];
const ITERATIONS: usize = 20_000;
/// How many times the tools a caller may call are listed per size.
const LISTS: usize = 50;
/// The policies every size has: tenant isolation and rules per risk group.
const BASE: usize = 20;

const ENTITIES: &str = r#"[{"uid":{"type":"Order","id":"ord_1"},"parents":[{"type":"Tenant","id":"acme"}],
 "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"alice"}},"total_cents":50000}}]"#;

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn tool_name(i: usize) -> String {
    format!("tool_{i:04}")
}

/// Writes a deployment of `TOOLS` tools and `policies` policies into `dir`.
fn generate(dir: &Path, policies: usize) -> BenchResult<()> {
    std::fs::create_dir_all(dir.join("tools"))?;
    std::fs::write(
        dir.join("schema.cedarschema"),
        "entity Order in [Tenant] { tenant: Tenant, owner: User, total_cents: Long };\n",
    )?;
    for i in 0..TOOLS {
        let contract = serde_json::json!({
            "name": tool_name(i),
            "version": "1.0.0",
            "description": "generated",
            "risk": RISKS[i % RISKS.len()],
            "idempotent": true,
            "parallel": true,
            "timeoutMs": 1000,
            "resource": {"type": "Order", "idPointer": "/order_id"},
            "inputSchema": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "pattern": "^ord_[0-9]{1,8}$"},
                    "amount": {"type": "integer", "minimum": 0, "maximum": 1000000},
                    "note": {"type": "string", "maxLength": 200}
                },
                "required": ["order_id", "amount"],
                "additionalProperties": false
            }
        });
        std::fs::write(
            dir.join("tools").join(format!("{}.json", tool_name(i))),
            serde_json::to_string_pretty(&contract)?,
        )?;
    }

    let mut text = String::new();
    // The base: unscoped tenant isolation, and per risk group a permit, a
    // forbid on large amounts and two more conditions.
    let _ = writeln!(
        text,
        "@id(\"tenant-isolation\")\nforbid (principal, action, resource is Order)\nunless {{ resource.tenant == principal.tenant }};"
    );
    let _ = writeln!(
        text,
        "@id(\"no-suspended\")\nforbid (principal, action, resource)\nwhen {{ principal.roles.contains(\"suspended\") }};"
    );
    let mut n = 2;
    'base: for round in 0.. {
        for risk in RISKS {
            if n == BASE {
                break 'base;
            }
            let group = format!("Action::\"risk:{risk}\"");
            let policy = match round {
                0 => format!(
                    "permit (principal, action in {group}, resource is Order)\nwhen {{ principal.roles.contains(\"agent\") && context.scopes.contains(\"{risk}\") }};"
                ),
                1 => format!(
                    "forbid (principal, action in {group}, resource is Order)\nwhen {{ context.input.amount > resource.total_cents }};"
                ),
                2 => format!(
                    "forbid (principal, action in {group}, resource)\nwhen {{ context.input.amount > 900000 }}\nunless {{ context.approved }};"
                ),
                _ => format!(
                    "permit (principal, action in {group}, resource is Order)\nwhen {{ principal.roles.contains(\"admin-{round}\") }};"
                ),
            };
            let _ = writeln!(text, "@id(\"base-{n}\")\n{policy}");
            n += 1;
        }
    }
    // Tool-specific policies, spread evenly over the tools.
    for k in 0..policies.saturating_sub(BASE) {
        let tool = tool_name(k % TOOLS);
        let nth = k / TOOLS;
        let policy = if nth.is_multiple_of(2) {
            format!(
                "permit (principal == User::\"user_{nth}\", action == Action::\"{tool}\", resource is Order)\nwhen {{ context.scopes.contains(\"{tool}:{nth}\") && context.input.amount < {} }};",
                1000 + nth
            )
        } else {
            format!(
                "forbid (principal, action == Action::\"{tool}\", resource is Order)\nwhen {{ context.input has note && context.input.note == \"blocked-{nth}\" }};"
            )
        };
        let _ = writeln!(text, "@id(\"{tool}-{nth}\")\n{policy}");
    }
    std::fs::write(dir.join("policies.cedar"), text)?;
    Ok(())
}

/// `VmRSS` and `VmHWM` of this process, in MiB (Linux; zero elsewhere).
fn memory() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len().max(1) - 1) as f64 * q) as usize;
    sorted.get(i).copied().unwrap_or_default()
}

struct Figures {
    policies: usize,
    load: Duration,
    largest_slice: usize,
    rss_mib: f64,
    p50: Duration,
    p99: Duration,
    /// One `callable_tools` over every tool.
    list_p50: Duration,
}

fn measure(policies: usize, rt: &tokio::runtime::Runtime) -> BenchResult<Figures> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("policies");
    generate(&dir, policies)?;

    let start = Instant::now();
    let reloader = common::load_policies(&dir)?;
    let load = start.elapsed();
    let engine = reloader.live().load_full();
    assert_eq!(engine.policy_count(), policies.max(BASE));
    assert_eq!(engine.tools().len(), TOOLS);
    let largest_slice = engine.largest_slice();
    let (rss_mib, _) = memory();

    let authorizer = rt.block_on(common::in_process(reloader))?.authorizer;
    // Every risk group's scope: the base permit allows every call.
    let caller = Caller {
        subject_id: "user_0".into(),
        tenant_id: "acme".into(),
        scopes: RISKS.iter().map(|r| (*r).to_owned()).collect(),
        roles: vec!["agent".into()],
        agent_id: "bench".into(),
        session_id: "s".into(),
    };
    let inputs: Vec<AuthorizeInput> = (0..TOOLS)
        .map(|i| AuthorizeInput {
            tool: tool_name(i),
            arguments: br#"{"order_id": "ord_1", "amount": 2500}"#.to_vec(),
            caller: Some(caller.clone()),
            request_id: "bench-1".into(),
            entities_json: ENTITIES.into(),
            tenants: TenantScope::Any,
            ..AuthorizeInput::default()
        })
        .collect();
    // Calls hop across tools in a fixed pseudo-random order.
    let mut next = 0usize;
    let mut pick = || {
        next = (next * 7919 + 104_729) % TOOLS;
        next
    };
    let mut samples = Vec::with_capacity(ITERATIONS);
    rt.block_on(async {
        for _ in 0..ITERATIONS / 10 {
            let _ = authorizer.authorize(&inputs[pick()]).await;
        }
        for _ in 0..ITERATIONS {
            let input = &inputs[pick()];
            let start = Instant::now();
            let outcome = authorizer.authorize(input).await;
            samples.push(start.elapsed());
            assert!(
                matches!(outcome, Ok(ref o) if o.decision == Decision::Allow),
                "{outcome:?}"
            );
        }
    });
    samples.sort();
    // The tools this caller may call (DESIGN §11.4): every one, each
    // partially evaluated, none settled at load (the permits read the scopes).
    let mut lists = Vec::with_capacity(LISTS);
    for _ in 0..LISTS {
        let start = Instant::now();
        let listed = authorizer.callable_tools(Some(&caller), "", &TenantScope::Any);
        lists.push(start.elapsed());
        assert!(
            matches!(listed, Ok(Checked::Passed(ref l)) if l.tools.len() == TOOLS),
            "{listed:?}"
        );
    }
    lists.sort();
    Ok(Figures {
        policies,
        load,
        largest_slice,
        rss_mib,
        p50: percentile(&samples, 0.5),
        p99: percentile(&samples, 0.99),
        list_p50: percentile(&lists, 0.5),
    })
}

fn main() -> BenchResult<()> {
    let sizes: Vec<usize> = {
        let given: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if given.is_empty() {
            vec![20, 1_000, 10_000]
        } else {
            given
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    println!(
        "{TOOLS} tools; {ITERATIONS} decisions per size over all tools; the whole pipeline in-process"
    );
    println!(
        "{:>9} {:>12} {:>14} {:>13} {:>10} {:>10} {:>12}",
        "policies", "load+valid.", "largest slice", "RSS after load", "p50", "p99", "tools list"
    );
    let mut all = Vec::new();
    for size in sizes {
        let f = measure(size, &rt)?;
        println!(
            "{:>9} {:>10.0}ms {:>14} {:>11.1}MiB {:>8.1}µs {:>8.1}µs {:>10.1}ms",
            f.policies,
            f.load.as_secs_f64() * 1e3,
            f.largest_slice,
            f.rss_mib,
            f.p50.as_secs_f64() * 1e6,
            f.p99.as_secs_f64() * 1e6,
            f.list_p50.as_secs_f64() * 1e3
        );
        all.push(f);
    }
    let (_, hwm) = memory();
    println!("peak resident memory (VmHWM) of the run: {hwm:.1} MiB");
    if let (Some(small), Some(large)) = (all.first(), all.last())
        && all.len() > 1
    {
        println!(
            "p50 at {} policies / p50 at {}: {:.2}× (target: within 2×)",
            large.policies,
            small.policies,
            large.p50.as_secs_f64() / small.p50.as_secs_f64().max(f64::MIN_POSITIVE)
        );
    }
    Ok(())
}
