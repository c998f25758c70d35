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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, TransactionBehavior, params};

use super::{
    APPROVAL_COLUMNS, ApprovalDecision, ApprovalUse, DecideOutcome, GatewayApproval, Store,
    StoreError,
};
use crate::approvals::{ApprovalRecord, ApprovalStatus, NewApproval, machine};
use crate::budgets::{BudgetKey, Charge, SessionRecord, SessionState, Usage};
use crate::clock::UnixMillis;
use crate::entities::{EntityKey, EntityWalk, StoredEntity};
use crate::ledger::{
    self, BeginAnswer, Collect, ExecutionRecord, Lapse, Lapsed, Settled, TicketKey,
};

mod approvals;
mod budgets;
mod executions;
mod gateway;
mod group;
mod schema;
mod sessions;

use approvals::{approval_from_row, lapse_pending_of_call, pending_in, read_approval};
use executions::{COLLECT_EXECUTIONS, apply_transition, read_execution};
use schema::migrate;

/// SQLite behind a mutex; calls run on tokio's blocking pool, and ledger
/// transitions are committed in groups ([`group`]).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    ledger: Arc<group::Queue>,
    /// How many calls reached the database (see [`Self::accesses`]).
    accesses: Arc<AtomicU64>,
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
            accesses: Arc::default(),
        })
    }

    /// How many store calls this store (and its clones) sent to the
    /// database so far: what shows that a stateless decision makes none.
    #[must_use]
    pub fn accesses(&self) -> u64 {
        self.accesses.load(Ordering::Relaxed)
    }

    /// Runs `step` in the one writer's next batch ([`group`]).
    async fn batched<T: group::Step>(&self, step: T) -> Result<T::Answer, StoreError> {
        self.accesses.fetch_add(1, Ordering::Relaxed);
        group::run(&self.conn, &self.ledger, step).await
    }

    async fn with<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.accesses.fetch_add(1, Ordering::Relaxed);
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

/// A charge, run by the one writer (see [`budgets::charge`]).
struct ChargeStep {
    tenant_id: String,
    idempotency_key: String,
    charges: Vec<Charge>,
    now: UnixMillis,
}

impl group::Step for ChargeStep {
    type Answer = bool;

    fn run(&self, tx: &Connection) -> Result<bool, StoreError> {
        budgets::charge(
            tx,
            &self.tenant_id,
            &self.idempotency_key,
            &self.charges,
            self.now,
        )
    }
}

/// A call added to its session, run by the one writer (see [`sessions::record`]).
struct RecordStep {
    tenant_id: String,
    idempotency_key: String,
    record: SessionRecord,
    now: UnixMillis,
}

impl group::Step for RecordStep {
    type Answer = bool;

    fn run(&self, tx: &Connection) -> Result<bool, StoreError> {
        sessions::record(
            tx,
            &self.tenant_id,
            &self.idempotency_key,
            &self.record,
            self.now,
        )
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn session_state(
        &self,
        tenant_id: &str,
        key: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<SessionState, StoreError> {
        let (tenant_id, key, idempotency_key) = (
            tenant_id.to_owned(),
            key.to_owned(),
            idempotency_key.to_owned(),
        );
        self.with(move |conn| sessions::state(conn, &tenant_id, &key, &idempotency_key, now))
            .await
    }

    async fn record_session(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        record: &SessionRecord,
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        let step = RecordStep {
            tenant_id: tenant_id.to_owned(),
            idempotency_key: idempotency_key.to_owned(),
            record: record.clone(),
            now,
        };
        self.batched(step).await
    }

    async fn budget_usage(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        keys: &[BudgetKey],
        now: UnixMillis,
    ) -> Result<Vec<Usage>, StoreError> {
        let (tenant_id, idempotency_key) = (tenant_id.to_owned(), idempotency_key.to_owned());
        let keys = keys.to_vec();
        self.with(move |conn| budgets::usage(conn, &tenant_id, &idempotency_key, &keys, now))
            .await
    }

    async fn charge_budgets(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        charges: &[Charge],
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        let step = ChargeStep {
            tenant_id: tenant_id.to_owned(),
            idempotency_key: idempotency_key.to_owned(),
            charges: charges.to_vec(),
            now,
        };
        self.batched(step).await
    }

    async fn release_charges(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<Vec<String>, StoreError> {
        let (tenant_id, idempotency_key) = (tenant_id.to_owned(), idempotency_key.to_owned());
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let names = budgets::release(&tx, &tenant_id, &idempotency_key, now)?;
            tx.commit()?;
            Ok(names)
        })
        .await
    }

    async fn begin_execution(&self, step: ledger::Begin) -> Result<BeginAnswer, StoreError> {
        self.batched(step).await
    }

    async fn complete_execution(&self, step: ledger::Complete) -> Result<Settled, StoreError> {
        self.batched(step).await
    }

    async fn reconcile_execution(
        &self,
        step: ledger::Reconcile,
    ) -> Result<Option<Settled>, StoreError> {
        self.batched(step).await
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
            // Charges whose window ended as long ago count for nothing.
            budgets::collect(&tx, collect.updated_at_or_before, limit)?;
            // Sessions idle since as long ago are forgotten.
            sessions::collect(&tx, collect.updated_at_or_before, limit)?;
            tx.commit()?;
            Ok(n)
        })
        .await
    }

    async fn lapse_executions(&self, lapse: Lapse) -> Result<Vec<Lapsed>, StoreError> {
        let limit = i64::try_from(lapse.limit).unwrap_or(i64::MAX);
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let sql = crate::store::lapse_sql('?', "");
            let mut lapsed = tx
                .prepare(&sql)?
                .query_map(params![lapse.updated_at_or_before, limit], |r| {
                    Ok(Lapsed {
                        tenant_id: r.get(0)?,
                        idempotency_key: r.get(1)?,
                        tool: r.get(2)?,
                        arguments_sha256: r.get(3)?,
                        attempt: r.get(4)?,
                        released: Vec::new(),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            for l in &mut lapsed {
                l.released = budgets::release(&tx, &l.tenant_id, &l.idempotency_key, lapse.now)?;
            }
            tx.commit()?;
            lapsed.sort_by(|a, b| {
                (&a.tenant_id, &a.idempotency_key).cmp(&(&b.tenant_id, &b.idempotency_key))
            });
            Ok(lapsed)
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
            let rows = stmt.query_and_then(
                params![tenant_id, status.map(ApprovalStatus::as_str), after, limit],
                approval_from_row,
            )?;
            rows.collect()
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
                stmt.query_and_then(params![now], approval_from_row)?
                    .collect::<Result<Vec<_>, _>>()?
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
mod tests;
