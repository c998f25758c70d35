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

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::access::{AccessPolicy, ListenerLimits};
use crate::audit::AuditConfig;
use crate::decision::AuthorizerConfig;
use crate::identity::{RemoteJwksConfig, VerifierConfig};
use crate::ledger::LedgerConfig;
use crate::policy::ReloadTriggers;
use crate::store::StoreSettings;

/// How long changes to the policy folder must be quiet before a reload.
pub const DEFAULT_RELOAD_DEBOUNCE: Duration = Duration::from_millis(250);
/// The longest debounce accepted: decisions should follow an edit within seconds.
pub const MAX_RELOAD_DEBOUNCE_MS: u64 = 10_000;
use crate::ratelimit::RateLimitConfig;

/// `TOOLGATE_*` variables read by toolgate's clients, examples and test
/// harness; the server ignores them. Any other `TOOLGATE_*` variable must
/// name a config key.
pub const CLIENT_VARIABLES: [&str; 13] = [
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
    // The console's browser tests: the Chromium they drive, and whether
    // they write their screenshots into docs/console/.
    "TOOLGATE_CHROMIUM",
    "TOOLGATE_UPDATE_SCREENSHOTS",
    // The wheels the Python SDK's packaging test installs offline
    // (scripts/test.sh downloads them and exports the folder).
    "TOOLGATE_WHEELHOUSE",
];

/// The largest clock-skew leeway accepted for identity tokens. A leeway is
/// for clocks that drift by seconds; minutes would quietly extend every
/// token's life.
pub const MAX_LEEWAY_SECONDS: u64 = 300;

/// Open `WatchApprovals` streams per verified subject and tenant, by default.
pub const DEFAULT_MAX_WATCHES_PER_CALLER: usize = 16;

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

mod raw;
mod sections;
mod serving;
mod sources;
#[cfg(test)]
mod tests;

use raw::RawConfig;
use sections::{
    access_policy, audit_config, authzen_config, console_config, ext_authz_config, key_source,
    ledger_config, listener_limits, rate_limits, reload_triggers, store_settings, verifier_config,
};
use serving::{authorizer_config, check_origins, listen_addr, unix_socket_mode};
use sources::{env_table, merge, read};

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

impl ListenAddr {
    /// Whether this is a TCP address on the loopback interface (`listen`
    /// takes IP addresses only, so the address is the one bound).
    #[must_use]
    pub fn is_loopback_tcp(&self) -> bool {
        matches!(self, Self::Tcp(text)
            if text.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_loopback()))
    }
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
    /// `[identity] jwks_url` or `discovery`: the key set fetched from the
    /// identity provider, refreshed as it rotates (instead of `jwks_file`).
    pub jwks_remote: Option<RemoteJwksConfig>,
    /// Issuer, audience, leeway and claim names for identity tokens.
    pub verifier: VerifierConfig,
    /// `[identity] approver_audience`: when set, ApprovalService accepts only
    /// tokens with this audience (and the executors' `audience` alone is
    /// not enough there).
    pub approver_audience: Option<String>,
    /// `[limits] max_watches_per_caller`: open `WatchApprovals` streams per
    /// verified subject and tenant (default 16).
    pub max_watches_per_caller: usize,
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
    /// `[authzen]`: the AuthZEN door's mapping and answers.
    pub authzen: crate::authzen::AuthzenConfig,
    /// `[limits]`: what one listener holds at once, the request timeout.
    pub listener_limits: ListenerLimits,
    /// `[ext_authz]`: the Envoy ext_authz door's refusals and identity header.
    pub ext_authz: crate::ext_authz::ExtAuthzConfig,
    /// `[console]`: the approval console (off by default).
    pub console: crate::console::ConsoleConfig,
}

/// `[tls]` files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl Config {
    /// Whether the DNS-rebinding guard holds on the configured listener
    /// ([`AccessPolicy::rebinding_guard`]), as `check-config` reports it.
    /// Decided on [`ListenAddr::is_loopback_tcp`], as the server decides
    /// on the address it bound.
    #[must_use]
    pub fn rebinding_guard(&self) -> bool {
        let transport = match &self.listen {
            ListenAddr::Unix(_) => crate::access::Transport::Unix,
            ListenAddr::Tcp(_) => crate::access::Transport::Tcp {
                loopback: self.listen.is_loopback_tcp(),
                tls: self.tls.is_some(),
            },
        };
        self.access.rebinding_guard(transport)
    }

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
        let listen = listen_addr(o.listen.or(raw.listen))?;
        let authorizer = authorizer_config(&raw.limits, &raw.decisions, &raw.sessions)?;
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
        let verifier = verifier_config(
            o.issuer.or(raw.issuer),
            o.audience.or(raw.audience),
            &raw.identity,
        )?;
        let (jwks_remote, approver_audience) =
            key_source(&raw.identity, jwks_file.as_deref(), &verifier)?;
        let require_identity_token = raw.require_identity_token.unwrap_or(false);
        if require_identity_token && jwks_file.is_none() && jwks_remote.is_none() {
            return Err(invalid(
                "require_identity_token",
                "needs `jwks_file` or `[identity] jwks_url`: tokens are verified against it",
            ));
        }
        let max_watches_per_caller = match raw.limits.max_watches_per_caller {
            None => DEFAULT_MAX_WATCHES_PER_CALLER,
            Some(0) => return Err(invalid("limits.max_watches_per_caller", "must be positive")),
            Some(n) => n,
        };
        let unix_socket_mode = unix_socket_mode(raw.unix_socket_mode)?;
        check_origins(&raw.grpc_web.allowed_origins)?;
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
            authzen: authzen_config(raw.authzen)?,
            listener_limits: listener_limits(&raw.limits)?,
            ext_authz: ext_authz_config(raw.ext_authz)?,
            console: console_config(raw.console)?,
            approval_expiry_interval: DEFAULT_APPROVAL_EXPIRY_INTERVAL,
            policies: o
                .policies
                .or(raw.policies)
                .unwrap_or_else(|| PathBuf::from("policies")),
            listen,
            store: with_ca_file(
                o.store
                    .or(raw.store.url)
                    .unwrap_or_else(|| DEFAULT_STORE.to_owned()),
                raw.store.settings.ca_file.as_deref(),
            )?,
            store_settings: store_settings(&raw.store.settings)?,
            jwks_file,
            jwks_remote,
            verifier,
            approver_audience,
            max_watches_per_caller,
            authorizer,
            ledger: ledger_config(&raw.ledger)?,
            reload: reload_triggers(&raw.reload)?,
        })
    }
}

/// `[store] ca_file` as the PostgreSQL URL's `sslrootcert` (unless the URL
/// names one: the URL wins), so the store reads its TLS settings from the
/// URL alone.
fn with_ca_file(url: String, ca_file: Option<&Path>) -> Result<String, ConfigError> {
    let Some(ca_file) = ca_file else {
        return Ok(url);
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(invalid(
            "store.ca_file",
            "is for a postgres:// store (TLS to PostgreSQL)",
        ));
    }
    let query = url.split_once('?').map_or("", |(_, q)| q);
    if query.split('&').any(|p| p.starts_with("sslrootcert=")) {
        return Ok(url);
    }
    let path = ca_file
        .to_str()
        .ok_or_else(|| invalid("store.ca_file", "must be a UTF-8 path"))?;
    let encoded: String = path
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let joiner = if url.contains('?') { '&' } else { '?' };
    Ok(format!("{url}{joiner}sslrootcert={encoded}"))
}
