//! The gRPC surface: wire types ⇄ domain types, nothing more.
//!
//! This is the only module that sees tonic or prost. Handlers destructure
//! each request, call the domain, and translate the answer; executor
//! mistakes become `INVALID_ARGUMENT` with `google.rpc.BadRequest` details,
//! everything about the model's call is a normal response with an envelope.

mod admission;
mod approval;
mod authorization;
mod convert;
mod entity;
mod ext_authz;
mod health;
mod ledger;
mod listen;
mod overload;
mod policy;
mod tls;
mod web;

pub use listen::{ListenError, bind_unix};
pub use tls::TlsSetupError;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::{Connected, TcpIncoming};

use crate::access::AccessPolicy;
use crate::approvals::desk::ApprovalDesk;
use crate::authzen::desk::AuthzenDesk;
use crate::console::desk::ConsoleDesk;
use crate::decision::ToolCallAuthorizer;
use crate::entities::desk::EntityDesk;
use crate::ext_authz::desk::ExtAuthzDesk;
use crate::ledger::desk::LedgerDesk;
use crate::metrics::Metrics;
use crate::policy::PolicyReloader;

/// The generated wire types, private to the crate except through `pb`.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    missing_docs,
    unreachable_pub
)]
pub mod pb {
    tonic::include_proto!("toolgate.v1");

    /// The encoded descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/toolgate_descriptor.bin"));
}

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("invalid gRPC-Web origin `{0}`")]
    Origin(String),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] tls::TlsSetupError),
}

/// The desks the gRPC surface translates for, as [`crate::server`] wired them.
#[derive(Debug, Clone)]
pub struct Handlers {
    pub authorizer: Arc<ToolCallAuthorizer>,
    pub approvals: Arc<ApprovalDesk>,
    pub ledger: Arc<LedgerDesk>,
    /// The entity store, for `EntityService`.
    pub entities: Arc<EntityDesk>,
    /// The live policy set, for `PolicyService`.
    pub policies: Arc<PolicyReloader>,
    /// Where refused connections are counted.
    pub metrics: Arc<Metrics>,
    /// The AuthZEN door, served over HTTP beside the gRPC services.
    pub authzen: Arc<AuthzenDesk>,
    /// The Envoy ext_authz door (`envoy.service.auth.v3.Authorization`).
    pub ext_authz: Arc<ExtAuthzDesk>,
    /// The approval console, served over HTTP beside the gRPC services.
    pub console: Arc<ConsoleDesk>,
    /// The COAZ-MCP declared mapping `ListTools` publishes per tool.
    pub mcp_mapping: serde_json::Value,
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    /// A Unix domain socket; the file is removed when the server stops.
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Self::Tcp(l)
    }
}

/// PEM text of the server's TLS identity and, for client certificates, the
/// CA that issues them.
#[derive(Debug, Clone)]
pub struct TlsPem {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    /// When set, every client must present a certificate this CA issued.
    pub client_ca: Option<Vec<u8>>,
}

/// How the server runs, beyond what it serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Which caller may call which service.
    pub access: AccessPolicy,
    pub tls: Option<TlsPem>,
    /// Browser origins allowed to call over gRPC-Web (CORS).
    pub cors_origins: Vec<String>,
    /// After the shutdown signal, how long health says NOT_SERVING while
    /// calls are still accepted, so load balancers move away first.
    pub drain: Duration,
    /// Then, how long in-flight calls get to finish before the server stops
    /// regardless.
    pub grace: Duration,
    /// What the listener holds at once, and the longest a call may take.
    pub limits: crate::access::ListenerLimits,
}

/// Serves every toolgate service, health and reflection on `listener` until
/// `shutdown` resolves, then shuts down gracefully ([`crate::server::serve`]
/// calls it, with the domain's jobs around it).
///
/// Health reports NOT_SERVING until the services are wired to a loaded
/// policy set, SERVING after; then, for the whole server and each service
/// that needs the store, NOT_SERVING while `store_answers` says `false`; and
/// NOT_SERVING again, for good, the moment `shutdown` resolves. Then, after
/// `drain`, no new connection or call is accepted; calls in flight finish,
/// for at most `grace`. gRPC-Web (HTTP/1.1) is served on the same listener.
///
/// # Errors
/// [`ServeError`] when the transport fails.
pub async fn serve(
    listener: impl Into<Listener>,
    handlers: Handlers,
    options: ServeOptions,
    store_answers: tokio::sync::watch::Receiver<bool>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    use pb::approval_service_server::ApprovalServiceServer;
    use pb::authorization_service_server::AuthorizationServiceServer;
    use pb::entity_service_server::EntityServiceServer;
    use pb::ledger_service_server::LedgerServiceServer;
    use pb::policy_service_server::PolicyServiceServer;

    let reporter = tonic_health::server::HealthReporter::new();
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    // Health watches end once the drain is over (see `health.rs`).
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let health = tonic_health::pb::health_server::HealthServer::new(health::DrainingHealth::new(
        &reporter,
        closing,
        overload::WatchSlots::new(
            options.limits.max_health_watches,
            Arc::clone(&handlers.metrics),
        ),
    ));
    let reflection_builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(ext_authz::FILE_DESCRIPTOR_SET)
    };
    let reflection = reflection_builder().build_v1()?;
    // v1alpha too: the generic clients many deployments have (grpcurl
    // before 1.9, grpcio-reflection) speak only it.
    let reflection_v1alpha = reflection_builder().build_v1alpha()?;

    let Handlers {
        authorizer,
        approvals: desk,
        ledger,
        entities,
        policies,
        metrics,
        authzen,
        ext_authz: ext_authz_desk,
        console,
        mcp_mapping,
    } = handlers;
    let authorization = AuthorizationServiceServer::new(authorization::AuthorizationApi::new(
        authorizer,
        Arc::clone(&ledger),
        mcp_mapping,
    ));
    // Open watch streams would hold a graceful shutdown forever: they end
    // (with UNAVAILABLE, so clients watch again elsewhere) once it starts.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let approvals = ApprovalServiceServer::new(approval::ApprovalApi::new(desk, stopping.clone()));
    let ledger = LedgerServiceServer::new(ledger::LedgerApi::new(ledger));
    let policy = PolicyServiceServer::new(policy::PolicyApi::new(policies));
    let entities = EntityServiceServer::new(entity::EntityApi::new(entities));
    let ext_authz =
        ext_authz::AuthorizationServer::new(ext_authz::ExtAuthzApi::new(ext_authz_desk));

    // The policy set is loaded before the authorizer exists, so the
    // services are ready as soon as they are wired.
    reporter
        .set_serving::<AuthorizationServiceServer<authorization::AuthorizationApi>>()
        .await;
    reporter
        .set_serving::<ApprovalServiceServer<approval::ApprovalApi>>()
        .await;
    reporter
        .set_serving::<LedgerServiceServer<ledger::LedgerApi>>()
        .await;
    reporter
        .set_serving::<PolicyServiceServer<policy::PolicyApi>>()
        .await;
    reporter
        .set_serving::<EntityServiceServer<entity::EntityApi>>()
        .await;
    reporter
        .set_serving::<ext_authz::AuthorizationServer<ext_authz::ExtAuthzApi>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let probe = tokio::spawn(follow_store(store_answers, reporter.clone()));

    let grpc_routes = Routes::new(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(authorization)
        .add_service(approvals)
        .add_service(ledger)
        .add_service(policy)
        .add_service(entities)
        .add_service(ext_authz);
    // The AuthZEN door's and the console's HTTP routes beside the gRPC
    // services, behind the same layers (admission included).
    let routes = Routes::from(
        grpc_routes
            .into_axum_router()
            .merge(crate::authzen::desk::router(authzen))
            .merge(crate::console::desk::router(console, stopping.clone())),
    );

    let drain = options.drain;
    let probe_stop = probe.abort_handle();
    let metrics_layer = Arc::clone(&metrics);
    let signal = {
        let reporter = reporter.clone();
        let metrics = Arc::clone(&metrics);
        async move {
            shutdown.await;
            // Following the store stops first, so it cannot set SERVING
            // again after the NOT_SERVING below.
            probe.abort();
            let _ = probe.await;
            // Health first, at once: balancers stop sending new work.
            reporter
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            reporter
                .set_not_serving::<AuthorizationServiceServer<authorization::AuthorizationApi>>()
                .await;
            reporter
                .set_not_serving::<ApprovalServiceServer<approval::ApprovalApi>>()
                .await;
            reporter
                .set_not_serving::<LedgerServiceServer<ledger::LedgerApi>>()
                .await;
            reporter
                .set_not_serving::<PolicyServiceServer<policy::PolicyApi>>()
                .await;
            reporter
                .set_not_serving::<EntityServiceServer<entity::EntityApi>>()
                .await;
            reporter
                .set_not_serving::<ext_authz::AuthorizationServer<ext_authz::ExtAuthzApi>>()
                .await;
            let _ = stopping_tx.send(true);
            tracing::info!(
                drain_ms = drain.as_millis(),
                "shutting down: health is NOT_SERVING"
            );
            metrics.shutting_down();
            tokio::time::sleep(drain).await;
            let _ = closing_tx.send(true);
        }
    };
    // In-flight calls get `grace` once the drain is over; then the server
    // stops regardless (a stuck call must not hold a deploy forever).
    let grace = options.grace;
    let mut stopped = stopping;
    let deadline = async move {
        let _ = stopped.wait_for(|s| *s).await;
        tokio::time::sleep(drain + grace).await;
    };
    let (listener, socket_path, transport) = match listener.into() {
        // TCP_NODELAY: without it a response's last frame waits for the
        // client's delayed ACK, some 40 ms on every call.
        Listener::Tcp(l) => {
            // The bound address decides, not the configured text: a name
            // like `localhost` is loopback too. An address that cannot be
            // read counts as loopback, so the guard fails closed.
            let loopback = l.local_addr().map_or(true, |a| a.ip().is_loopback());
            (
                Incoming::Tcp(TcpIncoming::from(l).with_nodelay(Some(true))),
                None,
                crate::access::Transport::Tcp {
                    loopback,
                    tls: options.tls.is_some(),
                },
            )
        }
        Listener::Unix { listener, path } => (
            Incoming::Unix(UnixListenerStream::new(listener)),
            Some(path),
            crate::access::Transport::Unix,
        ),
    };
    let served = Served {
        routes,
        options: &options,
        transport,
        metrics: &metrics_layer,
    };
    let server = async {
        match listener {
            Incoming::Tcp(s) => run(s, served, signal).await,
            Incoming::Unix(s) => run(s, served, signal).await,
        }
    };
    let result = tokio::select! {
        r = server => r,
        () = deadline => {
            tracing::warn!(grace_ms = grace.as_millis(), "in-flight calls did not finish within the grace period; stopping");
            Ok(())
        }
    };
    probe_stop.abort();
    if let Some(path) = socket_path {
        let _ = std::fs::remove_file(path);
    }
    result
}

enum Incoming {
    Tcp(TcpIncoming),
    Unix(UnixListenerStream),
}

/// What one server serves, and how.
struct Served<'a> {
    routes: Routes,
    options: &'a ServeOptions,
    /// What the listener is, for the DNS-rebinding guard.
    transport: crate::access::Transport,
    metrics: &'a Arc<Metrics>,
}

/// The server on one incoming stream, over TLS when configured (see
/// `tls.rs`): CORS, then gRPC-Web (except for the AuthZEN door's plain
/// HTTP), then the access layer, in front of every route.
async fn run<I, IO>(
    incoming: I,
    served: Served<'_>,
    signal: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    I: tokio_stream::Stream<Item = std::io::Result<IO>> + Send + Unpin + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Connected + Unpin + Send + 'static,
{
    let incoming = overload::limit_connections(
        incoming,
        served.options.limits.max_connections,
        Arc::clone(served.metrics),
    );
    let Some(pem) = &served.options.tls else {
        return serve_on(incoming, served, signal).await;
    };
    let (secured, accepting) = tls::handshakes(incoming, tls::acceptor(pem)?);
    let result = serve_on(secured, served, signal).await;
    // The listener stops accepting with the server.
    accepting.abort();
    result
}

async fn serve_on<I, IO>(
    incoming: I,
    served: Served<'_>,
    signal: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    I: tokio_stream::Stream<Item = std::io::Result<IO>>,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Connected + Unpin + Send + 'static,
{
    let Served {
        routes,
        options,
        transport,
        metrics,
    } = served;
    Server::builder()
        .accept_http1(true)
        .max_concurrent_streams(options.limits.max_concurrent_streams)
        .layer(cors(&options.cors_origins)?)
        .layer(web::GrpcWebExceptDoorLayer)
        .layer(admission::AccessLayer::new(
            options.access.clone(),
            transport,
            &options.cors_origins,
            Arc::clone(metrics),
        ))
        .layer(overload::OverloadLayer::new(
            &options.limits,
            Arc::clone(metrics),
        ))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, signal)
        .await?;
    Ok(())
}

/// CORS for browser approval UIs calling over gRPC-Web: only the configured
/// origins, only POST, and the gRPC-Web headers.
fn cors(origins: &[String]) -> Result<tower_http::cors::CorsLayer, ServeError> {
    use http::header::{HeaderName, HeaderValue};
    let origins = origins
        .iter()
        .map(|o| HeaderValue::from_str(o).map_err(|_| ServeError::Origin(o.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let names = |list: &[&'static str]| {
        list.iter()
            .map(|h| HeaderName::from_static(h))
            .collect::<Vec<_>>()
    };
    Ok(tower_http::cors::CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([http::Method::POST])
        .allow_headers(names(&[
            "content-type",
            "x-grpc-web",
            "x-user-agent",
            "grpc-timeout",
        ]))
        .expose_headers(names(&[
            "grpc-status",
            "grpc-message",
            "grpc-status-details-bin",
        ]))
        .max_age(Duration::from_secs(600)))
}

/// Health follows the store: NOT_SERVING for the whole server and for each
/// service that needs the store while it does not answer, SERVING again once
/// it does; aborted when the server starts shutting down.
async fn follow_store(
    mut answering: tokio::sync::watch::Receiver<bool>,
    reporter: tonic_health::server::HealthReporter,
) {
    use pb::approval_service_server::ApprovalServiceServer;
    use pb::authorization_service_server::AuthorizationServiceServer;
    use pb::entity_service_server::EntityServiceServer;
    use pb::ledger_service_server::LedgerServiceServer;
    use tonic::server::NamedService;
    use tonic_health::ServingStatus;

    let names = [
        "",
        <AuthorizationServiceServer<authorization::AuthorizationApi> as NamedService>::NAME,
        <ApprovalServiceServer<approval::ApprovalApi> as NamedService>::NAME,
        <LedgerServiceServer<ledger::LedgerApi> as NamedService>::NAME,
        <EntityServiceServer<entity::EntityApi> as NamedService>::NAME,
    ];
    // SERVING was set when the services were wired.
    let mut serving = true;
    loop {
        let now = *answering.borrow_and_update();
        if now != serving {
            serving = now;
            let status = if now {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for name in names {
                reporter.set_service_status(name, status).await;
            }
        }
        if answering.changed().await.is_err() {
            return;
        }
    }
}
