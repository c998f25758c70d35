//! Rows to domain records, and event kinds to and from their names.

use tokio_postgres::Row;

use super::super::{
    StoreError, stored_error, stored_risk, stored_state, stored_status, stored_unsigned,
};
use crate::approvals::{ApprovalEventKind, ApprovalRecord};
use crate::ledger::ExecutionRecord;

pub(super) const fn kind_name(kind: ApprovalEventKind) -> &'static str {
    match kind {
        ApprovalEventKind::Created => "created",
        ApprovalEventKind::Decided => "decided",
        ApprovalEventKind::Expired => "expired",
        ApprovalEventKind::Consumed => "consumed",
    }
}

pub(super) fn kind_from_name(name: &str) -> Option<ApprovalEventKind> {
    [
        ApprovalEventKind::Created,
        ApprovalEventKind::Decided,
        ApprovalEventKind::Expired,
        ApprovalEventKind::Consumed,
    ]
    .into_iter()
    .find(|k| kind_name(*k) == name)
}

pub(super) fn approval_from_row(row: &Row) -> Result<ApprovalRecord, StoreError> {
    Ok(ApprovalRecord {
        approval_id: row.try_get(0)?,
        tenant_id: row.try_get(1)?,
        requester_subject_id: row.try_get(2)?,
        agent_id: row.try_get(3)?,
        tool: row.try_get(4)?,
        tool_version: row.try_get(5)?,
        risk: stored_risk(row.try_get(6)?)?,
        arguments_sha256: row.try_get(7)?,
        display_arguments: row.try_get(8)?,
        request_id: row.try_get(9)?,
        status: stored_status(row.try_get(10)?)?,
        created_at: row.try_get(11)?,
        expires_at: row.try_get(12)?,
        decided_by: row.try_get(13)?,
        decided_at: row.try_get(14)?,
        reason: row.try_get(15)?,
        consumed_by_idempotency_key: row.try_get(16)?,
        why: super::super::stored_why(row.try_get(17)?)?,
    })
}

pub(super) fn approval_rows(rows: &[Row]) -> Result<Vec<ApprovalRecord>, StoreError> {
    rows.iter().map(approval_from_row).collect()
}

pub(super) fn execution_from_row(row: &Row) -> Result<ExecutionRecord, StoreError> {
    let small = |i: usize| -> Result<u32, StoreError> {
        let v: i64 = row.try_get(i)?;
        u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} is out of range")))
    };
    Ok(ExecutionRecord {
        tenant_id: row.try_get(0)?,
        idempotency_key: row.try_get(1)?,
        tool: row.try_get(2)?,
        arguments_sha256: row.try_get(3)?,
        state: stored_state(row.try_get(4)?)?,
        attempt: small(5)?,
        max_attempts: small(6)?,
        fencing_token: stored_unsigned(row.try_get(7)?)?,
        lease_expires_at: row.try_get(8)?,
        result_json: row.try_get(9)?,
        error: stored_error(row.try_get(10)?)?,
        created_at: row.try_get(11)?,
        updated_at: row.try_get(12)?,
        revision: stored_unsigned(row.try_get(13)?)?,
    })
}
