//! Prometheus metrics (DESIGN §9), served on their own listener so a scrape
//! never shares a port or an access policy with the executors' gRPC.
//!
//! Label values are bounded: a tool label is a loaded tool's name or
//! `unknown` (the model writes the tool name; it must not mint series), and
//! codes, decisions and states come from fixed tables. This module counts;
//! it decides nothing and never sees arguments or tokens.
//!
//! The policy reloader keeps its own counters; they and the live
//! `policy_version` are read at each scrape through [`PolicyGauges`] (which
//! the reloader implements, so this module depends on no policy type), and
//! the exported values are the reloader's, never a copy that could drift.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// What the metrics read of the live policy set at each scrape.
pub trait PolicyGauges: Send + Sync + std::fmt::Debug {
    /// Reloads that put a valid set live (changed or not).
    fn reloads_succeeded(&self) -> u64;
    /// Reloads refused (the last good set stayed live).
    fn reloads_failed(&self) -> u64;
    /// The live set's `policy_version`.
    fn policy_version(&self) -> String;
}

/// The label value for a tool name that is not loaded.
pub const UNKNOWN_TOOL: &str = "unknown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    tool: String,
    decision: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionKindLabels {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LedgerLabels {
    operation: &'static str,
    tool: String,
    outcome: &'static str,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    /// A loaded budget's name: bounded by the policy set, never a key.
    budget: String,
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabels {
    scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: &'static str,
}

fn latency_histogram() -> Histogram {
    // 50 µs … ~3.3 s: a decision is sub-millisecond in memory, milliseconds
    // with a store write.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
}

/// Every metric toolgate exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    decision_latency: Family<DecisionKindLabels, Histogram, fn() -> Histogram>,
    approvals: Family<StateLabels, Counter>,
    approval_decisions: Family<OutcomeLabels, Counter>,
    approval_views_refused: Family<OutcomeLabels, Counter>,
    ledger: Family<LedgerLabels, Counter>,
    entity_calls: Family<OutcomeLabels, Counter>,
    policies: Arc<OnceLock<Arc<dyn PolicyGauges>>>,
    rate_limited: Family<ScopeLabels, Counter>,
    overloaded: Family<LimitLabels, Counter>,
    access_denied: Family<ServiceLabels, Counter>,
    store_errors: Counter,
    budget_events: Family<BudgetLabels, Counter>,
    shutting_down: Gauge,
    approval_watches: Gauge,
    audit_events: Counter,
    audit_dropped: Counter,
    audit_write_errors: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("toolgate");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Authorize decisions by tool, decision and envelope code",
            decisions.clone(),
        );
        let decision_latency =
            Family::<DecisionKindLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register(
            "decision_duration_seconds",
            "Time to decide one call, by decision",
            decision_latency.clone(),
        );
        let approvals = Family::<StateLabels, Counter>::default();
        registry.register(
            "approvals",
            "Approvals entering a state (pending, approved, rejected, expired, consumed)",
            approvals.clone(),
        );
        let approval_decisions = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "approval_decisions",
            "DecideApproval calls by outcome (approved, rejected, or the refusal code)",
            approval_decisions.clone(),
        );
        let approval_views_refused = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "approval_views_refused",
            "Approvals withheld from a caller by view_approval, by call (get, list, watch) \
             and refusal code (forbidden, policy_error, internal_error)",
            approval_views_refused.clone(),
        );
        let ledger = Family::<LedgerLabels, Counter>::default();
        registry.register(
            "ledger_transitions",
            "Execution ledger calls by operation (begin, complete, reconcile), tool, \
             outcome (begin: acquired, in_progress, completed, reconcile_required, refused; \
             complete and reconcile: ok, not_found or the answer's code) and the state after",
            ledger.clone(),
        );
        let entity_calls = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "entity_calls",
            "Entity store calls by operation (upsert, delete, get) and outcome \
             (ok, tenant_not_granted, internal_error or the refusal code)",
            entity_calls.clone(),
        );
        let policies = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(PolicyCollector(Arc::clone(&policies))));
        let rate_limited = Family::<ScopeLabels, Counter>::default();
        registry.register(
            "rate_limited",
            "Calls refused by a rate limit, by scope (tenant, tool)",
            rate_limited.clone(),
        );
        let overloaded = Family::<LimitLabels, Counter>::default();
        registry.register(
            "overload_refusals",
            "Connections closed and calls refused at once past a listener limit, and calls cut off at the request timeout, by limit",
            overloaded.clone(),
        );
        let access_denied = Family::<ServiceLabels, Counter>::default();
        registry.register(
            "access_denied",
            "Calls refused because the caller has no grant for the service",
            access_denied.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Store operations that failed",
            store_errors.clone(),
        );
        let budget_events = Family::<BudgetLabels, Counter>::default();
        registry.register(
            "budget_events",
            "Budget charges, releases and decisions not allowed over a budget's limit, \
             by budget name (never by key) and event (charged, released, over_limit)",
            budget_events.clone(),
        );
        let approval_watches = Gauge::default();
        registry.register(
            "approval_watches",
            "WatchApprovals streams open now (each one's task, until it ends)",
            approval_watches.clone(),
        );
        let shutting_down = Gauge::default();
        registry.register(
            "shutting_down",
            "1 from the shutdown signal on: health is NOT_SERVING, calls drain",
            shutting_down.clone(),
        );
        let audit_events = Counter::default();
        registry.register(
            "audit_events",
            "Audit events written to the sink",
            audit_events.clone(),
        );
        let audit_dropped = Counter::default();
        registry.register(
            "audit_dropped",
            "Audit events not recorded because the queue stayed full",
            audit_dropped.clone(),
        );
        let audit_write_errors = Counter::default();
        registry.register(
            "audit_write_errors",
            "Failed writes to the audit sink",
            audit_write_errors.clone(),
        );
        Self {
            registry,
            decisions,
            decision_latency,
            approvals,
            approval_decisions,
            approval_views_refused,
            ledger,
            entity_calls,
            policies,
            rate_limited,
            overloaded,
            access_denied,
            store_errors,
            budget_events,
            shutting_down,
            approval_watches,
            audit_events,
            audit_dropped,
            audit_write_errors,
        }
    }
}

impl Metrics {
    /// Counts one decision. `tool` must be a loaded tool's name or
    /// [`UNKNOWN_TOOL`]; `code` is the envelope code, `""` for an allow.
    pub fn decision(&self, tool: &str, decision: &'static str, code: &'static str, took: Duration) {
        self.decisions
            .get_or_create(&DecisionLabels {
                tool: tool.to_owned(),
                decision,
                code,
            })
            .inc();
        self.decision_latency
            .get_or_create(&DecisionKindLabels { decision })
            .observe(took.as_secs_f64());
    }

    /// Counts an approval entering `state`.
    pub fn approval_state(&self, state: &'static str) {
        self.approvals.get_or_create(&StateLabels { state }).inc();
    }

    /// Counts one DecideApproval call by outcome.
    pub fn approval_decision(&self, outcome: &'static str) {
        self.approval_decisions
            .get_or_create(&OutcomeLabels {
                operation: "decide",
                outcome,
            })
            .inc();
    }

    /// Counts one approval withheld from a caller that may not view it:
    /// `call` is `get`, `list` or `watch`, `code` the refusal's code.
    pub fn approval_view_refused(&self, call: &'static str, code: &'static str) {
        self.approval_views_refused
            .get_or_create(&OutcomeLabels {
                operation: call,
                outcome: code,
            })
            .inc();
    }

    /// Counts one ledger call. `tool` must be a loaded tool's name or
    /// [`UNKNOWN_TOOL`]; `outcome` and `state` come from fixed tables
    /// (`state` is `none` when there is no record).
    pub fn ledger(
        &self,
        operation: &'static str,
        tool: &str,
        outcome: &'static str,
        state: &'static str,
    ) {
        self.ledger
            .get_or_create(&LedgerLabels {
                operation,
                tool: tool.to_owned(),
                outcome,
                state,
            })
            .inc();
    }

    /// Counts one entity-store call; `outcome` comes from a fixed table.
    pub fn entity_call(&self, operation: &'static str, outcome: &'static str) {
        self.entity_calls
            .get_or_create(&OutcomeLabels { operation, outcome })
            .inc();
    }

    /// Exports `reloader`'s reload counters and live policy version from
    /// now on. The first reloader given is the one exported.
    pub fn watch_policies(&self, reloader: Arc<dyn PolicyGauges>) {
        let _ = self.policies.set(reloader);
    }

    /// Counts one charge made to `budget` (a key of it).
    pub fn budget_charged(&self, budget: &str) {
        self.budget_event(budget, "charged");
    }

    /// Counts one charge of `budget` released (its call did not happen).
    pub fn budget_released(&self, budget: &str) {
        self.budget_event(budget, "released");
    }

    /// Counts a decision not allowed while `budget`'s use with the call
    /// exceeded its limit.
    pub fn budget_over_limit(&self, budget: &str) {
        self.budget_event(budget, "over_limit");
    }

    fn budget_event(&self, budget: &str, event: &'static str) {
        self.budget_events
            .get_or_create(&BudgetLabels {
                budget: budget.to_owned(),
                event,
            })
            .inc();
    }

    /// Counts a call refused by a rate limit of `scope`.
    pub fn rate_limited(&self, scope: &'static str) {
        self.rate_limited
            .get_or_create(&ScopeLabels { scope })
            .inc();
    }

    /// Counts a connection or call refused past the listener's `limit`
    /// (`connections`, `calls`, `health_watches`), or cut off
    /// (`request_timeout`).
    pub fn overloaded(&self, limit: &'static str) {
        self.overloaded.get_or_create(&LimitLabels { limit }).inc();
    }

    /// Counts a call refused for want of a grant.
    pub fn access_denied(&self, service: &'static str) {
        self.access_denied
            .get_or_create(&ServiceLabels { service })
            .inc();
    }

    /// Counts a failed store operation.
    pub fn store_error(&self) {
        self.store_errors.inc();
    }

    /// One more open `WatchApprovals` stream; the guard counts it closed
    /// when dropped (its task ended).
    #[must_use]
    pub fn approval_watch_opened(&self) -> WatchGuard {
        self.approval_watches.inc();
        WatchGuard(self.approval_watches.clone())
    }

    /// Marks the start of the shutdown (`toolgate_shutting_down` 1).
    pub fn shutting_down(&self) {
        self.shutting_down.set(1);
    }

    pub(crate) fn audit_written(&self, n: u64) {
        self.audit_events.inc_by(n);
    }

    pub(crate) fn audit_dropped(&self) {
        self.audit_dropped.inc();
    }

    pub(crate) fn audit_write_error(&self) {
        self.audit_write_errors.inc();
    }

    /// The exposition text (OpenMetrics).
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an empty body is the fallback.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Reads the policy reloader at each scrape:
/// `toolgate_policy_reloads_total{result}` and
/// `toolgate_policy_version_info{policy_version} 1`.
#[derive(Debug)]
struct PolicyCollector(Arc<OnceLock<Arc<dyn PolicyGauges>>>);

impl Collector for PolicyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(reloader) = self.0.get() else {
            return Ok(());
        };
        {
            let mut family = encoder.encode_descriptor(
                "policy_reloads",
                "Policy reloads by result: succeeded (a valid set loaded, changed or not) \
                 or failed (refused; the last good set stayed live)",
                None,
                MetricType::Counter,
            )?;
            for (result, n) in [
                ("succeeded", reloader.reloads_succeeded()),
                ("failed", reloader.reloads_failed()),
            ] {
                ConstCounter::new(n).encode(family.encode_family(&[("result", result)])?)?;
            }
        }
        let version = reloader.policy_version();
        let mut family = encoder.encode_descriptor(
            "policy_version_info",
            "The live policy set: always 1, labelled with its policy_version",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1_i64)
            .encode(family.encode_family(&[("policy_version", version.as_str())])?)
    }
}

/// The content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
///
/// # Errors
/// The listener's IO error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)],
                    metrics.encode(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Counts one open `WatchApprovals` stream until dropped.
#[derive(Debug)]
pub struct WatchGuard(Gauge);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_are_exported_with_bounded_labels() {
        let m = Metrics::default();
        m.decision("refund_order", "allow", "", Duration::from_micros(300));
        m.decision("refund_order", "allow", "", Duration::from_micros(300));
        m.decision(
            UNKNOWN_TOOL,
            "deny",
            "tool_not_found",
            Duration::from_micros(10),
        );
        m.approval_state("pending");
        m.store_error();
        let text = m.encode();
        assert!(
            text.contains(
                "toolgate_decisions_total{tool=\"refund_order\",decision=\"allow\",code=\"\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "toolgate_decisions_total{tool=\"unknown\",decision=\"deny\",code=\"tool_not_found\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("toolgate_decision_duration_seconds_count{decision=\"allow\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("toolgate_approvals_total{state=\"pending\"} 1"),
            "{text}"
        );
        assert!(text.contains("toolgate_store_errors_total 1"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
