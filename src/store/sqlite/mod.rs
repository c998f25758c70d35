//! The embedded SQLite backend (the default): one file, WAL journal, every
//! write in a `BEGIN IMMEDIATE` transaction; ledger transitions are
//! committed in groups, several per transaction ([`group`]).
//!
//! `BEGIN IMMEDIATE` takes the database's write lock before the first read,
//! so a ledger transition reads and writes a record with no other writer in
//! between, whether the other writer is this process or another one with
//! the same file open: that is what makes a Begin exactly-once. A decision
//! and a consumption of an approval are run the same way: the record read,
//! the pure rule of [`crate::approvals::machine`] applied, its write made.

mod entities;

use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use super::{
    APPROVAL_COLUMNS, ApprovalDecision, ApprovalUse, DecideOutcome, EXECUTION_COLUMNS,
    GatewayApproval, Store, StoreError, collectable_states_sql, error_to_json, signed,
    stored_error, stored_risk, stored_state, stored_status, stored_unsigned,
};
use crate::approvals::{ApprovalRecord, ApprovalStatus, NewApproval, machine};
use crate::clock::UnixMillis;
use crate::entities::{EntityKey, EntityWalk, StoredEntity};
use crate::ledger::{
    self, BeginAnswer, Collect, ExecutionRecord, Settled, TicketKey, Transition, Write,
};

mod gateway;
mod group;

/// Versioned migrations; index + 1 is the schema version they produce.
const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE approvals (
    approval_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    requester_subject_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    risk TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    display_arguments TEXT NOT NULL,
    request_id TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    decided_by TEXT,
    decided_at INTEGER,
    reason TEXT,
    consumed_by_idempotency_key TEXT
);
CREATE UNIQUE INDEX approvals_one_pending_per_call
    ON approvals (tenant_id, requester_subject_id, tool, arguments_sha256, request_id)
    WHERE status = 'PENDING';
CREATE INDEX approvals_by_tenant_status ON approvals (tenant_id, status, created_at);
",
    r"
CREATE TABLE executions (
    tenant_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('IN_PROGRESS', 'SUCCEEDED', 'FAILED_RETRYABLE', 'UNKNOWN', 'FAILED_FINAL')),
    attempt INTEGER NOT NULL CHECK (attempt >= 1),
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    fencing_token INTEGER NOT NULL CHECK (fencing_token >= 1),
    lease_expires_at INTEGER NOT NULL,
    result_json TEXT,
    error_json TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    revision INTEGER NOT NULL CHECK (revision >= 1),
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE INDEX executions_by_updated_at ON executions (updated_at);
CREATE TABLE ledger_fencing (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    last_token INTEGER NOT NULL CHECK (last_token >= 0)
);
INSERT INTO ledger_fencing (singleton, last_token) VALUES (1, 0);
",
    // One PENDING per whole call: tool version and risk too (DESIGN §4).
    r"
DROP INDEX approvals_one_pending_per_call;
CREATE UNIQUE INDEX approvals_one_pending_per_call ON approvals
    (tenant_id, requester_subject_id, tool, tool_version, risk, arguments_sha256, request_id)
    WHERE status = 'PENDING';
",
    // A gateway call finds its approvals by the call minus its request id
    // (DESIGN §11.3), oldest or latest first.
    r"
CREATE INDEX approvals_by_call ON approvals
    (tenant_id, requester_subject_id, tool, arguments_sha256, created_at);
",
    // The entity store (DESIGN §11.6).
    entities::MIGRATION,
    // Execution tickets' keys (DESIGN §5, a record belongs to a decision);
    // fencing tokens are random secrets now, so the counter goes.
    LEDGER_SECRETS,
];

/// Migration 6: the ticket keys, versioned for rotation; the fencing
/// counter is gone (tokens are random, the attempt is the fence).
const LEDGER_SECRETS: &str = r"
CREATE TABLE ledger_ticket_keys (
    version INTEGER PRIMARY KEY CHECK (version >= 1),
    secret BLOB NOT NULL CHECK (length(secret) = 32),
    created_at INTEGER NOT NULL
);
DROP TABLE ledger_fencing;
";

/// The whole call an approval is bound to (DESIGN §4), parameters ?1–?7.
const SAME_CALL: &str = "tenant_id = ?1 AND requester_subject_id = ?2 AND tool = ?3 AND tool_version = ?4 \
     AND risk = ?5 AND arguments_sha256 = ?6 AND request_id = ?7";

/// SQLite behind a mutex; calls run on tokio's blocking pool, and ledger
/// transitions are committed in groups ([`group`]).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    ledger: Arc<group::Queue>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies migrations.
    ///
    /// # Errors
    /// [`StoreError`] if the file cannot be opened, or its schema is newer
    /// than this binary knows.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        let mut conn = Connection::open(path).map_err(|source| StoreError::Open {
            path: path.display().to_string(),
            source,
        })?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        migrate(&mut conn)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            ledger: Arc::default(),
        })
    }

    async fn with<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| StoreError::Task("the connection lock is poisoned".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

/// `Collect::covers` in SQLite: settled records, last changed at or before
/// `?1`, at most `?2` of them.
static COLLECT_EXECUTIONS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM executions WHERE rowid IN (SELECT rowid FROM executions \
         WHERE updated_at <= ?1 AND state IN ({}) LIMIT ?2)",
        collectable_states_sql()
    )
});

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
    let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if current > known {
        return Err(StoreError::SchemaTooNew {
            found: current,
            known,
        });
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(current).unwrap_or(0))
    {
        tx.execute_batch(sql)?;
        tx.pragma_update(
            None,
            "user_version",
            i64::try_from(i + 1).unwrap_or(i64::MAX),
        )?;
    }
    tx.commit()?;
    Ok(())
}

fn approval_from_row(row: &Row<'_>) -> rusqlite::Result<Result<ApprovalRecord, StoreError>> {
    let (risk, status) = match (
        stored_risk(&row.get::<_, String>(6)?),
        stored_status(&row.get::<_, String>(10)?),
    ) {
        (Ok(risk), Ok(status)) => (risk, status),
        (Err(e), _) | (_, Err(e)) => return Ok(Err(e)),
    };
    Ok(Ok(ApprovalRecord {
        approval_id: row.get(0)?,
        tenant_id: row.get(1)?,
        requester_subject_id: row.get(2)?,
        agent_id: row.get(3)?,
        tool: row.get(4)?,
        tool_version: row.get(5)?,
        risk,
        arguments_sha256: row.get(7)?,
        display_arguments: row.get(8)?,
        request_id: row.get(9)?,
        status,
        created_at: row.get(11)?,
        expires_at: row.get(12)?,
        decided_by: row.get(13)?,
        decided_at: row.get(14)?,
        reason: row.get(15)?,
        consumed_by_idempotency_key: row.get(16)?,
    }))
}

fn execution_from_row(row: &Row<'_>) -> rusqlite::Result<Result<ExecutionRecord, StoreError>> {
    let parsed = (
        stored_state(&row.get::<_, String>(4)?),
        stored_error(row.get::<_, Option<String>>(10)?.as_deref()),
        stored_unsigned(row.get(7)?),
        stored_unsigned(row.get(13)?),
    );
    let (state, error, fencing_token, revision) = match parsed {
        (Ok(s), Ok(e), Ok(t), Ok(r)) => (s, e, t, r),
        (Err(e), ..) | (_, Err(e), ..) | (.., Err(e), _) | (.., Err(e)) => return Ok(Err(e)),
    };
    Ok(Ok(ExecutionRecord {
        tenant_id: row.get(0)?,
        idempotency_key: row.get(1)?,
        tool: row.get(2)?,
        arguments_sha256: row.get(3)?,
        state,
        attempt: row.get(5)?,
        max_attempts: row.get(6)?,
        fencing_token,
        lease_expires_at: row.get(8)?,
        result_json: row.get(9)?,
        error,
        created_at: row.get(11)?,
        updated_at: row.get(12)?,
        revision,
    }))
}

fn read_approval(
    conn: &Connection,
    tenant_id: &str,
    approval_id: &str,
) -> Result<Option<ApprovalRecord>, StoreError> {
    conn.query_row(
        &format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tenant_id = ?1 AND approval_id = ?2"
        ),
        params![tenant_id, approval_id],
        approval_from_row,
    )
    .optional()?
    .transpose()
}

/// The ledger's statements, prepared once per connection and kept in its
/// statement cache (`prepare_cached`) instead of parsed per transition.
static SELECT_EXECUTION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {EXECUTION_COLUMNS} FROM executions WHERE tenant_id = ?1 AND idempotency_key = ?2"
    )
});
static INSERT_EXECUTION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO executions ({EXECUTION_COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
    )
});
const UPDATE_EXECUTION: &str = "UPDATE executions SET state = ?3, attempt = ?4, max_attempts = ?5, \
     fencing_token = ?6, lease_expires_at = ?7, result_json = ?8, error_json = ?9, updated_at = ?10, \
     revision = ?11 WHERE tenant_id = ?1 AND idempotency_key = ?2 AND revision = ?12";

fn read_execution(
    conn: &Connection,
    tenant_id: &str,
    idempotency_key: &str,
) -> Result<Option<ExecutionRecord>, StoreError> {
    // Cached: every ledger transition reads its record first.
    conn.prepare_cached(&SELECT_EXECUTION)?
        .query_row(params![tenant_id, idempotency_key], execution_from_row)
        .optional()?
        .transpose()
}

/// One ledger transition in one `BEGIN IMMEDIATE` transaction (see
/// [`Store::begin_execution`] for the protocol); the served path batches
/// them instead ([`group`]).
#[cfg(test)]
fn transition<T: Transition>(conn: &mut Connection, step: &T) -> Result<T::Answer, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let answer = apply_transition(&tx, step)?;
    tx.commit()?;
    Ok(answer)
}

/// One ledger transition inside the caller's write transaction (or a
/// savepoint of it): read the record, apply the server's own rule, write.
/// The caller commits; nothing here is visible before it does.
fn apply_transition<T: Transition>(tx: &Connection, step: &T) -> Result<T::Answer, StoreError> {
    let id = step.id();
    let current = read_execution(tx, &id.tenant_id, &id.idempotency_key)?;
    let next_token = ledger::fresh_fencing_token().map_err(|_| StoreError::Random)?;
    let (answer, write) = step.apply(current.as_ref(), next_token);
    let row = |r: &ExecutionRecord| -> Result<_, StoreError> {
        Ok((
            signed(r.fencing_token)?,
            signed(r.revision)?,
            r.error.as_ref().map(error_to_json),
        ))
    };
    match &write {
        Write::Nothing => {}
        Write::Insert(r) => {
            let (token, revision, error) = row(r)?;
            tx.prepare_cached(&INSERT_EXECUTION)?.execute(params![
                r.tenant_id,
                r.idempotency_key,
                r.tool,
                r.arguments_sha256,
                r.state.as_str(),
                r.attempt,
                r.max_attempts,
                token,
                r.lease_expires_at,
                r.result_json,
                error,
                r.created_at,
                r.updated_at,
                revision
            ])?;
        }
        Write::Update {
            record: r,
            previous_revision,
        } => {
            let (token, revision, error) = row(r)?;
            // The identity, tool and hash of a record never change.
            let changed = tx.prepare_cached(UPDATE_EXECUTION)?.execute(params![
                r.tenant_id,
                r.idempotency_key,
                r.state.as_str(),
                r.attempt,
                r.max_attempts,
                token,
                r.lease_expires_at,
                r.result_json,
                error,
                r.updated_at,
                revision,
                signed(*previous_revision)?
            ])?;
            if changed != 1 {
                return Err(StoreError::Conflict {
                    expected: *previous_revision,
                });
            }
        }
    }
    Ok(answer)
}

/// Marks EXPIRED the PENDING approvals of exactly `new`'s call whose
/// expiry has come (a pending approval past its expiry is no longer
/// pending), the first step of every call that may create an approval
/// (`approvals::machine`, `Approvals::pending_for_call` and
/// `Approvals::gateway`).
fn lapse_pending_of_call(
    tx: &rusqlite::Transaction<'_>,
    new: &NewApproval,
    now: UnixMillis,
) -> Result<(), StoreError> {
    tx.execute(
        &format!("UPDATE approvals SET status = 'EXPIRED' WHERE status = 'PENDING' AND expires_at <= ?8 AND {SAME_CALL}"),
        params![new.tenant_id, new.requester_subject_id, new.tool, new.tool_version, new.risk.as_str(), new.arguments_sha256, new.request_id, now],
    )?;
    Ok(())
}

/// The PENDING, unexpired approval bound to exactly this call, else a new
/// one under the caps, inside the caller's `BEGIN IMMEDIATE` transaction
/// (see [`Store::pending_approval_for_call`]); the caller commits.
fn pending_in(
    tx: &rusqlite::Transaction<'_>,
    new: NewApproval,
    now: UnixMillis,
) -> Result<(ApprovalRecord, bool), StoreError> {
    lapse_pending_of_call(tx, &new, now)?;
    let existing = tx
        .query_row(
            &format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE status = 'PENDING' AND {SAME_CALL}"
            ),
            params![
                new.tenant_id,
                new.requester_subject_id,
                new.tool,
                new.tool_version,
                new.risk.as_str(),
                new.arguments_sha256,
                new.request_id
            ],
            approval_from_row,
        )
        .optional()?;
    if let Some(record) = existing {
        return record.map(|r| (r, false));
    }
    // Inside BEGIN IMMEDIATE: no other writer counts or inserts meanwhile.
    let (subject, tenant): (i64, i64) = tx.query_row(
        &super::pending_counts_sql('?'),
        params![new.tenant_id, new.requester_subject_id, now],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    if let Some(scope) = crate::approvals::PendingScope::exceeded(new.limits, subject, tenant) {
        return Err(StoreError::PendingLimit(scope));
    }
    tx.execute(
        &format!("INSERT INTO approvals ({APPROVAL_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'PENDING', ?11, ?12, NULL, NULL, NULL, NULL)"),
        params![
            new.approval_id,
            new.tenant_id,
            new.requester_subject_id,
            new.agent_id,
            new.tool,
            new.tool_version,
            new.risk.as_str(),
            new.arguments_sha256,
            new.display_arguments,
            new.request_id,
            new.created_at,
            new.expires_at
        ],
    )?;
    Ok((
        ApprovalRecord {
            approval_id: new.approval_id,
            tenant_id: new.tenant_id,
            requester_subject_id: new.requester_subject_id,
            agent_id: new.agent_id,
            tool: new.tool,
            tool_version: new.tool_version,
            risk: new.risk,
            arguments_sha256: new.arguments_sha256,
            display_arguments: new.display_arguments,
            request_id: new.request_id,
            status: ApprovalStatus::Pending,
            created_at: new.created_at,
            expires_at: new.expires_at,
            decided_by: None,
            decided_at: None,
            reason: None,
            consumed_by_idempotency_key: None,
        },
        true,
    ))
}

#[async_trait]
impl Store for SqliteStore {
    async fn begin_execution(&self, step: ledger::Begin) -> Result<BeginAnswer, StoreError> {
        group::run(&self.conn, &self.ledger, step).await
    }

    async fn complete_execution(&self, step: ledger::Complete) -> Result<Settled, StoreError> {
        group::run(&self.conn, &self.ledger, step).await
    }

    async fn reconcile_execution(
        &self,
        step: ledger::Reconcile,
    ) -> Result<Option<Settled>, StoreError> {
        group::run(&self.conn, &self.ledger, step).await
    }

    async fn get_execution(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
    ) -> Result<Option<ExecutionRecord>, StoreError> {
        let (tenant_id, key) = (tenant_id.to_owned(), idempotency_key.to_owned());
        self.with(move |conn| read_execution(conn, &tenant_id, &key))
            .await
    }

    async fn collect_executions(&self, collect: Collect) -> Result<usize, StoreError> {
        let limit = i64::try_from(collect.limit).unwrap_or(i64::MAX);
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            // Exactly `Collect::covers`, at most `limit` rows.
            let n = tx.execute(
                &COLLECT_EXECUTIONS,
                params![collect.updated_at_or_before, limit],
            )?;
            tx.commit()?;
            Ok(n)
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.with(|conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    async fn ticket_keys(&self, candidate: TicketKey) -> Result<Vec<TicketKey>, StoreError> {
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO ledger_ticket_keys (version, secret, created_at) \
                 SELECT 1, ?1, CAST(strftime('%s', 'now') AS INTEGER) * 1000 \
                 WHERE NOT EXISTS (SELECT 1 FROM ledger_ticket_keys)",
                params![candidate.secret.as_slice()],
            )?;
            let mut stmt =
                tx.prepare("SELECT version, secret FROM ledger_ticket_keys ORDER BY version")?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            drop(stmt);
            tx.commit()?;
            rows.iter()
                .map(|(version, secret)| super::stored_ticket_key(*version, secret))
                .collect()
        })
        .await
    }

    async fn pending_approval_for_call(
        &self,
        new: NewApproval,
        now: UnixMillis,
    ) -> Result<(ApprovalRecord, bool), StoreError> {
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let answer = pending_in(&tx, new, now)?;
            tx.commit()?;
            Ok(answer)
        })
        .await
    }

    async fn approval_for_gateway_call(
        &self,
        new: NewApproval,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<GatewayApproval, StoreError> {
        let key = idempotency_key.to_owned();
        self.with(move |conn| gateway::approval_for_gateway_call(conn, new, &key, now))
            .await
    }

    async fn consume_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<ApprovalUse, StoreError> {
        let (tenant_id, approval_id, key) = (
            tenant_id.to_owned(),
            approval_id.to_owned(),
            idempotency_key.to_owned(),
        );
        self.with(move |conn| {
            // Read, apply the rule, write: inside BEGIN IMMEDIATE nobody
            // consumes or decides it in between.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let answer = match read_approval(&tx, &tenant_id, &approval_id)? {
                None => ApprovalUse::NotUsable,
                Some(record) => {
                    let (answer, write) = machine::consume(&record, &key, now);
                    if let Some(consumed) = write {
                        tx.execute(
                            "UPDATE approvals SET consumed_by_idempotency_key = ?3 \
                             WHERE tenant_id = ?1 AND approval_id = ?2 AND consumed_by_idempotency_key IS NULL",
                            params![tenant_id, approval_id, consumed.consumed_by_idempotency_key],
                        )?;
                    }
                    answer
                }
            };
            tx.commit()?;
            Ok(answer)
        })
        .await
    }

    async fn list_approvals(
        &self,
        tenant_id: &str,
        status: Option<ApprovalStatus>,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        let tenant_id = tenant_id.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tenant_id = ?1 \
                 AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR approval_id > ?3) \
                 ORDER BY approval_id LIMIT ?4"
            ))?;
            let rows = stmt.query_map(
                params![tenant_id, status.map(ApprovalStatus::as_str), after, limit],
                approval_from_row,
            )?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row??);
            }
            Ok(out)
        })
        .await
    }

    async fn decide_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
        d: ApprovalDecision,
    ) -> Result<DecideOutcome, StoreError> {
        let (tenant_id, approval_id) = (tenant_id.to_owned(), approval_id.to_owned());
        self.with(move |conn| {
            // Read, apply the rule (the first decision wins, none after
            // expiry), write: inside BEGIN IMMEDIATE nobody decides between.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let outcome = match read_approval(&tx, &tenant_id, &approval_id)? {
                None => DecideOutcome::NotFound,
                Some(record) => match machine::decide(&record, &d) {
                    None => DecideOutcome::AlreadyDecided(record),
                    Some(decided) => {
                        tx.execute(
                            "UPDATE approvals SET status = ?3, decided_by = ?4, decided_at = ?5, reason = ?6, \
                             expires_at = ?7 WHERE tenant_id = ?1 AND approval_id = ?2 AND status = 'PENDING'",
                            params![
                                tenant_id,
                                approval_id,
                                decided.status.as_str(),
                                decided.decided_by,
                                decided.decided_at,
                                decided.reason,
                                decided.expires_at
                            ],
                        )?;
                        DecideOutcome::Decided(decided)
                    }
                },
            };
            tx.commit()?;
            Ok(outcome)
        })
        .await
    }

    async fn expire_due(&self, now: UnixMillis) -> Result<Vec<ApprovalRecord>, StoreError> {
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = {
                let mut stmt = tx.prepare(&format!(
                    "UPDATE approvals SET status = 'EXPIRED' WHERE expires_at <= ?1 \
                     AND (status = 'PENDING' OR (status = 'APPROVED' AND consumed_by_idempotency_key IS NULL)) \
                     RETURNING {APPROVAL_COLUMNS}"
                ))?;
                let rows = stmt.query_map(params![now], approval_from_row)?;
                let mut out = Vec::new();
                for row in rows {
                    out.push(row??);
                }
                out
            };
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn get_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        let (tenant_id, approval_id) = (tenant_id.to_owned(), approval_id.to_owned());
        self.with(move |conn| read_approval(conn, &tenant_id, &approval_id))
            .await
    }

    // ---- The entity store (DESIGN §11.6): see `sqlite/entities.rs`.

    async fn upsert_entities(
        &self,
        tenant_id: &str,
        entities: Vec<StoredEntity>,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let tenant_id = tenant_id.to_owned();
        self.with(move |conn| entities::upsert(conn, &tenant_id, &entities, now))
            .await
    }

    async fn delete_entities(
        &self,
        tenant_id: &str,
        uids: Vec<EntityKey>,
    ) -> Result<usize, StoreError> {
        let tenant_id = tenant_id.to_owned();
        self.with(move |conn| entities::delete(conn, &tenant_id, &uids))
            .await
    }

    async fn get_entities(
        &self,
        tenant_id: &str,
        uids: Vec<EntityKey>,
    ) -> Result<Vec<(EntityKey, String)>, StoreError> {
        let tenant_id = tenant_id.to_owned();
        self.with(move |conn| entities::get(conn, &tenant_id, uids))
            .await
    }

    async fn walk_entities(
        &self,
        tenant_id: &str,
        root: EntityKey,
        max_walk: usize,
    ) -> Result<EntityWalk, StoreError> {
        let tenant_id = tenant_id.to_owned();
        self.with(move |conn| entities::walk(conn, &tenant_id, &root, max_walk))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::suite::{self, Backend, new_approval};

    /// A fresh SQLite file; every store opened on it is another connection.
    struct File(tempfile::TempDir);

    #[async_trait]
    impl Backend for File {
        async fn open(&self) -> Arc<dyn Store> {
            Arc::new(SqliteStore::open(&self.0.path().join("s.db")).unwrap())
        }
    }

    async fn file() -> Option<File> {
        Some(File(tempfile::tempdir().unwrap()))
    }

    mod suite_on_sqlite {
        crate::store::suite::store_suite!(super::file);
    }

    fn store(dir: &tempfile::TempDir) -> SqliteStore {
        SqliteStore::open(&dir.path().join("s.db")).unwrap()
    }

    #[tokio::test]
    async fn records_survive_a_reopen_of_the_file() {
        let backend = file().await.unwrap();
        suite::transitions_round_trip(&backend).await;
        let again = store(&backend.0);
        let r = again.get_execution("acme", "k1").await.unwrap().unwrap();
        assert_eq!(r.state, crate::ledger::ExecutionState::Succeeded);
    }

    #[tokio::test]
    async fn an_update_of_a_changed_record_is_a_conflict_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let (stale, first) = suite::stale_target(&store).await;
        let err = store
            .with(move |conn| transition(conn, &stale))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict { expected: 98 }),
            "{err}"
        );
        let r = store.get_execution("acme", "k").await.unwrap().unwrap();
        assert_eq!((r.revision, r.fencing_token), (1, first));
    }

    #[tokio::test]
    async fn the_schema_refuses_an_unknown_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let conn = store.conn.lock().unwrap();
        let err = conn
            .execute(
                "INSERT INTO executions (tenant_id, idempotency_key, tool, arguments_sha256, state, attempt, \
                 max_attempts, fencing_token, lease_expires_at, created_at, updated_at, revision) \
                 VALUES ('t', 'k', 'x', 'aa', 'DONE', 1, 1, 1, 0, 0, 0, 1)",
                [],
            )
            .unwrap_err();
        assert!(err.to_string().contains("CHECK constraint failed"), "{err}");
    }

    #[tokio::test]
    async fn a_version_1_file_is_migrated_and_keeps_its_approvals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute(
                &format!("INSERT INTO approvals ({APPROVAL_COLUMNS}) VALUES ('a1', 't1', 'alice', 'agent', \
                 'refund_order', '1', 'financial', 'ab', '{{}}', 'r1', 'PENDING', 0, 1000, NULL, NULL, NULL, NULL)"),
                [],
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let version: i64 = store
            .conn
            .lock()
            .unwrap()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, 6);
        assert_eq!(
            store
                .get_approval("t1", "a1")
                .await
                .unwrap()
                .unwrap()
                .status,
            ApprovalStatus::Pending
        );
        assert_eq!(store.get_execution("t1", "k").await.unwrap(), None);
    }

    #[tokio::test]
    async fn reopening_keeps_the_data_and_refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/s.db");
        {
            let store = SqliteStore::open(&path).unwrap();
            store
                .pending_approval_for_call(new_approval("a1", 0), 0)
                .await
                .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        assert!(store.get_approval("t1", "a1").await.unwrap().is_some());
        drop(store);
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        assert!(matches!(
            SqliteStore::open(&path),
            Err(StoreError::SchemaTooNew {
                found: 99,
                known: 6
            })
        ));
    }

    pub(super) fn begin_of(key: &str) -> ledger::Begin {
        ledger::Begin {
            id: ledger::ExecutionId {
                tenant_id: "acme".into(),
                idempotency_key: key.into(),
            },
            tool: "refund_order".into(),
            arguments_sha256: "aa".into(),
            lease_ms: 60_000,
            max_attempts: 3,
            now: 1_000,
        }
    }

    /// Holds the store's connection on another thread until told to let go,
    /// so that transitions queue up behind it.
    fn hold_connection(
        store: &SqliteStore,
    ) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (held, is_held) = std::sync::mpsc::channel::<()>();
        let conn = Arc::clone(&store.conn);
        let holder = std::thread::spawn(move || {
            let _guard = conn.lock().unwrap();
            held.send(()).unwrap();
            // Bounded: a test that fails never leaves the connection held.
            let _ = released.recv_timeout(std::time::Duration::from_secs(20));
        });
        is_held
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        (release, holder)
    }

    async fn until_queued(store: &SqliteStore, n: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.ledger.waiting() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "only {} of {n} transitions queued",
                store.ledger.waiting()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_transitions_are_one_commit_in_their_serial_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let (release, holder) = hold_connection(&store);
        let mut calls = Vec::new();
        for i in 0..30 {
            let store = store.clone();
            calls.push(tokio::spawn(async move {
                store.begin_execution(begin_of(&format!("k{i}"))).await
            }));
        }
        // Two executors racing for one key inside the same batch.
        for _ in 0..2 {
            let store = store.clone();
            calls.push(tokio::spawn(async move {
                store.begin_execution(begin_of("dup")).await
            }));
        }
        until_queued(&store, 32).await;
        assert_eq!(
            store
                .ledger
                .commits
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        release.send(()).unwrap();
        holder.join().unwrap();
        let mut outcomes = Vec::new();
        for call in calls {
            outcomes.push(call.await.unwrap().unwrap().outcome);
        }
        assert_eq!(
            store
                .ledger
                .commits
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert!(
            outcomes[..30]
                .iter()
                .all(|o| *o == ledger::BeginOutcome::Acquired)
        );
        let mut dup = outcomes[30..].to_vec();
        dup.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(
            dup,
            [
                ledger::BeginOutcome::Acquired,
                ledger::BeginOutcome::InProgress
            ]
        );
        // Committed: another connection to the file reads every record.
        let other = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        for i in 0..30 {
            let r = other
                .get_execution("acme", &format!("k{i}"))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (r.state, r.attempt),
                (ledger::ExecutionState::InProgress, 1)
            );
        }
        let r = other.get_execution("acme", "dup").await.unwrap().unwrap();
        assert_eq!((r.attempt, r.revision), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_transition_rolls_back_alone_and_the_rest_of_its_batch_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        // A record whose stored error is not JSON: reading it is an error.
        store
            .with(|conn| {
                conn.execute(
                    &format!(
                        "INSERT INTO executions ({EXECUTION_COLUMNS}) VALUES \
                         ('acme', 'bad', 'refund_order', 'aa', 'FAILED_FINAL', 1, 3, 7, 0, NULL, \
                         'not json', 0, 0, 1)"
                    ),
                    [],
                )?;
                Ok(())
            })
            .await
            .unwrap();
        let (release, holder) = hold_connection(&store);
        let first = {
            let store = store.clone();
            tokio::spawn(async move { store.begin_execution(begin_of("before")).await })
        };
        until_queued(&store, 1).await;
        let bad = {
            let store = store.clone();
            tokio::spawn(async move { store.begin_execution(begin_of("bad")).await })
        };
        until_queued(&store, 2).await;
        let last = {
            let store = store.clone();
            tokio::spawn(async move { store.begin_execution(begin_of("after")).await })
        };
        until_queued(&store, 3).await;
        release.send(()).unwrap();
        holder.join().unwrap();
        let bad = bad.await.unwrap().unwrap_err();
        assert!(matches!(bad, StoreError::Corrupt(_)), "{bad}");
        for (call, key) in [(first, "before"), (last, "after")] {
            let answer = call.await.unwrap().unwrap();
            assert_eq!(answer.outcome, ledger::BeginOutcome::Acquired, "{key}");
            let r = store.get_execution("acme", key).await.unwrap().unwrap();
            assert_eq!(r.fencing_token, answer.fencing_token, "{key}");
        }
        assert_eq!(
            store
                .ledger
                .commits
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // The corrupt record is as it was.
        let text: String = store
            .with(|conn| {
                Ok(conn.query_row(
                    "SELECT error_json FROM executions WHERE idempotency_key = 'bad'",
                    [],
                    |row| row.get(0),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(text, "not json");
    }
}
