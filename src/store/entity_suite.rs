//! The entity store's semantics (DESIGN §11.6) every backend must keep:
//! replace by uid, tenants apart, a bounded ancestor walk, whole upserts
//! under concurrency. Run through `store_suite!` like every other check
//! of `suite.rs`, which re-exports these.

use std::sync::Arc;

use super::suite::{Backend, at_once};
use crate::entities::{EntityKey, EntityWalk, StoredEntity};
use crate::store::Store;

fn key(ty: &str, id: &str) -> EntityKey {
    EntityKey::new(ty, id)
}

/// A stored entity whose JSON names its tenant and a marker, so a read
/// shows whose version it is.
fn entity(ty: &str, id: &str, parents: &[(&str, &str)], marker: &str) -> StoredEntity {
    let parents: Vec<EntityKey> = parents.iter().map(|(t, i)| key(t, i)).collect();
    let json = serde_json::json!({
        "uid": {"type": ty, "id": id},
        "parents": parents.iter().map(|p| serde_json::json!({"type": p.entity_type, "id": p.id})).collect::<Vec<_>>(),
        "attrs": {"marker": marker},
    })
    .to_string();
    StoredEntity {
        key: key(ty, id),
        parents,
        json,
    }
}

fn json_of(e: &StoredEntity) -> String {
    e.json.clone()
}

/// Found entities, sorted, for comparisons that do not depend on walk order.
fn sorted(walk: EntityWalk) -> (Vec<String>, bool) {
    let mut found = walk.found;
    found.sort();
    (found, walk.exceeded)
}

/// Upsert, read back in the order asked, replace (JSON and parents),
/// delete: every call sees exactly what the last write left.
pub async fn entities_are_replaced_read_and_deleted_by_uid(backend: &dyn Backend) {
    let store = &*backend.open().await;
    let o1 = entity("Order", "ord_1", &[("Tenant", "acme")], "first");
    let o2 = entity("Order", "ord_2", &[], "second");
    store
        .upsert_entities("acme", vec![o1.clone(), o2.clone()], 10)
        .await
        .unwrap();
    let got = store
        .get_entities(
            "acme",
            vec![
                key("Order", "ord_2"),
                key("Order", "missing"),
                key("Order", "ord_1"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        got,
        vec![
            (key("Order", "ord_2"), json_of(&o2)),
            (key("Order", "ord_1"), json_of(&o1)),
        ]
    );
    // The same uid again replaces the entity and its parents.
    let folder = entity("Folder", "f1", &[], "folder");
    let o1b = entity("Order", "ord_1", &[("Folder", "f1")], "replaced");
    store
        .upsert_entities("acme", vec![o1b.clone(), folder.clone()], 20)
        .await
        .unwrap();
    let got = store
        .get_entities("acme", vec![key("Order", "ord_1")])
        .await
        .unwrap();
    assert_eq!(got, vec![(key("Order", "ord_1"), json_of(&o1b))]);
    let walk = store
        .walk_entities("acme", key("Order", "ord_1"), 10)
        .await
        .unwrap();
    let mut expected = vec![json_of(&o1b), json_of(&folder)];
    expected.sort();
    assert_eq!(sorted(walk), (expected, false));
    // Deleting counts what was stored; a missing uid is no error.
    let n = store
        .delete_entities("acme", vec![key("Order", "ord_1"), key("Order", "missing")])
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        store
            .get_entities("acme", vec![key("Order", "ord_1"), key("Order", "ord_2")])
            .await
            .unwrap(),
        vec![(key("Order", "ord_2"), json_of(&o2))]
    );
    // Its parent edges went with it: the walk finds nothing now.
    assert_eq!(
        store
            .walk_entities("acme", key("Order", "ord_1"), 10)
            .await
            .unwrap(),
        EntityWalk::default()
    );
    // Another store on the same database sees the same rows.
    let other = backend.open().await;
    assert_eq!(
        other
            .get_entities("acme", vec![key("Order", "ord_2")])
            .await
            .unwrap()
            .len(),
        1
    );
}

/// A tenant's reads, walks and deletes touch its own rows only.
pub async fn entities_of_one_tenant_are_invisible_to_another(backend: &dyn Backend) {
    let store = &*backend.open().await;
    let acme = entity("Order", "ord_1", &[("Folder", "shared")], "acme");
    let globex = entity("Order", "ord_1", &[("Folder", "shared")], "globex");
    let globex_folder = entity("Folder", "shared", &[], "globex folder");
    store
        .upsert_entities("acme", vec![acme.clone()], 1)
        .await
        .unwrap();
    store
        .upsert_entities("globex", vec![globex.clone(), globex_folder], 1)
        .await
        .unwrap();
    let got = store
        .get_entities("acme", vec![key("Order", "ord_1"), key("Folder", "shared")])
        .await
        .unwrap();
    assert_eq!(got, vec![(key("Order", "ord_1"), json_of(&acme))]);
    // acme's walk reaches the uid Folder::"shared" but never globex's row.
    let walk = store
        .walk_entities("acme", key("Order", "ord_1"), 10)
        .await
        .unwrap();
    assert_eq!(sorted(walk), (vec![json_of(&acme)], false));
    assert_eq!(
        store
            .walk_entities("initech", key("Order", "ord_1"), 10)
            .await
            .unwrap(),
        EntityWalk::default()
    );
    // globex deleting its ord_1 leaves acme's.
    assert_eq!(
        store
            .delete_entities("globex", vec![key("Order", "ord_1")])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .get_entities("acme", vec![key("Order", "ord_1")])
            .await
            .unwrap(),
        vec![(key("Order", "ord_1"), json_of(&acme))]
    );
}

/// The walk follows stored parents transitively, visits each uid once (a
/// cycle ends it), counts uids that are not stored, and says when it
/// would visit more than its bound (finding nothing then).
pub async fn the_ancestor_walk_is_transitive_and_bounded(backend: &dyn Backend) {
    let store = &*backend.open().await;
    // f0 → f1 → f2 → f3 → f0 (a cycle), f2 → Tenant::"acme" (not stored),
    // and a diamond: f1 → g, f3 → g.
    let chain = vec![
        entity("Folder", "f0", &[("Folder", "f1")], "0"),
        entity("Folder", "f1", &[("Folder", "f2"), ("Folder", "g")], "1"),
        entity("Folder", "f2", &[("Folder", "f3"), ("Tenant", "acme")], "2"),
        entity("Folder", "f3", &[("Folder", "f0"), ("Folder", "g")], "3"),
        entity("Folder", "g", &[], "g"),
        entity("Folder", "unrelated", &[], "u"),
    ];
    store
        .upsert_entities("acme", chain.clone(), 1)
        .await
        .unwrap();
    let mut all: Vec<String> = chain.iter().take(5).map(json_of).collect();
    all.sort();
    // Six uids in all: five stored folders and the tenant.
    for bound in [6, 7, 100] {
        let walk = store
            .walk_entities("acme", key("Folder", "f0"), bound)
            .await
            .unwrap();
        assert_eq!(sorted(walk), (all.clone(), false), "bound {bound}");
    }
    let walk = store
        .walk_entities("acme", key("Folder", "f0"), 5)
        .await
        .unwrap();
    assert_eq!(
        walk,
        EntityWalk {
            found: Vec::new(),
            exceeded: true
        }
    );
    // From the middle: f2, f3, f0, f1, g and the tenant: the same six.
    let walk = store
        .walk_entities("acme", key("Folder", "f2"), 6)
        .await
        .unwrap();
    assert_eq!(sorted(walk), (all, false));
    // A leaf walks to itself alone; a root not stored finds nothing.
    let walk = store
        .walk_entities("acme", key("Folder", "g"), 1)
        .await
        .unwrap();
    assert_eq!(sorted(walk), (vec![json_of(&chain[4])], false));
    assert_eq!(
        store
            .walk_entities("acme", key("Folder", "nope"), 1)
            .await
            .unwrap(),
        EntityWalk::default()
    );
}

/// Concurrent upserts of one uid from two connections: the survivor is one
/// writer's whole entity, its JSON and its parents together.
pub async fn concurrent_upserts_leave_one_whole_entity(backend: &dyn Backend) {
    let stores = [backend.open().await, backend.open().await];
    let parents = vec![
        entity("Folder", "pa", &[], "pa"),
        entity("Folder", "pb", &[], "pb"),
    ];
    stores[0]
        .upsert_entities("acme", parents.clone(), 1)
        .await
        .unwrap();
    let versions = [
        entity("Order", "x", &[("Folder", "pa")], "a"),
        entity("Order", "x", &[("Folder", "pb")], "b"),
    ];
    let written = at_once(&stores, 16, |store: Arc<dyn Store>, i| {
        let version = versions[i % 2].clone();
        async move {
            store
                .upsert_entities("acme", vec![version], 2)
                .await
                .unwrap();
        }
    })
    .await;
    assert_eq!(written.len(), 16);
    let walk = stores[1]
        .walk_entities("acme", key("Order", "x"), 10)
        .await
        .unwrap();
    let (found, exceeded) = sorted(walk);
    assert!(!exceeded);
    let whole_a = {
        let mut v = vec![json_of(&versions[0]), json_of(&parents[0])];
        v.sort();
        v
    };
    let whole_b = {
        let mut v = vec![json_of(&versions[1]), json_of(&parents[1])];
        v.sort();
        v
    };
    assert!(found == whole_a || found == whole_b, "{found:?}");
}
