//! What one listener lets all its callers together hold at once.

/// What one listener lets all its callers together hold at once
/// (`[limits]`, DESIGN §9): past each limit the next one is refused at once,
/// never queued, so an overloaded or attacked sidecar answers quickly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Open connections (TLS handshakes included); one more is closed as
    /// soon as it is accepted.
    pub max_connections: usize,
    /// HTTP/2 streams open at once on one connection (the server's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_concurrent_streams: u32,
    /// Calls in progress at once, watches excepted; one more is answered
    /// `RESOURCE_EXHAUSTED` (retryable) at once.
    pub max_calls_in_flight: usize,
    /// The longest one call may take, request body included; then it is
    /// answered `CANCELLED` and its work dropped. Watches are not bounded by it.
    pub request_timeout: std::time::Duration,
    /// `grpc.health.v1.Health/Watch` streams open at once.
    pub max_health_watches: usize,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_concurrent_streams: 256,
            max_calls_in_flight: 1024,
            request_timeout: std::time::Duration::from_secs(15),
            max_health_watches: 64,
        }
    }
}
