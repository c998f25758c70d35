//! One in-process decision for the README's refund example: raw bytes →
//! decode → schema → canonical form and hashes → entities → Cedar →
//! decision. Prints p50, p99 and mean over many runs.
//!
//! Run: `cargo bench --bench decision` (optionally `-- <iterations>`).

#[allow(
    dead_code,
    reason = "the sidecar launcher is for the benches that serve"
)]
mod common;

use std::time::{Duration, Instant};

use toolgate::access::TenantScope;
use toolgate::decision::{AuthorizeInput, Decision};
use toolgate::identity::Caller;

const ENTITIES: &str = r#"[{"uid":{"type":"Order","id":"ord_1001"},"parents":[{"type":"Tenant","id":"acme"}],
 "attrs":{"tenant":{"__entity":{"type":"Tenant","id":"acme"}},"owner":{"__entity":{"type":"User","id":"alice"}},
 "status":"delivered","total_cents":50000}}]"#;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let iterations: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let policies = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let services = rt.block_on(common::in_process(common::load_policies(&policies)?))?;
    let authorizer = services.authorizer;
    let input = AuthorizeInput {
        tool: "refund_order".into(),
        arguments: br#"{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}"#.to_vec(),
        caller: Some(Caller {
            subject_id: "bob".into(),
            tenant_id: "acme".into(),
            scopes: vec!["orders:read".into(), "orders:refund".into()],
            roles: vec!["support_agent".into()],
            agent_id: "support-bot".into(),
            session_id: "s-42".into(),
        }),
        call_id: "call_7".into(),
        request_id: "refund-ord_1001-1".into(),
        entities_json: ENTITIES.into(),
        tenants: TenantScope::Any,
        ..AuthorizeInput::default()
    };
    let mut samples: Vec<Duration> = Vec::with_capacity(iterations);
    rt.block_on(async {
        for _ in 0..iterations / 10 {
            let _ = authorizer.authorize(&input).await;
        }
        for _ in 0..iterations {
            let start = Instant::now();
            let outcome = authorizer.authorize(&input).await;
            samples.push(start.elapsed());
            assert!(
                matches!(outcome, Ok(ref o) if o.decision == Decision::Allow),
                "{outcome:?}"
            );
        }
    });
    samples.sort();
    let pick = |q: f64| {
        samples
            .get(((samples.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    let mean = samples.iter().sum::<Duration>() / u32::try_from(samples.len().max(1)).unwrap_or(1);
    println!(
        "in-process decision (refund example), {iterations} runs: p50 {:.1} µs, p99 {:.1} µs, mean {:.1} µs",
        pick(0.5).as_secs_f64() * 1e6,
        pick(0.99).as_secs_f64() * 1e6,
        mean.as_secs_f64() * 1e6
    );
    Ok(())
}
