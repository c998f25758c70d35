//! Persistent state: approvals, the execution ledger and the entity store.
//!
//! [`Store`] is the one interface every backend implements with the same
//! semantics; each method is one database transaction. Backends touch the
//! outside world and hold no authorization rules of their own: the ledger's
//! state machine is [`crate::ledger`], which a backend runs inside its
//! transaction (see [`Store::begin_execution`]).
//!
//! Two backends: [`SqliteStore`], one embedded file for one sidecar, and
//! [`PostgresStore`], one database shared by many replicas (which also
//! relays approval events between them, see
//! [`Store::relay_approval_events`]).

mod open;
mod postgres;
#[cfg(any(test, feature = "test-support"))]
pub mod scratch;
mod sqlite;

#[cfg(test)]
mod budget_suite;
#[cfg(test)]
mod entity_suite;
#[cfg(test)]
mod gateway_suite;
#[cfg(test)]
mod machine_suite;
mod session_rows;
#[cfg(test)]
mod session_suite;
#[cfg(test)]
mod suite;

pub use open::open;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;
// The answers of the approval calls are the approval rules' own types.
pub use crate::approvals::{ApprovalDecision, ApprovalUse, DecideOutcome, GatewayApproval};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::approvals::{ApprovalEvents, ApprovalRecord, ApprovalStatus, NewApproval};
use crate::budgets::{BudgetKey, Charge, SessionRecord, SessionState, Usage};
use crate::clock::UnixMillis;
use crate::entities::{EntityKey, EntityWalk, StoredEntity};
use crate::ledger::{
    self, BeginAnswer, Collect, ExecutionRecord, ExecutionState, Lapse, Lapsed, RecordedError,
    Settled, TicketKey,
};
use crate::tools::Risk;

/// Why the store could not answer. Messages are for logs, never for the model.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store at `{path}`: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot create the store directory `{path}`: {source}")]
    CreateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the store schema is version {found}, newer than this binary knows ({known})")]
    SchemaTooNew { found: i64, known: i64 },
    #[error("a stored row is corrupt: {0}")]
    Corrupt(String),
    #[error("the store task failed: {0}")]
    Task(String),
    #[error("unsupported store url `{0}` (use sqlite:///path/file.db or postgres://…)")]
    UnsupportedUrl(String),
    #[error("the record changed under a transition (expected revision {expected})")]
    Conflict { expected: u64 },
    #[error("invalid postgres url: {0}")]
    PostgresUrl(String),
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("the postgres connection pool: {0}")]
    Pool(String),
    #[error("the database did not answer within {ms} ms")]
    Timeout { ms: u128 },
    #[error("the transaction conflicted with concurrent ones {tries} times; retry")]
    Contended { tries: u32 },
    #[error("the operating system gave no randomness")]
    Random,
    #[error("too many approvals are pending ({})", .0.as_str())]
    PendingLimit(crate::approvals::PendingScope),
}

/// Settings of a shared database (`[store]` in `toolgate.toml`); the
/// embedded SQLite file needs none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreSettings {
    /// The most connections one sidecar holds.
    pub pool_size: usize,
    /// The longest wait for a connection: a new one's TCP connect and
    /// login, or a free one from a full pool.
    pub connect_timeout: Duration,
    /// The longest one statement may run (the server's
    /// `statement_timeout`, lock waits included), and the client's bound on
    /// one whole transaction.
    pub statement_timeout: Duration,
    /// How often the server checks that the store answers, for health.
    pub health_interval: Duration,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            pool_size: 16,
            connect_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            health_interval: Duration::from_secs(1),
        }
    }
}

impl StoreSettings {
    /// The longest any one store call takes before it fails: a connection,
    /// then the transaction (retries of a conflicting transaction included).
    #[must_use]
    pub fn call_bound(&self) -> Duration {
        self.connect_timeout.saturating_add(self.statement_timeout)
    }
}

/// Counts one tenant's PENDING, unexpired approvals: of the subject `?2`
/// (`$2`) and of the whole tenant `?1` (`$1`), unexpired after `?3` (`$3`).
const PENDING_COUNTS: &str = "SELECT \
     COUNT(*) FILTER (WHERE requester_subject_id = {2}), COUNT(*) \
     FROM approvals WHERE tenant_id = {1} AND status = 'PENDING' AND expires_at > {3}";

/// [`PENDING_COUNTS`] with the backend's placeholders.
fn pending_counts_sql(mark: char) -> String {
    PENDING_COUNTS
        .replace("{1}", &format!("{mark}1"))
        .replace("{2}", &format!("{mark}2"))
        .replace("{3}", &format!("{mark}3"))
}

/// The columns of an approval, in the order every backend reads them.
const APPROVAL_COLUMNS: &str = "approval_id, tenant_id, requester_subject_id, agent_id, tool, tool_version, risk, \
     arguments_sha256, display_arguments, request_id, status, created_at, expires_at, decided_by, decided_at, \
     reason, consumed_by_idempotency_key, why";

/// Marks FAILED_FINAL, oldest failure first, the records [`Lapse::covers`]
/// (`{mark}1`: updated at or before; `{mark}2`: the most), the inner
/// select ending with `lock`; a row is checked again when written. The
/// record keeps its `updated_at`: it ages out of retention from its failure.
fn lapse_sql(mark: char, lock: &str) -> String {
    format!(
        "UPDATE executions SET state = 'FAILED_FINAL', revision = revision + 1 \
         WHERE state = 'FAILED_RETRYABLE' AND (tenant_id, idempotency_key) IN \
         (SELECT tenant_id, idempotency_key FROM executions \
         WHERE state = 'FAILED_RETRYABLE' AND updated_at <= {mark}1 ORDER BY updated_at LIMIT {mark}2{lock}) \
         RETURNING tenant_id, idempotency_key, tool, arguments_sha256, attempt"
    )
}

/// The columns of an execution record, in the order every backend reads them.
const EXECUTION_COLUMNS: &str = "tenant_id, idempotency_key, tool, arguments_sha256, state, attempt, \
     max_attempts, fencing_token, lease_expires_at, result_json, error_json, created_at, updated_at, revision";

/// How a [`RecordedError`] is kept: a JSON object of its fields.
fn error_to_json(e: &RecordedError) -> String {
    serde_json::json!({
        "code": e.code,
        "category": e.category,
        "message": e.message,
        "retryable": e.retryable,
        "resolution": e.resolution,
        "expose_to_model": e.expose_to_model,
        "expose_to_user": e.expose_to_user,
        "details_json": e.details_json,
    })
    .to_string()
}

fn error_from_json(text: &str) -> Option<RecordedError> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let text = |k: &str| v.get(k)?.as_str().map(str::to_owned);
    let flag = |k: &str| v.get(k)?.as_bool();
    Some(RecordedError {
        code: text("code")?,
        category: text("category")?,
        message: text("message")?,
        retryable: flag("retryable")?,
        resolution: text("resolution")?,
        expose_to_model: flag("expose_to_model")?,
        expose_to_user: flag("expose_to_user")?,
        details_json: text("details_json")?,
    })
}

fn signed(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} does not fit a stored integer")))
}

fn stored_unsigned(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} is negative")))
}

/// A stored ticket key.
fn stored_ticket_key(version: i64, secret: &[u8]) -> Result<TicketKey, StoreError> {
    let version = u32::try_from(version)
        .map_err(|_| StoreError::Corrupt(format!("ticket key version {version}")))?;
    let secret = secret.try_into().map_err(|_| {
        StoreError::Corrupt(format!(
            "ticket key {version} has a secret of the wrong size"
        ))
    })?;
    Ok(TicketKey { version, secret })
}

fn stored_risk(s: &str) -> Result<Risk, StoreError> {
    Risk::parse(s).ok_or_else(|| StoreError::Corrupt(format!("unknown risk `{s}`")))
}

fn stored_why(s: &str) -> Result<crate::approvals::ApprovalWhy, StoreError> {
    crate::approvals::ApprovalWhy::from_stored(s)
        .map_err(|e| StoreError::Corrupt(format!("an approval's why: {e}")))
}

fn stored_status(s: &str) -> Result<ApprovalStatus, StoreError> {
    ApprovalStatus::parse(s)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown approval status `{s}`")))
}

/// The SQL list of the states retention may collect, `'SUCCEEDED', …`,
/// built from [`ExecutionState::COLLECTABLE`] so a backend's collecting
/// query cannot drift from [`Collect::covers`]. The names are this crate's
/// constants, never input.
fn collectable_states_sql() -> String {
    ExecutionState::COLLECTABLE
        .iter()
        .map(|state| format!("'{}'", state.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn stored_state(s: &str) -> Result<ExecutionState, StoreError> {
    ExecutionState::parse(s)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown execution state `{s}`")))
}

fn stored_error(text: Option<&str>) -> Result<Option<RecordedError>, StoreError> {
    text.map(|t| {
        error_from_json(t)
            .ok_or_else(|| StoreError::Corrupt("an execution's error is not readable".into()))
    })
    .transpose()
}

/// The persistence every backend provides.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Returns the PENDING, unexpired approval bound to exactly this call
    /// (tenant, requester, tool, tool version, risk, arguments hash, request
    /// id: DESIGN §4), creating it
    /// from `new` if there is none, in one transaction: the same call again
    /// never floods approvers with duplicates. The flag is true when this
    /// call created it. A new approval must fit under `new.limits`, counted
    /// in the same transaction (PENDING and unexpired ones only).
    ///
    /// # Errors
    /// [`StoreError::PendingLimit`] when a new approval would exceed a cap;
    /// [`StoreError`] when the database fails.
    async fn pending_approval_for_call(
        &self,
        new: NewApproval,
        now: UnixMillis,
    ) -> Result<(ApprovalRecord, bool), StoreError>;

    /// The approval with this id in this tenant.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn get_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError>;

    /// Binds an APPROVED, unexpired approval to `idempotency_key`, atomically:
    /// the first key wins, the same key may use it again.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn consume_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<ApprovalUse, StoreError>;

    /// The approval a gateway call that names none uses (DESIGN §11.3), in
    /// one transaction: among the approvals bound to `new`'s tenant,
    /// requester, tool, tool version, risk and arguments hash (not its
    /// request id), the APPROVED, unexpired one `idempotency_key` already
    /// consumed; else the oldest APPROVED, unexpired, unconsumed one,
    /// consumed by `idempotency_key` (of concurrent calls exactly one
    /// consumes it, across processes); else the oldest PENDING, unexpired
    /// one; else the latest one if it is REJECTED and unexpired; else a new
    /// PENDING approval from `new`, under `new.limits` as in
    /// [`Store::pending_approval_for_call`].
    ///
    /// # Errors
    /// [`StoreError::PendingLimit`] when a new approval would exceed a cap;
    /// [`StoreError`] when the database fails.
    async fn approval_for_gateway_call(
        &self,
        new: NewApproval,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<GatewayApproval, StoreError>;

    /// A page of one tenant's approvals in id (creation) order, after the
    /// approval id `after`, optionally of one status.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn list_approvals(
        &self,
        tenant_id: &str,
        status: Option<ApprovalStatus>,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<ApprovalRecord>, StoreError>;

    /// Records a decision on a PENDING, unexpired approval, atomically: of
    /// concurrent decisions exactly one is `Decided`.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn decide_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
        decision: ApprovalDecision,
    ) -> Result<DecideOutcome, StoreError>;

    /// Marks EXPIRED every pending approval past its expiry, and every
    /// approved one past its expiry that nobody consumed; returns them.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn expire_due(&self, now: UnixMillis) -> Result<Vec<ApprovalRecord>, StoreError>;

    /// Runs a ledger Begin in one transaction. Every ledger transition is run
    /// the same way, and this is all a backend does with it:
    ///
    /// 1. in one transaction that no other transition on the same record can
    ///    interleave with (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: `SELECT …
    ///    FOR UPDATE`, an insert racing another insert retried), read the
    ///    record of the step's tenant and key;
    /// 2. call [`ledger::Transition::apply`] with it and a fresh fencing
    ///    token ([`ledger::fresh_fencing_token`]: random, 63 bits, never 0;
    ///    the record's attempt number is the monotonic fence, the token the
    ///    holder's secret);
    /// 3. write the [`ledger::Write`] it returns (an update only if the record
    ///    is still at `previous_revision`, else [`StoreError::Conflict`]),
    ///    commit, and return the answer.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn begin_execution(&self, step: ledger::Begin) -> Result<BeginAnswer, StoreError>;

    /// The ticket keys of this database, newest last: if it holds none
    /// yet, `candidate` is stored first as version 1 (one insert that a
    /// concurrent first start of another replica cannot duplicate: whoever
    /// inserts first wins, and both read the winner's key).
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn ticket_keys(&self, candidate: TicketKey) -> Result<Vec<TicketKey>, StoreError>;

    /// Runs a ledger completion in one transaction, like [`Store::begin_execution`].
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn complete_execution(&self, step: ledger::Complete) -> Result<Settled, StoreError>;

    /// Runs a ledger reconciliation in one transaction, like
    /// [`Store::begin_execution`]; `None` when there is no such record.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn reconcile_execution(
        &self,
        step: ledger::Reconcile,
    ) -> Result<Option<Settled>, StoreError>;

    /// The record of `idempotency_key` in this tenant.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn get_execution(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
    ) -> Result<Option<ExecutionRecord>, StoreError>;

    /// Deletes, in one transaction, at most `collect.limit` of the records
    /// [`Collect::covers`]; returns how many.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn collect_executions(&self, collect: Collect) -> Result<usize, StoreError>;

    /// Makes FAILED_FINAL, in one transaction, at most `lapse.limit` of the
    /// records [`Lapse::covers`], and releases each one's live charges:
    /// the call did not happen and no ticket can retry it (DESIGN §13.1).
    /// A record a transition holds right now is left for the next sweep.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn lapse_executions(&self, lapse: Lapse) -> Result<Vec<Lapsed>, StoreError>;

    // ---- Budgets (DESIGN §13.1): charges per key in a sliding window.

    /// Each of `keys` as it stands at `now`: the sum of the live charges in
    /// its window (the operation `idempotency_key`'s own left out), its
    /// version, and whether that operation holds a live charge on it. One
    /// consistent read per key.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn budget_usage(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        keys: &[BudgetKey],
        now: UnixMillis,
    ) -> Result<Vec<Usage>, StoreError>;

    /// Makes every one of `charges` for the operation `idempotency_key`, in
    /// one transaction, only if each key's version is still the one its
    /// decision read ([`Charge::seen_version`]): each key's version moves,
    /// and the operation's charge on it is written (a released one
    /// charged again). `Ok(false)`, nothing written, when a key moved:
    /// the decision must be taken again on the new usage.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn charge_budgets(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        charges: &[Charge],
        now: UnixMillis,
    ) -> Result<bool, StoreError>;

    /// Releases the operation's live charges (its call will not happen):
    /// the names of the budgets released, one per charge (the ledger's desk
    /// calls it for every answer whose record is FAILED_FINAL).
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn release_charges(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<Vec<String>, StoreError>;

    // ---- Sessions (DESIGN §13.2): what the calls allowed in a session touched.

    /// The session `key` as it stands at `now`: the labels and tools of the
    /// calls allowed in it and their count (the operation
    /// `idempotency_key`'s own left out), its version, and whether that
    /// operation is one of them. A session idle past its time is empty
    /// (its version kept).
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn session_state(
        &self,
        tenant_id: &str,
        key: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<SessionState, StoreError>;

    /// Adds the allowed operation `idempotency_key` to its session, in one
    /// transaction, only if the session's version is still the one its
    /// decision read ([`SessionRecord::seen_version`], when it read one):
    /// the labels and the tool joined, the count and the version moved,
    /// the idle time restarted. An operation already in the session is not
    /// added again (`Ok(true)`). `Ok(false)`, nothing written, when the
    /// session moved.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn record_session(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        record: &SessionRecord,
        now: UnixMillis,
    ) -> Result<bool, StoreError>;

    /// Whether the database answers now (a trivial query, bounded like
    /// every call): what health reports.
    ///
    /// # Errors
    /// [`StoreError`] when it does not.
    async fn ping(&self) -> Result<(), StoreError>;

    // ---- The entity store (DESIGN §11.6): Cedar entities keyed by
    // (tenant, type, id). Every call reads or writes one tenant's rows only.

    /// Writes `entities` into `tenant_id`'s rows in one transaction, each
    /// replacing the stored entity of the same uid, parents and all
    /// (`now` is its `updated_at`). All or nothing.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn upsert_entities(
        &self,
        tenant_id: &str,
        entities: Vec<StoredEntity>,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Deletes these uids from `tenant_id`'s rows in one transaction;
    /// returns how many were stored.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then deleted.
    async fn delete_entities(
        &self,
        tenant_id: &str,
        uids: Vec<EntityKey>,
    ) -> Result<usize, StoreError>;

    /// `tenant_id`'s stored entities of these uids (each as its canonical
    /// JSON), in the order asked; a uid not stored is left out.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn get_entities(
        &self,
        tenant_id: &str,
        uids: Vec<EntityKey>,
    ) -> Result<Vec<(EntityKey, String)>, StoreError>;

    /// What a decision needs of `tenant_id`'s rows, in one read: `root`
    /// (the resource) if stored, and every stored entity its stored
    /// parents reach, transitively, each once (a cycle ends the walk).
    /// The walk visits at most `max_walk` uids, stored or not; one more
    /// would make [`EntityWalk::exceeded`] true.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    async fn walk_entities(
        &self,
        tenant_id: &str,
        root: EntityKey,
        max_walk: usize,
    ) -> Result<EntityWalk, StoreError>;

    /// Relays into `events` the approval events that *other* processes
    /// sharing this database cause, for as long as the returned task runs;
    /// this process's own events are published by the desks that cause
    /// them and are never relayed twice. Returns once the relay listens, so
    /// a watcher that subscribes after it misses nothing. When the relay
    /// loses its connection it announces a gap
    /// ([`ApprovalEvents::announce_gap`]) when the loss is seen and again
    /// when it listens anew, then carries on. A backend only one process
    /// uses relays nothing (`None`).
    ///
    /// # Errors
    /// [`StoreError`] when the relay cannot start listening.
    async fn relay_approval_events(
        &self,
        events: Arc<ApprovalEvents>,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, StoreError> {
        let _ = events;
        Ok(None)
    }
}
