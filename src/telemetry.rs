//! Structured logs and the audit event of every decision.
//!
//! Audit events carry ids, hashes and the decision, never raw arguments,
//! display arguments or tokens.

use std::time::Duration;

use crate::authorizer::{AuthorizeInput, AuthorizeOutcome};

/// The tracing target of audit events, for routing them to their own sink.
pub const AUDIT_TARGET: &str = "toolgate::audit";

/// Logs one audit event for a decision.
pub fn audit_decision(input: &AuthorizeInput, outcome: &AuthorizeOutcome, latency: Duration) {
    let (tenant, subject, agent) = input.caller.as_ref().map_or(("", "", ""), |c| {
        (
            c.tenant_id.as_str(),
            c.subject_id.as_str(),
            c.agent_id.as_str(),
        )
    });
    tracing::info!(
        target: AUDIT_TARGET,
        decision_id = %outcome.decision_id,
        call_id = %outcome.call_id,
        request_id = %input.request_id,
        tool = %input.tool.chars().take(64).collect::<String>(),
        tool_version = %outcome.tool_version,
        policy_version = %outcome.policy_version,
        tenant = %tenant,
        subject = %subject,
        agent = %agent,
        idempotency_key = %outcome.idempotency_key,
        arguments_sha256 = %outcome.arguments_sha256,
        decision = outcome.decision.as_str(),
        code = outcome.error.as_ref().map_or("", |e| e.code.as_str()),
        policies = ?outcome.policies,
        // The approval this call created, else the one it presented.
        approval_id = %outcome.approval.as_ref().map_or_else(
            || input.approval_id.chars().take(64).collect::<String>(),
            |a| a.0.clone(),
        ),
        latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
        "decision"
    );
}

/// Installs the global subscriber: JSON lines to stderr, filtered by
/// `RUST_LOG` (default `info`).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
