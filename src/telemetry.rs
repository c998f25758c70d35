//! Structured logs (`tracing`): JSON lines on stderr.
//!
//! The audit log is not a log stream: it is [`crate::audit`], one JSON line
//! per decision to its own sink. Logs never carry raw arguments or tokens,
//! at any level: the dependencies that print payloads at debug or trace are
//! capped by [`payload_caps`], whatever `RUST_LOG` says.

use tracing_subscriber::filter::{FilterExt as _, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// The dependencies whose debug or trace events can carry a payload, each
/// capped at `info`: `tokio_postgres` (and `postgres`) print every
/// statement's parameters at debug (the arguments, results and reasons the
/// ledger and approvals store); `h2`, `hyper` and `hyper_util` print
/// frames and headers (`authorization`) at debug and trace; `tonic`,
/// `tower`, `tower_http`, `axum` and `rustls` sit on the same requests and
/// handshakes. A target is matched by prefix (`tokio_postgres::query`).
pub const CAPPED_TARGETS: &[&str] = &[
    "tokio_postgres",
    "postgres",
    "deadpool_postgres",
    "h2",
    "hyper",
    "hyper_util",
    "tonic",
    "tonic_web",
    "tower",
    "tower_http",
    "axum",
    "rustls",
];

/// The caps: every target in [`CAPPED_TARGETS`] at `info` or less, every
/// other target unbounded (left to `RUST_LOG`).
pub fn payload_caps() -> Targets {
    CAPPED_TARGETS.iter().fold(
        Targets::new().with_default(LevelFilter::TRACE),
        |t, name| t.with_target(*name, LevelFilter::INFO),
    )
}

/// Installs the global subscriber: JSON lines to stderr, filtered by
/// `RUST_LOG` (default `info`) and, on top of it, by [`payload_caps`].
pub fn init() {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = subscriber(env, std::io::stderr).try_init();
}

/// JSON lines to `writer`, filtered by `env` and [`payload_caps`]: an event
/// passes only when both let it, so `RUST_LOG=trace` (or
/// `RUST_LOG=tokio_postgres::query=trace`) cannot lift a cap.
fn subscriber<W>(env: EnvFilter, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer()
        .json()
        .with_writer(writer)
        .with_filter(env.and(payload_caps()));
    tracing_subscriber::registry().with(layer)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Even a directive naming the capped target exactly cannot lift its
    /// cap; the targets that are not capped are left to `RUST_LOG`.
    #[test]
    fn rust_log_cannot_lift_a_cap() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let env = EnvFilter::new("trace,tokio_postgres::query=trace,h2=trace,hyper=trace");
        tracing::subscriber::with_default(subscriber(env, move || writer.clone()), || {
            tracing::debug!(target: "tokio_postgres::query", "pg-debug");
            tracing::trace!(target: "h2::codec::framed_write", "h2-trace");
            tracing::trace!(target: "hyper::proto::h1", "hyper-trace");
            tracing::info!(target: "tokio_postgres::connection", "pg-info");
            tracing::trace!(target: "toolgate::ledger", "own-trace");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let messages: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|v| v["fields"]["message"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(messages, ["pg-info", "own-trace"]);
    }
}
