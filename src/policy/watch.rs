//! What sets a reload off: a debounced watch of the policy folder and, on
//! Unix, `SIGHUP`. Each trigger runs [`PolicyReloader::reload`] off the
//! async runtime; triggers that arrive during a reload fold into one more.
//!
//! Only changes count: a reload reads every file of the folder, so a watch
//! that also took reads (inotify's open and close-after-read events) for
//! changes would set off the next reload itself, forever, and so would any
//! operator reading a policy file.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
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
    let watch = triggers.watch.and_then(|_| watch(&reloader, tx.clone()));
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
    let quiet = triggers.watch.unwrap_or_default();
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
            // A change reloads once the folder has been quiet for `quiet`:
            // an editor's save or a config system's sync is many events.
            if trigger == "file change" {
                while let Ok(more) = tokio::time::timeout(quiet, rx.recv()).await {
                    if more.is_none() {
                        return;
                    }
                }
            }
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
fn watch(reloader: &PolicyReloader, tx: mpsc::Sender<()>) -> Option<RecommendedWatcher> {
    let dir = reloader.dir().to_path_buf();
    let tests = dir.join("tests");
    let handler = move |event: notify::Result<Event>| match event {
        Ok(event) => {
            if changes_the_set(&event, &tests) {
                // Full means a change is queued already; it covers this one.
                let _ = tx.try_send(());
            }
        }
        Err(e) => tracing::warn!(error = %e, "policy folder watch error"),
    };
    let started = notify::recommended_watcher(handler).and_then(|mut watcher| {
        watcher
            .watch(&dir, RecursiveMode::Recursive)
            .map(|()| watcher)
    });
    match started {
        Ok(watcher) => {
            tracing::info!(dir = %dir.display(), "watching the policy folder");
            Some(watcher)
        }
        Err(e) => {
            tracing::error!(error = %e, dir = %dir.display(), "cannot watch the policy folder; reload with SIGHUP");
            None
        }
    }
}

/// Whether `event` may change the policy set: anything but a read, on a
/// path outside `tests/`.
fn changes_the_set(event: &Event, tests: &Path) -> bool {
    !matches!(event.kind, EventKind::Access(_)) && event.paths.iter().any(|p| !p.starts_with(tests))
}
