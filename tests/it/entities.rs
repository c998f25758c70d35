//! The entity store (DESIGN §11.6) over real gRPC: entities upserted per
//! tenant through `EntityService` decide `Authorize` calls that give no
//! `entities_json`; tenants never see each other's; every refusal has its
//! code and writes nothing; `"[]"` given means the store is not read; the
//! real `toolgate serve` keeps entities across a SIGKILL.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

use toolgate::access::{AccessPolicy, CallerPattern, Grant, ServiceName, TenantScope};
use toolgate::audit::{AuditConfig, AuditSink};
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::entity_service_client::EntityServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::sidecar::Sidecar;
use crate::support::{Backend, TestServer, auth, both_backends, code, details, request};

const GET_ORDER: &str = r#"{"order_id":"ord_1001"}"#;

/// Order `ord_1001` of `tenant`, owned by `owner`, worth `total` cents.
fn order(tenant: &str, owner: &str, total: i64) -> Value {
    json!({"uid": {"type": "Order", "id": "ord_1001"}, "parents": [{"type": "Tenant", "id": tenant}],
           "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": tenant}},
                     "owner": {"__entity": {"type": "User", "id": owner}},
                     "status": "delivered", "total_cents": total}})
}

fn uid(ty: &str, id: &str) -> pb::EntityUid {
    pb::EntityUid {
        r#type: ty.into(),
        id: id.into(),
    }
}

async fn entities_client(server: &TestServer) -> EntityServiceClient<Channel> {
    EntityServiceClient::new(server.channel().await)
}

async fn upsert(
    client: &mut EntityServiceClient<Channel>,
    tenant: &str,
    entities: &Value,
) -> Result<u32, tonic::Status> {
    client
        .upsert_entities(pb::UpsertEntitiesRequest {
            tenant_id: tenant.into(),
            entities_json: entities.to_string(),
        })
        .await
        .map(|r| r.into_inner().upserted_count)
}

/// Writes one entity for `tenant`, which must be accepted.
async fn put(client: &mut EntityServiceClient<Channel>, tenant: &str, entity: Value) {
    assert_eq!(upsert(client, tenant, &json!([entity])).await.unwrap(), 1);
}

/// The decision and its envelope code (`""` for an allow).
fn verdict(r: &pb::AuthorizeResponse) -> (Decision, &str) {
    (r.decision(), code(r))
}

async fn get(client: &mut EntityServiceClient<Channel>, tenant: &str) -> Value {
    let text = client
        .get_entities(pb::GetEntitiesRequest {
            tenant_id: tenant.into(),
            uids: vec![uid("Order", "ord_1001"), uid("Order", "ord_2")],
        })
        .await
        .unwrap()
        .into_inner()
        .entities_json;
    serde_json::from_str(&text).unwrap()
}

/// `get_order` by alice, a customer of `tenant` with only `orders:read`,
/// with no `entities_json` (the store decides) unless `given`.
async fn alice_reads(
    client: &mut AuthorizationServiceClient<Channel>,
    tenant: &str,
    given: &str,
) -> pb::AuthorizeResponse {
    let mut req = request("get_order", GET_ORDER);
    req.auth = Some(auth("alice", tenant, &[], &["orders:read"]));
    req.entities_json = given.into();
    client.authorize(req).await.unwrap().into_inner()
}

/// The `ErrorInfo` reason and metadata of a status.
fn info(status: &tonic::Status) -> (String, std::collections::HashMap<String, String>) {
    let details = status.get_error_details();
    let info = details.error_info().expect("ErrorInfo details");
    (info.reason.clone(), info.metadata.clone())
}

both_backends!(
    a_stored_resource_decides_authorize_without_entities,
    tenants_never_see_each_others_entities,
);

/// Upsert, then `Authorize` with no `entities_json`: the stored owner
/// allows alice, a stored new owner denies her, the stored total bounds a
/// refund; deleted, the order is `resource_not_found`; `"[]"` given is
/// decided without the store.
async fn a_stored_resource_decides_authorize_without_entities(backend: Backend) {
    let server = TestServer::start_on(backend).await;
    let mut entities = entities_client(&server).await;
    let mut client = server.client().await;

    // Nothing stored: as before, the resource is not found.
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Deny, "resource_not_found"));
    assert_eq!(details(&r)["resource"], json!("Order::\"ord_1001\""));

    put(&mut entities, "acme", order("acme", "alice", 5000)).await;
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Allow, ""), "{:?}", r.error);

    // The same uid again replaces it: carol's order now, alice is denied.
    put(&mut entities, "acme", order("acme", "carol", 5000)).await;
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Deny, "forbidden"));

    // The stored total bounds a refund by the support agent.
    let mut refund = request(
        "refund_order",
        r#"{"order_id":"ord_1001","amount_cents":6000,"currency":"USD","reason":"late"}"#,
    );
    refund.entities_json = String::new();
    let r = client.authorize(refund.clone()).await.unwrap().into_inner();
    assert_eq!(verdict(&r), (Decision::Deny, "forbidden"));
    assert_eq!(
        r.error.as_ref().unwrap().message,
        "a refund cannot exceed the order total"
    );
    put(&mut entities, "acme", order("acme", "carol", 9000)).await;
    let r = client.authorize(refund).await.unwrap().into_inner();
    assert_eq!(verdict(&r), (Decision::Allow, ""), "{:?}", r.error);

    // `"[]"` is given: the store is not read, so the resource is missing.
    let r = alice_reads(&mut client, "acme", "[]").await;
    assert_eq!(verdict(&r), (Decision::Deny, "resource_not_found"));

    // Deleted: not found again; a second delete finds nothing.
    for expected in [1, 0] {
        let deleted = entities
            .delete_entities(pb::DeleteEntitiesRequest {
                tenant_id: "acme".into(),
                uids: vec![uid("Order", "ord_1001"), uid("Order", "ord_1001")],
            })
            .await
            .unwrap()
            .into_inner()
            .deleted_count;
        assert_eq!(deleted, expected);
    }
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Deny, "resource_not_found"));
    assert_eq!(get(&mut entities, "acme").await, json!([]));
    server.stop().await;
}

/// globex's order is never acme's: acme's decision does not find it, and
/// acme's own order (another owner) decides acme's calls.
async fn tenants_never_see_each_others_entities(backend: Backend) {
    let server = TestServer::start_on(backend).await;
    let mut entities = entities_client(&server).await;
    let mut client = server.client().await;
    put(&mut entities, "globex", order("globex", "alice", 5000)).await;
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Deny, "resource_not_found"));
    assert_eq!(get(&mut entities, "acme").await, json!([]));
    let r = alice_reads(&mut client, "globex", "").await;
    assert_eq!(verdict(&r), (Decision::Allow, ""), "{:?}", r.error);

    put(&mut entities, "acme", order("acme", "carol", 5000)).await;
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Deny, "forbidden"));
    let r = alice_reads(&mut client, "globex", "").await;
    assert_eq!(verdict(&r), (Decision::Allow, ""), "{:?}", r.error);
    // Each reads back its own, in canonical form.
    let acme = get(&mut entities, "acme").await;
    assert_eq!(acme, json!([order("acme", "carol", 5000)]));
    let globex = get(&mut entities, "globex").await;
    assert_eq!(globex, json!([order("globex", "alice", 5000)]));
    server.stop().await;
}

/// A caller granted `entities` for globex only: every call for acme is
/// `PERMISSION_DENIED` (`tenant_not_granted`) and changes nothing; its
/// calls for globex are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_granted_another_tenant_cannot_touch_this_ones_entities() {
    let server = TestServer::start_setup(|c| {
        c.access = AccessPolicy::Grants(vec![
            Grant {
                caller: CallerPattern::Any,
                services: BTreeSet::from([ServiceName::Entities]),
                tenants: TenantScope::of(["globex"]),
            },
            Grant {
                caller: CallerPattern::Any,
                services: BTreeSet::from([ServiceName::Authorization]),
                tenants: TenantScope::Any,
            },
        ]);
    })
    .await;
    let mut entities = entities_client(&server).await;
    let refused = |status: tonic::Status| {
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        let (reason, metadata) = info(&status);
        assert_eq!(reason, "tenant_not_granted");
        assert_eq!(metadata.get("tenant").map(String::as_str), Some("acme"));
    };
    refused(
        upsert(
            &mut entities,
            "acme",
            &json!([order("acme", "alice", 5000)]),
        )
        .await
        .unwrap_err(),
    );
    refused(
        entities
            .get_entities(pb::GetEntitiesRequest {
                tenant_id: "acme".into(),
                uids: vec![uid("Order", "ord_1001")],
            })
            .await
            .unwrap_err(),
    );
    refused(
        entities
            .delete_entities(pb::DeleteEntitiesRequest {
                tenant_id: "acme".into(),
                uids: vec![uid("Order", "ord_1001")],
            })
            .await
            .unwrap_err(),
    );
    // Nothing of acme's was written: its decision still finds no order.
    let mut client = server.client().await;
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(code(&r), "resource_not_found");
    // globex is this caller's.
    put(&mut entities, "globex", order("globex", "alice", 5000)).await;
    assert_eq!(
        get(&mut entities, "globex").await,
        json!([order("globex", "alice", 5000)])
    );
    server.stop().await;
}

/// Each refusal: `INVALID_ARGUMENT`, its stable code as the `ErrorInfo`
/// reason, the entity's index, and nothing written (the valid entity ahead
/// of the bad one included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_has_its_code_and_writes_nothing() {
    let server = TestServer::start().await;
    let mut entities = entities_client(&server).await;
    let good = order("acme", "alice", 5000);
    let good_text = good.to_string();
    let mut wrong_type = order("acme", "alice", 5000);
    wrong_type["uid"]["id"] = json!("ord_2");
    wrong_type["attrs"]["total_cents"] = json!("5000");
    let mut missing = order("acme", "alice", 5000);
    missing["uid"]["id"] = json!("ord_2");
    missing["attrs"].as_object_mut().unwrap().remove("status");
    let mut bad_parent = order("acme", "alice", 5000);
    bad_parent["uid"]["id"] = json!("ord_2");
    bad_parent["parents"] = json!([{"type": "Customer", "id": "cus_1"}]);
    let cases: Vec<(String, &str, Option<&str>, Option<&str>)> = vec![
        // Strict decoding, of the whole text.
        (
            good_text.replacen(r#""status":"delivered""#, r#""status":"delivered","status":"cancelled""#, 1),
            "invalid_json",
            None,
            Some("duplicate_key"),
        ),
        (
            good_text.replacen("delivered", r"\ud800", 1),
            "invalid_json",
            None,
            Some("lone_surrogate"),
        ),
        ("{}".into(), "not_an_array", None, None),
        (
            json!([good, {"uid": {"type": "Invoice", "id": "i1"}, "attrs": {}, "parents": []}]).to_string(),
            "unknown_entity_type",
            Some("1"),
            None,
        ),
        (json!([good, wrong_type]).to_string(), "attribute_type_mismatch", Some("1"), None),
        (json!([good, missing]).to_string(), "missing_attribute", Some("1"), None),
        (json!([good, bad_parent]).to_string(), "invalid_parent_type", Some("1"), None),
        (
            json!([good, {"uid": {"type": "Action", "id": "get_order"}, "attrs": {}, "parents": []}]).to_string(),
            "action_entity",
            Some("1"),
            None,
        ),
        (
            json!([good, {"uid": {"type": "User", "id": "alice"}, "attrs": {}, "parents": []}]).to_string(),
            "generated_entity_type",
            Some("1"),
            None,
        ),
        (
            json!([good, {"uid": {"type": "Tenant", "id": "acme"}, "attrs": {}, "parents": []}]).to_string(),
            "generated_entity_type",
            Some("1"),
            None,
        ),
        (json!([good, good]).to_string(), "duplicate_uid", Some("1"), None),
        (
            json!([good, {"uid": {"__entity": {"type": "Order", "id": "o"}}, "attrs": {}}]).to_string(),
            "malformed_entity",
            Some("1"),
            None,
        ),
    ];
    for (text, expected, index, reason) in cases {
        let status = entities
            .upsert_entities(pb::UpsertEntitiesRequest {
                tenant_id: "acme".into(),
                entities_json: text.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{text}: {status:?}");
        let (code, metadata) = info(&status);
        assert_eq!(code, expected, "{text}: {}", status.message());
        assert_eq!(metadata.get("index").map(String::as_str), index, "{text}");
        assert_eq!(metadata.get("reason").map(String::as_str), reason, "{text}");
        assert_eq!(crate::support::bad_request_field(&status), "entities_json");
        assert_eq!(get(&mut entities, "acme").await, json!([]), "{text}");
    }
    // A message names types and attributes, never an attribute's value.
    let mut secret = order("acme", "alice", 5000);
    secret["attrs"]["total_cents"] = json!("s3cr3t-value");
    let status = upsert(&mut entities, "acme", &json!([secret]))
        .await
        .unwrap_err();
    assert!(
        !status.message().contains("s3cr3t-value"),
        "{}",
        status.message()
    );
    // Too many entities, and no tenant.
    let many: Vec<Value> = (0..1001)
        .map(|i| {
            let mut o = order("acme", "alice", 1);
            o["uid"]["id"] = json!(format!("ord_{i}"));
            o
        })
        .collect();
    let status = upsert(&mut entities, "acme", &Value::Array(many))
        .await
        .unwrap_err();
    assert_eq!(info(&status).0, "too_many_entities");
    let status = upsert(&mut entities, "", &json!([good])).await.unwrap_err();
    assert_eq!(
        (status.code(), info(&status).0.as_str()),
        (Code::InvalidArgument, "tenant_required")
    );
    assert_eq!(crate::support::bad_request_field(&status), "tenant_id");
    // One entity over the size bound.
    let mut large = order("acme", "alice", 5000);
    large["attrs"]["status"] = json!("x".repeat(70_000));
    let status = upsert(&mut entities, "acme", &json!([large]))
        .await
        .unwrap_err();
    assert_eq!(info(&status).0, "entity_too_large");
    // More parents than one entity may name.
    let mut crowded = order("acme", "alice", 5000);
    crowded["parents"] = Value::Array(
        (0..65)
            .map(|i| json!({"type": "Tenant", "id": format!("t{i}")}))
            .collect(),
    );
    let status = upsert(&mut entities, "acme", &json!([crowded]))
        .await
        .unwrap_err();
    assert_eq!(info(&status).0, "too_many_parents");
    assert_eq!(get(&mut entities, "acme").await, json!([]));
    // A uid with no type, on a read and on a delete.
    let status = entities
        .get_entities(pb::GetEntitiesRequest {
            tenant_id: "acme".into(),
            uids: vec![uid("Order", "ord_1001"), uid("", "x")],
        })
        .await
        .unwrap_err();
    let (reason, metadata) = info(&status);
    assert_eq!(
        (reason.as_str(), metadata.get("index").map(String::as_str)),
        ("malformed_uid", Some("1"))
    );
    assert_eq!(crate::support::bad_request_field(&status), "uids");
    let status = entities
        .delete_entities(pb::DeleteEntitiesRequest {
            tenant_id: "acme".into(),
            uids: vec![uid("", "x")],
        })
        .await
        .unwrap_err();
    assert_eq!(info(&status).0, "malformed_uid");
    server.stop().await;
}

/// Each write leaves one audit event of counts and outcome (never a uid or
/// an attribute), and every call is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_audited_without_entity_data_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    let server = TestServer::start_setup(|c| {
        c.audit = AuditConfig {
            sink: AuditSink::File(audit_path.clone()),
            ..AuditConfig::default()
        };
    })
    .await;
    let metrics = server.metrics_endpoint();
    let mut entities = entities_client(&server).await;
    put(&mut entities, "acme", order("acme", "s3cr3t-owner", 5000)).await;
    let status = upsert(
        &mut entities,
        "acme",
        &json!([{"uid": {"type": "Invoice", "id": "i"}}]),
    )
    .await
    .unwrap_err();
    assert_eq!(info(&status).0, "unknown_entity_type");
    entities
        .delete_entities(pb::DeleteEntitiesRequest {
            tenant_id: "acme".into(),
            uids: vec![uid("Order", "ord_1001"), uid("Order", "ord_9")],
        })
        .await
        .unwrap();
    get(&mut entities, "acme").await;
    let text = metrics.scrape().await;
    for (labels, n) in [
        (r#"operation="upsert",outcome="ok""#, 1),
        (r#"operation="upsert",outcome="unknown_entity_type""#, 1),
        (r#"operation="delete",outcome="ok""#, 1),
        (r#"operation="get",outcome="ok""#, 1),
    ] {
        assert_eq!(
            crate::support::series(&text, &format!("toolgate_entity_calls_total{{{labels}}}")),
            n,
            "{labels}"
        );
    }
    server.stop().await;
    let log = std::fs::read_to_string(&audit_path).unwrap();
    assert!(
        !log.contains("s3cr3t-owner") && !log.contains("ord_1001"),
        "{log}"
    );
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "entities")
        .map(|mut e| {
            let o = e.as_object_mut().unwrap();
            for k in ["time", "latency_us", "policy_version", "peer"] {
                assert!(o.remove(k).is_some(), "{k}");
            }
            e
        })
        .collect();
    assert_eq!(
        events,
        vec![
            json!({"event": "entities", "operation": "upsert", "tenant": "acme", "uids": 1, "changed": 1, "outcome": "ok"}),
            json!({"event": "entities", "operation": "upsert", "tenant": "acme", "uids": 0, "changed": 0, "outcome": "unknown_entity_type"}),
            json!({"event": "entities", "operation": "delete", "tenant": "acme", "uids": 2, "changed": 1, "outcome": "ok"}),
        ]
    );
}

/// The real `toolgate serve` on SQLite, killed with SIGKILL after an
/// upsert and restarted on its file: the entity is still there and still
/// decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_survive_a_restart_of_the_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(dir.path(), &[]);
    let mut entities = EntityServiceClient::new(sidecar.channel().await);
    put(&mut entities, "acme", order("acme", "alice", 5000)).await;
    sidecar.kill();

    let sidecar = Sidecar::start(dir.path(), &[]);
    let mut entities = EntityServiceClient::new(sidecar.channel().await);
    let mut client = AuthorizationServiceClient::new(sidecar.channel().await);
    let got = entities
        .get_entities(pb::GetEntitiesRequest {
            tenant_id: "acme".into(),
            uids: vec![uid("Order", "ord_1001")],
        })
        .await
        .unwrap()
        .into_inner()
        .entities_json;
    assert_eq!(
        serde_json::from_str::<Value>(&got).unwrap(),
        json!([order("acme", "alice", 5000)])
    );
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Allow, ""), "{:?}", r.error);
    sidecar.kill();
}

/// A resource whose walk would visit more uids than the bound (the order
/// and its tenant: two, over a bound of one) is denied, never decided on
/// part of its hierarchy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_over_its_bound_is_a_policy_error() {
    let mut config = toolgate::decision::AuthorizerConfig::default();
    config.entity_store.max_walk = 1;
    let server = TestServer::start_with(&crate::support::example_policies(), config).await;
    let mut entities = entities_client(&server).await;
    let mut client = server.client().await;
    put(&mut entities, "acme", order("acme", "alice", 5000)).await;
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Deny, "policy_error"));
    assert_eq!(details(&r)["reason"], json!("entity_walk_exceeded"));
    // Without a parent the walk is the order alone: within the bound.
    let mut alone = order("acme", "alice", 5000);
    alone["parents"] = json!([]);
    put(&mut entities, "acme", alone).await;
    let r = alice_reads(&mut client, "acme", "").await;
    assert_eq!(verdict(&r), (Decision::Allow, ""), "{:?}", r.error);
    server.stop().await;
}

/// An entity stored under one schema that a reloaded schema no longer
/// admits (a new required attribute) denies its calls with `policy_error`
/// (`stored_entities_invalid`): not the caller's mistake, never an allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_entities_the_schema_no_longer_admits_are_denied() {
    let (_tmp, dir) = crate::support::copy_of_examples();
    let server = TestServer::start_reloading(&dir).await;
    let mut entities = entities_client(&server).await;
    let mut client = server.client().await;
    put(&mut entities, "acme", order("acme", "alice", 5000)).await;
    let before = alice_reads(&mut client, "acme", "").await;
    assert_eq!(before.decision(), Decision::Allow, "{:?}", before.error);
    let schema = dir.join("schema.cedarschema");
    let text = std::fs::read_to_string(&schema).unwrap();
    let edited = text.replacen(
        "  total_cents: Long,\n",
        "  total_cents: Long,\n  priority: Long,\n",
        1,
    );
    assert_ne!(edited, text);
    std::fs::write(&schema, edited).unwrap();
    let started = std::time::Instant::now();
    let r = loop {
        let r = alice_reads(&mut client, "acme", "").await;
        if r.policy_version != before.policy_version {
            break r;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "no reload"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(verdict(&r), (Decision::Deny, "policy_error"));
    assert_eq!(details(&r)["reason"], json!("stored_entities_invalid"));
    // The same entity written again is refused under the new schema.
    let status = upsert(
        &mut entities,
        "acme",
        &json!([order("acme", "alice", 5000)]),
    )
    .await
    .unwrap_err();
    assert_eq!(info(&status).0, "missing_attribute");
    server.stop().await;
}
