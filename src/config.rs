//! Configuration: `toolgate.toml`, overridden by `TOOLGATE_*` environment
//! variables and command-line flags (in that order of precedence, flags last).
//!
//! The file is parsed into a raw struct that refuses unknown keys, then
//! validated into a typed [`Config`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::authorizer::AuthorizerConfig;
use crate::decode::Limits;
use crate::identity::{ClaimNames, VerifierConfig};
use crate::ledger::LedgerConfig;
use crate::policy::ReloadTriggers;
use crate::store::StoreSettings;

/// How long changes to the policy folder must be quiet before a reload.
pub const DEFAULT_RELOAD_DEBOUNCE: Duration = Duration::from_millis(250);
/// The longest debounce accepted: decisions should follow an edit within seconds.
pub const MAX_RELOAD_DEBOUNCE_MS: u64 = 10_000;

/// The largest clock-skew leeway accepted for identity tokens. A leeway is
/// for clocks that drift by seconds; minutes would quietly extend every
/// token's life.
pub const MAX_LEEWAY_SECONDS: u64 = 300;

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
}

impl Config {
    /// Loads `path` (or `./toolgate.toml` if it exists and no path is
    /// given), then applies the overrides.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable file, an unknown key, or an invalid value.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Self, ConfigError> {
        let raw = match path {
            Some(p) => read(p)?,
            None if Path::new("toolgate.toml").is_file() => read(Path::new("toolgate.toml"))?,
            None => RawConfig::default(),
        };
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
        Ok(Self {
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
            jwks_file: o.jwks_file.or(raw.jwks_file),
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

fn read(path: &Path) -> Result<RawConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    })
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
        let raw: RawConfig =
            toml::from_str("listen = \"127.0.0.1:1\"\n[limits]\nmax_depth = 8\n").unwrap();
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
}
