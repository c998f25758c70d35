//! The execution ledger (DESIGN §5): the state machine that makes a retry
//! the same operation, never a second one.
//!
//! Rules only, no IO. A store backend runs one [`Transition`] inside one
//! database transaction: it reads the record of `(tenant, idempotency key)`,
//! calls [`Transition::apply`] with it and a fresh fencing token, writes the
//! [`Write`] that comes back (an update only if the record is still at the
//! revision it read) and commits (SQLite commits a group of transitions
//! at once, each under its own savepoint: the same serial order). Every rule of §5 lives in this module,
//! once; the backends (SQLite and PostgreSQL) hold none. This module and
//! `transitions` must not do IO, log, or know about gRPC; [`desk`] is the
//! IO side, what executors call.
//!
//! | record is | `BeginExecution` answers |
//! |---|---|
//! | absent | ACQUIRED: attempt 1, a fencing token, a lease |
//! | IN_PROGRESS, lease live | IN_PROGRESS with `operation_in_progress` and `retry_after_ms` (time to lease expiry, at most [`MAX_RETRY_AFTER_MS`]); never a second executor, never the holder's token |
//! | IN_PROGRESS, lease expired | RECONCILE_REQUIRED (`reconcile_required`, reason `lease_expired`): it may have run |
//! | SUCCEEDED | COMPLETED with the stored result |
//! | FAILED_RETRYABLE | ACQUIRED (attempt + 1) while the budget lasts, else the record becomes FAILED_FINAL and the answer is COMPLETED |
//! | UNKNOWN | RECONCILE_REQUIRED (`reconcile_required`, reason: the stored cause, `timeout_unknown` or `output_invalid`) |
//! | FAILED_FINAL | COMPLETED with the stored error |
//! | another tool or `arguments_sha256` | REFUSED with `idempotency_key_reused`; nothing changes |
//!
//! Decisions this module makes, beyond the table:
//! - **An unretried FAILED_RETRYABLE lapses** ([`Lapse`]): unchanged for
//!   the ticket TTL plus [`LAPSE_GRACE`], every ticket issued before its
//!   failure has expired, and the record becomes FAILED_FINAL (the call did
//!   not happen and will not: a later Begin answers COMPLETED), its budget
//!   charges released in the same transaction (DESIGN §13.1).
//! - **Retention** ([`Collect`]) deletes only settled records
//!   ([`ExecutionState::COLLECTABLE`]) unchanged for the retention period.
//!   UNKNOWN and IN_PROGRESS (live lease or not) are kept however old, still
//!   answering RECONCILE_REQUIRED, until reconciled: a call that may have run
//!   is never ACQUIRED again.
//! - **Fencing tokens** are secrets: each acquisition (the first attempt, a
//!   retry after FAILED_RETRYABLE) draws a fresh random 63-bit token
//!   ([`fresh_fencing_token`]), stored with the attempt and told only to the
//!   executor that acquired it. The attempt number is the monotonic fence;
//!   the token proves who holds it. A completion, or a reconciliation that
//!   names a token, whose token is not the record's current one is
//!   `lease_lost`: a token of an earlier attempt, or of an earlier life of
//!   the key before retention collected it, matches with probability 2^-63,
//!   and another executor of the tenant cannot guess the holder's.
//! - **A record belongs to a decision**: `BeginExecution` needs the
//!   execution ticket of an ALLOW decision of the same tenant, subject, key,
//!   hash and tool ([`TicketKeys`]); `Authorize` with `begin_execution`
//!   begins under its own decision. Without one nothing is read or written.
//! - **Reconciling** needs the holder's token (the executor that reported
//!   UNKNOWN, or whose lease expired) or the caller's `reconcile` grant; a
//!   reconciliation without a token is checked by the desk, one with a token
//!   by [`Reconcile`] itself.
//! - **A completion after its lease expired** is accepted if its token is
//!   still current and the record still IN_PROGRESS. An expired lease hands
//!   the key to nobody (Begin answers RECONCILE_REQUIRED, never ACQUIRED), so
//!   a still-current token proves nobody else ran it, and the late executor
//!   is the one party that knows what happened: refusing its report would
//!   only turn a known outcome into an unknown one. Once a reconciliation has
//!   settled the record, the late completion is `lease_lost`.
//! - **A completion that already landed** (same token, same outcome) is
//!   acknowledged again, unchanged: an executor whose answer was lost may
//!   simply repeat its call. Any other completion of a record that is not
//!   IN_PROGRESS under that token is `lease_lost` and changes nothing.
//! - **`timeout_unknown`** is what a completion with status UNKNOWN stores
//!   (the executor gave up waiting and cannot tell whether the side effect
//!   happened); `output_invalid` is what a success whose result fails the
//!   tool's `outputSchema` stores (the side effect happened, the result is
//!   quarantined in `result_json`). Both leave the record UNKNOWN, and a
//!   Begin on it answers `reconcile_required` naming that cause.
//! - **The retry budget** (`maxAttempts` of the tool, else the configured
//!   default) is fixed in the record when the operation begins. A retryable
//!   failure of the last attempt, reported or reconciled, is stored as
//!   FAILED_FINAL at once, so the executor learns it in the same answer.
//! - **Reconciliation** settles an UNKNOWN record, or an IN_PROGRESS one
//!   whose lease expired: `applied` stores SUCCEEDED with the given result
//!   (checked against `outputSchema` like a completion; an invalid one is
//!   refused with `output_invalid` and changes nothing), not applied stores
//!   FAILED_RETRYABLE (or FAILED_FINAL when the budget is spent). A live
//!   lease is `operation_in_progress`; a record already settled the same way
//!   is acknowledged, one settled otherwise is `lease_lost`.

pub mod desk;
mod ticket;
mod transitions;

#[cfg(test)]
mod model_check;
#[cfg(test)]
mod tests;

use std::time::Duration;

use serde_json::Value;

pub use ticket::{KEY_BYTES, TicketClaims, TicketKey, TicketKeys, TicketRefusal};
pub use transitions::{
    Begin, BeginAnswer, BeginOutcome, Complete, Completion, Reconcile, RecordSummary, Settled,
    Verdict,
};

use crate::clock::UnixMillis;
use crate::envelope::Envelope;
use crate::tools::Violation;

/// A fresh fencing token: random, 63 bits (it fits a signed 64-bit
/// column), never 0.
///
/// # Errors
/// When the operating system has no randomness to give.
pub fn fresh_fencing_token() -> Result<u64, getrandom::Error> {
    Ok((getrandom::u64()? >> 1).max(1))
}

/// The longest `retry_after_ms` an IN_PROGRESS answer suggests, however
/// long the lease: polling once a second is cheap, and the holder may
/// finish long before its lease ends.
pub const MAX_RETRY_AFTER_MS: u64 = 1_000;

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecutionState {
    InProgress,
    Succeeded,
    FailedRetryable,
    Unknown,
    FailedFinal,
}

impl ExecutionState {
    /// Every state, in the order of DESIGN §5.
    pub const ALL: [Self; 5] = [
        Self::InProgress,
        Self::Succeeded,
        Self::FailedRetryable,
        Self::Unknown,
        Self::FailedFinal,
    ];

    /// The stored name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "IN_PROGRESS",
            Self::Succeeded => "SUCCEEDED",
            Self::FailedRetryable => "FAILED_RETRYABLE",
            Self::Unknown => "UNKNOWN",
            Self::FailedFinal => "FAILED_FINAL",
        }
    }

    /// The states retention may collect: those that say definitively what
    /// the call did (SUCCEEDED, FAILED_FINAL) or that it did not take effect
    /// (FAILED_RETRYABLE, which Begin re-acquires anyway). UNKNOWN and
    /// IN_PROGRESS, live lease or not, are absent: the call may have run,
    /// and forgetting the record would hand the key out as ACQUIRED again.
    /// Backends that filter in SQL derive their state list from this slice.
    pub const COLLECTABLE: [Self; 3] = [Self::Succeeded, Self::FailedRetryable, Self::FailedFinal];

    /// Whether retention may collect a record in this state (it is in
    /// [`Self::COLLECTABLE`]): it is settled, and no call of it may have run
    /// without the ledger knowing the outcome.
    #[must_use]
    pub fn collectable(self) -> bool {
        Self::COLLECTABLE.contains(&self)
    }

    /// Parses a stored name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }
}

/// An error as the ledger keeps it: one of ours (an [`Envelope`] copied
/// with its fixed row) or the executor's own report of a failure, whose
/// code may be any string the executor uses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordedError {
    pub code: String,
    pub category: String,
    pub message: String,
    pub retryable: bool,
    pub resolution: String,
    pub expose_to_model: bool,
    pub expose_to_user: bool,
    /// A JSON object as text.
    pub details_json: String,
}

impl From<&Envelope> for RecordedError {
    fn from(e: &Envelope) -> Self {
        let info = e.info();
        Self {
            code: info.code.to_owned(),
            category: info.category.to_owned(),
            message: e.message.clone(),
            retryable: info.retryable,
            resolution: info.resolution.as_str().to_owned(),
            expose_to_model: info.expose_to_model,
            expose_to_user: info.expose_to_user,
            details_json: e.details_json(),
        }
    }
}

/// Which record: the ledger is keyed by tenant and idempotency key, and a
/// tenant never sees another's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionId {
    pub tenant_id: String,
    pub idempotency_key: String,
}

/// One operation's record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecutionRecord {
    pub tenant_id: String,
    pub idempotency_key: String,
    pub tool: String,
    pub arguments_sha256: String,
    pub state: ExecutionState,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The retry budget, fixed when the operation began.
    pub max_attempts: u32,
    /// The secret token of the latest acquisition.
    pub fencing_token: u64,
    /// When the latest acquisition's lease ends.
    pub lease_expires_at: UnixMillis,
    /// SUCCEEDED: the result; UNKNOWN after `output_invalid`: the quarantined result.
    pub result_json: Option<String>,
    pub error: Option<RecordedError>,
    pub created_at: UnixMillis,
    pub updated_at: UnixMillis,
    /// Bumped by every write; updates are conditional on it.
    pub revision: u64,
}

impl ExecutionRecord {
    /// Whether the latest acquisition's lease still runs.
    #[must_use]
    pub const fn lease_live(&self, now: UnixMillis) -> bool {
        self.lease_expires_at > now
    }

    /// Whether the budget allows another attempt after this one.
    #[must_use]
    pub const fn budget_left(&self) -> bool {
        self.attempt < self.max_attempts
    }
}

/// What one transition writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Nothing,
    /// A new record; there was none.
    Insert(ExecutionRecord),
    /// Replaces the record, only if it is still at `previous_revision`.
    Update {
        record: ExecutionRecord,
        previous_revision: u64,
    },
}

impl Write {
    /// The record written, if any.
    #[must_use]
    pub const fn record(&self) -> Option<&ExecutionRecord> {
        match self {
            Self::Nothing => None,
            Self::Insert(record) | Self::Update { record, .. } => Some(record),
        }
    }
}

/// One step of the state machine, run by a store inside one transaction.
pub trait Transition: Send + 'static {
    /// What the caller is told.
    type Answer: Send + 'static;

    /// The record this transition reads and writes.
    fn id(&self) -> &ExecutionId;

    /// The answer and the write, given the record as it is now (`None`:
    /// absent) and `next_token`, a fresh fencing token
    /// ([`fresh_fencing_token`]) that an acquisition stores and hands out.
    fn apply(&self, current: Option<&ExecutionRecord>, next_token: u64) -> (Self::Answer, Write);
}

/// Checks results against tools' `outputSchema`.
pub trait OutputSchemas: Send + Sync + std::fmt::Debug {
    /// The violations of `result` against `tool`'s output schema (empty when
    /// it is valid or the tool has none); `None` when no contract of that
    /// name is loaded.
    fn check(&self, tool: &str, result: &Value) -> Option<Vec<Violation>>;
}

/// Settings of the ledger (`[ledger]` in `toolgate.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerConfig {
    /// The retry budget of a tool whose contract has no `maxAttempts`.
    pub default_max_attempts: u32,
    /// Added to the tool's `timeoutMs` when the executor asks for no
    /// particular lease: time to report the outcome after the tool returns.
    pub lease_margin: Duration,
    /// The longest lease granted, whatever is asked.
    pub max_lease: Duration,
    /// How long a record is kept after its last change.
    pub retention: Duration,
    /// How often expired records are collected.
    pub collect_interval: Duration,
    /// How many records one collecting transaction deletes at most.
    pub collect_batch: usize,
    /// How long an execution ticket of an ALLOW decision stays valid.
    pub ticket_ttl: Duration,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            default_max_attempts: 3,
            lease_margin: Duration::from_secs(5),
            max_lease: Duration::from_secs(15 * 60),
            retention: Duration::from_secs(24 * 3600),
            collect_interval: Duration::from_secs(60),
            collect_batch: 500,
            ticket_ttl: Duration::from_secs(5 * 60),
        }
    }
}

impl LedgerConfig {
    /// The lease granted for `requested_ms`: 0 means the tool's timeout
    /// plus the margin; anything is cut to `max_lease` (and is at least 1 ms).
    #[must_use]
    pub fn lease_ms(&self, requested_ms: u32, tool_timeout_ms: u64) -> u64 {
        let wanted = if requested_ms == 0 {
            tool_timeout_ms.saturating_add(millis(self.lease_margin))
        } else {
            u64::from(requested_ms)
        };
        wanted.clamp(1, millis(self.max_lease).max(1))
    }

    /// The retry budget of a tool whose contract says `contract`.
    #[must_use]
    pub fn max_attempts(&self, contract: Option<u32>) -> u32 {
        contract.unwrap_or(self.default_max_attempts).max(1)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a lapse sweep allows for between replicas' clocks: a record lapses
/// this long after the last ticket that could retry it expired.
pub const LAPSE_GRACE: Duration = Duration::from_secs(60);

/// Which FAILED_RETRYABLE records nobody retried in time ([`Lapse::covers`]):
/// unchanged since `updated_at_or_before`, so every ticket issued before
/// the failure has expired. A backend makes at most `limit` of them
/// FAILED_FINAL (keeping `updated_at`, revision + 1) and releases their
/// live charges at `now`, in one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lapse {
    pub updated_at_or_before: UnixMillis,
    pub now: UnixMillis,
    pub limit: usize,
}

impl Lapse {
    /// The sweep due at `now` for tickets valid `ticket_ttl`.
    #[must_use]
    pub fn new(now: UnixMillis, ticket_ttl: Duration, limit: usize) -> Self {
        let wait =
            i64::try_from(ticket_ttl.saturating_add(LAPSE_GRACE).as_millis()).unwrap_or(i64::MAX);
        Self {
            updated_at_or_before: now.saturating_sub(wait),
            now,
            limit: limit.max(1),
        }
    }

    /// Whether `record` lapses.
    #[must_use]
    pub fn covers(&self, record: &ExecutionRecord) -> bool {
        record.state == ExecutionState::FailedRetryable
            && record.updated_at <= self.updated_at_or_before
    }
}

/// An operation a lapse sweep made FAILED_FINAL, and the budgets it
/// released (one name per charge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lapsed {
    pub tenant_id: String,
    pub idempotency_key: String,
    pub tool: String,
    pub arguments_sha256: String,
    pub attempt: u32,
    pub released: Vec<String>,
}

/// Which records retention deletes: settled ones ([`ExecutionState::COLLECTABLE`])
/// unchanged for the retention period. A record whose call may have run
/// (UNKNOWN, or IN_PROGRESS whether or not its lease expired) is never
/// collected, however old: it is kept, answering RECONCILE_REQUIRED, until a
/// reconciliation settles it, and ages from then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collect {
    /// Settled records last changed at or before this instant are due.
    pub updated_at_or_before: UnixMillis,
    /// The most one transaction deletes, so none holds the store long.
    pub limit: usize,
}

impl Collect {
    /// The collection due at `now`.
    #[must_use]
    pub fn new(now: UnixMillis, retention: Duration, limit: usize) -> Self {
        let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        Self {
            updated_at_or_before: now.saturating_sub(retention),
            limit: limit.max(1),
        }
    }

    /// Whether `record` is due. A backend deletes exactly these (in its own
    /// query language, its state filter built from
    /// [`ExecutionState::COLLECTABLE`]), at most `limit` per transaction.
    #[must_use]
    pub fn covers(&self, record: &ExecutionRecord) -> bool {
        record.updated_at <= self.updated_at_or_before && record.state.collectable()
    }
}
