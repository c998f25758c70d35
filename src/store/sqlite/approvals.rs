//! The approvals' rows: one read, and the PENDING approval of a call.

use crate::approvals::{ApprovalRecord, ApprovalStatus, NewApproval};
use crate::clock::UnixMillis;
use crate::store::{APPROVAL_COLUMNS, StoreError, stored_risk, stored_status};
use rusqlite::{Connection, Row, params};

/// The whole call an approval is bound to (DESIGN §4), parameters ?1–?7.
pub(super) const SAME_CALL: &str = "tenant_id = ?1 AND requester_subject_id = ?2 AND tool = ?3 AND tool_version = ?4 \
     AND risk = ?5 AND arguments_sha256 = ?6 AND request_id = ?7";

/// One `approvals` row, read through `query_and_then`: a column SQLite
/// cannot give and a stored value toolgate cannot read are both a
/// [`StoreError`].
pub(super) fn approval_from_row(row: &Row<'_>) -> Result<ApprovalRecord, StoreError> {
    let (risk, status) = match (
        stored_risk(&row.get::<_, String>(6)?),
        stored_status(&row.get::<_, String>(10)?),
    ) {
        (Ok(risk), Ok(status)) => (risk, status),
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    Ok(ApprovalRecord {
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
        why: crate::store::stored_why(&row.get::<_, String>(17)?)?,
    })
}

pub(super) fn read_approval(
    conn: &Connection,
    tenant_id: &str,
    approval_id: &str,
) -> Result<Option<ApprovalRecord>, StoreError> {
    conn.prepare(&format!(
        "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tenant_id = ?1 AND approval_id = ?2"
    ))?
    .query_and_then(params![tenant_id, approval_id], approval_from_row)?
    .next()
    .transpose()
}

/// Marks EXPIRED the PENDING approvals of exactly `new`'s call whose
/// expiry has come (a pending approval past its expiry is no longer
/// pending), the first step of every call that may create an approval
/// (`approvals::machine`, `Approvals::pending_for_call` and
/// `Approvals::gateway`).
pub(super) fn lapse_pending_of_call(
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
pub(super) fn pending_in(
    tx: &rusqlite::Transaction<'_>,
    new: NewApproval,
    now: UnixMillis,
) -> Result<(ApprovalRecord, bool), StoreError> {
    lapse_pending_of_call(tx, &new, now)?;
    let existing = tx
        .prepare(&format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE status = 'PENDING' AND {SAME_CALL}"
        ))?
        .query_and_then(
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
        )?
        .next()
        .transpose()?;
    if let Some(record) = existing {
        return Ok((record, false));
    }
    // Inside BEGIN IMMEDIATE: no other writer counts or inserts meanwhile.
    let (subject, tenant): (i64, i64) = tx.query_row(
        &crate::store::pending_counts_sql('?'),
        params![new.tenant_id, new.requester_subject_id, now],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    if let Some(scope) = crate::approvals::PendingScope::exceeded(new.limits, subject, tenant) {
        return Err(StoreError::PendingLimit(scope));
    }
    tx.execute(
        &format!("INSERT INTO approvals ({APPROVAL_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'PENDING', ?11, ?12, NULL, NULL, NULL, NULL, ?13)"),
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
            new.expires_at,
            new.why.to_stored()
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
            why: new.why,
        },
        true,
    ))
}
