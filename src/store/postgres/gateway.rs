//! The approval a gateway call finds (DESIGN §11.3) in PostgreSQL.
//!
//! One transaction, after [`lock_call`]: the tenant's creator lock makes
//! every gateway lookup of a tenant (and every creation of an approval)
//! wait for the one before it, so of two calls racing for one approval the
//! second sees the first's consumption, and of two calls finding nothing
//! only one creates an approval. The consumption itself is a conditional
//! `UPDATE`, so an executor consuming the same approval by its id (which
//! takes no such lock) cannot consume it too: the loser runs again.

use deadpool_postgres::{Object, Transaction};
use tokio_postgres::types::ToSql;

use super::super::{APPROVAL_COLUMNS, GatewayApproval};
use super::{Failure, PostgresStore, approval_from_row, lock_call, pending_after_lock};
use crate::approvals::{ApprovalEventKind, ApprovalRecord, ApprovalStatus, NewApproval};
use crate::clock::UnixMillis;

/// The call an approval is bound to minus its request id, parameters $1–$6.
const SAME_CALL_ANY_REQUEST: &str = "tenant_id = $1 AND requester_subject_id = $2 AND tool = $3 \
     AND tool_version = $4 AND risk = $5 AND arguments_sha256 = $6";
const OLDEST: &str = "created_at, approval_id";
/// APPROVED and unexpired at `$7`.
const USABLE: &str = "status = 'APPROVED' AND expires_at > $7";

/// One run of [`super::super::Store::approval_for_gateway_call`].
pub(super) async fn approval_for_gateway_call(
    mut client: Object,
    new: &NewApproval,
    idempotency_key: &str,
    now: UnixMillis,
    origin: &str,
) -> Result<GatewayApproval, Failure> {
    let tx = client.transaction().await?;
    lock_call(&tx, new, now).await?;
    let find = Find {
        tx: &tx,
        new,
        now,
        idempotency_key,
    };
    let answer = if let Some(record) = find
        .first(
            &format!("{USABLE} AND consumed_by_idempotency_key = $8"),
            OLDEST,
        )
        .await?
    {
        GatewayApproval::Consumed {
            record,
            first: false,
        }
    } else if let Some(oldest) = find
        .first(
            &format!("{USABLE} AND consumed_by_idempotency_key IS NULL"),
            OLDEST,
        )
        .await?
    {
        let consume = format!(
            "WITH used AS (UPDATE approvals SET consumed_by_idempotency_key = $3 \
             WHERE tenant_id = $1 AND approval_id = $2 AND status = 'APPROVED' \
             AND expires_at > $4 AND consumed_by_idempotency_key IS NULL RETURNING *) \
             SELECT {APPROVAL_COLUMNS}, {} FROM used",
            PostgresStore::announce(ApprovalEventKind::Consumed, "$5")
        );
        let consume = tx.prepare_cached(&consume).await?;
        let used = tx
            .query_opt(
                &consume,
                &[
                    &oldest.tenant_id,
                    &oldest.approval_id,
                    &idempotency_key,
                    &now,
                    &origin,
                ],
            )
            .await?;
        match used {
            Some(row) => GatewayApproval::Consumed {
                record: approval_from_row(&row)?,
                first: true,
            },
            // An executor consumed it by its id since the read: again.
            None => return Err(Failure::Retry),
        }
    } else if let Some(record) = find
        .first("status = 'PENDING' AND expires_at > $7", OLDEST)
        .await?
    {
        GatewayApproval::Pending(record)
    } else {
        match find
            .first("TRUE", "created_at DESC, approval_id DESC")
            .await?
        {
            Some(latest)
                if latest.status == ApprovalStatus::Rejected && latest.expires_at > now =>
            {
                GatewayApproval::Rejected(latest)
            }
            // Created unless it exists (it cannot: no PENDING one was found
            // under the lock every creator takes).
            _ => match pending_after_lock(&tx, new, now, origin).await? {
                (record, true) => GatewayApproval::Requested(record),
                (record, false) => GatewayApproval::Pending(record),
            },
        }
    };
    tx.commit().await?;
    Ok(answer)
}

/// The lookups of one call's approvals.
struct Find<'a> {
    tx: &'a Transaction<'a>,
    new: &'a NewApproval,
    now: UnixMillis,
    idempotency_key: &'a str,
}

impl Find<'_> {
    /// The first approval of the call (minus its request id) in `order` of
    /// those `filter` admits; `$7` is now and `$8` the idempotency key
    /// where used.
    async fn first(&self, filter: &str, order: &str) -> Result<Option<ApprovalRecord>, Failure> {
        let risk = self.new.risk.as_str();
        let all: [&(dyn ToSql + Sync); 8] = [
            &self.new.tenant_id,
            &self.new.requester_subject_id,
            &self.new.tool,
            &self.new.tool_version,
            &risk,
            &self.new.arguments_sha256,
            &self.now,
            &self.idempotency_key,
        ];
        let stmt = self
            .tx
            .prepare_cached(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE {SAME_CALL_ANY_REQUEST} AND {filter} \
                 ORDER BY {order} LIMIT 1"
            ))
            .await?;
        // The server refuses parameters a statement does not use.
        let used = all.get(..stmt.params().len()).unwrap_or(&all);
        let row = self.tx.query_opt(&stmt, used).await?;
        Ok(row.as_ref().map(approval_from_row).transpose()?)
    }
}
