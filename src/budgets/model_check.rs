//! An exhaustive model check of budget charges (issue 30) with
//! `stateright`, beside the ledger's: one budget key, several calls
//! deciding at once (each its own operation), each read–decide–charge
//! step interleaved with the others', with retries of the same operation,
//! releases of calls that failed for good, and a sliding window over a
//! bounded clock.
//!
//! The model holds no rule of its own about what is charged: a decision
//! is [`charge::seen`] and [`charge::charges`] on the usage a store would
//! answer (the live charges in the window, the operation's own left out),
//! the policy is the example's (`used + this_call > limit` forbids), and a
//! charge is written as both stores write it: all or nothing, only if the
//! key's version is still the one the decision read ([`applies`]). What
//! the model adds is the world: concurrency, time, failures.
//!
//! Proven over every interleaving (the `always` properties):
//! - a charge never lands on more than its decision saw used: whatever
//!   was charged to the key since the read, the charge is refused;
//! - the live charges in the window never sum above the limit, which every
//!   allowing decision compared against;
//! - an operation holds at most one live charge on the key (a retry is
//!   charged once).
//!
//! And not vacuous (`sometimes`): a decision's charge is refused because
//! the key moved and it decides again; a released charge lets a later
//! call in; a retry is allowed without a second charge.

use std::time::Instant;

use stateright::{Checker, Model, Property};

use super::charge::{self, BudgetKey, Charge, Meter, Usage};

/// The calls racing on the key, and what each charges.
const AMOUNTS: [i64; 3] = [3, 4, 5];
const CALLS: usize = AMOUNTS.len();
/// The budget's limit.
const LIMIT: i64 = 8;
/// The window, in ticks: a charge at `t` counts until `t + WINDOW`.
const WINDOW: i64 = 2;
/// The last tick: bounds the state space.
const LAST_TICK: i64 = 3;

/// One charge row of the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Row {
    call: usize,
    amount: i64,
    at: i64,
    released: bool,
}

/// Where one call is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Call {
    /// Not decided yet (or a retry about to read again).
    Ready,
    /// Read the key: what the store said.
    Read(Usage),
    /// Answered: allowed or not.
    Done { allowed: bool },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    now: i64,
    version: i64,
    rows: Vec<Row>,
    calls: [Call; CALLS],
    /// Each call retries and fails for good at most once: bounds the
    /// versions, hence the state space.
    retried: [bool; CALLS],
    released: [bool; CALLS],
    /// A charge landed on more than its decision saw used.
    over_seen: bool,
    // What the `sometimes` properties look for.
    stale_refused: bool,
    in_after_release: bool,
    retried_uncharged: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Action {
    Read(usize),
    Decide(usize),
    /// The allowed call failed for good: its charge is released.
    Release(usize),
    /// The same operation asked again (a retry after a lost answer).
    Retry(usize),
    Tick,
}

fn key() -> BudgetKey {
    BudgetKey {
        budget: "b".into(),
        key: "k".into(),
        window_ms: WINDOW,
    }
}

fn meter(call: usize) -> Meter {
    Meter {
        key: key(),
        this_call: AMOUNTS[call],
        limit: LIMIT,
    }
}

/// Whether a row counts at `now`: live, and in the window `(now - WINDOW, now]`.
fn counts(row: &Row, now: i64) -> bool {
    !row.released && row.at > now - WINDOW
}

/// What a store answers `call` about the key now.
fn usage(s: &State, call: usize) -> Usage {
    let live = |r: &&Row| counts(r, s.now);
    Usage {
        used: Some(
            s.rows
                .iter()
                .filter(live)
                .filter(|r| r.call != call)
                .map(|r| r.amount)
                .sum(),
        ),
        version: s.version,
        charged: s.rows.iter().filter(live).any(|r| r.call == call),
    }
}

/// Whether a charge is written: every key it charges is still at the
/// version its decision read (both stores' rule, one key here).
fn applies(version: i64, charges: &[Charge]) -> bool {
    charges.iter().all(|c| c.seen_version == version)
}

fn live_sum(s: &State) -> i64 {
    s.rows
        .iter()
        .filter(|r| counts(r, s.now))
        .map(|r| r.amount)
        .sum()
}

struct BudgetModel;

impl Model for BudgetModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            version: 0,
            rows: Vec::new(),
            calls: std::array::from_fn(|_| Call::Ready),
            retried: [false; CALLS],
            released: [false; CALLS],
            over_seen: false,
            stale_refused: false,
            in_after_release: false,
            retried_uncharged: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (i, call) in s.calls.iter().enumerate() {
            match call {
                Call::Ready => actions.push(Action::Read(i)),
                Call::Read(_) => actions.push(Action::Decide(i)),
                Call::Done { allowed } => {
                    if *allowed
                        && !s.released[i]
                        && s.rows.iter().any(|r| r.call == i && !r.released)
                    {
                        actions.push(Action::Release(i));
                    }
                    if !s.retried[i] {
                        actions.push(Action::Retry(i));
                    }
                }
            }
        }
        if s.now < LAST_TICK {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Read(i) => s.calls[i] = Call::Read(usage(&s, i)),
            Action::Decide(i) => {
                let Call::Read(read) = s.calls[i] else {
                    return None;
                };
                let meters = [meter(i)];
                let seen = charge::seen(&meters, &[read]).ok()?;
                let b = &seen[0];
                if b.used + b.this_call > b.limit {
                    s.calls[i] = Call::Done { allowed: false };
                    return Some(s);
                }
                let charges = charge::charges(&meters, &[read]);
                if charges.is_empty() {
                    // A retry of an operation already charged.
                    s.retried_uncharged = true;
                    s.calls[i] = Call::Done { allowed: true };
                    return Some(s);
                }
                if !applies(s.version, &charges) {
                    // The key moved: decided again on a new read.
                    s.stale_refused = true;
                    s.calls[i] = Call::Ready;
                    return Some(s);
                }
                let now_used = usage(&s, i).used.unwrap_or(i64::MAX);
                if now_used > b.used {
                    s.over_seen = true;
                }
                if s.rows.iter().any(|r| r.released) {
                    s.in_after_release = true;
                }
                // An upsert of the operation's row: a released one charged again.
                s.rows.retain(|r| r.call != i);
                s.rows.push(Row {
                    call: i,
                    amount: charges[0].amount,
                    at: s.now,
                    released: false,
                });
                s.version += 1;
                s.calls[i] = Call::Done { allowed: true };
            }
            Action::Release(i) => {
                s.released[i] = true;
                for r in s.rows.iter_mut().filter(|r| r.call == i) {
                    r.released = true;
                }
            }
            Action::Retry(i) => {
                s.retried[i] = true;
                s.calls[i] = Call::Ready;
            }
            Action::Tick => s.now += 1,
        }
        // Rows that left the window are what the collector deletes.
        let now = s.now;
        s.rows.retain(|r| r.released || r.at > now - WINDOW);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no charge lands on more than its decision saw",
                |_, s: &State| !s.over_seen,
            ),
            Property::always(
                "the live charges never sum above the limit",
                |_, s: &State| live_sum(s) <= LIMIT,
            ),
            Property::always(
                "an operation holds one live charge at most",
                |_, s: &State| {
                    (0..CALLS).all(|i| {
                        s.rows
                            .iter()
                            .filter(|r| r.call == i && counts(r, s.now))
                            .count()
                            <= 1
                    })
                },
            ),
            Property::sometimes(
                "a charge on a moved key is decided again",
                |_, s: &State| s.stale_refused,
            ),
            Property::sometimes("a release lets a later call in", |_, s: &State| {
                s.in_after_release
            }),
            Property::sometimes(
                "a retry is allowed and not charged again",
                |_, s: &State| s.retried_uncharged,
            ),
        ]
    }
}

#[test]
fn budget_charges_never_exceed_what_their_decisions_saw_in_any_interleaving() {
    let started = Instant::now();
    let checker = BudgetModel.checker().spawn_bfs().join();
    checker.assert_properties();
    let (states, unique) = (checker.state_count(), checker.unique_state_count());
    eprintln!(
        "budget model: {unique} unique states ({states} visited, depth {}) in {:?}",
        checker.max_depth(),
        started.elapsed()
    );
    assert_eq!(unique, EXPECTED_UNIQUE_STATES, "{states} visited");
}

/// The unique states the check above explores: a change of the rules or
/// of the model that changes it must be looked at, not slip by.
const EXPECTED_UNIQUE_STATES: usize = 1_124_453;

/// The model can fail: with the version check taken out (a charge written
/// whatever was charged since its read), the checker finds the overspend.
#[test]
fn without_the_version_check_the_checker_finds_an_overspend() {
    struct Unchecked;
    impl Model for Unchecked {
        type State = State;
        type Action = Action;
        fn init_states(&self) -> Vec<State> {
            BudgetModel.init_states()
        }
        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            BudgetModel.actions(s, actions);
        }
        fn next_state(&self, last: &State, action: Action) -> Option<State> {
            let mut last = last.clone();
            if let Action::Decide(i) = action
                && let Call::Read(read) = last.calls[i]
            {
                // Pretend the key never moved.
                last.version = read.version;
            }
            BudgetModel.next_state(&last, action)
        }
        fn properties(&self) -> Vec<Property<Self>> {
            vec![Property::always(
                "the live charges never sum above the limit",
                |_, s: &State| live_sum(s) <= LIMIT,
            )]
        }
    }
    let checker = Unchecked.checker().spawn_bfs().join();
    assert!(
        checker
            .discovery("the live charges never sum above the limit")
            .is_some(),
        "the unchecked model must overspend somewhere"
    );
}
