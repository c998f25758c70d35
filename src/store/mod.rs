//! Persistent state: approvals and the execution ledger.
//!
//! [`Store`] is the one interface every backend implements with the same
//! semantics; each method is one database transaction. Backends touch the
//! outside world and hold no authorization rules of their own: the ledger's
//! state machine is [`crate::ledger`], which a backend runs inside its
//! transaction (see [`Store::begin_execution`]).

mod sqlite;

#[cfg(test)]
mod ledger_tests;

pub use sqlite::SqliteStore;

use async_trait::async_trait;

use crate::approvals::{ApprovalRecord, ApprovalStatus, NewApproval};
use crate::clock::UnixMillis;
use crate::ledger::{self, BeginAnswer, Collect, ExecutionRecord, Settled};

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
    #[error("unsupported store url `{0}` (use sqlite:///path/file.db)")]
    UnsupportedUrl(String),
    #[error("the record changed under a transition (expected revision {expected})")]
    Conflict { expected: u64 },
}

/// The result of trying to consume an approval for one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalUse {
    /// Now bound to this idempotency key (or already was: a retry).
    /// `first` is true for the call that consumed it.
    Consumed { first: bool },
    /// Already consumed by another idempotency key.
    ConsumedByOther,
    /// No longer approved and unexpired.
    NotUsable,
}

/// A human's decision, to record on a PENDING approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalDecision {
    pub approve: bool,
    pub decided_by: String,
    pub reason: String,
    pub decided_at: UnixMillis,
    /// When an approved one stops being usable (the contract's TTL from now).
    pub approved_expires_at: UnixMillis,
}

/// What recording a decision did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideOutcome {
    Decided(ApprovalRecord),
    /// Somebody decided first (or it expired): the first decision wins.
    AlreadyDecided(ApprovalRecord),
    NotFound,
}

/// The persistence every backend provides.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Returns the PENDING, unexpired approval bound to exactly this call
    /// (tenant, requester, tool, arguments hash, request id), creating it
    /// from `new` if there is none, in one transaction: the same call again
    /// never floods approvers with duplicates. The flag is true when this
    /// call created it.
    ///
    /// # Errors
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
    /// 2. call [`ledger::Transition::apply`] with it and a fencing token
    ///    greater than every token the store ever issued (a store-wide
    ///    counter or sequence; it is consumed only if the written record
    ///    carries it);
    /// 3. write the [`ledger::Write`] it returns (an update only if the record
    ///    is still at `previous_revision`, else [`StoreError::Conflict`]),
    ///    commit, and return the answer.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails; nothing is then written.
    async fn begin_execution(&self, step: ledger::Begin) -> Result<BeginAnswer, StoreError>;

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
}

/// Opens the store a URL names: `sqlite:///path/file.db` (or a bare path).
///
/// # Errors
/// [`StoreError`] for an unsupported URL or a database that cannot be opened.
pub fn open(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        return Ok(std::sync::Arc::new(SqliteStore::open(
            std::path::Path::new(path),
        )?));
    }
    if url.contains("://") {
        return Err(StoreError::UnsupportedUrl(url.to_owned()));
    }
    Ok(std::sync::Arc::new(SqliteStore::open(
        std::path::Path::new(url),
    )?))
}
