//! The embedded SQLite backend (the default): one file, WAL journal, every
//! transition one `BEGIN IMMEDIATE` transaction.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use super::{ApprovalDecision, ApprovalUse, DecideOutcome, Store, StoreError};
use crate::approvals::{ApprovalRecord, ApprovalStatus, NewApproval};
use crate::clock::UnixMillis;
use crate::tools::Risk;

/// Versioned migrations; index + 1 is the schema version they produce.
const MIGRATIONS: &[&str] = &[r"
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
"];

/// SQLite behind a mutex; calls run on tokio's blocking pool.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
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

const APPROVAL_COLUMNS: &str = "approval_id, tenant_id, requester_subject_id, agent_id, tool, tool_version, risk, \
     arguments_sha256, display_arguments, request_id, status, created_at, expires_at, decided_by, decided_at, \
     reason, consumed_by_idempotency_key";

fn approval_from_row(row: &Row<'_>) -> rusqlite::Result<Result<ApprovalRecord, StoreError>> {
    let risk: String = row.get(6)?;
    let status: String = row.get(10)?;
    let Some(risk) = Risk::parse(&risk) else {
        return Ok(Err(StoreError::Corrupt(format!("unknown risk `{risk}`"))));
    };
    let Some(status) = ApprovalStatus::parse(&status) else {
        return Ok(Err(StoreError::Corrupt(format!(
            "unknown approval status `{status}`"
        ))));
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

#[async_trait]
impl Store for SqliteStore {
    async fn pending_approval_for_call(
        &self,
        new: NewApproval,
        now: UnixMillis,
    ) -> Result<(ApprovalRecord, bool), StoreError> {
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            // A pending approval past its expiry is no longer pending.
            tx.execute(
                "UPDATE approvals SET status = 'EXPIRED' WHERE status = 'PENDING' AND expires_at <= ?1 \
                 AND tenant_id = ?2 AND requester_subject_id = ?3 AND tool = ?4 AND arguments_sha256 = ?5 AND request_id = ?6",
                params![now, new.tenant_id, new.requester_subject_id, new.tool, new.arguments_sha256, new.request_id],
            )?;
            let existing = tx
                .query_row(
                    &format!(
                        "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE status = 'PENDING' AND tenant_id = ?1 \
                         AND requester_subject_id = ?2 AND tool = ?3 AND arguments_sha256 = ?4 AND request_id = ?5"
                    ),
                    params![new.tenant_id, new.requester_subject_id, new.tool, new.arguments_sha256, new.request_id],
                    approval_from_row,
                )
                .optional()?;
            if let Some(record) = existing {
                tx.commit()?;
                return record.map(|r| (r, false));
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
            tx.commit()?;
            Ok((ApprovalRecord {
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
            }, true))
        })
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
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let first = tx.execute(
                "UPDATE approvals SET consumed_by_idempotency_key = ?3 WHERE tenant_id = ?1 AND approval_id = ?2 \
                 AND status = 'APPROVED' AND expires_at > ?4 AND consumed_by_idempotency_key IS NULL",
                params![tenant_id, approval_id, key, now],
            )?;
            let again = if first == 1 {
                0
            } else {
                tx.query_row(
                    "SELECT COUNT(*) FROM approvals WHERE tenant_id = ?1 AND approval_id = ?2 \
                     AND status = 'APPROVED' AND expires_at > ?4 AND consumed_by_idempotency_key = ?3",
                    params![tenant_id, approval_id, key, now],
                    |r| r.get::<_, i64>(0),
                )?
            };
            let answer = if first == 1 || again == 1 {
                ApprovalUse::Consumed { first: first == 1 }
            } else {
                let other: Option<Option<String>> = tx
                    .query_row(
                        "SELECT consumed_by_idempotency_key FROM approvals WHERE tenant_id = ?1 AND approval_id = ?2",
                        params![tenant_id, approval_id],
                        |r| r.get(0),
                    )
                    .optional()?;
                match other {
                    Some(Some(k)) if k != key => ApprovalUse::ConsumedByOther,
                    _ => ApprovalUse::NotUsable,
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
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let status = if d.approve { "APPROVED" } else { "REJECTED" };
            // The condition on PENDING makes the first decision win.
            let changed = tx.execute(
                "UPDATE approvals SET status = ?3, decided_by = ?4, decided_at = ?5, reason = ?6, \
                 expires_at = CASE WHEN ?3 = 'APPROVED' THEN ?7 ELSE expires_at END \
                 WHERE tenant_id = ?1 AND approval_id = ?2 AND status = 'PENDING' AND expires_at > ?5",
                params![
                    tenant_id,
                    approval_id,
                    status,
                    d.decided_by,
                    d.decided_at,
                    d.reason,
                    d.approved_expires_at
                ],
            )?;
            let record = tx
                .query_row(
                    &format!(
                        "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tenant_id = ?1 AND approval_id = ?2"
                    ),
                    params![tenant_id, approval_id],
                    approval_from_row,
                )
                .optional()?
                .transpose()?;
            tx.commit()?;
            Ok(match record {
                None => DecideOutcome::NotFound,
                Some(r) if changed == 1 => DecideOutcome::Decided(r),
                Some(r) => DecideOutcome::AlreadyDecided(r),
            })
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
        self.with(move |conn| {
            conn.query_row(
                &format!("SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tenant_id = ?1 AND approval_id = ?2"),
                params![tenant_id, approval_id],
                approval_from_row,
            )
            .optional()?
            .transpose()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_first_decision_wins_and_expiry_sweeps_what_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        store
            .pending_approval_for_call(new_approval("a1", 0), 0)
            .await
            .unwrap();
        let d = |approve: bool, by: &str| ApprovalDecision {
            approve,
            decided_by: by.into(),
            reason: "ok".into(),
            decided_at: 5,
            approved_expires_at: 500,
        };
        let first = store
            .decide_approval("t1", "a1", d(true, "dana"))
            .await
            .unwrap();
        let DecideOutcome::Decided(r) = first else {
            panic!("{first:?}")
        };
        assert_eq!(
            (r.status, r.expires_at, r.decided_by.as_deref()),
            (ApprovalStatus::Approved, 500, Some("dana"))
        );
        let second = store
            .decide_approval("t1", "a1", d(false, "erin"))
            .await
            .unwrap();
        let DecideOutcome::AlreadyDecided(r) = second else {
            panic!("{second:?}")
        };
        assert_eq!(r.status, ApprovalStatus::Approved);
        assert_eq!(
            store
                .decide_approval("t2", "a1", d(true, "x"))
                .await
                .unwrap(),
            DecideOutcome::NotFound
        );
        let mut pending = new_approval("a2", 0);
        pending.request_id = "r2".into();
        store.pending_approval_for_call(pending, 0).await.unwrap();
        assert!(store.expire_due(499).await.unwrap().is_empty());
        let mut expired: Vec<String> = store
            .expire_due(1000)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.approval_id)
            .collect();
        expired.sort();
        assert_eq!(expired, vec!["a1", "a2"]);
        assert!(store.expire_due(2000).await.unwrap().is_empty());
        let all = store
            .list_approvals("t1", Some(ApprovalStatus::Expired), None, 10)
            .await
            .unwrap();
        assert_eq!(all.len(), 2);
        let page = store
            .list_approvals("t1", None, Some("a1".into()), 10)
            .await
            .unwrap();
        assert_eq!(
            page.iter()
                .map(|r| r.approval_id.as_str())
                .collect::<Vec<_>>(),
            vec!["a2"]
        );
    }

    #[tokio::test]
    async fn an_approval_is_consumed_by_the_first_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        store
            .pending_approval_for_call(new_approval("a1", 0), 0)
            .await
            .unwrap();
        assert_eq!(
            store.consume_approval("t1", "a1", "k1", 1).await.unwrap(),
            ApprovalUse::NotUsable
        );
        {
            let conn = store.conn.lock().unwrap();
            conn.execute("UPDATE approvals SET status = 'APPROVED'", [])
                .unwrap();
        }
        assert_eq!(
            store.consume_approval("t1", "a1", "k1", 1).await.unwrap(),
            ApprovalUse::Consumed { first: true }
        );
        assert_eq!(
            store.consume_approval("t1", "a1", "k1", 2).await.unwrap(),
            ApprovalUse::Consumed { first: false }
        );
        assert_eq!(
            store.consume_approval("t1", "a1", "k2", 2).await.unwrap(),
            ApprovalUse::ConsumedByOther
        );
        assert_eq!(
            store.consume_approval("t2", "a1", "k1", 2).await.unwrap(),
            ApprovalUse::NotUsable
        );
        assert_eq!(
            store
                .consume_approval("t1", "a1", "k1", 1000)
                .await
                .unwrap(),
            ApprovalUse::NotUsable
        );
    }

    use super::*;

    fn new_approval(id: &str, now: UnixMillis) -> NewApproval {
        NewApproval {
            approval_id: id.into(),
            tenant_id: "t1".into(),
            requester_subject_id: "alice".into(),
            agent_id: "agent".into(),
            tool: "refund_order".into(),
            tool_version: "1".into(),
            risk: Risk::Financial,
            arguments_sha256: "ab".into(),
            display_arguments: "{}".into(),
            request_id: "r1".into(),
            created_at: now,
            expires_at: now + 1000,
        }
    }

    #[tokio::test]
    async fn the_same_call_gets_the_same_pending_approval_until_it_expires() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        let (a, created) = store
            .pending_approval_for_call(new_approval("a1", 0), 0)
            .await
            .unwrap();
        assert!(created);
        let (b, created) = store
            .pending_approval_for_call(new_approval("a2", 10), 10)
            .await
            .unwrap();
        assert!(!created);
        assert_eq!(a.approval_id, "a1");
        assert_eq!(b.approval_id, "a1");
        let (c, _) = store
            .pending_approval_for_call(new_approval("a3", 1000), 1000)
            .await
            .unwrap();
        assert_eq!(c.approval_id, "a3");
        let old = store.get_approval("t1", "a1").await.unwrap().unwrap();
        assert_eq!(old.status, ApprovalStatus::Expired);
        assert!(store.get_approval("t2", "a3").await.unwrap().is_none());
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
                known: 1
            })
        ));
    }
}
