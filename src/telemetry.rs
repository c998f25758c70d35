//! Structured logs (`tracing`): JSON lines on stderr.
//!
//! The audit log is not a log stream: it is [`crate::audit`], one JSON line
//! per decision to its own sink. Logs never carry raw arguments or tokens.

/// Installs the global subscriber: JSON lines to stderr, filtered by
/// `RUST_LOG` (default `info`).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
