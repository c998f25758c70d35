//! Group commit for the ledger on SQLite: many transitions, one
//! transaction, one sync of the write-ahead log.
//!
//! With `synchronous = FULL` every commit waits for the disk, and with one
//! connection the transitions of concurrent executors queue behind each
//! other's syncs. Here a transition is queued, and one writer (the
//! *leader*, on a blocking thread) takes the connection, then up to
//! [`MAX_BATCH`] queued transitions, in arrival order, into one
//! `BEGIN IMMEDIATE` transaction, each under its own savepoint, commits
//! once, and only then answers each of them; it goes on with the next batch
//! until the queue is empty. So:
//!
//! - each transition reads what the ones before it in the batch wrote: the
//!   batch is exactly the serial order of its transitions, and every
//!   exactly-once rule of the ledger holds as it did one by one;
//! - one that fails (a conflict, a corrupt row) rolls back to its
//!   savepoint alone and gets its error; the others are unaffected;
//! - no answer is given before the commit that makes it durable: if the
//!   commit fails, every transition of the batch gets the error and none
//!   of them happened (the process dying mid-batch is the same as dying
//!   mid-transaction before);
//! - every queued transition is taken by the leader: whether one leads is
//!   decided under the queue's lock, the call that queues into an idle
//!   queue starts the leader, and the leader stops only when it finds the
//!   queue empty under that lock. A leader that cannot go on (a poisoned
//!   lock, a panic, a runtime that never ran it) answers every queued
//!   transition with an error and leaves the queue idle for the next call.
//!
//! One leader at a time, instead of one blocking task per transition
//! contending for the connection, saves a thread hand-off and a lock
//! convoy per transition (`cargo bench --bench perf -- --ledger-only`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use super::apply_transition;
use crate::ledger::Transition;
use crate::store::StoreError;

/// A write the one writer runs inside its batch: a ledger transition, or
/// a budget charge ([`super::ChargeStep`]).
pub(super) trait Step: Send + 'static {
    /// What the caller is told.
    type Answer: Send + 'static;

    /// Runs inside the batch's transaction (under the step's savepoint).
    fn run(&self, tx: &Connection) -> Result<Self::Answer, StoreError>;
}

impl<T: Transition> Step for T {
    type Answer = T::Answer;

    fn run(&self, tx: &Connection) -> Result<T::Answer, StoreError> {
        apply_transition(tx, self)
    }
}

/// The most transitions one commit carries: bounds the latency a
/// transition queued behind a long batch can see.
pub(super) const MAX_BATCH: usize = 64;

/// A queued transition: applied inside a batch, answered after its commit.
trait Queued: Send {
    /// Applies the transition under its own savepoint of `tx`, keeping the
    /// answer until the batch is settled.
    fn apply(&mut self, tx: &mut rusqlite::Transaction<'_>);

    /// Sends the kept answer if the batch committed, else the commit's
    /// error.
    fn settle(self: Box<Self>, commit: Result<(), &rusqlite::Error>);

    /// Answers with `error`, the transition not applied.
    fn refuse(self: Box<Self>, error: StoreError);
}

struct Job<T: Step> {
    step: T,
    answer: Option<Result<T::Answer, StoreError>>,
    reply: oneshot::Sender<Result<T::Answer, StoreError>>,
}

impl<T: Step> Queued for Job<T> {
    fn apply(&mut self, tx: &mut rusqlite::Transaction<'_>) {
        let answer = tx.savepoint().map_err(StoreError::from).and_then(|sp| {
            // Dropped without a commit on an error: rolled back to here.
            let answer = self.step.run(&sp)?;
            sp.commit()?;
            Ok(answer)
        });
        self.answer = Some(answer);
    }

    fn settle(self: Box<Self>, commit: Result<(), &rusqlite::Error>) {
        let answer = match (commit, self.answer) {
            (Ok(()), Some(answer)) => answer,
            (Ok(()), None) => Err(StoreError::Task(
                "a ledger transition was not applied".into(),
            )),
            (Err(e), _) => Err(again(e)),
        };
        // The caller may have gone away (its request was cancelled); the
        // transition happened all the same, as it would have one by one.
        let _ = self.reply.send(answer);
    }

    fn refuse(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }
}

/// The transitions waiting for the leader, and whether one runs.
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<State>,
    #[cfg(test)]
    pub(super) commits: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Box<dyn Queued>>,
    /// A leader runs, or has been started: it will take what is queued.
    leading: bool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waiting = self.state.lock().map_or(0, |q| q.waiting.len());
        f.debug_struct("Queue").field("waiting", &waiting).finish()
    }
}

impl Queue {
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.state.lock().map_or(0, |q| q.waiting.len())
    }

    /// Queues `job`; true when no leader runs, and the caller must start one.
    fn push(&self, job: Box<dyn Queued>) -> Result<bool, StoreError> {
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        state.waiting.push_back(job);
        let start = !state.leading;
        state.leading = true;
        Ok(start)
    }

    /// The next batch, or `None` when the queue is empty: the leader stops,
    /// and the next call to queue starts another.
    fn take(&self) -> Option<Vec<Box<dyn Queued>>> {
        let mut state = self.state.lock().ok()?;
        if state.waiting.is_empty() {
            state.leading = false;
            return None;
        }
        let n = state.waiting.len().min(MAX_BATCH);
        Some(state.waiting.drain(..n).collect())
    }

    /// Answers everything queued with `error` and leaves the queue idle.
    fn refuse_all(&self, error: &dyn Fn() -> StoreError) {
        let jobs: Vec<_> = match self.state.lock() {
            Ok(mut state) => {
                state.leading = false;
                state.waiting.drain(..).collect()
            }
            // Poisoned: no call can queue any more, each gets the error.
            Err(poisoned) => poisoned.into_inner().waiting.drain(..).collect(),
        };
        for job in jobs {
            job.refuse(error());
        }
    }
}

/// Runs `step` in the next batch on `conn` and returns its answer once the
/// batch has committed.
pub(super) async fn run<T: Step>(
    conn: &Arc<Mutex<Connection>>,
    queue: &Arc<Queue>,
    step: T,
) -> Result<T::Answer, StoreError> {
    let (reply, answer) = oneshot::channel();
    let start = queue.push(Box::new(Job {
        step,
        answer: None,
        reply,
    }))?;
    if start {
        let leader = Leader {
            queue: Arc::clone(queue),
            done: false,
        };
        let conn = Arc::clone(conn);
        // Not awaited: every queued transition is answered through its
        // own channel, by this leader or, if it fails, by its `Drop`.
        drop(tokio::task::spawn_blocking(move || leader.lead(&conn)));
    }
    answer
        .await
        .map_err(|_| StoreError::Task("the ledger batch ended without an answer".into()))?
}

/// The one writer: batches until the queue is empty.
struct Leader {
    queue: Arc<Queue>,
    /// Stopped on an empty queue (not by a panic, nor dropped unrun).
    done: bool,
}

impl Leader {
    /// Takes the connection, then whatever is queued, runs it as one batch,
    /// and again, until the queue is empty.
    fn lead(mut self, conn: &Mutex<Connection>) {
        loop {
            let Ok(mut conn) = conn.lock() else {
                self.queue.refuse_all(&poisoned);
                self.done = true;
                return;
            };
            let Some(mut jobs) = self.queue.take() else {
                self.done = true;
                return;
            };
            let outcome = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .and_then(|mut tx| {
                    for job in &mut jobs {
                        job.apply(&mut tx);
                    }
                    tx.commit()
                });
            drop(conn);
            #[cfg(test)]
            if outcome.is_ok() {
                self.queue
                    .commits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            for job in jobs {
                job.settle(outcome.as_ref().map(|_| ()));
            }
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if !self.done {
            // A panic mid-batch, or a runtime shutting down before this
            // leader ran: nothing queued is left waiting for it.
            self.queue.refuse_all(&|| {
                StoreError::Task("the ledger's writer stopped; nothing was done".into())
            });
        }
    }
}

/// The commit's error, for each transition of the batch: SQLite's own
/// code kept (so a busy database stays a retryable answer).
fn again(e: &rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(code, message) => {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(*code, message.clone()))
        }
        other => StoreError::Task(format!("the ledger batch did not commit: {other}")),
    }
}

fn poisoned() -> StoreError {
    StoreError::Task("the connection lock is poisoned".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger;

    fn queued(
        queue: &Queue,
        key: &str,
    ) -> (
        bool,
        oneshot::Receiver<Result<ledger::BeginAnswer, StoreError>>,
    ) {
        let (reply, answer) = oneshot::channel();
        let start = queue
            .push(Box::new(Job {
                step: super::super::tests::begin_of(key),
                answer: None,
                reply,
            }))
            .unwrap();
        (start, answer)
    }

    /// Only the call that queues into an idle queue starts a leader; a
    /// leader that stops on the empty queue leaves it idle for the next.
    #[test]
    fn one_leader_at_a_time_and_none_left_waiting() {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::migrate(&mut conn).unwrap();
        let conn = Mutex::new(conn);
        let queue = Arc::new(Queue::default());
        let (first, mut a) = queued(&queue, "a");
        let (second, mut b) = queued(&queue, "b");
        assert_eq!((first, second), (true, false));
        Leader {
            queue: Arc::clone(&queue),
            done: false,
        }
        .lead(&conn);
        for answer in [a.try_recv(), b.try_recv()] {
            assert_eq!(
                answer.unwrap().unwrap().outcome,
                ledger::BeginOutcome::Acquired
            );
        }
        assert_eq!(queue.waiting(), 0);
        let (third, _c) = queued(&queue, "c");
        assert!(third, "the stopped leader left the queue idle");
    }

    /// A leader dropped before it ran (or unwound by a panic) answers
    /// every queued transition with an error instead of leaving it
    /// waiting, and a later call starts a new leader.
    #[test]
    fn a_leader_that_never_runs_refuses_what_was_queued() {
        let queue = Arc::new(Queue::default());
        let (start, mut a) = queued(&queue, "a");
        assert!(start);
        let (_, mut b) = queued(&queue, "b");
        drop(Leader {
            queue: Arc::clone(&queue),
            done: false,
        });
        for answer in [a.try_recv(), b.try_recv()] {
            let error = answer.unwrap().unwrap_err();
            assert_eq!(
                error.to_string(),
                StoreError::Task("the ledger's writer stopped; nothing was done".into())
                    .to_string()
            );
        }
        let (again, _c) = queued(&queue, "c");
        assert!(again);
    }
}
