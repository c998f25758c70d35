//! What sets a reload off: a debounced watch of the policy folder and, on
//! Unix, `SIGHUP`. Each trigger runs [`PolicyReloader::reload`] off the
//! async runtime; triggers that arrive during a reload fold into one more.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use notify_debouncer_mini::notify::RecursiveMode;
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};
use tokio::sync::mpsc;

use super::reload::PolicyReloader;

/// The reload triggers of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReloadTriggers {
    /// Watch the folder, reloading once changes have been quiet this long.
    pub watch: Option<Duration>,
    /// Reload on `SIGHUP` (Unix only; ignored elsewhere).
    pub sighup: bool,
}

impl ReloadTriggers {
    /// No automatic reloads.
    pub const NONE: Self = Self {
        watch: None,
        sighup: false,
    };
}

/// Starts the triggers now (the watch, the `SIGHUP` handler) and returns
/// the loop that reloads `reloader` on each, to spawn. Dropping the loop
/// stops the watch; the server aborts it when it stops. Starting eagerly
/// means that once a server answers, an edit or a `SIGHUP` is not missed.
pub fn start_reloads(
    reloader: Arc<PolicyReloader>,
    triggers: ReloadTriggers,
) -> impl Future<Output = ()> + Send + 'static {
    // Capacity one: a trigger while one is queued adds nothing.
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let watch = triggers
        .watch
        .and_then(|quiet| watch(&reloader, quiet, tx.clone()));
    #[cfg(unix)]
    let mut hangup = if triggers.sighup {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGHUP; reload by editing the policy folder");
                None
            }
        }
    } else {
        None
    };
    async move {
        let _watch = watch;
        // Keeps the channel open when nothing watches, so the loop waits
        // for SIGHUP instead of ending.
        let _tx = tx;
        loop {
            #[cfg(unix)]
            let trigger = tokio::select! {
                r = rx.recv() => r.map(|()| "file change"),
                r = next(&mut hangup) => r.map(|()| "SIGHUP"),
            };
            #[cfg(not(unix))]
            let trigger = rx.recv().await.map(|()| "file change");
            let Some(trigger) = trigger else {
                return;
            };
            tracing::info!(trigger, dir = %reloader.dir().display(), "reloading policies");
            let r = Arc::clone(&reloader);
            if let Err(e) = tokio::task::spawn_blocking(move || r.reload()).await {
                tracing::error!(error = %e, "the policy reload task failed; the last good set stays live");
            }
        }
    }
}

#[cfg(unix)]
async fn next(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Watches the folder (and below, except `tests/`, which holds no part of
/// the policy set). `None` after logging when the watch cannot start: the
/// server runs on, reloadable by `SIGHUP`.
fn watch(
    reloader: &PolicyReloader,
    quiet: Duration,
    tx: mpsc::Sender<()>,
) -> Option<Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>> {
    let dir = reloader.dir().to_path_buf();
    let tests = dir.join("tests");
    let handler = move |events: DebounceEventResult| match events {
        Ok(events) => {
            if events.iter().any(|e| !e.path.starts_with(&tests)) {
                // Full means a reload is queued already; it will see this change.
                let _ = tx.try_send(());
            }
        }
        Err(e) => tracing::warn!(error = %e, "policy folder watch error"),
    };
    let started = new_debouncer(quiet, handler).and_then(|mut debouncer| {
        debouncer
            .watcher()
            .watch(&dir, RecursiveMode::Recursive)
            .map(|()| debouncer)
    });
    match started {
        Ok(debouncer) => {
            tracing::info!(dir = %dir.display(), quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX), "watching the policy folder");
            Some(debouncer)
        }
        Err(e) => {
            tracing::error!(error = %e, dir = %dir.display(), "cannot watch the policy folder; reload with SIGHUP");
            None
        }
    }
}
