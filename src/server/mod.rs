//! The one wiring: a validated [`Config`] becomes the running sidecar.
//!
//! [`build`] assembles the object graph — the live policy set, the store,
//! metrics, the audit log, the approvals hub, the principal rule, and the
//! four desks (decisions, approvals, ledger, entities) with the doors onto
//! them (AuthZEN, the approval console) — and [`serve`] runs it: the
//! background jobs of the domain (approval expiry, ledger retention, policy
//! reloads, other replicas' approval events, the store probe) for as long
//! as the gRPC server and the metrics endpoint answer, then the audit log's
//! flush. `main` (`toolgate serve`, `toolgate authorize`), `toolgate test`,
//! the integration tests and the benches all go through here, so a test
//! exercises the graph that ships: a wiring that lost its audit log or its
//! metrics would fail them.
//!
//! This module wires and schedules; it holds no rule of its own, and it
//! leaves the wire to [`crate::grpc`].

mod jobs;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::access::AccessPolicy;
use crate::approvals::ApprovalEvents;
use crate::approvals::desk::{ApprovalDesk, ApprovalDeskParts};
use crate::audit::{Audit, AuditError};
use crate::authzen::http::{AuthzenHttp, AuthzenParts};
use crate::clock::Clock;
use crate::config::{Config, ListenAddr};
use crate::console::http::ConsoleHttp;
use crate::decision::{AuthorizerParts, ToolCallAuthorizer};
use crate::entities::desk::{EntityDesk, EntityDeskParts};
use crate::ext_authz::desk::{ExtAuthzDesk, ExtAuthzParts};
use crate::grpc;
use crate::identity::{
    IdentityVerifier, KeySource, Principals, RemoteKeySet, RemoteKeysError, TokenError,
    TokenVerifier, VerifierConfig,
};
use crate::ledger::desk::{LedgerDesk, LedgerParts};
use crate::listener::{self, Listener, ServeError, TlsPem};
use crate::metrics::Metrics;
use crate::policy::{LoadErrors, PolicyReloader};
use crate::ratelimit::RateLimits;
use crate::store::{Store, StoreError};

/// How long a stopping sidecar waits for the audit log to be written out.
const AUDIT_FLUSH: Duration = Duration::from_secs(10);

/// Why the sidecar could not be built or stopped with an error.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ServerError {
    /// The policy folder does not load; each diagnostic has its file:line.
    #[error("the policy set in `{}` is invalid", .dir.display())]
    Policies { dir: PathBuf, errors: LoadErrors },
    #[error("the store: {0}")]
    Store(#[from] StoreError),
    #[error("starting the audit log: {0}")]
    Audit(#[from] AuditError),
    #[error("loading the key set `{}`: {source}", .path.display())]
    KeySet {
        path: PathBuf,
        #[source]
        source: TokenError,
    },
    #[error("loading the identity provider's key set: {0}")]
    RemoteKeys(#[from] RemoteKeysError),
    #[error("reading `{}`: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("binding {what} `{addr}`: {source}")]
    Bind {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Listen(#[from] listener::ListenError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// The running parts of one sidecar, as [`build`] wired them.
#[derive(Debug, Clone)]
pub struct Services {
    /// The live policy set every desk decides on, and its reloads.
    pub policies: Arc<PolicyReloader>,
    /// The store the desks share.
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub audit: Arc<Audit>,
    /// The approvals hub: this replica's changes, and others' relayed.
    pub events: Arc<ApprovalEvents>,
    pub authorizer: Arc<ToolCallAuthorizer>,
    pub approvals: Arc<ApprovalDesk>,
    pub ledger: Arc<LedgerDesk>,
    /// The entity store's desk (DESIGN §11.6).
    pub entities: Arc<EntityDesk>,
    /// The AuthZEN door (DESIGN §11.1), on the same pipeline.
    pub authzen: Arc<AuthzenHttp>,
    /// The Envoy ext_authz door (DESIGN §11.2), on the same pipeline.
    pub ext_authz: Arc<ExtAuthzDesk>,
    /// The approval console (DESIGN §12), a door onto the approval desk.
    pub console: Arc<ConsoleHttp>,
    jobs: jobs::Schedule,
}

/// Loads the policy folder of `config` and wires the whole sidecar on it.
///
/// # Errors
/// [`ServerError`] when the policies do not load, the store does not open,
/// the audit sink or the key set cannot be read.
pub async fn build(config: &Config, clock: Arc<dyn Clock>) -> Result<Services, ServerError> {
    let policies =
        PolicyReloader::load(&config.policies, Arc::clone(&clock)).map_err(|errors| {
            ServerError::Policies {
                dir: config.policies.clone(),
                errors,
            }
        })?;
    assemble(config, clock, Arc::new(policies)).await
}

/// Wires the sidecar of `config` on an already loaded policy set (so that
/// `toolgate test` loads its folder once and still gets a fresh store per
/// case). [`build`] is this after loading.
///
/// # Errors
/// As [`build`], but for the policies.
pub async fn assemble(
    config: &Config,
    clock: Arc<dyn Clock>,
    policies: Arc<PolicyReloader>,
) -> Result<Services, ServerError> {
    let store = crate::store::open(&config.store, config.store_settings).await?;
    assemble_on(config, clock, policies, store).await
}

/// [`assemble`] on a store already open (`config.store` is not read): for
/// a caller that keeps its own handle on the same store.
///
/// # Errors
/// As [`assemble`].
pub async fn assemble_on(
    config: &Config,
    clock: Arc<dyn Clock>,
    policies: Arc<PolicyReloader>,
    store: Arc<dyn Store>,
) -> Result<Services, ServerError> {
    let metrics = Arc::new(Metrics::default());
    // Before anything is served: a scrape never misses the policy series.
    metrics.watch_policies(Arc::clone(&policies) as Arc<dyn crate::metrics::PolicyGauges>);
    let audit = Arc::new(Audit::start(&config.audit, Arc::clone(&metrics))?);
    let (verifier, approver_verifier) = verifiers(config).await?;
    let events = Arc::new(ApprovalEvents::default().with_metrics(Arc::clone(&metrics)));
    // Decisions and the ledger establish principals alike.
    let principals = Principals::new(verifier.clone(), config.require_identity_token);
    let engine = policies.live();
    let authorizer = Arc::new(ToolCallAuthorizer::new(AuthorizerParts {
        engine: Arc::clone(&engine),
        store: Arc::clone(&store),
        clock: Arc::clone(&clock),
        config: config.authorizer.clone(),
        events: Arc::clone(&events),
        audit: Arc::clone(&audit),
        metrics: Arc::clone(&metrics),
        limits: Arc::new(RateLimits::new(&config.rate_limits)),
        principals: principals.clone(),
    }));
    let ledger = Arc::new(LedgerDesk::new(LedgerParts {
        engine: Arc::clone(&engine),
        store: Arc::clone(&store),
        clock: Arc::clone(&clock),
        config: config.ledger.clone(),
        limits: config.authorizer.limits,
        violation_cap: config.authorizer.violation_cap,
        principals,
        audit: Arc::clone(&audit),
        metrics: Arc::clone(&metrics),
    }));
    // The execution tickets' key: made on the database's first start,
    // shared by every replica of it; a store that cannot give it fails the
    // start rather than the first Authorize.
    ledger.ticket_keys().await?;
    let entities = Arc::new(EntityDesk::new(EntityDeskParts {
        engine: Arc::clone(&engine),
        store: Arc::clone(&store),
        clock: Arc::clone(&clock),
        audit: Arc::clone(&audit),
        metrics: Arc::clone(&metrics),
        limits: config.authorizer.entity_store,
        decoding: config.authorizer.entity_limits,
    }));
    let ext_authz = Arc::new(ExtAuthzDesk::new(ExtAuthzParts {
        authorizer: Arc::clone(&authorizer),
        audit: Arc::clone(&audit),
        verifier: verifier.clone(),
        clock: Arc::clone(&clock),
        config: config.ext_authz.clone(),
        argument_limits: config.authorizer.limits,
    }));
    let approvals = Arc::new(ApprovalDesk::new(ApprovalDeskParts {
        engine,
        store: Arc::clone(&store),
        clock,
        verifier: approver_verifier,
        events: Arc::clone(&events),
        audit: Arc::clone(&audit),
        metrics: Arc::clone(&metrics),
        max_watches_per_caller: config.max_watches_per_caller,
    }));
    let authzen = Arc::new(AuthzenHttp::new(AuthzenParts {
        authorizer: Arc::clone(&authorizer),
        audit: Arc::clone(&audit),
        config: config.authzen.clone(),
        argument_limits: config.authorizer.limits,
        require_identity_token: config.require_identity_token,
        tls: config.tls.is_some(),
    }));
    let console = Arc::new(ConsoleHttp::new(
        Arc::clone(&approvals),
        config.console.clone(),
    ));
    Ok(Services {
        policies,
        store,
        metrics,
        audit,
        events,
        authorizer,
        approvals,
        ledger,
        entities,
        authzen,
        ext_authz,
        console,
        jobs: jobs::Schedule {
            approval_expiry: config.approval_expiry_interval,
            reload: config.reload,
            store_probe: config.store_settings.health_interval,
        },
    })
}

/// The executors' and the approvers' verifiers, when a key set is configured.
type Verifiers = (
    Option<Arc<dyn IdentityVerifier>>,
    Option<Arc<dyn IdentityVerifier>>,
);

/// The identity-token verifiers of `config`, if it names a key set (a file,
/// or the identity provider's URL): the executors' (Authorize, the ledger)
/// and the approvers' (ApprovalService). They share the keys, so a rotation
/// reaches both; with `[identity] approver_audience` the approvers' accepts
/// only tokens of that audience, so a token an executor forwards cannot
/// decide or read approvals.
async fn verifiers(config: &Config) -> Result<Verifiers, ServerError> {
    let keys: Arc<dyn KeySource> = match (&config.jwks_file, &config.jwks_remote) {
        (Some(path), _) => {
            let verifier = TokenVerifier::from_jwks_file(path, VerifierConfig::default()).map_err(
                |source| ServerError::KeySet {
                    path: path.clone(),
                    source,
                },
            )?;
            return Ok(pair(&verifier, config));
        }
        (None, Some(remote)) => {
            let set = RemoteKeySet::start(remote).await?;
            tracing::info!(jwks_url = %set.url(), "identity key set fetched");
            set
        }
        (None, None) => {
            tracing::warn!(
                "no jwks_file: every ApprovalService call will be refused as unauthorized"
            );
            return Ok((None, None));
        }
    };
    Ok(pair(
        &TokenVerifier::with_keys(keys, VerifierConfig::default()),
        config,
    ))
}

/// The executors' and the approvers' verifiers over the keys of `keys`.
fn pair(keys: &TokenVerifier, config: &Config) -> Verifiers {
    let executors = keys.sharing_keys(config.verifier.clone());
    let approvers = keys.sharing_keys(VerifierConfig {
        audience: config
            .approver_audience
            .clone()
            .or_else(|| config.verifier.audience.clone()),
        ..config.verifier.clone()
    });
    (Some(Arc::new(executors)), Some(Arc::new(approvers)))
}

/// The sockets a sidecar serves on, bound before it is built so that a
/// port already taken fails fast, and so that `127.0.0.1:0` tells its port.
#[derive(Debug)]
pub struct Listeners {
    api: Listener,
    api_addr: Option<SocketAddr>,
    metrics: Option<tokio::net::TcpListener>,
    metrics_addr: Option<SocketAddr>,
}

impl Listeners {
    /// Binds `config.listen` and, when set, `config.metrics_listen`.
    ///
    /// # Errors
    /// [`ServerError::Bind`] or [`ServerError::Listen`] when an address
    /// cannot be bound.
    pub async fn bind(config: &Config) -> Result<Self, ServerError> {
        let bind_error =
            |what, addr: String| move |source| ServerError::Bind { what, addr, source };
        let (api, api_addr) = match &config.listen {
            ListenAddr::Tcp(addr) => {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(bind_error("the listener", addr.clone()))?;
                let bound = l.local_addr().ok();
                (Listener::Tcp(l), bound)
            }
            ListenAddr::Unix(path) => (
                Listener::Unix {
                    listener: listener::bind_unix(path, config.unix_socket_mode)?,
                    path: path.clone(),
                },
                None,
            ),
        };
        let (metrics, metrics_addr) = match config.metrics_listen {
            Some(addr) => {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(bind_error("the metrics listener", addr.to_string()))?;
                let bound = l.local_addr().ok();
                (Some(l), bound)
            }
            None => (None, None),
        };
        Ok(Self {
            api,
            api_addr,
            metrics,
            metrics_addr,
        })
    }

    /// The bound TCP address of the API listener (`None` on a Unix socket).
    #[must_use]
    pub const fn api_addr(&self) -> Option<SocketAddr> {
        self.api_addr
    }

    /// The bound address of the metrics endpoint, when one is configured.
    #[must_use]
    pub const fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }
}

/// Serves `services` on `listeners` until `shutdown` resolves, then shuts
/// down as [`listener::serve`] says (NOT_SERVING, drain, grace), keeps the
/// metrics endpoint up until the gRPC server has drained (so the shutdown
/// can be watched), stops the background jobs and writes out the audit log.
///
/// # Errors
/// [`ServerError`] when the TLS files cannot be read or the transport fails.
pub async fn serve(
    services: Services,
    listeners: Listeners,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let options = listener::ServeOptions {
        access: config.access.clone(),
        tls: tls(config)?,
        cors_origins: config.cors_origins.clone(),
        drain: config.drain,
        grace: config.grace,
        limits: config.listener_limits,
    };
    if options.access == AccessPolicy::Open {
        tracing::warn!(
            "no [[access]] grants: every caller on this loopback listener may call every service, \
             including DecideApproval; configure grants before production"
        );
    }
    // Before anything is served, so no watcher subscribes before it listens.
    let relay = services
        .store
        .relay_approval_events(Arc::clone(&services.events))
        .await?;
    let running = jobs::start(&services);
    let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics_server = listeners.metrics.map(|l| {
        if let Some(addr) = listeners.metrics_addr {
            tracing::info!(metrics_listen = %addr, "metrics serving");
        }
        tokio::spawn(crate::metrics::serve(
            l,
            Arc::clone(&services.metrics),
            async {
                let _ = metrics_stopped.await;
            },
        ))
    });
    {
        let engine = services.authorizer.engine();
        tracing::info!(
            listen = %listeners.api_addr.map_or_else(|| format!("{:?}", config.listen), |a| a.to_string()),
            tls = config.tls.is_some(),
            policies = %config.policies.display(),
            policy_version = engine.version(),
            tools = engine.tools().len(),
            "toolgate serving"
        );
    }
    let doors = listener::Doors {
        grpc: grpc::Handlers {
            authorizer: Arc::clone(&services.authorizer),
            ext_authz: Arc::clone(&services.ext_authz),
            mcp_mapping: crate::authzen::declared_mapping(&config.authzen, &config.verifier.claims),
            approvals: Arc::clone(&services.approvals),
            ledger: Arc::clone(&services.ledger),
            entities: Arc::clone(&services.entities),
            policies: Arc::clone(&services.policies),
            metrics: Arc::clone(&services.metrics),
        },
        authzen: Arc::clone(&services.authzen),
        console: Arc::clone(&services.console),
    };
    let result = listener::serve(
        listeners.api,
        doors,
        options,
        running.store_health(),
        shutdown,
    )
    .await;
    running.stop();
    if let Some(relay) = relay {
        relay.abort();
    }
    // Every decision answered was queued for the audit log: write it out.
    if !services.audit.flush(AUDIT_FLUSH).await {
        tracing::error!("the audit log could not be flushed within 10 s");
    }
    let _ = metrics_stop.send(());
    if let Some(m) = metrics_server {
        let _ = m.await;
    }
    result.map_err(ServerError::from)
}

/// The TLS identity and client CA of `config`, read from their files.
fn tls(config: &Config) -> Result<Option<TlsPem>, ServerError> {
    let Some(files) = &config.tls else {
        return Ok(None);
    };
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| ServerError::Read {
            path: p.to_path_buf(),
            source,
        })
    };
    Ok(Some(TlsPem {
        cert: read(&files.cert)?,
        key: read(&files.key)?,
        client_ca: files.client_ca.as_deref().map(read).transpose()?,
    }))
}
