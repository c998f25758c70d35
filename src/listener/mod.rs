//! The listener stack every door is served on: the sockets (TCP, or a
//! Unix socket created owner-only, `listen.rs`), TLS with client
//! certificates (`tls.rs`), the connection and call limits (`overload.rs`),
//! the one place caller grants are enforced (`admission.rs`), gRPC-Web
//! beside the plain HTTP doors (`web.rs`), CORS; and the graceful shutdown
//! (NOT_SERVING, drain, grace). The gRPC services come from
//! [`crate::grpc`], the HTTP doors from [`crate::authzen::http`] and
//! [`crate::console::http`]; this module only serves them.

mod admission;
mod listen;
mod overload;
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
use crate::authzen::http::AuthzenHttp;
use crate::console::http::ConsoleHttp;
use crate::grpc;
use crate::metrics::Metrics;

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

/// Every door the listener serves, as [`crate::server`] wired them.
#[derive(Debug, Clone)]
pub struct Doors {
    /// The gRPC services' desks.
    pub grpc: grpc::Handlers,
    /// The AuthZEN door, served over HTTP beside the gRPC services.
    pub authzen: Arc<AuthzenHttp>,
    /// The approval console, served over HTTP beside the gRPC services.
    pub console: Arc<ConsoleHttp>,
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

/// Serves every toolgate door on `listener` until `shutdown` resolves,
/// then shuts down gracefully ([`crate::server::serve`] calls it, with the
/// domain's jobs around it): the gRPC services (health and reflection
/// included, see [`grpc::wire`]), and beside them the AuthZEN door's and the
/// console's HTTP routes, all behind the same layers (admission included).
/// gRPC-Web (HTTP/1.1) is served on the same listener.
///
/// The moment `shutdown` resolves, health says NOT_SERVING, for good, and
/// open watches (approvals, the console's stream) end. Then, after `drain`,
/// no new connection or call is accepted; calls in flight finish, for at
/// most `grace`.
///
/// # Errors
/// [`ServeError`] when the transport fails.
pub async fn serve(
    listener: impl Into<Listener>,
    doors: Doors,
    options: ServeOptions,
    store_answers: tokio::sync::watch::Receiver<bool>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let Doors {
        grpc: handlers,
        authzen,
        console,
    } = doors;
    let metrics = Arc::clone(&handlers.metrics);
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let grpc::Wired { routes, mut health } = grpc::wire(
        handlers,
        options.limits.max_health_watches,
        store_answers,
        stopping.clone(),
    )
    .await?;
    let routes = Routes::from(
        routes
            .into_axum_router()
            .merge(crate::authzen::http::router(authzen))
            .merge(crate::console::http::router(console, stopping.clone())),
    );

    let drain = options.drain;
    let probe_stop = health.stopper();
    let signal = {
        let metrics = Arc::clone(&metrics);
        async move {
            shutdown.await;
            // Health first, at once: balancers stop sending new work.
            health.not_serving().await;
            let _ = stopping_tx.send(true);
            tracing::info!(
                drain_ms = drain.as_millis(),
                "shutting down: health is NOT_SERVING"
            );
            metrics.shutting_down();
            tokio::time::sleep(drain).await;
            health.end_watches();
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
        metrics: &metrics,
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
    // However the server stopped, the store is no longer followed.
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
