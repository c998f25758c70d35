//! The entity store in SQLite (DESIGN §11.6): the tables of migration 5,
//! each call one transaction on one tenant's rows.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::super::StoreError;
use crate::clock::UnixMillis;
use crate::entities::{EntityKey, EntityWalk, StoredEntity};

/// Entities and the parent edges the ancestor walk follows; a parent edge
/// goes with its entity (`ON DELETE CASCADE`, foreign keys are on).
pub(super) const MIGRATION: &str = r"
CREATE TABLE entities (
    tenant_id TEXT NOT NULL,
    entity_type TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    entity_json TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, entity_type, entity_id)
);
CREATE TABLE entity_parents (
    tenant_id TEXT NOT NULL,
    entity_type TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    parent_type TEXT NOT NULL,
    parent_id TEXT NOT NULL,
    PRIMARY KEY (tenant_id, entity_type, entity_id, parent_type, parent_id),
    FOREIGN KEY (tenant_id, entity_type, entity_id)
        REFERENCES entities (tenant_id, entity_type, entity_id) ON DELETE CASCADE
);
";

/// The resource `?2`/`?3` and its ancestors in tenant `?1`, each uid once,
/// at most `?4` uids (the LIMIT of a recursive CTE stops the recursion).
const WALK: &str = "WITH RECURSIVE walk(entity_type, entity_id) AS ( \
     SELECT ?2, ?3 \
     UNION \
     SELECT p.parent_type, p.parent_id FROM entity_parents p JOIN walk w \
       ON p.tenant_id = ?1 AND p.entity_type = w.entity_type AND p.entity_id = w.entity_id \
     LIMIT ?4) \
     SELECT e.entity_json FROM walk w LEFT JOIN entities e \
       ON e.tenant_id = ?1 AND e.entity_type = w.entity_type AND e.entity_id = w.entity_id";

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn upsert(
    conn: &mut Connection,
    tenant_id: &str,
    entities: &[StoredEntity],
    now: UnixMillis,
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut put = tx.prepare_cached(
            "INSERT INTO entities (tenant_id, entity_type, entity_id, entity_json, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (tenant_id, entity_type, entity_id) \
             DO UPDATE SET entity_json = excluded.entity_json, updated_at = excluded.updated_at",
        )?;
        let mut unlink = tx.prepare_cached(
            "DELETE FROM entity_parents WHERE tenant_id = ?1 AND entity_type = ?2 AND entity_id = ?3",
        )?;
        let mut link = tx.prepare_cached(
            "INSERT OR IGNORE INTO entity_parents \
             (tenant_id, entity_type, entity_id, parent_type, parent_id) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for e in entities {
            let (ty, id) = (&e.key.entity_type, &e.key.id);
            put.execute(params![tenant_id, ty, id, e.json, now])?;
            unlink.execute(params![tenant_id, ty, id])?;
            for p in &e.parents {
                link.execute(params![tenant_id, ty, id, p.entity_type, p.id])?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

pub(super) fn delete(
    conn: &mut Connection,
    tenant_id: &str,
    uids: &[EntityKey],
) -> Result<usize, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut n = 0;
    {
        let mut delete = tx.prepare_cached(
            "DELETE FROM entities WHERE tenant_id = ?1 AND entity_type = ?2 AND entity_id = ?3",
        )?;
        for u in uids {
            n += delete.execute(params![tenant_id, u.entity_type, u.id])?;
        }
    }
    tx.commit()?;
    Ok(n)
}

pub(super) fn get(
    conn: &Connection,
    tenant_id: &str,
    uids: Vec<EntityKey>,
) -> Result<Vec<(EntityKey, String)>, StoreError> {
    let mut read = conn.prepare_cached(
        "SELECT entity_json FROM entities WHERE tenant_id = ?1 AND entity_type = ?2 AND entity_id = ?3",
    )?;
    let mut out = Vec::new();
    for u in uids {
        let json: Option<String> = read
            .query_row(params![tenant_id, u.entity_type, u.id], |r| r.get(0))
            .optional()?;
        if let Some(json) = json {
            out.push((u, json));
        }
    }
    Ok(out)
}

pub(super) fn walk(
    conn: &Connection,
    tenant_id: &str,
    root: &EntityKey,
    max_walk: usize,
) -> Result<EntityWalk, StoreError> {
    let mut stmt = conn.prepare_cached(WALK)?;
    let rows = stmt.query_map(
        params![
            tenant_id,
            root.entity_type,
            root.id,
            limit(max_walk.saturating_add(1))
        ],
        |r| r.get::<_, Option<String>>(0),
    )?;
    let mut walk = EntityWalk::default();
    let mut visited = 0usize;
    for row in rows {
        visited += 1;
        if let Some(json) = row? {
            walk.found.push(json);
        }
    }
    walk.exceeded = visited > max_walk;
    if walk.exceeded {
        walk.found.clear();
    }
    Ok(walk)
}
