//! `ListTools` with an auth context (DESIGN §11.4), over real gRPC: only
//! the tools the principal could be allowed to call, each proven by a
//! witness `Authorize` call the pipeline allows or answers
//! approval-required, each tool left out denied; the principal from the
//! identity token when the deployment requires one; a tenant the caller's
//! grants do not name is `PERMISSION_DENIED`. Without `auth`, every tool.

use std::collections::BTreeSet;

use tonic::Code;
use tonic_types::StatusExt;

use toolgate::access::{AccessPolicy, CallerPattern, Grant, ServiceName, TenantScope};
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::support::{
    TestServer, agent_bob, approver_claims, auth, code, entities, example_policies, signed,
};

/// The example tools, one contract file each, named as the tool.
fn all_tools() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(example_policies().join("tools"))
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A call of `tool` that the example entities let a support agent or
/// admin of acme make: it is allowed, or (deleting an account) needs an
/// approval, when the caller has the scope and role its permit asks.
fn witness(tool: &str) -> &'static str {
    match tool {
        "delete_account" => r#"{"customer_id":"cus_alice","confirm":true,"reason":"asked to"}"#,
        "get_order" => r#"{"order_id":"ord_1001"}"#,
        "read_secret" => r#"{"name":"shop_api_key"}"#,
        "refund_order" => {
            r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#
        }
        "search_docs" => r#"{"query":"refund policy"}"#,
        "send_email" => r#"{"customer_id":"cus_alice","subject":"Hello","body":"On its way."}"#,
        "update_preferences" => r#"{"customer_id":"cus_alice","newsletter":false}"#,
        other => panic!("no witness for {other}"),
    }
}

async fn list(
    client: &mut AuthorizationServiceClient<tonic::transport::Channel>,
    auth: Option<pb::AuthContext>,
) -> Result<pb::ListToolsResponse, tonic::Status> {
    client
        .list_tools(pb::ListToolsRequest { auth })
        .await
        .map(tonic::Response::into_inner)
}

fn names(r: &pb::ListToolsResponse) -> Vec<&str> {
    r.tools.iter().map(|t| t.name.as_str()).collect()
}

/// Each tool listed for `who` is allowed or approval-required on its
/// witness call; each tool left out is denied (`forbidden`) on it.
async fn check_witnesses(
    client: &mut AuthorizationServiceClient<tonic::transport::Channel>,
    who: &pb::AuthContext,
    listed: &[&str],
) {
    for tool in all_tools() {
        let tool = tool.as_str();
        let answer = client
            .authorize(pb::AuthorizeRequest {
                tool: tool.into(),
                arguments: witness(tool).as_bytes().to_vec(),
                auth: Some(who.clone()),
                request_id: format!("req-{tool}"),
                entities_json: entities(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let expected = if !listed.contains(&tool) {
            Decision::Deny
        } else if tool == "delete_account" {
            Decision::ApprovalRequired
        } else {
            Decision::Allow
        };
        assert_eq!(
            answer.decision(),
            expected,
            "{} {tool}: {:?}",
            who.subject_id,
            answer.error
        );
        if expected == Decision::Deny {
            assert_eq!(code(&answer), "forbidden", "{tool}");
        }
    }
}

#[tokio::test]
async fn list_tools_with_auth_lists_exactly_what_a_call_can_be_allowed_for() {
    let server = TestServer::start().await;
    let mut client = server.client().await;

    let everything = list(&mut client, None).await.unwrap();
    assert_eq!(names(&everything), all_tools());
    assert_eq!(everything.tools.len(), 7);
    assert_eq!(everything.tools[0].version, "1.0.0");

    // Bob, a support agent without `accounts:delete`: everything but deleting.
    let bob = agent_bob();
    let listed = list(&mut client, Some(bob.clone())).await.unwrap();
    assert_eq!(
        names(&listed),
        [
            "get_order",
            "refund_order",
            "search_docs",
            "send_email",
            "update_preferences"
        ]
    );
    assert_eq!(listed.policy_version, everything.policy_version);
    let refund = listed
        .tools
        .iter()
        .find(|t| t.name == "refund_order")
        .unwrap();
    assert_eq!(
        (refund.version.as_str(), refund.risk()),
        ("1.2.0", pb::RiskLevel::Financial)
    );
    check_witnesses(&mut client, &bob, &names(&listed)).await;

    // Dana, an admin with the delete scope: deleting is listed, and needs an approval.
    let dana = auth(
        "dana",
        "acme",
        &["support_admin"],
        &["accounts:delete", "docs:read"],
    );
    let listed = list(&mut client, Some(dana.clone())).await.unwrap();
    assert_eq!(names(&listed), ["delete_account", "search_docs"]);
    check_witnesses(&mut client, &dana, &names(&listed)).await;

    // Someone with no scope: nothing.
    let nobody = auth("zoe", "acme", &["support_agent"], &[]);
    let listed = list(&mut client, Some(nobody.clone())).await.unwrap();
    assert!(listed.tools.is_empty(), "{:?}", names(&listed));
    check_witnesses(&mut client, &nobody, &[]).await;

    // An auth context naming nobody is the executor's mistake, as for Authorize.
    let status = list(&mut client, Some(auth("", "acme", &[], &[])))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    server.stop().await;
}

/// A token whose claims the test key set verifies, with these scopes.
fn token_with_scopes(subject: &str, tenant: &str, roles: &[&str], scopes: &str) -> String {
    let mut claims = approver_claims(subject, tenant, roles, 300);
    claims["scope"] = serde_json::json!(scopes);
    signed(jsonwebtoken::Algorithm::ES256, Some("ec-1"), &claims)
}

fn with_token(token: String) -> pb::AuthContext {
    pb::AuthContext {
        identity_token: token,
        agent_id: "support-bot".into(),
        ..Default::default()
    }
}

fn error_reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// With `require_identity_token` the principal is the token's, as for
/// Authorize; with a caller granted only tenant acme, a principal of
/// globex is refused before anything is evaluated.
#[tokio::test]
async fn list_tools_runs_as_the_token_and_within_the_granted_tenants() {
    let server = TestServer::start_setup(|c| {
        c.require_identity_token = true;
        c.access = AccessPolicy::Grants(vec![Grant {
            caller: CallerPattern::Any,
            services: BTreeSet::from([ServiceName::Authorization]),
            tenants: TenantScope::Only(BTreeSet::from(["acme".to_owned()])),
        }]);
    })
    .await;
    let mut client = server.client().await;

    // Without auth: every tool, as before.
    assert_eq!(names(&list(&mut client, None).await.unwrap()), all_tools());

    // A customer's token: reading orders and the docs (own orders only, but
    // some order is hers).
    let alice = token_with_scopes("alice", "acme", &[], "orders:read docs:read");
    let listed = list(&mut client, Some(with_token(alice.clone())))
        .await
        .unwrap();
    assert_eq!(names(&listed), ["get_order", "search_docs"]);

    // Claims in the auth context that the token does not prove: refused.
    let mut claiming = with_token(alice);
    claiming.roles = vec!["support_admin".into()];
    let status = list(&mut client, Some(claiming)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(error_reason(&status), "roles_mismatch");

    // No token at all.
    let status = list(&mut client, Some(auth("alice", "acme", &[], &[])))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(error_reason(&status), "missing_token");

    // A verified principal of a tenant this caller may not act for.
    let gina = token_with_scopes("gina", "globex", &["support_admin"], "docs:read");
    let status = list(&mut client, Some(with_token(gina))).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(error_reason(&status), "tenant_not_granted");
    assert_eq!(
        status.message(),
        "the caller's grants do not name tenant `globex`: it may not act for it"
    );
    server.stop().await;
}
