//! The audit log (DESIGN §9): one JSON line per decision, approval decision
//! and ledger transition, to a configured sink (stdout or an append-only
//! file), written by one thread of its own (plain blocking writes, no async
//! runtime round trip per batch) so a slow disk never holds a request for long.
//!
//! Events carry ids, hashes, the decision, its code and the determining
//! policies (a ledger event: the operation, outcome, state, code, fencing
//! token and attempt) — never raw arguments, display arguments, tokens, a
//! tool's result or an executor's error message or details, any of which
//! may hold what the tool saw: the event builders below take the domain
//! values and copy only those fields.
//!
//! **When the queue is full.** Requests put events on a bounded queue and the
//! writer drains it. If the queue stays full for `full_wait`, the default
//! policy is *fail closed*: the decision is answered as `internal_error`
//! (retryable with the same key) instead of an unaudited allow, and the drop
//! is counted. A security team signs off an authorization service whose
//! every allow is on record; a stalled sink therefore costs availability,
//! visibly (`toolgate_audit_dropped_total`, the error log), rather than
//! records. `when_full = "drop"` trades that for availability, still
//! counting every lost event. Approval decisions and ledger transitions are
//! already durable in the store when they are audited, so for them a full
//! queue is counted and logged, and the answer stands.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::io::Write as _;

use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;

mod event;

pub use event::{
    ApprovalAudit, ApprovedCall, AuditEvent, DecisionAudit, EntityAudit, LedgerAudit, RefusalAudit,
};

/// Where audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSink {
    Stdout,
    /// Appended to, created owner-only (0600) if absent.
    File(PathBuf),
    /// Nowhere (tests and `toolgate authorize`).
    Discard,
}

/// What a request does when the queue stays full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// A decision that cannot be audited is answered `internal_error`.
    FailClosed,
    /// The event is dropped and counted; the answer stands.
    Drop,
}

/// Settings of the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    pub sink: AuditSink,
    /// Events the queue holds before requests wait.
    pub queue: usize,
    pub when_full: WhenFull,
    /// How long a request waits for room in a full queue.
    pub full_wait: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            sink: AuditSink::Stdout,
            queue: 10_000,
            when_full: WhenFull::FailClosed,
            full_wait: Duration::from_millis(100),
        }
    }
}

/// Why the audit log cannot start.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("cannot open the audit file `{}`: {source}", .path.display())]
pub struct AuditError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The event could not be queued within `full_wait` (or the writer is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the audit queue is full")]
pub struct AuditUnavailable;

enum Msg {
    Line(String),
    Flush(oneshot::Sender<()>),
}

/// A handle to the audit log; cheap to share.
#[derive(Debug)]
pub struct Audit {
    tx: Option<mpsc::Sender<Msg>>,
    when_full: WhenFull,
    full_wait: Duration,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl Audit {
    /// Opens the sink and starts the writer thread.
    ///
    /// # Errors
    /// [`AuditError`] when the file cannot be opened for appending.
    pub fn start(config: &AuditConfig, metrics: Arc<Metrics>) -> Result<Self, AuditError> {
        let out: Box<dyn std::io::Write + Send> = match &config.sink {
            AuditSink::Discard => {
                // Chosen by name (`sink = "discard"`): nothing is written,
                // and nothing is refused for it.
                return Ok(Self {
                    tx: None,
                    when_full: WhenFull::Drop,
                    full_wait: Duration::ZERO,
                    metrics,
                });
            }
            AuditSink::Stdout => Box::new(std::io::stdout()),
            AuditSink::File(path) => {
                let mut options = std::fs::OpenOptions::new();
                options.append(true).create(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                let file = options.open(path).map_err(|source| AuditError {
                    path: path.clone(),
                    source,
                })?;
                Box::new(file)
            }
        };
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let writer_metrics = Arc::clone(&metrics);
        std::thread::Builder::new()
            .name("toolgate-audit".into())
            .spawn(move || write_lines(rx, out, &writer_metrics))
            .map_err(|source| AuditError {
                path: PathBuf::from("<audit writer thread>"),
                source,
            })?;
        Ok(Self {
            tx: Some(tx),
            when_full: config.when_full,
            full_wait: config.full_wait,
            metrics,
        })
    }

    /// Queues one event. Waits at most `full_wait` for room.
    ///
    /// # Errors
    /// [`AuditUnavailable`] when the queue stayed full under the fail-closed
    /// policy (the event is counted as dropped either way).
    pub async fn record(&self, event: AuditEvent) -> Result<(), AuditUnavailable> {
        let Some(tx) = &self.tx else { return Ok(()) };
        let line = event.into_line();
        let queued = match tx.try_send(Msg::Line(line)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(msg)) => {
                matches!(tx.send_timeout(msg, self.full_wait).await, Ok(()))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        };
        if queued {
            return Ok(());
        }
        self.metrics.audit_dropped();
        tracing::error!(
            "the audit queue is full: an event was not recorded (policy: {:?})",
            self.when_full
        );
        match self.when_full {
            WhenFull::FailClosed => Err(AuditUnavailable),
            WhenFull::Drop => Ok(()),
        }
    }

    /// Waits until every event queued before this call is written and the
    /// sink flushed, or `within` passes. Returns whether it finished.
    pub async fn flush(&self, within: Duration) -> bool {
        let Some(tx) = &self.tx else { return true };
        let (ack, done) = oneshot::channel();
        tokio::time::timeout(within, async {
            tx.send(Msg::Flush(ack)).await.is_ok() && done.await.is_ok()
        })
        .await
        .unwrap_or(false)
    }
}

/// The writer task: drains what is queued, writes it, flushes, repeats.
fn write_lines(
    mut rx: mpsc::Receiver<Msg>,
    mut out: Box<dyn std::io::Write + Send>,
    metrics: &Metrics,
) {
    const BATCH: usize = 4096;
    // After a write the thread rests this long, so events gather into one
    // write instead of each waking it (a futex wake and a context switch
    // per event, on the cores the requests need). A flush request waits at
    // most this much longer.
    const GATHER: Duration = Duration::from_millis(2);
    let mut buf = Vec::with_capacity(64 * 1024);
    // Ends when every sender is gone (the server stopped).
    while let Some(first) = rx.blocking_recv() {
        let mut lines = 0u64;
        let mut acks = Vec::new();
        let mut next = Some(first);
        let mut taken = 0;
        // Whatever else is queued already goes out in the same write.
        while let Some(msg) = next.take() {
            match msg {
                Msg::Line(line) => {
                    buf.extend_from_slice(line.as_bytes());
                    buf.push(b'\n');
                    lines += 1;
                }
                Msg::Flush(ack) => acks.push(ack),
            }
            taken += 1;
            if taken < BATCH {
                next = rx.try_recv().ok();
            }
        }
        let written = out.write_all(&buf).and_then(|()| out.flush());
        buf.clear();
        match written {
            Ok(()) => metrics.audit_written(lines),
            Err(e) => {
                metrics.audit_write_error();
                tracing::error!(error = %e, lines, "cannot write to the audit sink");
            }
        }
        for ack in acks {
            let _ = ack.send(());
        }
        std::thread::sleep(GATHER);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[tokio::test]
    async fn lines_reach_the_file_and_flush_waits_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let metrics = Arc::new(Metrics::default());
        let config = AuditConfig {
            sink: AuditSink::File(path.clone()),
            ..AuditConfig::default()
        };
        let audit = Audit::start(&config, Arc::clone(&metrics)).unwrap();
        for i in 0..50 {
            audit
                .record(AuditEvent::fields("test", &[("n", Value::from(i))]))
                .await
                .unwrap();
        }
        assert!(audit.flush(Duration::from_secs(5)).await);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 50);
        assert_eq!(lines[49]["n"], 49);
        assert_eq!(lines[0]["event"], "test");
        assert!(metrics.encode().contains("toolgate_audit_events_total 50"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    /// A queue that never drains: fail closed refuses, drop counts and passes.
    #[tokio::test]
    async fn a_full_queue_fails_closed_or_drops_as_configured() {
        let metrics = Arc::new(Metrics::default());
        let (tx, _rx) = mpsc::channel(1);
        let mut audit = Audit {
            tx: Some(tx),
            when_full: WhenFull::FailClosed,
            full_wait: Duration::from_millis(1),
            metrics: Arc::clone(&metrics),
        };
        let event = || AuditEvent::fields("test", &[]);
        assert_eq!(audit.record(event()).await, Ok(()));
        assert_eq!(audit.record(event()).await, Err(AuditUnavailable));
        audit.when_full = WhenFull::Drop;
        assert_eq!(audit.record(event()).await, Ok(()));
        assert!(
            metrics.encode().contains("toolgate_audit_dropped_total 2"),
            "{}",
            metrics.encode()
        );
    }
}
