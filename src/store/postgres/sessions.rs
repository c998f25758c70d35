//! Sessions in PostgreSQL (DESIGN §13.2), shared by every replica: a
//! session read in one statement (one snapshot), a call added under the
//! session row's lock, so it joins only the version its decision read,
//! whichever replica added the others.
//!
//! The first call of a session inserts its row as an empty, already idle
//! placeholder (version 0, what an absent session reads as) and locks it:
//! two first calls race on the primary key, the second waits for the first
//! to commit and then finds the version moved.

use deadpool_postgres::Object;

use super::Failure;
use crate::budgets::{SessionRecord, SessionState};
use crate::clock::UnixMillis;
use crate::store::session_rows::{self, SessionRow};

fn session_row(row: &tokio_postgres::Row) -> Result<SessionRow, tokio_postgres::Error> {
    Ok(SessionRow {
        labels: row.try_get(0)?,
        tools: row.try_get(1)?,
        calls: row.try_get(2)?,
        version: row.try_get(3)?,
        expires_at: row.try_get(4)?,
    })
}

/// See [`crate::store::Store::session_state`].
pub(super) async fn state(
    client: &Object,
    tenant_id: &str,
    key: &str,
    idempotency_key: &str,
    now: UnixMillis,
) -> Result<SessionState, Failure> {
    let stmt = client
        .prepare_cached(
            "SELECT s.labels, s.tools, s.calls, s.version, s.expires_at, \
             EXISTS (SELECT 1 FROM session_calls c WHERE c.tenant_id = s.tenant_id \
                AND c.key = s.key AND c.idempotency_key = $3) \
             FROM sessions s WHERE s.tenant_id = $1 AND s.key = $2",
        )
        .await?;
    let Some(found) = client
        .query_opt(&stmt, &[&tenant_id, &key, &idempotency_key])
        .await?
    else {
        return Ok(SessionState::default());
    };
    let row = session_row(&found)?;
    let holds: bool = found.try_get(5)?;
    let own = if holds && row.live(now) {
        let others = client
            .prepare_cached(
                "SELECT tool, labels FROM session_calls \
                 WHERE tenant_id = $1 AND key = $2 AND idempotency_key <> $3",
            )
            .await?;
        let rows = client
            .query(&others, &[&tenant_id, &key, &idempotency_key])
            .await?;
        Some(
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<Vec<(String, String)>, tokio_postgres::Error>>()?,
        )
    } else {
        None
    };
    Ok(session_rows::state_of(Some(&row), now, own)?)
}

/// See [`crate::store::Store::record_session`]: `false` (rolled back,
/// nothing written) when the session moved.
pub(super) async fn record(
    mut client: Object,
    tenant_id: &str,
    idempotency_key: &str,
    record: &SessionRecord,
    now: UnixMillis,
) -> Result<bool, Failure> {
    let placeholder = client
        .prepare_cached(
            "INSERT INTO sessions (tenant_id, key, labels, tools, calls, version, expires_at) \
             VALUES ($1, $2, '[]', '[]', 0, 0, 0) ON CONFLICT (tenant_id, key) DO NOTHING",
        )
        .await?;
    let lock = client
        .prepare_cached(
            "SELECT labels, tools, calls, version, expires_at FROM sessions \
             WHERE tenant_id = $1 AND key = $2 FOR UPDATE",
        )
        .await?;
    let holds = client
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM session_calls \
             WHERE tenant_id = $1 AND key = $2 AND idempotency_key = $3)",
        )
        .await?;
    let forget = client
        .prepare_cached("DELETE FROM session_calls WHERE tenant_id = $1 AND key = $2")
        .await?;
    let update = client
        .prepare_cached(
            "UPDATE sessions SET labels = $3, tools = $4, calls = $5, version = $6, expires_at = $7 \
             WHERE tenant_id = $1 AND key = $2",
        )
        .await?;
    let join = client
        .prepare_cached(
            "INSERT INTO session_calls (tenant_id, key, idempotency_key, tool, labels, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .await?;
    let tx = client.transaction().await?;
    tx.execute(&placeholder, &[&tenant_id, &record.key]).await?;
    let found = session_row(&tx.query_one(&lock, &[&tenant_id, &record.key]).await?)?;
    let live = found.live(now);
    if live {
        let held: bool = tx
            .query_one(&holds, &[&tenant_id, &record.key, &idempotency_key])
            .await?
            .try_get(0)?;
        if held {
            return Ok(true);
        }
    }
    let Some(next) = session_rows::joined(Some(&found), record, now)? else {
        // Dropped without a commit: rolled back.
        return Ok(false);
    };
    if !live {
        // An idle session is forgotten: its calls with it.
        tx.execute(&forget, &[&tenant_id, &record.key]).await?;
    }
    tx.execute(
        &update,
        &[
            &tenant_id,
            &record.key,
            &next.labels,
            &next.tools,
            &next.calls,
            &next.version,
            &next.expires_at,
        ],
    )
    .await?;
    tx.execute(
        &join,
        &[
            &tenant_id,
            &record.key,
            &idempotency_key,
            &record.tool,
            &session_rows::labels_text(record),
            &next.expires_at,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Deletes at most `$2` sessions idle since `$1` or before.
pub(super) const COLLECT_SESSIONS: &str = "DELETE FROM sessions WHERE ctid IN \
     (SELECT ctid FROM sessions WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// Deletes at most `$2` calls of sessions idle since `$1` or before.
pub(super) const COLLECT_CALLS: &str = "DELETE FROM session_calls WHERE ctid IN \
     (SELECT ctid FROM session_calls WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)";
