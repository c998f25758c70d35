//! The one place caller grants are enforced: a tower layer in front of every
//! service. It reads the transport identity off the connection (client
//! certificate, Unix peer credentials), maps the request path to a service,
//! and answers `PERMISSION_DENIED` (with `ErrorInfo` reason
//! `caller_not_granted`) to a caller outside its grant. An admitted request
//! carries the [`PeerIdentity`] in its extensions for the audit log, and
//! the [`TenantScope`](crate::access::TenantScope) its grants of the
//! service give (every tenant under open access), which the desks check
//! against the request's principal (`grpc/admitted.rs` reads them).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::access::{
    AccessPolicy, PeerIdentity, ReconcileScope, ServiceName, Target, target_of_path,
};
use crate::metrics::Metrics;

/// The [`PeerIdentity`] of a connection, from what tonic recorded of it.
fn peer_of(ext: &http::Extensions) -> PeerIdentity {
    let cert = ext
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs)
        .or_else(|| {
            ext.get::<TlsConnectInfo<UdsConnectInfo>>()
                .and_then(TlsConnectInfo::peer_certs)
        });
    if let Some(certs) = cert {
        // The first certificate is the client's own (the rest is its chain).
        return certs
            .first()
            .map(|c| PeerIdentity::from_certificate_der(c))
            .unwrap_or_default();
    }
    if let Some(uds) = ext.get::<UdsConnectInfo>() {
        return PeerIdentity::unix(uds.peer_cred.map(|c| c.uid()));
    }
    PeerIdentity::default()
}

/// A plain HTTP door's request refused here: the door's own `403` (an
/// HTTP client reads no gRPC status), its `X-Request-ID` echoed.
fn http_refusal(
    req: &http::Request<Body>,
    service: ServiceName,
    message: &str,
) -> http::Response<Body> {
    let refusal = if service == ServiceName::Console {
        crate::console::http::forbidden(message)
    } else {
        crate::authzen::http::forbidden(message)
    };
    let mut response = refusal.map(Body::new);
    let mut ids = req.headers().get_all("x-request-id").iter();
    if let (Some(id), None) = (ids.next(), ids.next()) {
        response.headers_mut().insert("x-request-id", id.clone());
    }
    response
}

/// The service a path names, as the metrics and messages label it.
const fn service_label(target: Target) -> &'static str {
    match target {
        Target::Service(s) => s.as_str(),
        Target::Health => "health",
        Target::Unknown => "unknown",
    }
}

/// The layer: wraps the routes of every service.
#[derive(Debug, Clone)]
pub struct AccessLayer {
    policy: Arc<AccessPolicy>,
    /// Whether the DNS-rebinding guard holds on this listener
    /// ([`AccessPolicy::rebinding_guard`]).
    guarded: bool,
    /// The configured gRPC-Web origins, which the DNS-rebinding guard also
    /// admits.
    origins: Arc<[String]>,
    metrics: Arc<Metrics>,
}

impl AccessLayer {
    /// The layer of a listener of `transport` under `policy`.
    pub fn new(
        policy: AccessPolicy,
        transport: crate::access::Transport,
        origins: &[String],
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            guarded: policy.rebinding_guard(transport),
            policy: Arc::new(policy),
            origins: origins.into(),
            metrics,
        }
    }
}

/// The one header value of `name`: `None` when absent, sent twice or not
/// text (a request that says two things is not taken at either).
fn single_header(headers: &http::HeaderMap, name: http::header::HeaderName) -> Option<&str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => v.to_str().ok(),
        _ => None,
    }
}

/// The DNS-rebinding guard ([`crate::access::admits_http1`]), where it
/// holds, on an HTTP/1.x
/// request: the authority is the request target's when it is in absolute
/// form (RFC 9112 §3.2.2), else `Host`. h2 is never a browser on a
/// plain-text listener, so it is not checked.
fn browser_refusal(
    layer: &AccessLayer,
    req: &http::Request<Body>,
) -> Option<crate::access::BrowserRefusal> {
    if !layer.guarded || req.version() > http::Version::HTTP_11 {
        return None;
    }
    let headers = req.headers();
    let host = match req.uri().authority() {
        Some(a) => Some(a.as_str()),
        None => single_header(headers, http::header::HOST),
    };
    let origin = if headers.contains_key(http::header::ORIGIN) {
        // Sent twice or not text: refused as a foreign origin.
        Some(single_header(headers, http::header::ORIGIN).unwrap_or("null"))
    } else {
        None
    };
    crate::access::admits_http1(host, origin, &layer.origins).err()
}

impl<S> tower::Layer<S> for AccessLayer {
    type Service = AccessService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AccessService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service the layer makes.
#[derive(Debug, Clone)]
pub struct AccessService<S> {
    inner: S,
    layer: AccessLayer,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for AccessService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let peer = peer_of(req.extensions());
        let target = target_of_path(req.uri().path());
        if let Some(refusal) = browser_refusal(&self.layer, &req) {
            let reason = refusal.reason();
            self.layer.metrics.access_denied(service_label(target));
            // The header values are the attacker's text: not logged.
            tracing::warn!(
                reason,
                "HTTP/1.1 request refused on the plaintext loopback listener (DNS rebinding guard)"
            );
            let message = match refusal {
                crate::access::BrowserRefusal::Host => {
                    "a plaintext loopback listener serves only requests addressed to a loopback host"
                }
                crate::access::BrowserRefusal::Origin => {
                    "a plaintext loopback listener serves browsers only from a loopback origin or a configured grpc_web.allowed_origins entry"
                }
            };
            if let Target::Service(service) = target
                && service.is_plain_http()
            {
                return Box::pin(std::future::ready(Ok(http_refusal(&req, service, message))));
            }
            let details = ErrorDetails::with_error_info(reason, "toolgate", []);
            let status = Status::with_error_details(Code::PermissionDenied, message, details);
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        if !self.layer.policy.allows(&peer, target) {
            let service = service_label(target);
            self.layer.metrics.access_denied(service);
            tracing::warn!(caller = %peer, service, "call refused: the caller has no grant for the service");
            if let Target::Service(plain) = target
                && plain.is_plain_http()
            {
                let message = format!("caller `{peer}` may not call the {service} service");
                return Box::pin(std::future::ready(Ok(http_refusal(&req, plain, &message))));
            }
            let details = ErrorDetails::with_error_info(
                "caller_not_granted",
                "toolgate",
                [
                    ("service".to_owned(), service.to_owned()),
                    ("caller".to_owned(), peer.to_string()),
                ],
            );
            let status = Status::with_error_details(
                Code::PermissionDenied,
                format!("caller `{peer}` may not call the {service} service"),
                details,
            );
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        // No scope for health or an unknown path: nothing there runs as a tenant.
        if let Target::Service(service) = target {
            let tenants = self.layer.policy.tenants(&peer, service);
            req.extensions_mut().insert(tenants);
            if service == ServiceName::Ledger {
                let reconcile = self.layer.policy.tenants(&peer, ServiceName::Reconcile);
                req.extensions_mut().insert(ReconcileScope(reconcile));
            }
        }
        req.extensions_mut().insert(peer);
        // The clone that was made ready is the one that is called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(inner.call(req))
    }
}
