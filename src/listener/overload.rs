//! What one listener holds at once ([`ListenerLimits`]): connections, calls
//! in flight and health watches, each refused at once past its limit (a
//! closed connection, `RESOURCE_EXHAUSTED`), never queued; and the longest
//! a call may take. An overloaded or attacked sidecar thus answers fast and
//! retryably instead of queueing without bound, and a client that sends a
//! request body slowly holds a slot for at most the request timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt as _};
use tonic::Status;
use tonic::body::Body;
use tonic::transport::server::Connected;

use crate::access::ListenerLimits;
use crate::metrics::Metrics;

/// A connection that holds one of its listener's connection slots until it
/// is dropped.
#[derive(Debug)]
pub(super) struct Limited<IO> {
    io: IO,
    _slot: OwnedSemaphorePermit,
}

impl<IO: Connected> Connected for Limited<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Limited<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// How often at most one kind of refusal is logged.
const LOG_EVERY_MS: u64 = 1_000;

/// At most one log line per [`LOG_EVERY_MS`] for one kind of refusal,
/// carrying how many refusals it stands for. Past a limit, a line per
/// refusal would spend on logging the CPU that refusing at once saves (and
/// flood the log when it is least readable); the metric
/// `toolgate_overload_refusals_total` still counts every one.
#[derive(Debug)]
struct LogEvery {
    start: Instant,
    /// Milliseconds after `start` before which no line is due.
    next_ms: AtomicU64,
    /// Refusals since the last line.
    pending: AtomicU64,
}

impl LogEvery {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            next_ms: AtomicU64::new(0),
            pending: AtomicU64::new(0),
        }
    }

    /// Counts one refusal; when a line is due, how many it stands for.
    fn tick(&self) -> Option<u64> {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.tick_at(now)
    }

    fn tick_at(&self, now_ms: u64) -> Option<u64> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let next = self.next_ms.load(Ordering::Relaxed);
        if now_ms < next {
            return None;
        }
        // One caller wins the line; the others count towards the next.
        self.next_ms
            .compare_exchange(
                next,
                now_ms.saturating_add(LOG_EVERY_MS),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .ok()?;
        Some(self.pending.swap(0, Ordering::Relaxed).max(1))
    }
}

/// The accepted connections of `incoming`, each holding a slot of
/// `max_connections`; one accepted while every slot is held is closed at
/// once (dropped) and counted.
pub(super) fn limit_connections<I, IO>(
    incoming: I,
    max_connections: usize,
    metrics: Arc<Metrics>,
) -> impl Stream<Item = std::io::Result<Limited<IO>>> + Send + Unpin + 'static
where
    I: Stream<Item = std::io::Result<IO>> + Send + Unpin + 'static,
    IO: Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let log = LogEvery::new();
    incoming.filter_map(move |conn| match conn {
        Ok(io) => match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => Some(Ok(Limited { io, _slot: slot })),
            Err(_) => {
                metrics.overloaded("connections");
                if let Some(closed) = log.tick() {
                    tracing::warn!(
                        max_connections,
                        closed,
                        "connections were closed at once: the listener holds its most connections"
                    );
                }
                None
            }
        },
        Err(e) => Some(Err(e)),
    })
}

/// Streams that stay open by design, bounded by their own limits rather
/// than the calls-in-flight one (which they would otherwise fill).
fn is_long_lived(path: &str) -> bool {
    matches!(
        path,
        "/toolgate.v1.ApprovalService/WatchApprovals"
            | "/grpc.health.v1.Health/Watch"
            | "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
            | "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    )
}

/// The layer: calls in flight and the request timeout.
#[derive(Debug, Clone)]
pub(super) struct OverloadLayer {
    calls: Arc<Semaphore>,
    max_calls: usize,
    timeout: std::time::Duration,
    metrics: Arc<Metrics>,
    refusals_logged: Arc<LogEvery>,
    timeouts_logged: Arc<LogEvery>,
}

impl OverloadLayer {
    pub(super) fn new(limits: &ListenerLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            calls: Arc::new(Semaphore::new(limits.max_calls_in_flight.max(1))),
            max_calls: limits.max_calls_in_flight.max(1),
            timeout: limits.request_timeout,
            metrics,
            refusals_logged: Arc::new(LogEvery::new()),
            timeouts_logged: Arc::new(LogEvery::new()),
        }
    }
}

impl<S> tower::Layer<S> for OverloadLayer {
    type Service = OverloadService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OverloadService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service the layer makes.
#[derive(Debug, Clone)]
pub(super) struct OverloadService<S> {
    inner: S,
    layer: OverloadLayer,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// A gRPC call (gRPC-Web included: its layer has translated it by now), as
/// opposed to a plain-HTTP door's request.
fn is_grpc(req: &http::Request<Body>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The refusal in the caller's protocol: `RESOURCE_EXHAUSTED` for gRPC,
/// `503` with `Retry-After` for plain HTTP.
fn overloaded(grpc: bool) -> http::Response<Body> {
    const MESSAGE: &str =
        "the sidecar is at its limit of calls in flight; nothing was done, retry shortly";
    if grpc {
        return Status::resource_exhausted(MESSAGE).into_http();
    }
    let mut response = http::Response::new(Body::new(MESSAGE.to_owned()));
    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    response
}

/// The timeout's answer: `DEADLINE_EXCEEDED` for gRPC, `504` for plain HTTP.
fn timed_out(grpc: bool) -> http::Response<Body> {
    const MESSAGE: &str = "the call took longer than the sidecar's request timeout";
    if grpc {
        return Status::deadline_exceeded(MESSAGE).into_http();
    }
    let mut response = http::Response::new(Body::new(MESSAGE.to_owned()));
    *response.status_mut() = http::StatusCode::GATEWAY_TIMEOUT;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl<S> tower::Service<http::Request<Body>> for OverloadService<S>
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

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if is_long_lived(req.uri().path()) {
            return Box::pin(self.inner.call(req));
        }
        let grpc = is_grpc(&req);
        let Ok(slot) = Arc::clone(&self.layer.calls).try_acquire_owned() else {
            self.layer.metrics.overloaded("calls");
            if let Some(refused) = self.layer.refusals_logged.tick() {
                tracing::warn!(
                    max_calls_in_flight = self.layer.max_calls,
                    refused,
                    "calls were refused at once: the listener has its most calls in flight"
                );
            }
            return Box::pin(std::future::ready(Ok(overloaded(grpc))));
        };
        let timeout = self.layer.timeout;
        let metrics = Arc::clone(&self.layer.metrics);
        let log = Arc::clone(&self.layer.timeouts_logged);
        let call = self.inner.call(req);
        Box::pin(async move {
            let answer = tokio::time::timeout(timeout, call).await;
            drop(slot);
            answer.unwrap_or_else(|_| {
                metrics.overloaded("request_timeout");
                if let Some(cut_off) = log.tick() {
                    tracing::warn!(
                        timeout_ms = timeout.as_millis(),
                        cut_off,
                        "calls were cut off at the request timeout"
                    );
                }
                Ok(timed_out(grpc))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::LogEvery;

    /// One line per second at most, each carrying every refusal since the
    /// last one; the first refusal is logged at once.
    #[test]
    fn refusals_are_logged_once_a_second_with_their_count() {
        let log = LogEvery::new();
        assert_eq!(log.tick_at(5), Some(1));
        for ms in [6, 200, 900, 1_004] {
            assert_eq!(log.tick_at(ms), None, "{ms}");
        }
        assert_eq!(log.tick_at(1_005), Some(5));
        assert_eq!(log.tick_at(1_006), None);
        assert_eq!(log.tick_at(9_000), Some(2));
    }
}
