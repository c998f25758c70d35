//! Budget charges in SQLite (DESIGN §13.1): each key's usage read in one
//! statement, a charge made by the one writer inside its `BEGIN IMMEDIATE`
//! batch only if no key it charges moved since its decision read it.

use rusqlite::{Connection, OptionalExtension, params};

use crate::budgets::{BudgetKey, Charge, Usage};
use crate::clock::UnixMillis;
use crate::store::StoreError;

/// The sums at or above this are refused as an overflow (`used` is `None`),
/// on every backend alike: SQLite's `SUM` would fail on the way past
/// `i64::MAX`, and `TOTAL` (a float) is exact to well below it.
pub(in crate::store) const SUM_CEILING: f64 = 9.0e18;

/// One key's usage at `?4` (its window's start is `?4 - ?6`): version, sum
/// of the live charges in the window but the operation `?5`'s, and whether
/// `?5` holds a live charge in it.
const USAGE: &str = "SELECT \
     COALESCE((SELECT version FROM budget_keys WHERE tenant_id = ?1 AND budget = ?2 AND key = ?3), 0), \
     CASE WHEN (SELECT TOTAL(amount) FROM budget_charges WHERE tenant_id = ?1 AND budget = ?2 \
         AND key = ?3 AND charged_at > ?4 - ?6 AND released_at IS NULL AND idempotency_key <> ?5) >= ?7 \
       THEN NULL \
       ELSE (SELECT COALESCE(SUM(amount), 0) FROM budget_charges WHERE tenant_id = ?1 AND budget = ?2 \
         AND key = ?3 AND charged_at > ?4 - ?6 AND released_at IS NULL AND idempotency_key <> ?5) END, \
     EXISTS (SELECT 1 FROM budget_charges WHERE tenant_id = ?1 AND budget = ?2 AND key = ?3 \
         AND idempotency_key = ?5 AND charged_at > ?4 - ?6 AND released_at IS NULL)";

/// See [`crate::store::Store::budget_usage`].
pub(super) fn usage(
    conn: &Connection,
    tenant_id: &str,
    idempotency_key: &str,
    keys: &[BudgetKey],
    now: UnixMillis,
) -> Result<Vec<Usage>, StoreError> {
    let mut stmt = conn.prepare_cached(USAGE)?;
    keys.iter()
        .map(|k| {
            let (version, used, charged) = stmt.query_row(
                params![
                    tenant_id,
                    k.budget,
                    k.key,
                    now,
                    idempotency_key,
                    k.window_ms,
                    SUM_CEILING
                ],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Option<i64>>(1)?, r.get(2)?)),
            )?;
            Ok(Usage {
                used,
                version,
                charged,
            })
        })
        .collect()
}

/// See [`crate::store::Store::charge_budgets`]: inside the writer's
/// transaction, so nothing charges these keys between the check and the
/// write. `false`, and nothing written, when a key moved.
pub(super) fn charge(
    tx: &Connection,
    tenant_id: &str,
    idempotency_key: &str,
    charges: &[Charge],
    now: UnixMillis,
) -> Result<bool, StoreError> {
    let mut version = tx.prepare_cached(
        "SELECT version FROM budget_keys WHERE tenant_id = ?1 AND budget = ?2 AND key = ?3",
    )?;
    for c in charges {
        let current: Option<i64> = version
            .query_row(params![tenant_id, c.key.budget, c.key.key], |r| r.get(0))
            .optional()?;
        if current.unwrap_or(0) != c.seen_version {
            return Ok(false);
        }
    }
    let mut bump = tx.prepare_cached(
        "INSERT INTO budget_keys (tenant_id, budget, key, version) VALUES (?1, ?2, ?3, 1) \
         ON CONFLICT (tenant_id, budget, key) DO UPDATE SET version = version + 1",
    )?;
    let mut write = tx.prepare_cached(
        "INSERT INTO budget_charges (tenant_id, budget, key, idempotency_key, amount, charged_at, \
         expires_at, released_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL) \
         ON CONFLICT (tenant_id, budget, key, idempotency_key) DO UPDATE SET amount = excluded.amount, \
         charged_at = excluded.charged_at, expires_at = excluded.expires_at, released_at = NULL",
    )?;
    for c in charges {
        bump.execute(params![tenant_id, c.key.budget, c.key.key])?;
        write.execute(params![
            tenant_id,
            c.key.budget,
            c.key.key,
            idempotency_key,
            c.amount,
            now,
            now.saturating_add(c.key.window_ms)
        ])?;
    }
    Ok(true)
}

/// Releases the live charges of one operation: the budgets' names, one
/// per released charge, in name order.
pub(super) fn release(
    tx: &Connection,
    tenant_id: &str,
    idempotency_key: &str,
    now: UnixMillis,
) -> Result<Vec<String>, StoreError> {
    let mut stmt = tx.prepare_cached(
        "UPDATE budget_charges SET released_at = ?3 \
         WHERE tenant_id = ?1 AND idempotency_key = ?2 AND released_at IS NULL RETURNING budget",
    )?;
    let mut names = stmt
        .query_map(params![tenant_id, idempotency_key, now], |r| r.get(0))?
        .collect::<Result<Vec<String>, _>>()?;
    names.sort();
    Ok(names)
}

/// Deletes the charges that left their window before `before`: at most
/// `limit`, how many.
pub(super) fn collect(
    tx: &Connection,
    before: UnixMillis,
    limit: i64,
) -> Result<usize, StoreError> {
    Ok(tx.execute(
        "DELETE FROM budget_charges WHERE rowid IN \
         (SELECT rowid FROM budget_charges WHERE expires_at <= ?1 LIMIT ?2)",
        params![before, limit],
    )?)
}

/// Migration 7: budget keys and their charges.
pub(super) const MIGRATION: &str = r"
CREATE TABLE budget_keys (
    tenant_id TEXT NOT NULL,
    budget TEXT NOT NULL,
    key TEXT NOT NULL,
    version INTEGER NOT NULL CHECK (version >= 1),
    PRIMARY KEY (tenant_id, budget, key)
);
CREATE TABLE budget_charges (
    tenant_id TEXT NOT NULL,
    budget TEXT NOT NULL,
    key TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount >= 0),
    charged_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    released_at INTEGER,
    PRIMARY KEY (tenant_id, budget, key, idempotency_key)
);
CREATE INDEX budget_charges_window ON budget_charges (tenant_id, budget, key, charged_at);
CREATE INDEX budget_charges_of_call ON budget_charges (tenant_id, idempotency_key);
CREATE INDEX budget_charges_expiry ON budget_charges (expires_at);
";
