//! The entity store in PostgreSQL (DESIGN §11.6): on the tables of
//! migration 4 (`migrations.rs`), each call one transaction (or one statement) on one tenant's rows,
//! whatever the number of entities: uids travel as arrays (`UNNEST`).

use deadpool_postgres::Object;

use super::Failure;
use crate::clock::UnixMillis;
use crate::entities::{EntityKey, EntityWalk, StoredEntity};

/// The resource `$2`/`$3` and its ancestors in tenant `$1`, each uid once
/// (`UNION`), at most `$4` uids: PostgreSQL evaluates a recursive query
/// only as far as its reader fetches, so the LIMIT bounds the walk.
const WALK: &str = "WITH RECURSIVE walk(entity_type, entity_id) AS ( \
     SELECT $2::text COLLATE \"C\", $3::text COLLATE \"C\" \
     UNION \
     SELECT p.parent_type, p.parent_id FROM entity_parents p JOIN walk w \
       ON p.tenant_id = $1 AND p.entity_type = w.entity_type AND p.entity_id = w.entity_id), \
     bounded AS (SELECT entity_type, entity_id FROM walk LIMIT $4) \
     SELECT e.entity_json FROM bounded b LEFT JOIN entities e \
       ON e.tenant_id = $1 AND e.entity_type = b.entity_type AND e.entity_id = b.entity_id";

/// The types and ids of `keys`, as two parallel arrays.
fn columns<'a>(keys: impl Iterator<Item = &'a EntityKey>) -> (Vec<&'a str>, Vec<&'a str>) {
    keys.map(|k| (k.entity_type.as_str(), k.id.as_str()))
        .unzip()
}

pub(super) async fn upsert(
    mut client: Object,
    tenant_id: &str,
    entities: &[StoredEntity],
    now: UnixMillis,
) -> Result<(), Failure> {
    // In key order, so two upserts of overlapping sets lock rows in the
    // same order (a deadlock would still be rolled back and run again).
    let mut sorted: Vec<&StoredEntity> = entities.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let (types, ids) = columns(sorted.iter().map(|e| &e.key));
    let jsons: Vec<&str> = sorted.iter().map(|e| e.json.as_str()).collect();
    let mut edges: (Vec<&str>, Vec<&str>, Vec<&str>, Vec<&str>) = Default::default();
    for e in &sorted {
        for p in &e.parents {
            edges.0.push(&e.key.entity_type);
            edges.1.push(&e.key.id);
            edges.2.push(&p.entity_type);
            edges.3.push(&p.id);
        }
    }
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO entities (tenant_id, entity_type, entity_id, entity_json, updated_at) \
         SELECT $1, t, i, j, $5 FROM UNNEST($2::text[], $3::text[], $4::text[]) AS u(t, i, j) \
         ORDER BY t, i \
         ON CONFLICT (tenant_id, entity_type, entity_id) \
         DO UPDATE SET entity_json = EXCLUDED.entity_json, updated_at = EXCLUDED.updated_at",
        &[&tenant_id, &types, &ids, &jsons, &now],
    )
    .await?;
    tx.execute(
        "DELETE FROM entity_parents WHERE tenant_id = $1 AND (entity_type, entity_id) IN \
         (SELECT t, i FROM UNNEST($2::text[], $3::text[]) AS u(t, i))",
        &[&tenant_id, &types, &ids],
    )
    .await?;
    tx.execute(
        "INSERT INTO entity_parents (tenant_id, entity_type, entity_id, parent_type, parent_id) \
         SELECT DISTINCT $1, t, i, pt, pi \
         FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[]) AS u(t, i, pt, pi)",
        &[&tenant_id, &edges.0, &edges.1, &edges.2, &edges.3],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn delete(
    client: Object,
    tenant_id: &str,
    uids: &[EntityKey],
) -> Result<usize, Failure> {
    let (types, ids) = columns(uids.iter());
    let n = client
        .execute(
            "DELETE FROM entities WHERE tenant_id = $1 AND (entity_type, entity_id) IN \
             (SELECT t, i FROM UNNEST($2::text[], $3::text[]) AS u(t, i))",
            &[&tenant_id, &types, &ids],
        )
        .await?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

pub(super) async fn get(
    client: Object,
    tenant_id: &str,
    uids: &[EntityKey],
) -> Result<Vec<(EntityKey, String)>, Failure> {
    let (types, ids) = columns(uids.iter());
    let rows = client
        .query(
            "SELECT u.t, u.i, e.entity_json \
             FROM UNNEST($2::text[], $3::text[]) WITH ORDINALITY AS u(t, i, n) \
             JOIN entities e ON e.tenant_id = $1 AND e.entity_type = u.t AND e.entity_id = u.i \
             ORDER BY u.n",
            &[&tenant_id, &types, &ids],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok((
                EntityKey::new(r.try_get::<_, String>(0)?, r.try_get::<_, String>(1)?),
                r.try_get(2)?,
            ))
        })
        .collect()
}

pub(super) async fn walk(
    client: Object,
    tenant_id: &str,
    root: &EntityKey,
    max_walk: usize,
) -> Result<EntityWalk, Failure> {
    let bound = i64::try_from(max_walk.saturating_add(1)).unwrap_or(i64::MAX);
    let stmt = client.prepare_cached(WALK).await?;
    let rows = client
        .query(&stmt, &[&tenant_id, &root.entity_type, &root.id, &bound])
        .await?;
    let exceeded = rows.len() > max_walk;
    let found = if exceeded {
        Vec::new()
    } else {
        rows.iter()
            .map(|r| r.try_get::<_, Option<String>>(0))
            .filter_map(Result::transpose)
            .collect::<Result<_, _>>()?
    };
    Ok(EntityWalk { found, exceeded })
}
