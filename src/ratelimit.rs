//! Rate limits per tenant and per tool (token buckets, GCRA via `governor`).
//!
//! Each tenant has its own bucket of the tenant quota; each configured tool
//! has, per tenant, its own bucket of that tool's quota, so one tenant's
//! burst of refunds never spends another's. Buckets live in memory, per
//! replica. A call over a limit is answered `rate_limited` with
//! `details.retry_after_ms` — nothing was started, so retrying the same key
//! after that time is safe. Tool buckets exist only for loaded tools
//! (the model writes the tool name; it must not mint buckets).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

/// A bucket: `per_period` tokens refill every `period`, at most `burst` held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Sustained rate: this many calls…
    pub calls: NonZeroU32,
    /// …per this period.
    pub period: Duration,
    /// Calls allowed at once from a full bucket.
    pub burst: NonZeroU32,
}

impl Limit {
    fn quota(self) -> Option<Quota> {
        let each = self.period.checked_div(self.calls.get())?;
        Some(Quota::with_period(each)?.allow_burst(self.burst))
    }
}

/// The configured limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// Every tenant's own bucket.
    pub tenant: Option<Limit>,
    /// Per tool name: every tenant's own bucket for that tool.
    pub tools: HashMap<String, Limit>,
}

/// Which limit refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Tenant,
    Tool,
}

impl Scope {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Tool => "tool",
        }
    }
}

/// A refusal: the scope, and how long until a call would be let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub scope: Scope,
    pub retry_after: Duration,
}

type Keyed<C> =
    RateLimiter<String, DefaultKeyedStateStore<String>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// Buckets kept before idle ones are collected.
const COLLECT_ABOVE: usize = 10_000;

/// One limiter and the size at which its idle buckets are next collected.
///
/// A collection scans every bucket, so it runs only once the map has grown
/// to twice what the last one kept (and at least [`COLLECT_ABOVE`]): with
/// more live buckets than that, a scan on every call would make each call
/// O(n); this way the scans cost O(1) per call, amortized.
struct Bucketed<C: Clock> {
    limiter: Keyed<C>,
    collect_at: AtomicUsize,
}

impl<C: Clock> Bucketed<C> {
    fn new(limiter: Keyed<C>) -> Self {
        Self {
            limiter,
            collect_at: AtomicUsize::new(COLLECT_ABOVE),
        }
    }

    fn collect_if_grown(&self) {
        if self.limiter.len() > self.collect_at.load(Ordering::Relaxed) {
            self.limiter.retain_recent();
            let kept = self.limiter.len();
            self.collect_at
                .store(COLLECT_ABOVE.max(kept.saturating_mul(2)), Ordering::Relaxed);
        }
    }
}

/// The live buckets.
pub struct RateLimits<C: Clock = DefaultClock> {
    clock: C,
    tenant: Option<Bucketed<C>>,
    tools: HashMap<String, Bucketed<C>>,
}

impl<C: Clock> std::fmt::Debug for RateLimits<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimits")
            .field("tenant", &self.tenant.is_some())
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl RateLimits {
    /// Buckets on the monotonic clock.
    #[must_use]
    pub fn new(config: &RateLimitConfig) -> Self {
        Self::with_clock(config, DefaultClock::default())
    }
}

impl Default for RateLimits {
    fn default() -> Self {
        Self::new(&RateLimitConfig::default())
    }
}

impl<C: Clock + Clone> RateLimits<C> {
    /// Buckets on `clock` (a fake one in tests). A limit whose period cannot
    /// be divided into its calls (zero) is left out; config validation
    /// refuses those before they get here.
    #[must_use]
    pub fn with_clock(config: &RateLimitConfig, clock: C) -> Self {
        let keyed = |l: Limit| {
            l.quota().map(|q| {
                Bucketed::new(RateLimiter::new(
                    q,
                    DefaultKeyedStateStore::default(),
                    clock.clone(),
                ))
            })
        };
        Self {
            tenant: config.tenant.and_then(keyed),
            tools: config
                .tools
                .iter()
                .filter_map(|(name, l)| keyed(*l).map(|r| (name.clone(), r)))
                .collect(),
            clock: clock.clone(),
        }
    }

    /// Spends one token of `tenant`'s bucket.
    ///
    /// # Errors
    /// [`Limited`] when the bucket is empty.
    pub fn check_tenant(&self, tenant: &str) -> Result<(), Limited> {
        self.check(self.tenant.as_ref(), tenant, Scope::Tenant)
    }

    /// Spends one token of `tenant`'s bucket for `tool` (a loaded tool).
    ///
    /// # Errors
    /// [`Limited`] when the bucket is empty.
    pub fn check_tool(&self, tenant: &str, tool: &str) -> Result<(), Limited> {
        self.check(self.tools.get(tool), tenant, Scope::Tool)
    }

    fn check(
        &self,
        bucketed: Option<&Bucketed<C>>,
        key: &str,
        scope: Scope,
    ) -> Result<(), Limited> {
        let Some(bucketed) = bucketed else {
            return Ok(());
        };
        bucketed.collect_if_grown();
        bucketed
            .limiter
            .check_key(&key.to_owned())
            .map_err(|not_until| Limited {
                scope,
                retry_after: not_until.wait_time_from(self.clock.now()),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;

    fn nz(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    #[test]
    fn buckets_are_per_tenant_and_per_tool_and_refill_on_the_clock() {
        let clock = FakeRelativeClock::default();
        let config = RateLimitConfig {
            tenant: Some(Limit {
                calls: nz(10),
                period: Duration::from_secs(1),
                burst: nz(3),
            }),
            tools: HashMap::from([(
                "refund_order".to_owned(),
                Limit {
                    calls: nz(1),
                    period: Duration::from_secs(60),
                    burst: nz(1),
                },
            )]),
        };
        let limits = RateLimits::with_clock(&config, clock.clone());
        for _ in 0..3 {
            assert_eq!(limits.check_tenant("acme"), Ok(()));
        }
        assert_eq!(
            limits.check_tenant("acme"),
            Err(Limited {
                scope: Scope::Tenant,
                retry_after: Duration::from_millis(100)
            })
        );
        // Another tenant has its own bucket.
        assert_eq!(limits.check_tenant("globex"), Ok(()));
        clock.advance(Duration::from_millis(100));
        assert_eq!(limits.check_tenant("acme"), Ok(()));

        assert_eq!(limits.check_tool("acme", "refund_order"), Ok(()));
        assert_eq!(
            limits.check_tool("acme", "refund_order"),
            Err(Limited {
                scope: Scope::Tool,
                retry_after: Duration::from_secs(60)
            })
        );
        assert_eq!(limits.check_tool("globex", "refund_order"), Ok(()));
        // Unconfigured tools are unlimited.
        for _ in 0..10 {
            assert_eq!(limits.check_tool("acme", "get_order"), Ok(()));
        }
        clock.advance(Duration::from_secs(59));
        assert_eq!(
            limits
                .check_tool("acme", "refund_order")
                .map_err(|l| l.retry_after),
            Err(Duration::from_secs(1))
        );
    }

    #[test]
    fn idle_buckets_are_collected_only_once_the_map_has_doubled() {
        let clock = FakeRelativeClock::default();
        let config = RateLimitConfig {
            tenant: Some(Limit {
                calls: nz(1),
                period: Duration::from_secs(1),
                burst: nz(1),
            }),
            tools: HashMap::new(),
        };
        let limits = RateLimits::with_clock(&config, clock);
        let tenant = limits.tenant.as_ref().unwrap();
        // More live (non-idle) buckets than COLLECT_ABOVE: one scan, which
        // keeps them all, then none until the map has doubled.
        for i in 0..=COLLECT_ABOVE + 1 {
            assert_eq!(limits.check_tenant(&format!("t{i}")), Ok(()));
        }
        assert_eq!(
            tenant.collect_at.load(Ordering::Relaxed),
            2 * (COLLECT_ABOVE + 1)
        );
        assert_eq!(tenant.limiter.len(), COLLECT_ABOVE + 2);
        // Still answered per tenant.
        assert!(limits.check_tenant("t0").is_err());
    }

    #[test]
    fn no_config_no_limits() {
        let limits = RateLimits::default();
        for _ in 0..1000 {
            assert_eq!(limits.check_tenant("acme"), Ok(()));
        }
    }
}
