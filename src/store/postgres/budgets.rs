//! Budget charges in PostgreSQL (DESIGN §13.1), shared by every replica:
//! a key's usage read in one statement (one snapshot), a charge made by
//! conditional writes on the keys' rows, so a charge lands only on the
//! version its decision read, whichever replica made the other charges.
//!
//! Under READ COMMITTED, `UPDATE … WHERE version = $seen` waits for a
//! concurrent charge of the same key to end and then re-reads the row: it
//! changes nothing once that charge committed, and the whole charge rolls
//! back as stale. The first charge of a key inserts its row; two first
//! charges race on its primary key and the loser writes nothing: stale
//! too. Keys are charged in (budget, key) order, so two calls charging the
//! same keys never wait for each other in a cycle.

use deadpool_postgres::Object;

use super::Failure;
use crate::budgets::{BudgetKey, Charge, Usage};
use crate::clock::UnixMillis;

/// See the SQLite store's `SUM_CEILING`: the same ceiling, exactly
/// (`SUM(BIGINT)` is NUMERIC, compared with it before the cast back).
const SUM_CEILING: i64 = 9_000_000_000_000_000_000;

/// See [`crate::store::Store::budget_usage`]: one statement per key.
pub(super) async fn usage(
    client: &Object,
    tenant_id: &str,
    idempotency_key: &str,
    keys: &[BudgetKey],
    now: UnixMillis,
) -> Result<Vec<Usage>, Failure> {
    let stmt = client
        .prepare_cached(
            "SELECT \
             COALESCE((SELECT version FROM budget_keys WHERE tenant_id = $1 AND budget = $2 AND key = $3), 0), \
             (SELECT CASE WHEN COALESCE(SUM(amount), 0) >= $7::BIGINT THEN NULL ELSE COALESCE(SUM(amount), 0)::BIGINT END \
                FROM budget_charges WHERE tenant_id = $1 AND budget = $2 AND key = $3 \
                AND charged_at > $4::BIGINT - $6::BIGINT AND released_at IS NULL AND idempotency_key <> $5), \
             EXISTS (SELECT 1 FROM budget_charges WHERE tenant_id = $1 AND budget = $2 AND key = $3 \
                AND idempotency_key = $5 AND charged_at > $4::BIGINT - $6::BIGINT AND released_at IS NULL)",
        )
        .await?;
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        let row = client
            .query_one(
                &stmt,
                &[
                    &tenant_id,
                    &k.budget,
                    &k.key,
                    &now,
                    &idempotency_key,
                    &k.window_ms,
                    &SUM_CEILING,
                ],
            )
            .await?;
        out.push(Usage {
            version: row.try_get(0)?,
            used: row.try_get(1)?,
            charged: row.try_get(2)?,
        });
    }
    Ok(out)
}

/// See [`crate::store::Store::charge_budgets`]: `false` (rolled back,
/// nothing written) when a key moved.
pub(super) async fn charge(
    mut client: Object,
    tenant_id: &str,
    idempotency_key: &str,
    charges: &[Charge],
    now: UnixMillis,
) -> Result<bool, Failure> {
    let mut ordered: Vec<&Charge> = charges.iter().collect();
    ordered.sort_by(|a, b| (&a.key.budget, &a.key.key).cmp(&(&b.key.budget, &b.key.key)));
    let bump = client
        .prepare_cached(
            "UPDATE budget_keys SET version = version + 1 \
             WHERE tenant_id = $1 AND budget = $2 AND key = $3 AND version = $4",
        )
        .await?;
    let first = client
        .prepare_cached(
            "INSERT INTO budget_keys (tenant_id, budget, key, version) VALUES ($1, $2, $3, 1) \
             ON CONFLICT (tenant_id, budget, key) DO NOTHING",
        )
        .await?;
    let write = client
        .prepare_cached(
            "INSERT INTO budget_charges (tenant_id, budget, key, idempotency_key, amount, charged_at, \
             expires_at, released_at) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL) \
             ON CONFLICT (tenant_id, budget, key, idempotency_key) DO UPDATE SET amount = EXCLUDED.amount, \
             charged_at = EXCLUDED.charged_at, expires_at = EXCLUDED.expires_at, released_at = NULL",
        )
        .await?;
    let tx = client.transaction().await?;
    for c in ordered {
        let moved = if c.seen_version == 0 {
            tx.execute(&first, &[&tenant_id, &c.key.budget, &c.key.key])
                .await?
        } else {
            tx.execute(
                &bump,
                &[&tenant_id, &c.key.budget, &c.key.key, &c.seen_version],
            )
            .await?
        };
        if moved != 1 {
            // Dropped without a commit: rolled back.
            return Ok(false);
        }
        tx.execute(
            &write,
            &[
                &tenant_id,
                &c.key.budget,
                &c.key.key,
                &idempotency_key,
                &c.amount,
                &now,
                &now.saturating_add(c.key.window_ms),
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// The release statement: `$1` tenant, `$2` operation, `$3` now.
pub(super) const RELEASE: &str = "UPDATE budget_charges SET released_at = $3 \
     WHERE tenant_id = $1 AND idempotency_key = $2 AND released_at IS NULL RETURNING budget";

/// Deletes at most `$2` charges whose window ended at or before `$1`.
pub(super) const COLLECT: &str = "DELETE FROM budget_charges WHERE ctid IN \
     (SELECT ctid FROM budget_charges WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)";
