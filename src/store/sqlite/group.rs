//! Group commit for the ledger on SQLite: many transitions, one
//! transaction, one sync of the write-ahead log.
//!
//! With `synchronous = FULL` every commit waits for the disk, and with one
//! connection the transitions of concurrent executors queue behind each
//! other's syncs. Here a transition is queued; whichever call next holds
//! the connection (the *leader*) takes up to [`MAX_BATCH`] queued
//! transitions, in arrival order, into one `BEGIN IMMEDIATE` transaction,
//! each under its own savepoint, commits once, and only then answers each
//! of them. So:
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
//! - every queued transition is taken by some leader: each call leads
//!   after queueing its own, and a leader that finds the queue non-empty
//!   takes at least one, so the queue never holds more transitions than
//!   there are leaders still to run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use super::apply_transition;
use crate::ledger::Transition;
use crate::store::StoreError;

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
}

struct Job<T: Transition> {
    step: T,
    answer: Option<Result<T::Answer, StoreError>>,
    reply: oneshot::Sender<Result<T::Answer, StoreError>>,
}

impl<T: Transition> Queued for Job<T> {
    fn apply(&mut self, tx: &mut rusqlite::Transaction<'_>) {
        let answer = tx.savepoint().map_err(StoreError::from).and_then(|sp| {
            // Dropped without a commit on an error: rolled back to here.
            let answer = apply_transition(&sp, &self.step)?;
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
}

/// The transitions waiting for a leader.
#[derive(Default)]
pub(super) struct Queue {
    waiting: Mutex<VecDeque<Box<dyn Queued>>>,
    #[cfg(test)]
    pub(super) commits: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waiting = self.waiting.lock().map_or(0, |q| q.len());
        f.debug_struct("Queue").field("waiting", &waiting).finish()
    }
}

impl Queue {
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.waiting.lock().map_or(0, |q| q.len())
    }

    fn push(&self, job: Box<dyn Queued>) -> Result<(), StoreError> {
        self.waiting.lock().map_err(|_| poisoned())?.push_back(job);
        Ok(())
    }

    fn take(&self) -> Result<Vec<Box<dyn Queued>>, StoreError> {
        let mut waiting = self.waiting.lock().map_err(|_| poisoned())?;
        let n = waiting.len().min(MAX_BATCH);
        Ok(waiting.drain(..n).collect())
    }
}

/// Runs `step` in the next batch on `conn` and returns its answer once the
/// batch has committed.
pub(super) async fn run<T: Transition>(
    conn: &Arc<Mutex<Connection>>,
    queue: &Arc<Queue>,
    step: T,
) -> Result<T::Answer, StoreError> {
    let (reply, answer) = oneshot::channel();
    queue.push(Box::new(Job {
        step,
        answer: None,
        reply,
    }))?;
    let conn = Arc::clone(conn);
    let leader_queue = Arc::clone(queue);
    tokio::task::spawn_blocking(move || lead(&conn, &leader_queue))
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
    // Ours was in this leader's batch or in an earlier one's; either way it
    // is answered, or its sender was dropped by a panic mid-batch.
    answer
        .await
        .map_err(|_| StoreError::Task("the ledger batch ended without an answer".into()))?
}

/// Takes the connection, then whatever is queued (possibly nothing: an
/// earlier leader took it), and runs it as one batch.
fn lead(conn: &Mutex<Connection>, queue: &Queue) -> Result<(), StoreError> {
    let mut conn = conn.lock().map_err(|_| poisoned())?;
    let mut jobs = queue.take()?;
    if jobs.is_empty() {
        return Ok(());
    }
    let outcome = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .and_then(|mut tx| {
            for job in &mut jobs {
                job.apply(&mut tx);
            }
            tx.commit()
        });
    #[cfg(test)]
    if outcome.is_ok() {
        queue
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    for job in jobs {
        job.settle(outcome.as_ref().map(|_| ()));
    }
    Ok(())
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
