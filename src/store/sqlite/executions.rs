//! The ledger's records in SQLite: their rows, and one transition run
//! inside the caller's transaction through the pure `ledger::Transition`.

use crate::ledger::{self, ExecutionRecord, Transition, Write};
use crate::store::{
    EXECUTION_COLUMNS, StoreError, collectable_states_sql, error_to_json, signed, stored_error,
    stored_state, stored_unsigned,
};
use rusqlite::{Connection, Row, params};
use std::sync::LazyLock;

/// `Collect::covers` in SQLite: settled records, last changed at or before
/// `?1`, at most `?2` of them.
pub(super) static COLLECT_EXECUTIONS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM executions WHERE rowid IN (SELECT rowid FROM executions \
         WHERE updated_at <= ?1 AND state IN ({}) LIMIT ?2)",
        collectable_states_sql()
    )
});

/// One `executions` row, read through `query_and_then`: a column SQLite
/// cannot give and a stored value toolgate cannot read are both a
/// [`StoreError`].
pub(super) fn execution_from_row(row: &Row<'_>) -> Result<ExecutionRecord, StoreError> {
    let parsed = (
        stored_state(&row.get::<_, String>(4)?),
        stored_error(row.get::<_, Option<String>>(10)?.as_deref()),
        stored_unsigned(row.get(7)?),
        stored_unsigned(row.get(13)?),
    );
    let (state, error, fencing_token, revision) = match parsed {
        (Ok(s), Ok(e), Ok(t), Ok(r)) => (s, e, t, r),
        (Err(e), ..) | (_, Err(e), ..) | (.., Err(e), _) | (.., Err(e)) => return Err(e),
    };
    Ok(ExecutionRecord {
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
    })
}

/// The ledger's statements, prepared once per connection and kept in its
/// statement cache (`prepare_cached`) instead of parsed per transition.
pub(super) static SELECT_EXECUTION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {EXECUTION_COLUMNS} FROM executions WHERE tenant_id = ?1 AND idempotency_key = ?2"
    )
});
pub(super) static INSERT_EXECUTION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO executions ({EXECUTION_COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
    )
});
pub(super) const UPDATE_EXECUTION: &str = "UPDATE executions SET state = ?3, attempt = ?4, max_attempts = ?5, \
     fencing_token = ?6, lease_expires_at = ?7, result_json = ?8, error_json = ?9, updated_at = ?10, \
     revision = ?11 WHERE tenant_id = ?1 AND idempotency_key = ?2 AND revision = ?12";

pub(super) fn read_execution(
    conn: &Connection,
    tenant_id: &str,
    idempotency_key: &str,
) -> Result<Option<ExecutionRecord>, StoreError> {
    // Cached: every ledger transition reads its record first.
    conn.prepare_cached(&SELECT_EXECUTION)?
        .query_and_then(params![tenant_id, idempotency_key], execution_from_row)?
        .next()
        .transpose()
}

/// One ledger transition in one `BEGIN IMMEDIATE` transaction (see
/// [`Store::begin_execution`] for the protocol); the served path batches
/// them instead ([`group`]).
#[cfg(test)]
pub(super) fn transition<T: Transition>(
    conn: &mut Connection,
    step: &T,
) -> Result<T::Answer, StoreError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let answer = apply_transition(&tx, step)?;
    tx.commit()?;
    Ok(answer)
}

/// One ledger transition inside the caller's write transaction (or a
/// savepoint of it): read the record, apply the server's own rule, write.
/// The caller commits; nothing here is visible before it does.
pub(super) fn apply_transition<T: Transition>(
    tx: &Connection,
    step: &T,
) -> Result<T::Answer, StoreError> {
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
