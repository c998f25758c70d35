//! A ledger transition in one transaction: the record locked from read to
//! commit, a fresh random fencing token for an acquisition.

use deadpool_postgres::Object;

use super::super::{EXECUTION_COLUMNS, StoreError, error_to_json, signed};
use super::{Failure, execution_from_row};
use crate::ledger::{Transition, Write};

/// One run of a ledger transition (see [`Store::begin_execution`]).
pub(super) async fn transition<T: Transition>(
    mut client: Object,
    step: &T,
) -> Result<T::Answer, Failure> {
    let read = client
        .prepare_cached(&format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions \
             WHERE tenant_id = $1 AND idempotency_key = $2 FOR UPDATE"
        ))
        .await?;
    let tx = client.transaction().await?;
    let id = step.id();
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id.tenant_id, &id.idempotency_key];
    let row = tx.query_opt(&read, &key).await?;
    let current = row.as_ref().map(execution_from_row).transpose()?;
    let next_token = crate::ledger::fresh_fencing_token().map_err(|_| StoreError::Random)?;
    let (answer, write) = step.apply(current.as_ref(), next_token);
    match &write {
        Write::Nothing => {}
        Write::Insert(r) => {
            let insert = tx
                .prepare_cached(&format!(
                    "INSERT INTO executions ({EXECUTION_COLUMNS}) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
                     ON CONFLICT (tenant_id, idempotency_key) DO NOTHING"
                ))
                .await?;
            let inserted = tx
                .execute(
                    &insert,
                    &[
                        &r.tenant_id,
                        &r.idempotency_key,
                        &r.tool,
                        &r.arguments_sha256,
                        &r.state.as_str(),
                        &i64::from(r.attempt),
                        &i64::from(r.max_attempts),
                        &signed(r.fencing_token)?,
                        &r.lease_expires_at,
                        &r.result_json,
                        &r.error.as_ref().map(error_to_json),
                        &r.created_at,
                        &r.updated_at,
                        &signed(r.revision)?,
                    ],
                )
                .await?;
            if inserted != 1 {
                // A concurrent transition inserted this key first: read it.
                return Err(Failure::Retry);
            }
        }
        Write::Update {
            record: r,
            previous_revision,
        } => {
            // The identity, tool and hash of a record never change.
            let update = tx
                .prepare_cached(
                    "UPDATE executions SET state = $3, attempt = $4, max_attempts = $5, \
                     fencing_token = $6, lease_expires_at = $7, result_json = $8, error_json = $9, \
                     updated_at = $10, revision = $11 \
                     WHERE tenant_id = $1 AND idempotency_key = $2 AND revision = $12",
                )
                .await?;
            let changed = tx
                .execute(
                    &update,
                    &[
                        &r.tenant_id,
                        &r.idempotency_key,
                        &r.state.as_str(),
                        &i64::from(r.attempt),
                        &i64::from(r.max_attempts),
                        &signed(r.fencing_token)?,
                        &r.lease_expires_at,
                        &r.result_json,
                        &r.error.as_ref().map(error_to_json),
                        &r.updated_at,
                        &signed(r.revision)?,
                        &signed(*previous_revision)?,
                    ],
                )
                .await?;
            if changed != 1 {
                return Err(StoreError::Conflict {
                    expected: *previous_revision,
                }
                .into());
            }
        }
    }
    tx.commit().await?;
    Ok(answer)
}
