//! Configuration: `toolgate.toml`, overridden by `TOOLGATE_*` environment
//! variables and command-line flags (in that order of precedence, flags last).
//!
//! The file is parsed into a raw struct that refuses unknown keys, then
//! validated into a typed [`Config`].
//!
//! Every key has an environment variable: `TOOLGATE_` + the key in capitals,
//! with `__` between nesting levels (`TOOLGATE_AUDIT__SINK`,
//! `TOOLGATE_RATE_LIMITS__TENANT__PER_SECOND`). A value is read as a TOML
//! value when it parses as one (`true`, `5`, `["a"]`, `[{caller="any"}]`),
//! else as a string; quote a string that looks like a number
//! (`TOOLGATE_AUDIENCE='"123"'`). The environment goes through the same
//! raw struct as the file, so an unknown `TOOLGATE_*` variable is an error
//! exactly like an unknown key — a typo never silently leaves a default in
//! place. [`CLIENT_VARIABLES`] are the only exceptions: they configure
//! toolgate's clients and test harness, not the server.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::access::{AccessPolicy, CallerPattern, Grant, ServiceName};
use crate::audit::{AuditConfig, AuditSink, WhenFull};
use crate::decision::AuthorizerConfig;
use crate::decode::Limits;
use crate::identity::{ClaimNames, VerifierConfig};
use crate::ledger::LedgerConfig;
use crate::policy::ReloadTriggers;
use crate::store::StoreSettings;

/// How long changes to the policy folder must be quiet before a reload.
pub const DEFAULT_RELOAD_DEBOUNCE: Duration = Duration::from_millis(250);
/// The longest debounce accepted: decisions should follow an edit within seconds.
pub const MAX_RELOAD_DEBOUNCE_MS: u64 = 10_000;
use crate::ratelimit::{Limit, RateLimitConfig};

/// `TOOLGATE_*` variables read by toolgate's clients, examples and test
/// harness; the server ignores them. Any other `TOOLGATE_*` variable must
/// name a config key.
pub const CLIENT_VARIABLES: [&str; 10] = [
    "TOOLGATE_CONFIG",
    "TOOLGATE_ADDR",
    "TOOLGATE_IDENTITY_TOKEN",
    "TOOLGATE_PYTHON",
    "TOOLGATE_NODE",
    "TOOLGATE_CONFORMANCE_DIR",
    "TOOLGATE_PROTO_DIR",
    // The PostgreSQL server of the test suite (scripts/test.sh exports it,
    // so every sidecar a test starts inherits it).
    "TOOLGATE_TEST_POSTGRES",
    // Whether a test may skip when a prerequisite is missing, and where it
    // records the skip (scripts/test.sh --allow-skips sets both).
    "TOOLGATE_ALLOW_SKIPS",
    "TOOLGATE_SKIP_LOG",
];

/// The largest clock-skew leeway accepted for identity tokens. A leeway is
/// for clocks that drift by seconds; minutes would quietly extend every
/// token's life.
pub const MAX_LEEWAY_SECONDS: u64 = 300;

/// How often due approvals are marked expired.
pub const DEFAULT_APPROVAL_EXPIRY_INTERVAL: Duration = Duration::from_secs(1);

/// The default listen address: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// The default store: an embedded SQLite file under `./toolgate-data/`.
pub const DEFAULT_STORE: &str = "sqlite://toolgate-data/toolgate.db";

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ConfigError {
    #[error("cannot read config file `{path}`: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file `{path}`: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
    #[error("invalid TOOLGATE_* environment: {source}")]
    Environment {
        #[source]
        source: toml::de::Error,
    },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    policies: Option<PathBuf>,
    listen: Option<String>,
    #[serde(default)]
    store: RawStore,
    jwks_file: Option<PathBuf>,
    issuer: Option<String>,
    audience: Option<String>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    decisions: RawDecisions,
    #[serde(default)]
    identity: RawIdentity,
    #[serde(default)]
    ledger: RawLedger,
    #[serde(default)]
    reload: RawReload,
    metrics_listen: Option<String>,
    require_identity_token: Option<bool>,
    unix_socket_mode: Option<String>,
    tls: Option<RawTls>,
    #[serde(default)]
    access: Vec<RawGrant>,
    #[serde(default)]
    audit: RawAudit,
    #[serde(default)]
    rate_limits: RawRateLimits,
    #[serde(default)]
    shutdown: RawShutdown,
    #[serde(default)]
    grpc_web: RawGrpcWeb,
}

/// `[ledger]`: the execution ledger's budget, leases and retention.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLedger {
    default_max_attempts: Option<u32>,
    lease_margin_ms: Option<u64>,
    max_lease_ms: Option<u64>,
    retention_seconds: Option<u64>,
    collect_interval_seconds: Option<u64>,
    collect_batch: Option<usize>,
}

/// `store = "URL"`, or a `[store]` table with the URL and the settings of a
/// shared database.
#[derive(Debug, Default)]
struct RawStore {
    url: Option<String>,
    settings: RawStoreSettings,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStoreSettings {
    url: Option<String>,
    pool_size: Option<usize>,
    connect_timeout_ms: Option<u64>,
    statement_timeout_ms: Option<u64>,
    health_interval_ms: Option<u64>,
}

impl<'de> Deserialize<'de> for RawStore {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = RawStore;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a store URL or a [store] table")
            }
            fn visit_str<E: serde::de::Error>(self, url: &str) -> Result<RawStore, E> {
                Ok(RawStore {
                    url: Some(url.to_owned()),
                    settings: RawStoreSettings::default(),
                })
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, map: M) -> Result<RawStore, M::Error> {
                // Through the table's own derive: its unknown keys are named.
                let mut settings = RawStoreSettings::deserialize(
                    serde::de::value::MapAccessDeserializer::new(map),
                )?;
                Ok(RawStore {
                    url: settings.url.take(),
                    settings,
                })
            }
        }
        d.deserialize_any(Either)
    }
}

/// `[reload]`: how the policy folder is reloaded while serving.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReload {
    watch: Option<bool>,
    debounce_ms: Option<u64>,
    sighup: Option<bool>,
}

/// `[tls]`: the server's certificate and key; with `client_ca`, clients
/// must present a certificate that CA issued (mutual TLS).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

/// `[[access]]`: one caller and the services it may call.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    caller: String,
    services: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAudit {
    /// `stdout`, `none`, or `file:/path`.
    sink: Option<String>,
    queue: Option<usize>,
    /// `fail_closed` or `drop`.
    when_full: Option<String>,
    full_wait_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimits {
    tenant: Option<RawLimit>,
    #[serde(default)]
    tools: std::collections::BTreeMap<String, RawLimit>,
}

/// A bucket: exactly one of the rates, and the burst (default: the rate).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    per_second: Option<u32>,
    per_minute: Option<u32>,
    per_hour: Option<u32>,
    burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShutdown {
    drain_ms: Option<u64>,
    grace_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrpcWeb {
    #[serde(default)]
    allowed_origins: Vec<String>,
}

/// `[identity]`: how approver tokens are read.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdentity {
    leeway_seconds: Option<u64>,
    #[serde(default)]
    claims: RawClaims,
}

/// `[identity.claims]`: the claim names, when the identity provider uses
/// others than `sub`, `tenant`, `roles` and `scope`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClaims {
    subject: Option<String>,
    tenant: Option<String>,
    roles: Option<String>,
    scope: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_argument_bytes: Option<usize>,
    max_depth: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDecisions {
    deadline_margin_ms: Option<u64>,
    pending_approval_ttl_seconds: Option<u64>,
    max_violations: Option<usize>,
}

/// Values given on the command line or in the environment (already merged
/// by the argument parser); each overrides the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub policies: Option<PathBuf>,
    pub listen: Option<String>,
    pub store: Option<String>,
    pub jwks_file: Option<PathBuf>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub metrics_listen: Option<String>,
}

/// Where the sidecar listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(String),
    Unix(PathBuf),
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub policies: PathBuf,
    pub listen: ListenAddr,
    pub store: String,
    /// Pool size, timeouts and the health probe of a shared database.
    pub store_settings: StoreSettings,
    pub jwks_file: Option<PathBuf>,
    /// Issuer, audience, leeway and claim names for identity tokens.
    pub verifier: VerifierConfig,
    pub authorizer: AuthorizerConfig,
    pub ledger: LedgerConfig,
    /// What reloads the policy folder while serving (default: a watch with
    /// a 250 ms debounce, and SIGHUP).
    pub reload: ReloadTriggers,
    /// Where Prometheus metrics are served (`host:port`), if anywhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Executors must send an identity token; the principal comes from it.
    pub require_identity_token: bool,
    /// Permission bits of a Unix socket listener (default 0600).
    pub unix_socket_mode: u32,
    pub tls: Option<TlsFiles>,
    pub access: AccessPolicy,
    pub audit: AuditConfig,
    pub rate_limits: RateLimitConfig,
    /// NOT_SERVING before calls stop being accepted.
    pub drain: Duration,
    /// How long in-flight calls get to finish.
    pub grace: Duration,
    /// Origins allowed to call over gRPC-Web (CORS).
    pub cors_origins: Vec<String>,
    /// How often due approvals are marked expired and announced (1 s; not
    /// a file key: tests on an injected clock shorten it).
    pub approval_expiry_interval: Duration,
}

/// `[tls]` files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl Config {
    /// Loads `path` (or `./toolgate.toml` if it exists and no path is
    /// given), then applies the overrides.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable file, an unknown key, or an invalid value.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Self, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with("TOOLGATE_"))
            .collect();
        Self::load_with_env(path, &env, overrides)
    }

    /// Every default, then the overrides: no file and no environment is
    /// read (`toolgate authorize`, `toolgate test`, tests and benches).
    ///
    /// # Errors
    /// [`ConfigError`] for an invalid override.
    pub fn with_defaults(overrides: Overrides) -> Result<Self, ConfigError> {
        Self::from_raw(RawConfig::default(), overrides)
    }

    /// [`Config::load`] with the environment given, not read.
    ///
    /// # Errors
    /// [`ConfigError`] as for [`Config::load`], and for a `TOOLGATE_*`
    /// variable that names no key or holds an invalid value.
    pub fn load_with_env(
        path: Option<&Path>,
        env: &[(String, String)],
        overrides: Overrides,
    ) -> Result<Self, ConfigError> {
        let mut table = match path {
            Some(p) => read(p)?,
            None if Path::new("toolgate.toml").is_file() => read(Path::new("toolgate.toml"))?,
            None => toml::Table::new(),
        };
        let env = env_table(env);
        // The environment alone first, so its errors name it.
        toml::Value::Table(env.clone())
            .try_into::<RawConfig>()
            .map_err(|source| ConfigError::Environment { source })?;
        merge(&mut table, env);
        let raw: RawConfig =
            toml::Value::Table(table)
                .try_into()
                .map_err(|source| ConfigError::Parse {
                    path: path.map_or_else(|| PathBuf::from("toolgate.toml"), Path::to_path_buf),
                    source,
                })?;
        Self::from_raw(raw, overrides)
    }

    fn from_raw(raw: RawConfig, o: Overrides) -> Result<Self, ConfigError> {
        let listen = o
            .listen
            .or(raw.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = match listen.strip_prefix("unix:") {
            Some(p) if !p.is_empty() => ListenAddr::Unix(PathBuf::from(p)),
            Some(_) => {
                return Err(ConfigError::Invalid {
                    key: "listen",
                    reason: "`unix:` needs a path".into(),
                });
            }
            None => {
                if listen.parse::<std::net::SocketAddr>().is_err() {
                    return Err(ConfigError::Invalid {
                        key: "listen",
                        reason: format!("`{listen}` is not host:port or unix:/path"),
                    });
                }
                ListenAddr::Tcp(listen)
            }
        };
        let mut authorizer = AuthorizerConfig::default();
        let defaults = Limits::default();
        authorizer.limits = Limits {
            max_bytes: raw.limits.max_argument_bytes.unwrap_or(defaults.max_bytes),
            max_depth: raw.limits.max_depth.unwrap_or(defaults.max_depth),
        };
        if authorizer.limits.max_bytes == 0 || authorizer.limits.max_depth == 0 {
            return Err(ConfigError::Invalid {
                key: "limits",
                reason: "limits must be positive".into(),
            });
        }
        if let Some(ms) = raw.decisions.deadline_margin_ms {
            authorizer.deadline_margin = Duration::from_millis(ms);
        }
        if let Some(s) = raw.decisions.pending_approval_ttl_seconds {
            if s == 0 {
                return Err(ConfigError::Invalid {
                    key: "decisions.pending_approval_ttl_seconds",
                    reason: "must be positive".into(),
                });
            }
            authorizer.pending_approval_ttl = Duration::from_secs(s);
        }
        if let Some(n) = raw.decisions.max_violations {
            authorizer.violation_cap = n.max(1);
        }
        let metrics_listen = o
            .metrics_listen
            .or(raw.metrics_listen)
            .map(|m| {
                m.parse::<std::net::SocketAddr>()
                    .map_err(|_| invalid("metrics_listen", format!("`{m}` is not host:port")))
            })
            .transpose()?;
        let tls = raw.tls.map(|t| TlsFiles {
            cert: t.cert,
            key: t.key,
            client_ca: t.client_ca,
        });
        let access = access_policy(raw.access, &listen, tls.as_ref())?;
        let jwks_file = o.jwks_file.or(raw.jwks_file);
        let require_identity_token = raw.require_identity_token.unwrap_or(false);
        if require_identity_token && jwks_file.is_none() {
            return Err(invalid(
                "require_identity_token",
                "needs `jwks_file`: tokens are verified against it",
            ));
        }
        let unix_socket_mode = match raw.unix_socket_mode {
            None => 0o600,
            Some(text) => {
                let mode = u32::from_str_radix(&text, 8)
                    .map_err(|_| invalid("unix_socket_mode", format!("`{text}` is not octal")))?;
                if mode & !0o770 != 0 || mode & 0o600 != 0o600 {
                    return Err(invalid(
                        "unix_socket_mode",
                        "must give the owner read and write and never anything to others (e.g. 0600, 0660)",
                    ));
                }
                mode
            }
        };
        for origin in &raw.grpc_web.allowed_origins {
            let ok = (origin.starts_with("https://") || origin.starts_with("http://"))
                && !origin.contains('*')
                && !origin.ends_with('/');
            if !ok {
                return Err(invalid(
                    "grpc_web.allowed_origins",
                    format!("`{origin}` is not an exact origin like https://approvals.example.com"),
                ));
            }
        }
        let defaults = AuditConfig::default();
        let shutdown_default = Duration::from_secs(10);
        Ok(Self {
            metrics_listen,
            require_identity_token,
            unix_socket_mode,
            tls,
            access,
            audit: audit_config(raw.audit, defaults)?,
            rate_limits: rate_limits(raw.rate_limits)?,
            drain: Duration::from_millis(raw.shutdown.drain_ms.unwrap_or(0)),
            grace: raw
                .shutdown
                .grace_ms
                .map_or(shutdown_default, Duration::from_millis),
            cors_origins: raw.grpc_web.allowed_origins,
            approval_expiry_interval: DEFAULT_APPROVAL_EXPIRY_INTERVAL,
            policies: o
                .policies
                .or(raw.policies)
                .unwrap_or_else(|| PathBuf::from("policies")),
            listen,
            store: o
                .store
                .or(raw.store.url)
                .unwrap_or_else(|| DEFAULT_STORE.to_owned()),
            store_settings: store_settings(&raw.store.settings)?,
            jwks_file,
            verifier: verifier_config(
                o.issuer.or(raw.issuer),
                o.audience.or(raw.audience),
                raw.identity,
            )?,
            authorizer,
            ledger: ledger_config(&raw.ledger)?,
            reload: reload_triggers(&raw.reload)?,
        })
    }
}

fn ledger_config(raw: &RawLedger) -> Result<LedgerConfig, ConfigError> {
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
    };
    // A record is collected only once its lease is over anyway; a lease
    // outliving retention would make a held operation look abandoned.
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

fn store_settings(raw: &RawStoreSettings) -> Result<StoreSettings, ConfigError> {
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

fn reload_triggers(raw: &RawReload) -> Result<ReloadTriggers, ConfigError> {
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

fn verifier_config(
    issuer: Option<String>,
    audience: Option<String>,
    raw: RawIdentity,
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
        subject: pick("identity.claims.subject", raw.claims.subject, names.subject)?,
        tenant: pick("identity.claims.tenant", raw.claims.tenant, names.tenant)?,
        roles: pick("identity.claims.roles", raw.claims.roles, names.roles)?,
        scope: pick("identity.claims.scope", raw.claims.scope, names.scope)?,
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

/// The grants, checked against the listener: who can be told apart there.
fn access_policy(
    raw: Vec<RawGrant>,
    listen: &ListenAddr,
    tls: Option<&TlsFiles>,
) -> Result<AccessPolicy, ConfigError> {
    if raw.is_empty() {
        let loopback = matches!(listen, ListenAddr::Tcp(a)
            if a.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_loopback()));
        if loopback && tls.is_none() {
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
        grants.push(Grant { caller, services });
    }
    Ok(AccessPolicy::Grants(grants))
}

fn audit_config(raw: RawAudit, defaults: AuditConfig) -> Result<AuditConfig, ConfigError> {
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

fn rate_limits(raw: RawRateLimits) -> Result<RateLimitConfig, ConfigError> {
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

/// The environment as a TOML table: `TOOLGATE_A__B=v` is `a.b = v`.
fn env_table(env: &[(String, String)]) -> toml::Table {
    let mut table = toml::Table::new();
    for (name, value) in env {
        if CLIENT_VARIABLES.contains(&name.as_str()) {
            continue;
        }
        let Some(key) = name.strip_prefix("TOOLGATE_") else {
            continue;
        };
        let path: Vec<String> = key.split("__").map(str::to_ascii_lowercase).collect();
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.clone()));
        insert(&mut table, &path, value);
    }
    table
}

fn insert(table: &mut toml::Table, path: &[String], value: toml::Value) {
    match path {
        [] => {}
        [last] => {
            table.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = table
                .entry(first.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(t) = entry {
                insert(t, rest, value);
            }
        }
    }
}

/// Overlays `over` on `base`, table by table.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn read(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    // Refused here too, so the error names the file.
    toml::Value::Table(table.clone())
        .try_into::<RawConfig>()
        .map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_loopback_and_embedded_sqlite() {
        let c = Config::from_raw(RawConfig::default(), Overrides::default()).unwrap();
        assert_eq!(c.listen, ListenAddr::Tcp("127.0.0.1:50051".into()));
        assert_eq!(c.store, "sqlite://toolgate-data/toolgate.db");
        assert_eq!(c.policies, PathBuf::from("policies"));
        assert_eq!(
            c.reload,
            ReloadTriggers {
                watch: Some(Duration::from_millis(250)),
                sighup: true
            }
        );
    }

    #[test]
    fn the_store_is_a_url_or_a_table_with_its_settings() {
        let raw: RawConfig = toml::from_str("store = \"postgres://db/toolgate\"\n").unwrap();
        let c = Config::from_raw(raw, Overrides::default()).unwrap();
        assert_eq!(c.store, "postgres://db/toolgate");
        assert_eq!(c.store_settings, StoreSettings::default());
        let raw: RawConfig = toml::from_str(
            "[store]\nurl = \"postgres://db/toolgate\"\npool_size = 4\nconnect_timeout_ms = 500\n\
             statement_timeout_ms = 1500\nhealth_interval_ms = 250\n",
        )
        .unwrap();
        let c = Config::from_raw(
            raw,
            Overrides {
                store: Some("postgres://other/toolgate".into()),
                ..Overrides::default()
            },
        )
        .unwrap();
        assert_eq!(c.store, "postgres://other/toolgate");
        assert_eq!(
            c.store_settings,
            StoreSettings {
                pool_size: 4,
                connect_timeout: Duration::from_millis(500),
                statement_timeout: Duration::from_millis(1500),
                health_interval: Duration::from_millis(250),
            }
        );
        assert_eq!(c.store_settings.call_bound(), Duration::from_millis(2000));
        let c = Config::from_raw(
            toml::from_str("[store]\npool_size = 2\n").unwrap(),
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            (c.store.as_str(), c.store_settings.pool_size),
            (DEFAULT_STORE, 2)
        );
        for (text, key) in [
            ("pool_size = 0", "store.pool_size"),
            ("connect_timeout_ms = 0", "store.connect_timeout_ms"),
            ("statement_timeout_ms = 0", "store.statement_timeout_ms"),
            ("health_interval_ms = 0", "store.health_interval_ms"),
        ] {
            let raw: RawConfig = toml::from_str(&format!("[store]\n{text}\n")).unwrap();
            match Config::from_raw(raw, Overrides::default()) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let unknown = toml::from_str::<RawConfig>("[store]\npool = 1\n").unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `pool`"),
            "{unknown}"
        );
        let wrong = toml::from_str::<RawConfig>("store = 3\n").unwrap_err();
        assert!(
            wrong.to_string().contains("a store URL or a [store] table"),
            "{wrong}"
        );
    }

    #[test]
    fn reload_triggers_are_configurable_and_bounded() {
        let raw: RawConfig = toml::from_str(
            "[reload]
watch = false
",
        )
        .unwrap();
        let c = Config::from_raw(raw, Overrides::default()).unwrap();
        assert_eq!(
            c.reload,
            ReloadTriggers {
                watch: None,
                sighup: true
            }
        );
        let raw: RawConfig = toml::from_str(
            "[reload]
debounce_ms = 50
sighup = false
",
        )
        .unwrap();
        let c = Config::from_raw(raw, Overrides::default()).unwrap();
        assert_eq!(
            c.reload,
            ReloadTriggers {
                watch: Some(Duration::from_millis(50)),
                sighup: false
            }
        );
        for bad in ["0", "10001"] {
            let raw: RawConfig = toml::from_str(&format!(
                "[reload]
debounce_ms = {bad}
"
            ))
            .unwrap();
            assert!(matches!(
                Config::from_raw(raw, Overrides::default()),
                Err(ConfigError::Invalid {
                    key: "reload.debounce_ms",
                    ..
                })
            ));
        }
    }

    #[test]
    fn unknown_keys_are_errors_and_flags_win() {
        let err =
            toml::from_str::<RawConfig>("listen = \"127.0.0.1:1\"\nlisten_port = 3\n").unwrap_err();
        assert!(
            err.to_string().contains("unknown field `listen_port`"),
            "{err}"
        );
        let raw: RawConfig = toml::from_str(
            "listen = \"127.0.0.1:1\"\n[limits]\nmax_depth = 8\n[[access]]\ncaller = \"any\"\nservices = [\"authorization\"]\n",
        )
        .unwrap();
        let c = Config::from_raw(
            raw,
            Overrides {
                listen: Some("unix:/tmp/tg.sock".into()),
                ..Overrides::default()
            },
        )
        .unwrap();
        assert_eq!(c.listen, ListenAddr::Unix("/tmp/tg.sock".into()));
        assert_eq!(c.authorizer.limits.max_depth, 8);
        let bad = Config::from_raw(
            RawConfig::default(),
            Overrides {
                listen: Some("nowhere".into()),
                ..Overrides::default()
            },
        );
        assert!(matches!(
            bad,
            Err(ConfigError::Invalid { key: "listen", .. })
        ));
    }

    #[test]
    fn the_ledger_section_sets_budget_leases_and_retention() {
        let c = Config::from_raw(RawConfig::default(), Overrides::default()).unwrap();
        assert_eq!(c.ledger, LedgerConfig::default());
        assert_eq!(c.ledger.retention, Duration::from_secs(86_400));
        let raw: RawConfig = toml::from_str(
            "[ledger]\ndefault_max_attempts = 5\nlease_margin_ms = 100\nmax_lease_ms = 60000\n\
             retention_seconds = 3600\ncollect_interval_seconds = 10\ncollect_batch = 50\n",
        )
        .unwrap();
        let c = Config::from_raw(raw, Overrides::default()).unwrap();
        assert_eq!(
            c.ledger,
            LedgerConfig {
                default_max_attempts: 5,
                lease_margin: Duration::from_millis(100),
                max_lease: Duration::from_secs(60),
                retention: Duration::from_secs(3600),
                collect_interval: Duration::from_secs(10),
                collect_batch: 50,
            }
        );
        for (text, key) in [
            ("default_max_attempts = 0", "ledger.default_max_attempts"),
            ("max_lease_ms = 0", "ledger.max_lease_ms"),
            ("retention_seconds = 0", "ledger.retention_seconds"),
            ("collect_batch = 0", "ledger.collect_batch"),
            ("retention_seconds = 60", "ledger.retention_seconds"),
        ] {
            let raw: RawConfig = toml::from_str(&format!("[ledger]\n{text}\n")).unwrap();
            match Config::from_raw(raw, Overrides::default()) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let unknown = toml::from_str::<RawConfig>("[ledger]\nlease_ms = 1\n").unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `lease_ms`"),
            "{unknown}"
        );
    }

    #[test]
    fn identity_leeway_and_claim_names_are_configurable_and_bounded() {
        let raw: RawConfig = toml::from_str(
            "issuer = \"https://idp\"\n[identity]\nleeway_seconds = 10\n[identity.claims]\ntenant = \"org\"\nroles = \"groups\"\n",
        )
        .unwrap();
        let c = Config::from_raw(
            raw,
            Overrides {
                audience: Some("toolgate".into()),
                ..Overrides::default()
            },
        )
        .unwrap();
        assert_eq!(c.verifier.issuer.as_deref(), Some("https://idp"));
        assert_eq!(c.verifier.audience.as_deref(), Some("toolgate"));
        assert_eq!(c.verifier.leeway_seconds, 10);
        assert_eq!(c.verifier.claims.subject, "sub");
        assert_eq!(c.verifier.claims.tenant, "org");
        assert_eq!(c.verifier.claims.roles, "groups");
        assert_eq!(c.verifier.claims.scope, "scope");

        let too_lax: RawConfig = toml::from_str("[identity]\nleeway_seconds = 301\n").unwrap();
        assert!(matches!(
            Config::from_raw(too_lax, Overrides::default()),
            Err(ConfigError::Invalid {
                key: "identity.leeway_seconds",
                ..
            })
        ));
        let empty: RawConfig = toml::from_str("[identity.claims]\nsubject = \" \"\n").unwrap();
        assert!(matches!(
            Config::from_raw(empty, Overrides::default()),
            Err(ConfigError::Invalid {
                key: "identity.claims.subject",
                ..
            })
        ));
        let unknown =
            toml::from_str::<RawConfig>("[identity.claims]\nemail = \"e\"\n").unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `email`"),
            "{unknown}"
        );
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn load(toml_text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolgate.toml");
        std::fs::write(&path, toml_text).unwrap();
        Config::load_with_env(Some(&path), &env(vars), Overrides::default())
    }

    /// The environment is validated like the file: a typo is an error.
    #[test]
    fn environment_variables_set_keys_and_unknown_ones_are_refused() {
        let c = load(
            "listen = \"127.0.0.1:7\"\n[audit]\nqueue = 5\n",
            &[
                ("TOOLGATE_LISTEN", "127.0.0.1:9"),
                ("TOOLGATE_AUDIT__SINK", "none"),
                ("TOOLGATE_RATE_LIMITS__TENANT__PER_SECOND", "5"),
                ("TOOLGATE_PYTHON", "/usr/bin/python3"),
            ],
        )
        .unwrap();
        assert_eq!(c.listen, ListenAddr::Tcp("127.0.0.1:9".into()));
        assert_eq!(c.audit.sink, AuditSink::Discard);
        assert_eq!(c.audit.queue, 5, "the file's other keys stay");
        let tenant = c.rate_limits.tenant.unwrap();
        assert_eq!((tenant.calls.get(), tenant.burst.get()), (5, 5));

        let typo = load("", &[("TOOLGATE_LISTN", "127.0.0.1:9")]).unwrap_err();
        assert!(
            matches!(&typo, ConfigError::Environment { source } if source.to_string().contains("unknown field `listn`")),
            "{typo}"
        );
        let nested = load("", &[("TOOLGATE_AUDIT__SINKK", "stdout")]).unwrap_err();
        assert!(
            nested.to_string().contains("unknown field `sinkk`"),
            "{nested}"
        );
        let bad_value = load("", &[("TOOLGATE_AUDIT__SINK", "syslog")]).unwrap_err();
        assert!(
            matches!(
                bad_value,
                ConfigError::Invalid {
                    key: "audit.sink",
                    ..
                }
            ),
            "{bad_value}"
        );
        let bad_type = load("", &[("TOOLGATE_REQUIRE_IDENTITY_TOKEN", "yes")]).unwrap_err();
        assert!(
            matches!(bad_type, ConfigError::Environment { .. }),
            "{bad_type}"
        );
    }

    #[test]
    fn grants_must_fit_the_listener() {
        let uds_open = load("listen = \"unix:/tmp/tg.sock\"\n", &[]).unwrap_err();
        assert!(
            matches!(uds_open, ConfigError::Invalid { key: "access", .. }),
            "{uds_open}"
        );
        let public_open = load("listen = \"0.0.0.0:50051\"\n", &[]).unwrap_err();
        assert!(matches!(
            public_open,
            ConfigError::Invalid { key: "access", .. }
        ));
        let cn_without_mtls = load(
            "[[access]]\ncaller = \"cn:approval-ui\"\nservices = [\"approvals\"]\n",
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(
                cn_without_mtls,
                ConfigError::Invalid {
                    key: "access.caller",
                    ..
                }
            ),
            "{cn_without_mtls}"
        );
        let uid_on_tcp = load(
            "[[access]]\ncaller = \"uid:0\"\nservices = [\"approvals\"]\n",
            &[],
        )
        .unwrap_err();
        assert!(matches!(
            uid_on_tcp,
            ConfigError::Invalid {
                key: "access.caller",
                ..
            }
        ));
        let unknown_service = load(
            "listen = \"unix:/tmp/tg.sock\"\n[[access]]\ncaller = \"uid:0\"\nservices = [\"admin\"]\n",
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(
                unknown_service,
                ConfigError::Invalid {
                    key: "access.services",
                    ..
                }
            ),
            "{unknown_service}"
        );
        let ok = load(
            "listen = \"unix:/tmp/tg.sock\"\nunix_socket_mode = \"0660\"\n[[access]]\ncaller = \"uid:1000\"\nservices = [\"authorization\", \"ledger\"]\n",
            &[],
        )
        .unwrap();
        assert_eq!(ok.unix_socket_mode, 0o660);
        assert!(matches!(ok.access, AccessPolicy::Grants(ref g) if g.len() == 1));
        let world = load("listen = \"unix:/tmp/tg.sock\"\nunix_socket_mode = \"0666\"\n[[access]]\ncaller = \"any\"\nservices = [\"authorization\"]\n", &[]).unwrap_err();
        assert!(matches!(
            world,
            ConfigError::Invalid {
                key: "unix_socket_mode",
                ..
            }
        ));
    }

    #[test]
    fn rate_limits_audit_and_identity_are_validated() {
        let two_rates = load(
            "[rate_limits.tenant]\nper_second = 1\nper_minute = 1\n",
            &[],
        )
        .unwrap_err();
        assert!(matches!(
            two_rates,
            ConfigError::Invalid {
                key: "rate_limits.tenant",
                ..
            }
        ));
        let zero = load("[rate_limits.tools.refund_order]\nper_minute = 0\n", &[]).unwrap_err();
        assert!(matches!(
            zero,
            ConfigError::Invalid {
                key: "rate_limits.tools",
                ..
            }
        ));
        let c = load("[rate_limits.tools.refund_order]\nper_minute = 10\nburst = 2\n[audit]\nsink = \"file:/var/log/tg.jsonl\"\nwhen_full = \"drop\"\n", &[]).unwrap();
        let refund = c.rate_limits.tools["refund_order"];
        assert_eq!(
            (refund.calls.get(), refund.period, refund.burst.get()),
            (10, Duration::from_secs(60), 2)
        );
        assert_eq!(c.audit.sink, AuditSink::File("/var/log/tg.jsonl".into()));
        assert_eq!(c.audit.when_full, WhenFull::Drop);
        let no_keys = load("require_identity_token = true\n", &[]).unwrap_err();
        assert!(matches!(
            no_keys,
            ConfigError::Invalid {
                key: "require_identity_token",
                ..
            }
        ));
        let star = load("[grpc_web]\nallowed_origins = [\"*\"]\n", &[]).unwrap_err();
        assert!(matches!(
            star,
            ConfigError::Invalid {
                key: "grpc_web.allowed_origins",
                ..
            }
        ));
    }

    /// The shipped, documented example loads as it is.
    #[test]
    fn the_example_configuration_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("toolgate.example.toml");
        let c = Config::load_with_env(Some(&path), &[], Overrides::default()).unwrap();
        let AccessPolicy::Grants(grants) = &c.access else {
            panic!("the example has grants");
        };
        let services = |caller: &str| {
            grants
                .iter()
                .find(|g| g.caller == CallerPattern::parse(caller).unwrap())
                .map(|g| g.services.iter().map(|s| s.as_str()).collect::<Vec<_>>())
        };
        assert_eq!(
            services("san:spiffe://acme.example/ns/agents/sa/executor"),
            Some(vec!["authorization", "ledger"])
        );
        assert_eq!(services("cn:approval-ui"), Some(vec!["approvals"]));
        assert!(c.tls.as_ref().is_some_and(|t| t.client_ca.is_some()));
        assert!(c.require_identity_token);
        assert!(c.metrics_listen.is_some());
    }
}
