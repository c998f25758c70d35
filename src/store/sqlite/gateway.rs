//! The approval a gateway call finds (DESIGN §11.3) in SQLite: one
//! `BEGIN IMMEDIATE` transaction, so no other writer (another call, a
//! decision, an executor's consumption) changes an approval between the
//! lookup and the consumption.

use rusqlite::{Connection, ToSql, TransactionBehavior, params};

use super::super::{APPROVAL_COLUMNS, GatewayApproval, StoreError};
use super::{approval_from_row, lapse_pending_of_call, pending_in};
use crate::approvals::{ApprovalRecord, ApprovalStatus, NewApproval};
use crate::clock::UnixMillis;

/// The call an approval is bound to minus its request id, parameters ?1–?6.
const SAME_CALL_ANY_REQUEST: &str = "tenant_id = ?1 AND requester_subject_id = ?2 AND tool = ?3 \
     AND tool_version = ?4 AND risk = ?5 AND arguments_sha256 = ?6";

/// See [`super::super::Store::approval_for_gateway_call`].
pub(super) fn approval_for_gateway_call(
    conn: &mut Connection,
    new: NewApproval,
    idempotency_key: &str,
    now: UnixMillis,
) -> Result<GatewayApproval, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // First, as in every call that may create an approval (and as the
    // PostgreSQL store does): this call's lapsed PENDING approval is
    // expired, whichever approval then answers.
    lapse_pending_of_call(&tx, &new, now)?;
    // One approval of the call, the first in `order` of those `filter`
    // admits; `?7` is now and `?8` the idempotency key where used.
    let first = |filter: &str, order: &str| -> Result<Option<ApprovalRecord>, StoreError> {
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE {SAME_CALL_ANY_REQUEST} AND {filter} \
             ORDER BY {order} LIMIT 1"
        );
        let risk = new.risk.as_str();
        let all: [&dyn ToSql; 8] = [
            &new.tenant_id,
            &new.requester_subject_id,
            &new.tool,
            &new.tool_version,
            &risk,
            &new.arguments_sha256,
            &now,
            &idempotency_key,
        ];
        let mut stmt = tx.prepare_cached(&sql)?;
        // SQLite refuses parameters a statement does not use.
        let used = all.get(..stmt.parameter_count()).unwrap_or(&all);
        let found = stmt.query_and_then(used, approval_from_row)?.next();
        found.transpose()
    };
    const OLDEST: &str = "created_at, approval_id";
    let usable = "status = 'APPROVED' AND expires_at > ?7";

    let answer = if let Some(record) = first(
        &format!("{usable} AND consumed_by_idempotency_key = ?8"),
        OLDEST,
    )? {
        GatewayApproval::Consumed {
            record,
            first: false,
        }
    } else if let Some(mut record) = first(
        &format!("{usable} AND consumed_by_idempotency_key IS NULL"),
        OLDEST,
    )? {
        // Inside BEGIN IMMEDIATE nobody consumed it since the read.
        tx.execute(
            "UPDATE approvals SET consumed_by_idempotency_key = ?3 \
             WHERE tenant_id = ?1 AND approval_id = ?2 AND consumed_by_idempotency_key IS NULL",
            params![record.tenant_id, record.approval_id, idempotency_key],
        )?;
        record.consumed_by_idempotency_key = Some(idempotency_key.to_owned());
        GatewayApproval::Consumed {
            record,
            first: true,
        }
    } else if let Some(record) = first("status = 'PENDING' AND expires_at > ?7", OLDEST)? {
        GatewayApproval::Pending(record)
    } else {
        match first("1 = 1", "created_at DESC, approval_id DESC")? {
            Some(latest)
                if latest.status == ApprovalStatus::Rejected && latest.expires_at > now =>
            {
                GatewayApproval::Rejected(latest)
            }
            // Created unless it exists (it cannot: no PENDING one was found).
            _ => match pending_in(&tx, new, now)? {
                (record, true) => GatewayApproval::Requested(record),
                (record, false) => GatewayApproval::Pending(record),
            },
        }
    };
    tx.commit()?;
    Ok(answer)
}
