//! Reloading a policy folder as one unit (DESIGN §9): schema, policies,
//! tool contracts and entities are loaded and fully validated into a new
//! [`PolicyEngine`], which replaces the live one in a single atomic swap.
//!
//! Invariants:
//! - An engine goes live only after [`PolicyEngine::load`] accepted it; on
//!   any error the last good set stays live and the error, with file:line,
//!   is logged and kept for operators ([`PolicyReloader::status`]).
//! - A decision loads one snapshot of the live engine and keeps it to the
//!   end, so a swap never changes a decision in flight.
//! - Reloads are serialised: an older, slower load never overwrites a newer one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

use super::{LoadErrors, PolicyEngine, SourceDiagnostic};
use crate::clock::{Clock, UnixMillis};

/// The live policy engine of a folder, and how its reloads went.
#[derive(Debug)]
pub struct PolicyReloader {
    dir: PathBuf,
    live: Arc<ArcSwap<PolicyEngine>>,
    clock: Arc<dyn Clock>,
    /// Held for the whole of one reload.
    reloading: Mutex<()>,
    /// Held only to read or write the fields; never across a load.
    state: Mutex<ReloadState>,
    metrics: ReloadMetrics,
}

#[derive(Debug, Clone)]
struct ReloadState {
    loaded_at: UnixMillis,
    last_error: Option<ReloadFailure>,
}

/// Why the last reload was refused; cleared by the next successful one.
#[derive(Debug, Clone)]
pub struct ReloadFailure {
    pub at: UnixMillis,
    /// Every problem, located by file, line and column.
    pub diagnostics: Vec<SourceDiagnostic>,
}

/// Counters of reloads since start, for metrics.
#[derive(Debug, Default)]
pub struct ReloadMetrics {
    succeeded: AtomicU64,
    failed: AtomicU64,
}

impl ReloadMetrics {
    /// Reloads that loaded a valid set (changed or not).
    #[must_use]
    pub fn succeeded(&self) -> u64 {
        self.succeeded.load(Ordering::Relaxed)
    }

    /// Reloads refused because the folder did not load; the last good set stayed.
    #[must_use]
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// What an operator sees of the live set.
#[derive(Debug, Clone)]
pub struct PolicyStatus {
    pub policy_version: String,
    /// When the live set was loaded.
    pub loaded_at: UnixMillis,
    pub policy_count: usize,
    pub tool_count: usize,
    /// Validator warnings of the live set.
    pub warnings: Vec<SourceDiagnostic>,
    pub last_reload_error: Option<ReloadFailure>,
    pub reloads_succeeded: u64,
    pub reloads_failed: u64,
}

/// What one reload did.
#[derive(Debug, Clone)]
pub enum ReloadOutcome {
    /// A new set is live.
    Swapped { from: String, to: String },
    /// The folder loaded to the set already live.
    Unchanged { version: String },
    /// The folder did not load; the set `kept` stays live.
    Failed {
        kept: String,
        diagnostics: Vec<SourceDiagnostic>,
    },
}

impl PolicyReloader {
    /// Loads `dir` for the first time.
    ///
    /// # Errors
    /// [`LoadErrors`]: nothing is live yet, so there is nothing to keep.
    pub fn load(dir: &Path, clock: Arc<dyn Clock>) -> Result<Self, LoadErrors> {
        let engine = PolicyEngine::load(dir)?;
        Ok(Self::new(dir, engine, clock))
    }

    /// A reloader whose live set is `engine`, loaded from `dir`.
    #[must_use]
    pub fn new(dir: &Path, engine: PolicyEngine, clock: Arc<dyn Clock>) -> Self {
        let loaded_at = clock.now_ms();
        Self {
            dir: dir.to_path_buf(),
            live: Arc::new(ArcSwap::from_pointee(engine)),
            clock,
            reloading: Mutex::new(()),
            state: Mutex::new(ReloadState {
                loaded_at,
                last_error: None,
            }),
            metrics: ReloadMetrics::default(),
        }
    }

    /// The live engine, shared with everything that decides: a swap here
    /// is seen by the authorizer and the approval desk at their next decision.
    #[must_use]
    pub fn live(&self) -> Arc<ArcSwap<PolicyEngine>> {
        Arc::clone(&self.live)
    }

    /// The folder this reloader loads.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reload counters.
    #[must_use]
    pub fn metrics(&self) -> &ReloadMetrics {
        &self.metrics
    }

    /// Loads the folder again and, if it is valid, makes it live. Blocking:
    /// call it off the async runtime.
    pub fn reload(&self) -> ReloadOutcome {
        let _one_at_a_time = self
            .reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.live.load_full();
        let loaded = PolicyEngine::load(&self.dir);
        let now = self.clock.now_ms();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match loaded {
            Ok(engine) => {
                self.metrics.succeeded.fetch_add(1, Ordering::Relaxed);
                state.last_error = None;
                let to = engine.version().to_owned();
                if to == current.version() {
                    return ReloadOutcome::Unchanged { version: to };
                }
                for w in engine.warnings() {
                    tracing::warn!(file = %w.path.display(), line = w.line, column = w.column, code = %w.code, "policy warning: {w}");
                }
                self.live.store(Arc::new(engine));
                state.loaded_at = now;
                tracing::info!(
                    policy_version = %to,
                    previous_policy_version = %current.version(),
                    dir = %self.dir.display(),
                    "policies reloaded"
                );
                ReloadOutcome::Swapped {
                    from: current.version().to_owned(),
                    to,
                }
            }
            Err(errors) => {
                self.metrics.failed.fetch_add(1, Ordering::Relaxed);
                let diagnostics = errors.diagnostics();
                for d in &diagnostics {
                    tracing::error!(
                        file = %d.path.display(),
                        line = d.line,
                        column = d.column,
                        code = %d.code,
                        kept_policy_version = %current.version(),
                        "policy reload refused, the last good set stays live: {d}"
                    );
                }
                state.last_error = Some(ReloadFailure {
                    at: now,
                    diagnostics: diagnostics.clone(),
                });
                ReloadOutcome::Failed {
                    kept: current.version().to_owned(),
                    diagnostics,
                }
            }
        }
    }

    /// The live set and the last reload's error, if it failed.
    #[must_use]
    pub fn status(&self) -> PolicyStatus {
        let engine = self.live.load_full();
        let state = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        PolicyStatus {
            policy_version: engine.version().to_owned(),
            loaded_at: state.loaded_at,
            policy_count: engine.policy_count(),
            tool_count: engine.tools().len(),
            warnings: engine.warnings().to_vec(),
            last_reload_error: state.last_error,
            reloads_succeeded: self.metrics.succeeded(),
            reloads_failed: self.metrics.failed(),
        }
    }
}

impl crate::metrics::PolicyGauges for PolicyReloader {
    fn reloads_succeeded(&self) -> u64 {
        self.metrics().succeeded()
    }

    fn reloads_failed(&self) -> u64 {
        self.metrics().failed()
    }

    fn policy_version(&self) -> String {
        self.live().load().version().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    use super::super::test_support::examples;

    #[test]
    fn a_broken_set_keeps_the_last_good_one_and_says_where() {
        let (_tmp, dir) = examples();
        let clock = ManualClock::new(1_000);
        let reloader = PolicyReloader::load(&dir, Arc::new(clock.clone())).unwrap();
        let live = reloader.live();
        let first = live.load_full().version().to_owned();

        // Unchanged files: nothing is swapped.
        assert!(
            matches!(reloader.reload(), ReloadOutcome::Unchanged { version } if version == first)
        );

        // A syntax error on line 4: refused, the old set stays, the status says where.
        clock.advance(1_000);
        let orders = dir.join("orders.cedar");
        let good = std::fs::read_to_string(&orders).unwrap();
        std::fs::write(&orders, good.replacen("action ==", "action ===", 1)).unwrap();
        let ReloadOutcome::Failed { kept, diagnostics } = reloader.reload() else {
            panic!("a broken set was accepted");
        };
        assert_eq!(kept, first);
        assert_eq!(live.load_full().version(), first);
        assert_eq!(diagnostics.len(), 1);
        assert_eq!(
            (diagnostics[0].path.as_path(), diagnostics[0].line),
            (orders.as_path(), 4)
        );
        assert_eq!(diagnostics[0].code, "cedar::parse");
        let status = reloader.status();
        let error = status.last_reload_error.unwrap();
        assert_eq!(error.at, 2_000);
        assert_eq!(error.diagnostics[0].to_string(), diagnostics[0].to_string());
        assert_eq!((status.reloads_succeeded, status.reloads_failed), (1, 1));
        assert_eq!(status.loaded_at, 1_000);

        // Fixed with a real change: the new set goes live and the error clears.
        clock.advance(1_000);
        std::fs::write(&orders, good.replace("10000", "20000")).unwrap();
        let ReloadOutcome::Swapped { from, to } = reloader.reload() else {
            panic!("a valid set was refused");
        };
        assert_eq!(from, first);
        assert_ne!(to, first);
        assert_eq!(live.load_full().version(), to);
        let status = reloader.status();
        assert!(status.last_reload_error.is_none());
        assert_eq!(status.policy_version, to);
        assert_eq!(status.loaded_at, 3_000);
        assert_eq!((status.reloads_succeeded, status.reloads_failed), (2, 1));
    }

    #[test]
    fn tool_contracts_and_entities_reload_with_the_policies() {
        let (_tmp, dir) = examples();
        let reloader = PolicyReloader::load(&dir, Arc::new(ManualClock::new(0))).unwrap();
        let live = reloader.live();
        let contract = dir.join("tools/search_docs.json");
        let text = std::fs::read_to_string(&contract).unwrap();
        std::fs::write(
            &contract,
            text.replace("\"version\": \"1.0.0\"", "\"version\": \"1.1.0\""),
        )
        .unwrap();
        assert!(matches!(reloader.reload(), ReloadOutcome::Swapped { .. }));
        assert_eq!(
            live.load_full().tools().get("search_docs").unwrap().version,
            "1.1.0"
        );

        // An invalid static entity is refused like a broken policy.
        std::fs::write(dir.join("entities.json"), "[{\"uid\": 3}]").unwrap();
        let ReloadOutcome::Failed { diagnostics, .. } = reloader.reload() else {
            panic!("invalid entities were accepted");
        };
        assert_eq!(diagnostics[0].path, dir.join("entities.json"));
        assert_eq!(
            live.load_full().tools().get("search_docs").unwrap().version,
            "1.1.0"
        );
    }
}
