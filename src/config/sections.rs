//! Each raw section validated into its typed settings, with the key that
//! is wrong named in the error.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use super::raw::{
    RawAudit, RawAuthzen, RawConsole, RawExtAuthz, RawGrant, RawIdentity, RawLedger, RawLimit,
    RawLimits, RawRateLimits, RawReload, RawStoreSettings,
};
use super::{
    ConfigError, DEFAULT_RELOAD_DEBOUNCE, ListenAddr, MAX_LEEWAY_SECONDS, MAX_RELOAD_DEBOUNCE_MS,
    TlsFiles, invalid,
};
use crate::access::{AccessPolicy, CallerPattern, Grant, ListenerLimits, ServiceName, TenantScope};
use crate::audit::{AuditConfig, AuditSink, WhenFull};
use crate::authzen::{AuthzenConfig, is_evaluation_pointer};
use crate::console::ConsoleConfig;
use crate::ext_authz::ExtAuthzConfig;
use crate::identity::{ClaimNames, JwksLocation, RemoteJwksConfig, VerifierConfig};
use crate::ledger::LedgerConfig;
use crate::policy::ReloadTriggers;
use crate::ratelimit::{Limit, RateLimitConfig};
use crate::store::StoreSettings;

pub(super) fn ledger_config(raw: &RawLedger) -> Result<LedgerConfig, ConfigError> {
    let positive = |key: &'static str, v: Option<u64>| match v {
        Some(0) => Err(ConfigError::Invalid {
            key,
            reason: "must be positive".into(),
        }),
        other => Ok(other),
    };
    let defaults = LedgerConfig::default();
    positive(
        "ledger.default_max_attempts",
        raw.default_max_attempts.map(u64::from),
    )?;
    let config = LedgerConfig {
        default_max_attempts: raw
            .default_max_attempts
            .unwrap_or(defaults.default_max_attempts),
        lease_margin: raw
            .lease_margin_ms
            .map_or(defaults.lease_margin, Duration::from_millis),
        max_lease: positive("ledger.max_lease_ms", raw.max_lease_ms)?
            .map_or(defaults.max_lease, Duration::from_millis),
        retention: positive("ledger.retention_seconds", raw.retention_seconds)?
            .map_or(defaults.retention, Duration::from_secs),
        collect_interval: positive(
            "ledger.collect_interval_seconds",
            raw.collect_interval_seconds,
        )?
        .map_or(defaults.collect_interval, Duration::from_secs),
        collect_batch: positive(
            "ledger.collect_batch",
            raw.collect_batch
                .map(|n| u64::try_from(n).unwrap_or(u64::MAX)),
        )?
        .map_or(defaults.collect_batch, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        }),
        ticket_ttl: positive("ledger.ticket_ttl_seconds", raw.ticket_ttl_seconds)?
            .map_or(defaults.ticket_ttl, Duration::from_secs),
    };
    // Retention never collects an IN_PROGRESS record (live lease or not:
    // `ExecutionState::COLLECTABLE`), so this bound is no longer what keeps
    // a held operation; it stays a sanity check that a lease is shorter than
    // the time a settled record is remembered.
    if config.retention <= config.max_lease {
        return Err(ConfigError::Invalid {
            key: "ledger.retention_seconds",
            reason: format!(
                "must be longer than ledger.max_lease_ms ({} ms)",
                config.max_lease.as_millis()
            ),
        });
    }
    Ok(config)
}

pub(super) fn store_settings(raw: &RawStoreSettings) -> Result<StoreSettings, ConfigError> {
    let defaults = StoreSettings::default();
    let millis = |key: &'static str, v: Option<u64>, default: Duration| match v {
        None => Ok(default),
        Some(0) => Err(ConfigError::Invalid {
            key,
            reason: "must be positive".into(),
        }),
        Some(ms) => Ok(Duration::from_millis(ms)),
    };
    Ok(StoreSettings {
        pool_size: match raw.pool_size {
            None => defaults.pool_size,
            Some(0) => {
                return Err(ConfigError::Invalid {
                    key: "store.pool_size",
                    reason: "must be positive".into(),
                });
            }
            Some(n) => n,
        },
        connect_timeout: millis(
            "store.connect_timeout_ms",
            raw.connect_timeout_ms,
            defaults.connect_timeout,
        )?,
        statement_timeout: millis(
            "store.statement_timeout_ms",
            raw.statement_timeout_ms,
            defaults.statement_timeout,
        )?,
        health_interval: millis(
            "store.health_interval_ms",
            raw.health_interval_ms,
            defaults.health_interval,
        )?,
    })
}

/// `[limits]`' listener keys: each positive; absent keys keep the default.
pub(super) fn listener_limits(raw: &RawLimits) -> Result<ListenerLimits, ConfigError> {
    fn positive<T: Default + PartialEq>(
        key: &'static str,
        v: Option<T>,
        default: T,
    ) -> Result<T, ConfigError> {
        match v {
            None => Ok(default),
            Some(n) if n == T::default() => Err(ConfigError::Invalid {
                key,
                reason: "must be positive".into(),
            }),
            Some(n) => Ok(n),
        }
    }
    let d = ListenerLimits::default();
    Ok(ListenerLimits {
        max_connections: positive(
            "limits.max_connections",
            raw.max_connections,
            d.max_connections,
        )?,
        max_concurrent_streams: positive(
            "limits.max_concurrent_streams",
            raw.max_concurrent_streams,
            d.max_concurrent_streams,
        )?,
        max_calls_in_flight: positive(
            "limits.max_calls_in_flight",
            raw.max_calls_in_flight,
            d.max_calls_in_flight,
        )?,
        request_timeout: Duration::from_millis(positive(
            "limits.request_timeout_ms",
            raw.request_timeout_ms,
            u64::try_from(d.request_timeout.as_millis()).unwrap_or(u64::MAX),
        )?),
        max_health_watches: positive(
            "limits.max_health_watches",
            raw.max_health_watches,
            d.max_health_watches,
        )?,
    })
}

pub(super) fn reload_triggers(raw: &RawReload) -> Result<ReloadTriggers, ConfigError> {
    let debounce = match raw.debounce_ms {
        None => DEFAULT_RELOAD_DEBOUNCE,
        Some(ms) if (1..=MAX_RELOAD_DEBOUNCE_MS).contains(&ms) => Duration::from_millis(ms),
        Some(ms) => {
            return Err(ConfigError::Invalid {
                key: "reload.debounce_ms",
                reason: format!("{ms} is not between 1 and {MAX_RELOAD_DEBOUNCE_MS}"),
            });
        }
    };
    Ok(ReloadTriggers {
        watch: raw.watch.unwrap_or(true).then_some(debounce),
        sighup: raw.sighup.unwrap_or(true),
    })
}

pub(super) fn verifier_config(
    issuer: Option<String>,
    audience: Option<String>,
    raw: &RawIdentity,
) -> Result<VerifierConfig, ConfigError> {
    let defaults = VerifierConfig::default();
    let leeway_seconds = raw.leeway_seconds.unwrap_or(defaults.leeway_seconds);
    if leeway_seconds > MAX_LEEWAY_SECONDS {
        return Err(ConfigError::Invalid {
            key: "identity.leeway_seconds",
            reason: format!("{leeway_seconds} is more than the maximum of {MAX_LEEWAY_SECONDS}"),
        });
    }
    let names = ClaimNames::default();
    let pick = |key: &'static str, given: Option<String>, default: String| match given {
        Some(name) if name.trim().is_empty() => Err(ConfigError::Invalid {
            key,
            reason: "a claim name must not be empty".into(),
        }),
        Some(name) => Ok(name),
        None => Ok(default),
    };
    let claims = ClaimNames {
        subject: pick(
            "identity.claims.subject",
            raw.claims.subject.clone(),
            names.subject,
        )?,
        tenant: pick(
            "identity.claims.tenant",
            raw.claims.tenant.clone(),
            names.tenant,
        )?,
        roles: pick(
            "identity.claims.roles",
            raw.claims.roles.clone(),
            names.roles,
        )?,
        scope: pick(
            "identity.claims.scope",
            raw.claims.scope.clone(),
            names.scope,
        )?,
    };
    let nonempty = |key: &'static str, v: Option<String>| match v {
        Some(s) if s.is_empty() => Err(ConfigError::Invalid {
            key,
            reason: "must not be empty (leave it out instead)".into(),
        }),
        other => Ok(other),
    };
    Ok(VerifierConfig {
        issuer: nonempty("issuer", issuer)?,
        audience: nonempty("audience", audience)?,
        leeway_seconds,
        claims,
    })
}

/// Where identity keys come from besides `jwks_file` (`[identity] jwks_url`
/// or `discovery`), and the approvers' own audience. The issuer is required
/// whenever tokens are verified at all: a key set is shared by every
/// application of the provider, and only `iss` (with `aud`) says a token
/// was minted for this deployment.
pub(super) fn key_source(
    raw: &RawIdentity,
    jwks_file: Option<&std::path::Path>,
    verifier: &VerifierConfig,
) -> Result<(Option<RemoteJwksConfig>, Option<String>), ConfigError> {
    let location = match (&raw.jwks_url, raw.discovery.unwrap_or(false)) {
        (Some(_), true) => {
            return Err(invalid(
                "identity.discovery",
                "give either `jwks_url` or `discovery = true`, not both",
            ));
        }
        (Some(url), false) if url.trim().is_empty() => {
            return Err(invalid("identity.jwks_url", "must not be empty"));
        }
        (Some(url), false) => Some(JwksLocation::Url(url.clone())),
        (None, true) => Some(JwksLocation::Discovery {
            issuer: verifier
                .issuer
                .clone()
                .ok_or_else(|| invalid("identity.discovery", "needs `issuer` to discover from"))?,
        }),
        (None, false) => None,
    };
    if location.is_some() && jwks_file.is_some() {
        return Err(invalid(
            "jwks_file",
            "give either `jwks_file` or `[identity] jwks_url`/`discovery`, not both",
        ));
    }
    if (location.is_some() || jwks_file.is_some()) && verifier.issuer.is_none() {
        return Err(invalid(
            "issuer",
            "is required whenever identity tokens are verified (`jwks_file`, `[identity] jwks_url` or `discovery`): \
             the issuer's tokens alone are accepted",
        ));
    }
    let seconds = |key: &'static str, v: Option<u64>, default: Duration| match v {
        None => Ok(default),
        Some(s) if (1..=86_400).contains(&s) => Ok(Duration::from_secs(s)),
        Some(s) => Err(invalid(key, format!("{s} is not between 1 and 86400"))),
    };
    let remote = match location {
        None => None,
        Some(location) => {
            let min_refresh = seconds(
                "identity.jwks_refresh_min_seconds",
                raw.jwks_refresh_min_seconds,
                RemoteJwksConfig::DEFAULT_MIN_REFRESH,
            )?;
            let max_refresh = seconds(
                "identity.jwks_refresh_max_seconds",
                raw.jwks_refresh_max_seconds,
                RemoteJwksConfig::DEFAULT_MAX_REFRESH.max(min_refresh),
            )?;
            if max_refresh < min_refresh {
                return Err(invalid(
                    "identity.jwks_refresh_max_seconds",
                    "must not be less than `jwks_refresh_min_seconds`",
                ));
            }
            Some(RemoteJwksConfig {
                location,
                min_refresh,
                max_refresh,
            })
        }
    };
    let approver_audience = match &raw.approver_audience {
        Some(a) if a.trim().is_empty() => {
            return Err(invalid(
                "identity.approver_audience",
                "must not be empty (leave it out instead)",
            ));
        }
        Some(a) if verifier.audience.as_deref() == Some(a.as_str()) => {
            return Err(invalid(
                "identity.approver_audience",
                "must differ from `audience`: the point is that a token an executor forwards cannot decide approvals",
            ));
        }
        other => other.clone(),
    };
    Ok((remote, approver_audience))
}

/// The grants, checked against the listener: who can be told apart there.
pub(super) fn access_policy(
    raw: Vec<RawGrant>,
    listen: &ListenAddr,
    tls: Option<&TlsFiles>,
) -> Result<AccessPolicy, ConfigError> {
    if raw.is_empty() {
        if listen.is_loopback_tcp() && tls.is_none() {
            return Ok(AccessPolicy::Open);
        }
        return Err(invalid(
            "access",
            "a Unix socket, TLS or non-loopback listener needs explicit [[access]] grants \
             (use `caller = \"any\"` to grant a service to every caller)",
        ));
    }
    let mtls = tls.is_some_and(|t| t.client_ca.is_some());
    let unix = matches!(listen, ListenAddr::Unix(_));
    let mut grants = Vec::with_capacity(raw.len());
    for g in raw {
        let caller = CallerPattern::parse(&g.caller).map_err(|r| invalid("access.caller", r))?;
        match &caller {
            CallerPattern::Cn(_) | CallerPattern::San(_) if !mtls => {
                return Err(invalid(
                    "access.caller",
                    format!(
                        "`{}` needs client certificates: set [tls] client_ca",
                        g.caller
                    ),
                ));
            }
            CallerPattern::Uid(_) if !unix => {
                return Err(invalid(
                    "access.caller",
                    format!("`{}` needs a unix:/path listener", g.caller),
                ));
            }
            _ => {}
        }
        let mut services = BTreeSet::new();
        for name in &g.services {
            let service = ServiceName::parse(name).ok_or_else(|| {
                invalid(
                    "access.services",
                    format!(
                        "`{name}` is not one of {}",
                        ServiceName::ALL.map(ServiceName::as_str).join(", ")
                    ),
                )
            })?;
            services.insert(service);
        }
        if services.is_empty() {
            return Err(invalid(
                "access.services",
                "a grant lists at least one service",
            ));
        }
        let tenants = grant_tenants(&g.caller, &services, g.tenants)?;
        grants.push(Grant {
            caller,
            services,
            tenants,
        });
    }
    Ok(AccessPolicy::Grants(grants))
}

/// The tenants of one grant. A grant of `authorization`, `ledger`,
/// `entities`, `authzen` or `ext_authz` names them (least privilege: an executor, a
/// gateway or a data feed acts for no tenant it was not given);
/// `approvals` need none, since an approver's tenant is its verified token's.
fn grant_tenants(
    caller: &str,
    services: &BTreeSet<ServiceName>,
    tenants: Option<Vec<String>>,
) -> Result<TenantScope, ConfigError> {
    let executes = [
        ServiceName::Authorization,
        ServiceName::Ledger,
        ServiceName::Entities,
        ServiceName::Authzen,
        ServiceName::Reconcile,
        ServiceName::ExtAuthz,
    ]
    .iter()
    .any(|s| services.contains(s));
    let Some(tenants) = tenants else {
        if executes {
            return Err(invalid(
                "access.tenants",
                format!(
                    "the grant of `{caller}` gives authorization, ledger, entities, authzen, ext_authz or reconcile, so it names \
                     the tenants its caller may act for (`tenants = [\"acme\"]`, or \
                     `[\"*\"]` for every tenant)"
                ),
            ));
        }
        return Ok(TenantScope::default());
    };
    if tenants.is_empty() {
        return Err(invalid(
            "access.tenants",
            format!("the grant of `{caller}` names no tenant (use `[\"*\"]` for every tenant)"),
        ));
    }
    if tenants.iter().any(String::is_empty) {
        return Err(invalid(
            "access.tenants",
            format!("the grant of `{caller}` names an empty tenant id"),
        ));
    }
    Ok(TenantScope::of(tenants))
}

pub(super) fn audit_config(
    raw: RawAudit,
    defaults: AuditConfig,
) -> Result<AuditConfig, ConfigError> {
    let sink = match raw.sink.as_deref() {
        None => defaults.sink,
        Some("stdout") => AuditSink::Stdout,
        Some("none") => AuditSink::Discard,
        Some(other) => match other.strip_prefix("file:") {
            Some(path) if !path.is_empty() => AuditSink::File(PathBuf::from(path)),
            _ => {
                return Err(invalid(
                    "audit.sink",
                    format!("`{other}` is not `stdout`, `none` or `file:/path`"),
                ));
            }
        },
    };
    let when_full = match raw.when_full.as_deref() {
        None => defaults.when_full,
        Some("fail_closed") => WhenFull::FailClosed,
        Some("drop") => WhenFull::Drop,
        Some(other) => {
            return Err(invalid(
                "audit.when_full",
                format!("`{other}` is not `fail_closed` or `drop`"),
            ));
        }
    };
    let queue = raw.queue.unwrap_or(defaults.queue);
    if queue == 0 {
        return Err(invalid("audit.queue", "must be positive"));
    }
    Ok(AuditConfig {
        sink,
        queue,
        when_full,
        full_wait: raw
            .full_wait_ms
            .map_or(defaults.full_wait, Duration::from_millis),
    })
}

pub(super) fn rate_limits(raw: RawRateLimits) -> Result<RateLimitConfig, ConfigError> {
    fn limit(key: &'static str, raw: &RawLimit) -> Result<Limit, ConfigError> {
        let rates = [
            (raw.per_second, Duration::from_secs(1)),
            (raw.per_minute, Duration::from_secs(60)),
            (raw.per_hour, Duration::from_secs(3600)),
        ];
        let mut given = rates.iter().filter_map(|(n, p)| n.map(|n| (n, *p)));
        let (Some((n, period)), None) = (given.next(), given.next()) else {
            return Err(invalid(
                key,
                "give exactly one of per_second, per_minute, per_hour",
            ));
        };
        let positive = |n: u32| {
            std::num::NonZeroU32::new(n)
                .ok_or_else(|| invalid(key, "rates and bursts must be positive"))
        };
        Ok(Limit {
            calls: positive(n)?,
            period,
            burst: positive(raw.burst.unwrap_or(n))?,
        })
    }
    Ok(RateLimitConfig {
        tenant: raw
            .tenant
            .as_ref()
            .map(|l| limit("rate_limits.tenant", l))
            .transpose()?,
        tools: raw
            .tools
            .iter()
            .map(|(name, l)| Ok((name.clone(), limit("rate_limits.tools", l)?)))
            .collect::<Result<_, ConfigError>>()?,
    })
}

/// `[authzen]`: each pointer a pointer into an evaluation, each list
/// non-empty, the URLs `https` (or `http` for a loopback development PDP),
/// the caps positive.
pub(super) fn authzen_config(raw: RawAuthzen) -> Result<AuthzenConfig, ConfigError> {
    let d = AuthzenConfig::default();
    let one = |key: &'static str, v: Option<String>, default: String| {
        let v = v.unwrap_or(default);
        if is_evaluation_pointer(&v) {
            Ok(v)
        } else {
            Err(invalid(
                key,
                format!(
                    "`{v}` is not a JSON pointer below `/subject`, `/resource`, `/action` or `/context`"
                ),
            ))
        }
    };
    let many = |key: &'static str, v: Option<Vec<String>>, default: Vec<String>| {
        let v = v.unwrap_or(default);
        if v.is_empty() {
            return Err(invalid(key, "names no pointer"));
        }
        if let Some(bad) = v.iter().find(|p| !is_evaluation_pointer(p)) {
            return Err(invalid(
                key,
                format!(
                    "`{bad}` is not a JSON pointer below `/subject`, `/resource`, `/action` or `/context`"
                ),
            ));
        }
        Ok(v)
    };
    let url = |key: &'static str, v: Option<String>| -> Result<Option<String>, ConfigError> {
        match v {
            None => Ok(None),
            Some(u)
                if (u.starts_with("https://") || u.starts_with("http://"))
                    && !u.contains('?')
                    && !u.contains('#') =>
            {
                Ok(Some(u))
            }
            Some(u) => Err(invalid(
                key,
                format!("`{u}` is not an https URL without query or fragment"),
            )),
        }
    };
    let tool_types = raw.tool_types.unwrap_or(d.tool_types);
    if tool_types.is_empty() || tool_types.iter().any(String::is_empty) {
        return Err(invalid(
            "authzen.tool_types",
            "must name at least one resource type, none empty",
        ));
    }
    if raw.default_tenant.as_deref() == Some("") {
        return Err(invalid(
            "authzen.default_tenant",
            "must not be empty (leave it unset to refuse requests without a tenant)",
        ));
    }
    let header = raw
        .identity_token_header
        .unwrap_or(d.identity_token_header)
        .to_ascii_lowercase();
    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        return Err(invalid(
            "authzen.identity_token_header",
            format!("`{header}` is not a header name"),
        ));
    }
    let positive = |key: &'static str, v: Option<usize>, default: usize| match v {
        Some(0) => Err(invalid(key, "must be positive")),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    Ok(AuthzenConfig {
        default_tenant: raw.default_tenant,
        tool_types,
        arguments: many("authzen.arguments", raw.arguments, d.arguments)?,
        subject: one("authzen.subject", raw.subject, d.subject)?,
        tenant: one("authzen.tenant", raw.tenant, d.tenant)?,
        roles: one("authzen.roles", raw.roles, d.roles)?,
        scopes: one("authzen.scopes", raw.scopes, d.scopes)?,
        agent: one("authzen.agent", raw.agent, d.agent)?,
        session: one("authzen.session", raw.session, d.session)?,
        request_id: many("authzen.request_id", raw.request_id, d.request_id)?,
        approval_id: one("authzen.approval_id", raw.approval_id, d.approval_id)?,
        identity_token_header: header,
        policy_decision_point: url("authzen.policy_decision_point", raw.policy_decision_point)?,
        access_request_endpoint: url(
            "authzen.access_request_endpoint",
            raw.access_request_endpoint,
        )?,
        max_body_bytes: positive(
            "authzen.max_body_bytes",
            raw.max_body_bytes,
            d.max_body_bytes,
        )?,
        max_evaluations: positive(
            "authzen.max_evaluations",
            raw.max_evaluations,
            d.max_evaluations,
        )?,
    })
}

/// `[ext_authz]`: the denied methods non-empty names, the identity header
/// a header name (lower case), the body cap positive.
pub(super) fn ext_authz_config(raw: RawExtAuthz) -> Result<ExtAuthzConfig, ConfigError> {
    let d = ExtAuthzConfig::default();
    let denied_methods = raw.denied_methods.unwrap_or(d.denied_methods);
    if denied_methods.iter().any(String::is_empty) {
        return Err(invalid("ext_authz.denied_methods", "names an empty method"));
    }
    if denied_methods.iter().any(|m| m == "tools/call") {
        return Err(invalid(
            "ext_authz.denied_methods",
            "`tools/call` is decided by policy, not denied wholesale",
        ));
    }
    let header = raw
        .identity_header
        .unwrap_or(d.identity_header)
        .to_ascii_lowercase();
    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        return Err(invalid(
            "ext_authz.identity_header",
            format!("`{header}` is not a header name"),
        ));
    }
    let max_body_bytes = match raw.max_body_bytes {
        Some(0) => return Err(invalid("ext_authz.max_body_bytes", "must be positive")),
        Some(n) => n,
        None => d.max_body_bytes,
    };
    Ok(ExtAuthzConfig {
        denied_methods,
        identity_header: header,
        max_body_bytes,
    })
}

/// `[console]`: off unless enabled; the token header a header name.
pub(super) fn console_config(raw: RawConsole) -> Result<ConsoleConfig, ConfigError> {
    let d = ConsoleConfig::default();
    let token_header = raw
        .token_header
        .unwrap_or(d.token_header)
        .to_ascii_lowercase();
    if http::HeaderName::from_bytes(token_header.as_bytes()).is_err() {
        return Err(invalid(
            "console.token_header",
            format!("`{token_header}` is not a header name"),
        ));
    }
    Ok(ConsoleConfig {
        enabled: raw.enabled.unwrap_or(d.enabled),
        token_header,
    })
}
