//! An exhaustive model check of the ledger's state machine (issue 18,
//! point 12) with `stateright`: one idempotency key, several executors,
//! an operator's reconciler and the retention sweep, over a bounded clock.
//!
//! The model holds no rule of its own: every step of the key's record is
//! the server's own [`Begin`], [`Complete`], [`Reconcile`] and
//! [`Collect`] applied to the record as a store would (the write replaces
//! the record; a delete removes it). What the model adds is the world
//! around the ledger: executors that begin, run the side effect while their
//! lease lasts, report any outcome (truthfully, or UNKNOWN), crash at any
//! step (forgetting their token), lose answers, and come back late; a
//! reconciler that tells the truth about the world; time; retention.
//!
//! Proven over every interleaving (the `always` properties):
//! - never two executors holding a live lease on the key at once;
//! - no completion or reconciliation by token is accepted from an attempt
//!   that is not the latest acquisition (no stale fence);
//! - no call that may have run (UNKNOWN, or IN_PROGRESS past its lease,
//!   even after retention) is ACQUIRED again before it is reconciled, so
//!   the side effect of one life of the key runs at most once.
//!
//! And the model is not vacuous: the `sometimes` properties find a run
//! where the key is re-acquired after a retryable failure, one where
//! retention collects it and it begins anew, and one where an UNKNOWN is
//! reconciled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use stateright::{Checker, Model, Property};

use super::{
    Begin, BeginOutcome, Collect, Complete, Completion, ExecutionId, ExecutionRecord,
    ExecutionState, OutputSchemas, Reconcile, Transition, Verdict, Write,
};
use crate::tools::Violation;

/// Executors racing for the key.
const EXECUTORS: usize = 2;
/// The retry budget.
const MAX_ATTEMPTS: u32 = 2;
/// A lease, in ticks of the model's clock.
const LEASE: u64 = 2;
/// Retention, in ticks.
const RETENTION_TICKS: u64 = 2;
/// The last tick: the clock stops here, which bounds the state space.
const LAST_TICK: i64 = 5;

/// A result its tool's output schema accepts, and one it refuses.
const VALID: &str = r#"{"ok":true}"#;
const INVALID: &str = r#"{"ok":"no"}"#;

/// Accepts `{"ok": true}` only.
#[derive(Debug)]
struct Schema;

impl OutputSchemas for Schema {
    fn check(&self, _: &str, result: &Value) -> Option<Vec<Violation>> {
        if result == &serde_json::json!({"ok": true}) {
            Some(Vec::new())
        } else {
            Some(vec![Violation {
                pointer: "/ok".into(),
                keyword: "const".into(),
                message: "must be true".into(),
            }])
        }
    }
}

/// What one executor is doing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Executor {
    /// Not holding the key (never began, finished, or crashed and restarted
    /// without its memory).
    Idle,
    /// ACQUIRED under `token` (acquisition number `acquisition`) until
    /// `lease_until`; whether it ran the side effect.
    Holding {
        token: u64,
        acquisition: u32,
        lease_until: i64,
        ran: bool,
    },
}

impl Executor {
    /// Whether it believes it may run the call at `now`.
    fn holds_live_lease(&self, now: i64) -> bool {
        matches!(self, Self::Holding { lease_until, .. } if *lease_until > now)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    now: i64,
    record: Option<ExecutionRecord>,
    executors: [Executor; EXECUTORS],
    /// The next token a store draws (distinct per acquisition, as random
    /// 63-bit tokens are with overwhelming probability).
    next_token: u64,
    // ---- The world, as no party of the protocol sees it.
    /// Acquisitions so far; the latest is the one that may settle.
    acquisitions: u32,
    /// Side effects of this life of the key (reset when retention
    /// collects a settled record: a later call is a new operation).
    effects: u8,
    /// Whether the side effect happened in this life (what a truthful
    /// reconciler finds).
    applied: bool,
    /// A call of this key may have run without the ledger knowing how it
    /// ended, and no reconciliation has settled it since.
    doubt: bool,
    /// Set when a step broke a property that is checked at the step.
    stale_fence_accepted: bool,
    acquired_in_doubt: bool,
    // ---- Coverage.
    reacquired: bool,
    reborn: bool,
    reconciled_unknown: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Report {
    Succeeded,
    /// A success whose result fails the output schema (quarantined as UNKNOWN).
    SucceededInvalid,
    FailedRetryable,
    FailedFinal,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Action {
    /// Executor `e` begins; `answer_lost`: the store committed, the answer
    /// never arrived (a crash between the two).
    Begin { e: usize, answer_lost: bool },
    /// Executor `e` performs the side effect (only while its lease lasts).
    Run(usize),
    /// Executor `e` reports and is done with the attempt (a lost answer
    /// changes nothing here: a repeated report is acknowledged unchanged,
    /// see the transitions' unit tests).
    Complete { e: usize, report: Report },
    /// Executor `e` reconciles its own attempt with its token, truthfully.
    ReconcileAsHolder(usize),
    /// The operator's reconciler (a `reconcile` grant, no token), truthfully.
    Reconcile,
    /// Executor `e` crashes and restarts, forgetting its token.
    Crash(usize),
    /// The retention sweep.
    Collect,
    /// Time passes.
    Tick,
}

#[derive(Debug, Clone, Copy)]
struct LedgerModel;

fn id() -> ExecutionId {
    ExecutionId {
        tenant_id: "acme".into(),
        idempotency_key: "refund_order:k".into(),
    }
}

fn outputs() -> Arc<dyn OutputSchemas> {
    Arc::new(Schema)
}

fn result(text: &str) -> (String, Value) {
    (
        text.to_owned(),
        serde_json::from_str(text).unwrap_or(Value::Null),
    )
}

/// The record after `write`, as a store leaves it.
fn written(current: Option<ExecutionRecord>, write: Write) -> Option<ExecutionRecord> {
    match write {
        Write::Nothing => current,
        Write::Insert(r) | Write::Update { record: r, .. } => Some(r),
    }
}

/// Whether the record says a call may have run with its outcome unknown.
fn in_doubt(record: Option<&ExecutionRecord>, now: i64) -> bool {
    record.is_some_and(|r| {
        r.state == ExecutionState::Unknown
            || (r.state == ExecutionState::InProgress && !r.lease_live(now))
    })
}

impl LedgerModel {
    /// The truthful verdict on the world as it is.
    fn verdict(s: &State) -> Verdict {
        if s.applied {
            let (result_json, result) = result(VALID);
            Verdict::Applied {
                result_json,
                result,
            }
        } else {
            Verdict::NotApplied
        }
    }

    fn reconcile(s: &mut State, holder_token: Option<u64>) {
        let step = Reconcile {
            id: id(),
            holder_token,
            verdict: Self::verdict(s),
            now: s.now,
            outputs: outputs(),
        };
        let before = s.record.clone();
        let (_, write) = step.apply(before.as_ref(), s.next_token);
        if matches!(write, Write::Update { .. })
            && before
                .as_ref()
                .is_some_and(|r| r.state == ExecutionState::Unknown)
        {
            s.reconciled_unknown = true;
        }
        if !matches!(write, Write::Nothing) {
            // Settled by someone who checked the world: no longer in doubt.
            s.doubt = false;
        }
        s.record = written(before, write);
    }
}

impl Model for LedgerModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            record: None,
            executors: std::array::from_fn(|_| Executor::Idle),
            next_token: 1,
            acquisitions: 0,
            effects: 0,
            applied: false,
            doubt: false,
            stale_fence_accepted: false,
            acquired_in_doubt: false,
            reacquired: false,
            reborn: false,
            reconciled_unknown: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (e, executor) in s.executors.iter().enumerate() {
            match executor {
                Executor::Idle => {
                    actions.push(Action::Begin {
                        e,
                        answer_lost: false,
                    });
                    actions.push(Action::Begin {
                        e,
                        answer_lost: true,
                    });
                }
                Executor::Holding {
                    ran, lease_until, ..
                } => {
                    if !ran && *lease_until > s.now {
                        actions.push(Action::Run(e));
                    }
                    let reports: &[Report] = if *ran {
                        &[Report::Succeeded, Report::SucceededInvalid, Report::Unknown]
                    } else {
                        &[
                            Report::FailedRetryable,
                            Report::FailedFinal,
                            Report::Unknown,
                        ]
                    };
                    for &report in reports {
                        actions.push(Action::Complete { e, report });
                    }
                    actions.push(Action::ReconcileAsHolder(e));
                    actions.push(Action::Crash(e));
                }
            }
        }
        if s.record.is_some() {
            actions.push(Action::Reconcile);
            actions.push(Action::Collect);
        }
        if s.now < LAST_TICK {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Begin { e, answer_lost } => {
                let step = Begin {
                    id: id(),
                    tool: "refund_order".into(),
                    arguments_sha256: "aa".into(),
                    lease_ms: LEASE,
                    max_attempts: MAX_ATTEMPTS,
                    now: s.now,
                };
                let before = s.record.clone();
                let (answer, write) = step.apply(before.as_ref(), s.next_token);
                if answer.outcome == BeginOutcome::Acquired {
                    if s.doubt || in_doubt(before.as_ref(), s.now) {
                        s.acquired_in_doubt = true;
                    }
                    if before.is_some() {
                        s.reacquired = true;
                    }
                    s.next_token += 1;
                    s.acquisitions += 1;
                    if !answer_lost {
                        s.executors[e] = Executor::Holding {
                            token: answer.fencing_token,
                            acquisition: s.acquisitions,
                            lease_until: answer.lease_expires_at.unwrap_or(i64::MIN),
                            ran: false,
                        };
                    }
                }
                s.record = written(before, write);
            }
            Action::Run(e) => {
                if let Executor::Holding { ran, .. } = &mut s.executors[e] {
                    *ran = true;
                }
                s.effects = s.effects.saturating_add(1);
                s.applied = true;
            }
            Action::Complete { e, report } => {
                let Executor::Holding {
                    token, acquisition, ..
                } = s.executors[e].clone()
                else {
                    return None;
                };
                let completion = match report {
                    Report::Succeeded | Report::SucceededInvalid => {
                        let text = if report == Report::Succeeded {
                            VALID
                        } else {
                            INVALID
                        };
                        let (result_json, result) = result(text);
                        Completion::Succeeded {
                            result_json,
                            result,
                        }
                    }
                    Report::FailedRetryable => Completion::FailedRetryable(None),
                    Report::FailedFinal => Completion::FailedFinal(None),
                    Report::Unknown => Completion::Unknown(None),
                };
                let step = Complete {
                    id: id(),
                    fencing_token: token,
                    completion,
                    now: s.now,
                    outputs: outputs(),
                };
                let before = s.record.clone();
                let (_, write) = step.apply(before.as_ref(), s.next_token);
                if !matches!(write, Write::Nothing) {
                    if acquisition != s.acquisitions {
                        s.stale_fence_accepted = true;
                    }
                    // The executor told what happened: settled, unless it
                    // said it cannot tell (then the record says UNKNOWN).
                    s.doubt = false;
                }
                s.record = written(before, write);
                s.executors[e] = Executor::Idle;
            }
            Action::ReconcileAsHolder(e) => {
                let Executor::Holding {
                    token, acquisition, ..
                } = s.executors[e].clone()
                else {
                    return None;
                };
                let before = s.record.clone();
                Self::reconcile(&mut s, Some(token));
                if s.record != before && acquisition != s.acquisitions {
                    s.stale_fence_accepted = true;
                }
                s.executors[e] = Executor::Idle;
            }
            Action::Reconcile => Self::reconcile(&mut s, None),
            Action::Crash(e) => s.executors[e] = Executor::Idle,
            Action::Collect => {
                let due = Collect::new(s.now, Duration::from_millis(RETENTION_TICKS), 1);
                if s.record.as_ref().is_some_and(|r| due.covers(r)) {
                    s.record = None;
                    // Settled and forgotten: a later call is a new operation.
                    s.effects = 0;
                    s.applied = false;
                    s.reborn = true;
                } else {
                    return None;
                }
            }
            Action::Tick => s.now += 1,
        }
        // A record that says the call may have run keeps the key in doubt,
        // and so does such a record vanishing (retention must never do that).
        let doubtful = in_doubt(s.record.as_ref(), s.now);
        s.doubt = doubtful || (s.doubt && s.record.is_none());
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never two live leases for one key", |_, s: &State| {
                s.executors
                    .iter()
                    .filter(|e| e.holds_live_lease(s.now))
                    .count()
                    <= 1
            }),
            Property::always("no completion with a stale fence", |_, s: &State| {
                !s.stale_fence_accepted
            }),
            Property::always(
                "no call that may have run is acquired again",
                |_, s: &State| !s.acquired_in_doubt,
            ),
            Property::always(
                "one life's side effect runs at most once",
                |_, s: &State| s.effects <= 1,
            ),
            Property::sometimes("a retryable failure is retried", |_, s: &State| {
                s.reacquired
            }),
            Property::sometimes(
                "retention collects and the key begins anew",
                |_, s: &State| s.reborn && s.record.is_some(),
            ),
            Property::sometimes("an UNKNOWN is reconciled", |_, s: &State| {
                s.reconciled_unknown
            }),
        ]
    }
}

#[test]
fn the_ledger_state_machine_holds_its_invariants_in_every_interleaving() {
    let started = Instant::now();
    let checker = LedgerModel.checker().spawn_bfs().join();
    checker.assert_properties();
    let (states, unique) = (checker.state_count(), checker.unique_state_count());
    eprintln!(
        "ledger model: {unique} unique states ({states} visited, depth {}) in {:?}",
        checker.max_depth(),
        started.elapsed()
    );
    // The exact size of the space explored: a change of the transitions or
    // of the model that changes it must be looked at, not slip by.
    assert_eq!(unique, EXPECTED_UNIQUE_STATES, "{states} visited");
}

/// The unique states the check above explores.
const EXPECTED_UNIQUE_STATES: usize = 10_244;
