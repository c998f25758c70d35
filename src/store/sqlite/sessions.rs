//! Sessions in SQLite (DESIGN §13.2): a session read in one statement (and,
//! for a retry, its other calls in a second), a call added by the one
//! writer inside its `BEGIN IMMEDIATE` batch only if the session did not
//! move since its decision read it.

use rusqlite::{Connection, OptionalExtension, params};

use crate::budgets::{SessionRecord, SessionState};
use crate::clock::UnixMillis;
use crate::store::StoreError;
use crate::store::session_rows::{self, SessionRow};

fn row(conn: &Connection, tenant_id: &str, key: &str) -> Result<Option<SessionRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT labels, tools, calls, version, expires_at FROM sessions \
         WHERE tenant_id = ?1 AND key = ?2",
    )?;
    Ok(stmt
        .query_row(params![tenant_id, key], |r| {
            Ok(SessionRow {
                labels: r.get(0)?,
                tools: r.get(1)?,
                calls: r.get(2)?,
                version: r.get(3)?,
                expires_at: r.get(4)?,
            })
        })
        .optional()?)
}

fn holds(
    conn: &Connection,
    tenant_id: &str,
    key: &str,
    idempotency_key: &str,
) -> Result<bool, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM session_calls \
         WHERE tenant_id = ?1 AND key = ?2 AND idempotency_key = ?3)",
    )?;
    Ok(stmt.query_row(params![tenant_id, key, idempotency_key], |r| r.get(0))?)
}

/// See [`crate::store::Store::session_state`].
pub(super) fn state(
    conn: &Connection,
    tenant_id: &str,
    key: &str,
    idempotency_key: &str,
    now: UnixMillis,
) -> Result<SessionState, StoreError> {
    let found = row(conn, tenant_id, key)?;
    let own = match &found {
        Some(r) if r.live(now) && holds(conn, tenant_id, key, idempotency_key)? => {
            let mut stmt = conn.prepare_cached(
                "SELECT tool, labels FROM session_calls \
                 WHERE tenant_id = ?1 AND key = ?2 AND idempotency_key <> ?3",
            )?;
            let others = stmt
                .query_map(params![tenant_id, key, idempotency_key], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect::<Result<Vec<(String, String)>, _>>()?;
            Some(others)
        }
        _ => None,
    };
    session_rows::state_of(found.as_ref(), now, own)
}

/// See [`crate::store::Store::record_session`]: inside the writer's
/// transaction, so nothing joins the session between the check and the
/// write. `false`, and nothing written, when it moved.
pub(super) fn record(
    tx: &Connection,
    tenant_id: &str,
    idempotency_key: &str,
    record: &SessionRecord,
    now: UnixMillis,
) -> Result<bool, StoreError> {
    let found = row(tx, tenant_id, &record.key)?;
    let live = found.as_ref().is_some_and(|r| r.live(now));
    if live && holds(tx, tenant_id, &record.key, idempotency_key)? {
        return Ok(true);
    }
    let Some(next) = session_rows::joined(found.as_ref(), record, now)? else {
        return Ok(false);
    };
    if !live {
        // An idle session is forgotten: its calls with it.
        tx.prepare_cached("DELETE FROM session_calls WHERE tenant_id = ?1 AND key = ?2")?
            .execute(params![tenant_id, record.key])?;
    }
    tx.prepare_cached(
        "INSERT INTO sessions (tenant_id, key, labels, tools, calls, version, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
         ON CONFLICT (tenant_id, key) DO UPDATE SET labels = excluded.labels, \
         tools = excluded.tools, calls = excluded.calls, version = excluded.version, \
         expires_at = excluded.expires_at",
    )?
    .execute(params![
        tenant_id,
        record.key,
        next.labels,
        next.tools,
        next.calls,
        next.version,
        next.expires_at
    ])?;
    tx.prepare_cached(
        "INSERT INTO session_calls (tenant_id, key, idempotency_key, tool, labels, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        tenant_id,
        record.key,
        idempotency_key,
        record.tool,
        session_rows::labels_text(record),
        next.expires_at
    ])?;
    Ok(true)
}

/// Deletes the sessions (and their calls) idle since before `before`: at
/// most `limit` of each.
pub(super) fn collect(tx: &Connection, before: UnixMillis, limit: i64) -> Result<(), StoreError> {
    tx.execute(
        "DELETE FROM sessions WHERE rowid IN \
         (SELECT rowid FROM sessions WHERE expires_at <= ?1 LIMIT ?2)",
        params![before, limit],
    )?;
    tx.execute(
        "DELETE FROM session_calls WHERE rowid IN \
         (SELECT rowid FROM session_calls WHERE expires_at <= ?1 LIMIT ?2)",
        params![before, limit],
    )?;
    Ok(())
}

/// Migration 8: sessions and the calls allowed in them.
pub(super) const MIGRATION: &str = r"
CREATE TABLE sessions (
    tenant_id TEXT NOT NULL,
    key TEXT NOT NULL,
    labels TEXT NOT NULL,
    tools TEXT NOT NULL,
    calls INTEGER NOT NULL CHECK (calls >= 0),
    version INTEGER NOT NULL CHECK (version >= 0),
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX sessions_expiry ON sessions (expires_at);
CREATE TABLE session_calls (
    tenant_id TEXT NOT NULL,
    key TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    tool TEXT NOT NULL,
    labels TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key, idempotency_key)
);
CREATE INDEX session_calls_expiry ON session_calls (expires_at);
";
