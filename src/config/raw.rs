//! The raw shape of `toolgate.toml` and of the `TOOLGATE_*` environment:
//! what serde reads, unknown keys refused, nothing validated yet.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) policies: Option<PathBuf>,
    pub(super) listen: Option<String>,
    #[serde(default)]
    pub(super) store: RawStore,
    pub(super) jwks_file: Option<PathBuf>,
    pub(super) issuer: Option<String>,
    pub(super) audience: Option<String>,
    #[serde(default)]
    pub(super) limits: RawLimits,
    #[serde(default)]
    pub(super) decisions: RawDecisions,
    #[serde(default)]
    pub(super) identity: RawIdentity,
    #[serde(default)]
    pub(super) ledger: RawLedger,
    #[serde(default)]
    pub(super) reload: RawReload,
    pub(super) metrics_listen: Option<String>,
    pub(super) require_identity_token: Option<bool>,
    pub(super) unix_socket_mode: Option<String>,
    pub(super) tls: Option<RawTls>,
    #[serde(default)]
    pub(super) access: Vec<RawGrant>,
    #[serde(default)]
    pub(super) audit: RawAudit,
    #[serde(default)]
    pub(super) rate_limits: RawRateLimits,
    #[serde(default)]
    pub(super) shutdown: RawShutdown,
    #[serde(default)]
    pub(super) grpc_web: RawGrpcWeb,
    #[serde(default)]
    pub(super) authzen: RawAuthzen,
    #[serde(default)]
    pub(super) ext_authz: RawExtAuthz,
    #[serde(default)]
    pub(super) console: RawConsole,
    #[serde(default)]
    pub(super) sessions: RawSessions,
}

/// `[sessions]`: how long an idle session's labels are kept (DESIGN §13.2).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSessions {
    pub(super) idle_seconds: Option<u64>,
}

/// `[console]`: the approval console.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsole {
    pub(super) enabled: Option<bool>,
    pub(super) token_header: Option<String>,
}

/// `[authzen]`: the AuthZEN door's mapping pointers and answers.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuthzen {
    pub(super) default_tenant: Option<String>,
    pub(super) tool_types: Option<Vec<String>>,
    pub(super) arguments: Option<Vec<String>>,
    pub(super) subject: Option<String>,
    pub(super) tenant: Option<String>,
    pub(super) roles: Option<String>,
    pub(super) scopes: Option<String>,
    pub(super) agent: Option<String>,
    pub(super) session: Option<String>,
    pub(super) request_id: Option<Vec<String>>,
    pub(super) approval_id: Option<String>,
    pub(super) identity_token_header: Option<String>,
    pub(super) policy_decision_point: Option<String>,
    pub(super) access_request_endpoint: Option<String>,
    pub(super) max_body_bytes: Option<usize>,
    pub(super) max_evaluations: Option<usize>,
}

/// `[ext_authz]`: the Envoy ext_authz door's refusals and identity header.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExtAuthz {
    pub(super) denied_methods: Option<Vec<String>>,
    pub(super) identity_header: Option<String>,
    pub(super) max_body_bytes: Option<usize>,
}

/// `[ledger]`: the execution ledger's budget, leases and retention.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLedger {
    pub(super) default_max_attempts: Option<u32>,
    pub(super) lease_margin_ms: Option<u64>,
    pub(super) max_lease_ms: Option<u64>,
    pub(super) retention_seconds: Option<u64>,
    pub(super) collect_interval_seconds: Option<u64>,
    pub(super) collect_batch: Option<usize>,
    pub(super) ticket_ttl_seconds: Option<u64>,
}

/// `store = "URL"`, or a `[store]` table with the URL and the settings of a
/// shared database.
#[derive(Debug, Default)]
pub(super) struct RawStore {
    pub(super) url: Option<String>,
    pub(super) settings: RawStoreSettings,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStoreSettings {
    pub(super) url: Option<String>,
    pub(super) pool_size: Option<usize>,
    pub(super) connect_timeout_ms: Option<u64>,
    pub(super) statement_timeout_ms: Option<u64>,
    pub(super) health_interval_ms: Option<u64>,
    /// The CA file a PostgreSQL server's certificate is verified against
    /// (`sslmode=verify-full`/`verify-ca`; the URL's `sslrootcert` wins).
    pub(super) ca_file: Option<PathBuf>,
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
pub(super) struct RawReload {
    pub(super) watch: Option<bool>,
    pub(super) debounce_ms: Option<u64>,
    pub(super) sighup: Option<bool>,
}

/// `[tls]`: the server's certificate and key; with `client_ca`, clients
/// must present a certificate that CA issued (mutual TLS).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    pub(super) client_ca: Option<PathBuf>,
}

/// `[[access]]`: one caller, the services it may call and the tenants it
/// may act for there.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrant {
    pub(super) caller: String,
    pub(super) services: Vec<String>,
    /// Tenant ids, or `["*"]`; required with `authorization` or `ledger`.
    pub(super) tenants: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAudit {
    /// `stdout`, `none`, or `file:/path`.
    pub(super) sink: Option<String>,
    pub(super) queue: Option<usize>,
    /// `fail_closed` or `drop`.
    pub(super) when_full: Option<String>,
    pub(super) full_wait_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRateLimits {
    pub(super) tenant: Option<RawLimit>,
    #[serde(default)]
    pub(super) tools: std::collections::BTreeMap<String, RawLimit>,
}

/// A bucket: exactly one of the rates, and the burst (default: the rate).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub(super) per_second: Option<u32>,
    pub(super) per_minute: Option<u32>,
    pub(super) per_hour: Option<u32>,
    pub(super) burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShutdown {
    pub(super) drain_ms: Option<u64>,
    pub(super) grace_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrpcWeb {
    #[serde(default)]
    pub(super) allowed_origins: Vec<String>,
}

/// `[identity]`: how approver tokens are read.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    pub(super) leeway_seconds: Option<u64>,
    /// The audience approver tokens must carry (ApprovalService only).
    pub(super) approver_audience: Option<String>,
    /// The identity provider's key set URL (instead of `jwks_file`).
    pub(super) jwks_url: Option<String>,
    /// Find the key set URL by OIDC discovery from `issuer`.
    pub(super) discovery: Option<bool>,
    pub(super) jwks_refresh_min_seconds: Option<u64>,
    pub(super) jwks_refresh_max_seconds: Option<u64>,
    #[serde(default)]
    pub(super) claims: RawClaims,
}

/// `[identity.claims]`: the claim names, when the identity provider uses
/// others than `sub`, `tenant`, `roles` and `scope`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClaims {
    pub(super) subject: Option<String>,
    pub(super) tenant: Option<String>,
    pub(super) roles: Option<String>,
    pub(super) scope: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) max_argument_bytes: Option<usize>,
    pub(super) max_entities_bytes: Option<usize>,
    pub(super) max_depth: Option<usize>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_concurrent_streams: Option<u32>,
    pub(super) max_calls_in_flight: Option<usize>,
    pub(super) request_timeout_ms: Option<u64>,
    pub(super) max_health_watches: Option<usize>,
    /// Open `WatchApprovals` streams per verified subject and tenant.
    pub(super) max_watches_per_caller: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDecisions {
    pub(super) deadline_margin_ms: Option<u64>,
    pub(super) pending_approval_ttl_seconds: Option<u64>,
    pub(super) max_pending_approvals_per_subject: Option<u32>,
    pub(super) max_pending_approvals_per_tenant: Option<u32>,
    pub(super) max_violations: Option<usize>,
}
