//! The OpenID AuthZEN door (DESIGN §11.1) over real HTTP/1.1 and h2 on
//! loopback, against the sidecar `TestServer` builds as `toolgate serve`
//! does: every request and answer checked against the AuthZEN 1.0 JSON
//! schemas (`../shared/conformance/authzen/schemas/`), the spec's own
//! request examples, the three decisions, the three evaluation semantics,
//! strict decoding, tenants, the `authzen` grant and the DNS-rebinding
//! guard.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::body::Bytes;
use serde_json::{Value, json};

use toolgate::access::{AccessPolicy, CallerPattern, Grant, ServiceName, TenantScope};
use toolgate::audit::{AuditConfig, AuditSink};
use toolgate::config::Config;
use toolgate::grpc::pb;

use crate::support::{TestServer, fixture, token};

/// The door's test deployment: `search_docs` (scope `docs:read`) and
/// `wire_funds` (role `treasury`; over 100.00 needs an approval, over
/// 1000.00 is forbidden), neither with a resource entity.
pub(crate) fn policies() -> PathBuf {
    fixture("authzen-policies")
}

const ACCESS_REQUESTS: &str = "https://access.example.com/requests";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    Http1,
    H2,
}

const VERSIONS: [Version; 2] = [Version::Http1, Version::H2];

/// One HTTP answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// One request on a fresh connection over `version`; `headers` are sent as
/// given (an HTTP/1.1 request gets `host: 127.0.0.1:<port>` unless they
/// name a host).
pub(crate) async fn send(
    addr: SocketAddr,
    version: Version,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let authority = addr.to_string();
    exchange(
        stream, "http", &authority, version, method, path, headers, body,
    )
    .await
}

/// One request over an open connection `io` to `authority`.
#[allow(
    clippy::too_many_arguments,
    reason = "one argument per part of the request, as a test names them"
)]
pub(crate) async fn exchange<IO>(
    io: IO,
    scheme: &str,
    authority: &str,
    version: Version,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(io);
    let mut builder = http::Request::builder().method(method);
    builder = match version {
        Version::Http1 => {
            let builder = builder.uri(path);
            if headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
                builder
            } else {
                builder.header("host", authority)
            }
        }
        Version::H2 => builder
            .uri(format!("{scheme}://{authority}{path}"))
            .version(http::Version::HTTP_2),
    };
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(http_body_util::Full::new(Bytes::copy_from_slice(body)))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), async move {
        match version {
            Version::Http1 => {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
                tokio::spawn(conn);
                sender.send_request(request).await.unwrap()
            }
            Version::H2 => {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                        .await
                        .unwrap();
                tokio::spawn(conn);
                sender.send_request(request).await.unwrap()
            }
        }
    })
    .await
    .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

/// A POST of `body` as `application/json`.
/// The `401` of a request that brings no identity token (AuthZEN §12).
pub(crate) fn refused_for_no_token(answer: &Answer) {
    assert_eq!(
        (answer.status, answer.text()),
        (
            401,
            "the request brings no identity token (send `Authorization: Bearer <token>`)"
                .to_owned()
        )
    );
    assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
}

pub(crate) async fn post(addr: SocketAddr, version: Version, path: &str, body: &str) -> Answer {
    send(
        addr,
        version,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .await
}

/// The AuthZEN 1.0 request and response schemas, compiled.
struct Schemas {
    request: jsonschema::Validator,
    response: jsonschema::Validator,
}

fn schemas() -> Option<Schemas> {
    let dir = toolgate::prerequisites::suite_dir("authzen")?.join("schemas");
    let load = |name: &str| {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let schema: Value = serde_json::from_str(&text).unwrap();
        jsonschema::draft202012::options()
            .should_validate_formats(true)
            .build(&schema)
            .unwrap()
    };
    Some(Schemas {
        request: load("evaluation-request.schema.json"),
        response: load("evaluation-response.schema.json"),
    })
}

impl Schemas {
    fn request_ok(&self, request: &Value) {
        let errors: Vec<String> = self
            .request
            .iter_errors(request)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{request}: {errors:?}");
    }

    fn decision_ok(&self, decision: &Value) {
        let errors: Vec<String> = self
            .response
            .iter_errors(decision)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{decision}: {errors:?}");
    }

    /// Each entry of an evaluations request with the top-level defaults,
    /// as the spec applies them.
    fn evaluations_request_ok(&self, request: &Value) {
        let entries = request["evaluations"].as_array().unwrap();
        for entry in entries {
            let mut merged = serde_json::Map::new();
            for part in ["subject", "action", "resource", "context"] {
                if let Some(v) = entry.get(part).or_else(|| request.get(part)) {
                    merged.insert(part.to_owned(), v.clone());
                }
            }
            self.request_ok(&Value::Object(merged));
        }
    }

    fn evaluations_answer_ok(&self, answer: &Value) {
        for decision in answer["evaluations"].as_array().unwrap() {
            self.decision_ok(decision);
        }
    }
}

/// A server on the door's policies, auditing to a file in `dir`, with an
/// Access Request endpoint configured, then `edit`.
async fn server(dir: &tempfile::TempDir, edit: impl FnOnce(&mut Config)) -> TestServer {
    let audit = dir.path().join("audit.jsonl");
    TestServer::start_setup(|c| {
        c.policies = policies();
        c.audit = AuditConfig {
            sink: AuditSink::File(audit),
            ..AuditConfig::default()
        };
        c.authzen.access_request_endpoint = Some(ACCESS_REQUESTS.to_owned());
        edit(c);
    })
    .await
}

/// Every audit event written so far.
async fn audit_events(server: &TestServer, dir: &tempfile::TempDir) -> Vec<Value> {
    assert!(server.audit.flush(Duration::from_secs(5)).await);
    std::fs::read_to_string(dir.path().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn events_of<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == kind).collect()
}

/// An evaluation of `tool` with `arguments` by `subject` of acme.
pub(crate) fn evaluation(
    subject: &str,
    roles: &[&str],
    scopes: &[&str],
    tool: &str,
    arguments: Value,
) -> Value {
    json!({
        "subject": {"type": "identity", "id": subject,
            "properties": {"tenant": "acme", "roles": roles, "scopes": scopes}},
        "action": {"name": "tools/call"},
        "resource": {"type": "tool", "id": tool, "properties": {"arguments": arguments}},
        "context": {"agent": "gateway-bot", "session": "s-1"},
    })
}

fn search(scopes: &[&str]) -> Value {
    evaluation(
        "bob",
        &[],
        scopes,
        "search_docs",
        json!({"query": "refunds"}),
    )
}

pub(crate) fn wire(amount_cents: u64) -> Value {
    evaluation(
        "tess",
        &["treasury"],
        &[],
        "wire_funds",
        json!({"amount_cents": amount_cents, "memo": "invoice 7"}),
    )
}

pub(crate) const EVALUATION: &str = "/access/v1/evaluation";
const EVALUATIONS: &str = "/access/v1/evaluations";
const METADATA: &str = "/.well-known/authzen-configuration";
const SEARCH_ACTION: &str = "/access/v1/search/action";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_names_the_endpoints_over_http1_and_h2() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |_| {}).await;
    let base = format!("http://{}", server.addr);
    for version in VERSIONS {
        let answer = send(server.addr, version, "GET", METADATA, &[], b"").await;
        assert_eq!(answer.status, 200, "{version:?}: {}", answer.text());
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert_eq!(
            answer.json(),
            json!({
                "policy_decision_point": base,
                "access_evaluation_endpoint": format!("{base}/access/v1/evaluation"),
                "access_evaluations_endpoint": format!("{base}/access/v1/evaluations"),
                "search_action_endpoint": format!("{base}/access/v1/search/action"),
                "access_request_endpoint": ACCESS_REQUESTS,
                "capabilities": ["urn:openid:authzen:capability:access-request"],
            }),
            "{version:?}"
        );
        // Only GET (and HEAD).
        let posted = post(server.addr, version, METADATA, "{}").await;
        assert_eq!(posted.status, 405);
        assert_eq!(posted.header("allow"), Some("GET, HEAD"));
        assert_eq!(
            posted.text(),
            "`/.well-known/authzen-configuration` takes GET"
        );
    }
    // A configured identifier is published as is.
    let dir = tempfile::tempdir().unwrap();
    let server = self::server(&dir, |c| {
        c.authzen.policy_decision_point = Some("https://pdp.example.com".into());
        c.authzen.access_request_endpoint = None;
    })
    .await;
    let answer = send(server.addr, Version::H2, "GET", METADATA, &[], b"").await;
    assert_eq!(
        answer.json(),
        json!({
            "policy_decision_point": "https://pdp.example.com",
            "access_evaluation_endpoint": "https://pdp.example.com/access/v1/evaluation",
            "access_evaluations_endpoint": "https://pdp.example.com/access/v1/evaluations",
            "search_action_endpoint": "https://pdp.example.com/access/v1/search/action",
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_deny_and_approval_required_over_http1_and_h2() {
    let Some(schemas) = schemas() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |_| {}).await;
    let mut opened = Vec::new();
    for version in VERSIONS {
        // Allowed: the scope is there.
        let request = search(&["docs:read"]);
        schemas.request_ok(&request);
        let answer = send(
            server.addr,
            version,
            "POST",
            EVALUATION,
            &[
                ("content-type", "application/json"),
                ("x-request-id", "req-allow"),
            ],
            request.to_string().as_bytes(),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert_eq!(answer.header("x-request-id"), Some("req-allow"));
        let allowed = answer.json();
        schemas.decision_ok(&allowed);
        assert_eq!(allowed["decision"], true, "{allowed}");
        let context = allowed["context"].as_object().unwrap();
        let keys: BTreeSet<&str> = context.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            BTreeSet::from([
                "arguments_sha256",
                "evaluation_id",
                "idempotency_key",
                "timeout_ms"
            ]),
            "{allowed}"
        );
        assert_eq!(
            context["arguments_sha256"],
            toolgate::decode::sha256_hex(br#"{"query":"refunds"}"#)
        );
        assert_eq!(context["timeout_ms"], 1500);
        assert!(
            context["idempotency_key"]
                .as_str()
                .unwrap()
                .starts_with("search_docs:")
        );

        // Denied: no scope; no policy permits, so no reason is shown.
        let denied = post(server.addr, version, EVALUATION, &search(&[]).to_string())
            .await
            .json();
        schemas.decision_ok(&denied);
        assert_eq!(denied["decision"], false);
        assert_eq!(denied["context"]["reason"], "forbidden");
        assert_eq!(
            denied["context"]["reason_user"],
            r#"{"error":{"code":"forbidden","message":"the call is not permitted by policy","resolution":"stop","retryable":false}}"#
        );

        // Denied by a forbid with a reason: the reason is the model's.
        let ceiling = post(server.addr, version, EVALUATION, &wire(200_000).to_string())
            .await
            .json();
        schemas.decision_ok(&ceiling);
        assert_eq!(ceiling["decision"], false);
        assert_eq!(ceiling["context"]["reason"], "forbidden");
        assert_eq!(
            ceiling["context"]["reason_user"],
            r#"{"error":{"code":"forbidden","message":"wires over 1000.00 are never sent from here","resolution":"stop","retryable":false}}"#
        );

        // Approval required: the approval is opened, and the profile's
        // requestable denial names it.
        // (Each version its own call: the same call again finds its approval.)
        let amount = if version == Version::Http1 {
            20_000
        } else {
            30_000
        };
        let required = post(server.addr, version, EVALUATION, &wire(amount).to_string())
            .await
            .json();
        schemas.decision_ok(&required);
        assert_eq!(required["decision"], false, "{required}");
        let context = &required["context"];
        assert_eq!(context["reason"], "approval_required");
        let approval_id = context["approval_id"].as_str().unwrap();
        assert!(!approval_id.is_empty());
        let reason_user: Value =
            serde_json::from_str(context["reason_user"].as_str().unwrap()).unwrap();
        assert_eq!(reason_user["error"]["code"], "approval_required");
        assert_eq!(reason_user["error"]["details"]["approval_id"], approval_id);
        let access_request = &context["access_request"];
        assert_eq!(access_request["endpoint"], ACCESS_REQUESTS);
        assert_eq!(access_request["template"], "toolgate:financial");
        let expires_at = access_request["expires_at"].as_str().unwrap();
        assert!(
            time::OffsetDateTime::parse(expires_at, &time::format_description::well_known::Rfc3339)
                .is_ok(),
            "{expires_at}"
        );
        assert_eq!(
            access_request["display"]["description"],
            format!(
                "This call waits for a human approval: approval {approval_id} is pending. \
                 Once an approver approves it, the same call is allowed."
            )
        );
        assert!(context["evaluation_id"].is_string());
        opened.push(approval_id.to_owned());
    }
    // The same call again while its approval is pending (DESIGN §11.3):
    // that approval, pending; no second one, no new requestable denial.
    let pending = post(
        server.addr,
        Version::H2,
        EVALUATION,
        &wire(20_000).to_string(),
    )
    .await
    .json();
    schemas.decision_ok(&pending);
    assert_eq!(pending["decision"], false);
    assert_eq!(pending["context"]["reason"], "approval_pending");
    assert_eq!(pending["context"]["approval_id"], opened[0].as_str());
    assert!(pending["context"].get("access_request").is_none());

    // One decision, one event: four per version and the repeat, each
    // naming the door and the action.
    let events = audit_events(&server, &dir).await;
    let decisions = events_of(&events, "decision");
    assert_eq!(decisions.len(), 9, "{events:?}");
    for d in &decisions {
        assert_eq!(d["door"], "gateway", "{d}");
        assert_eq!(d["action"], "tools/call", "{d}");
        assert_eq!(d["tenant"], "acme", "{d}");
        assert_eq!(d["agent"], "gateway-bot", "{d}");
    }
    assert_eq!(decisions[0]["call_id"], "req-allow");
    assert_eq!(decisions[0]["decision"], "allow");
    assert_eq!(decisions[3]["decision"], "approval_required");
}

/// Three evaluations of one subject, in this order: allowed, denied, allowed.
fn three(semantic: &str) -> Value {
    json!({
        "subject": {"type": "identity", "id": "bob",
            "properties": {"tenant": "acme", "scopes": ["docs:read"]}},
        "action": {"name": "tools/call"},
        "options": {"evaluations_semantic": semantic},
        "evaluations": [
            {"resource": {"type": "tool", "id": "search_docs",
                "properties": {"arguments": {"query": "one"}}}},
            {"resource": {"type": "tool", "id": "wire_funds",
                "properties": {"arguments": {"amount_cents": 500}}}},
            {"resource": {"type": "tool", "id": "search_docs",
                "properties": {"arguments": {"query": "three"}}}},
        ],
    })
}

fn decisions(answer: &Value) -> Vec<bool> {
    answer["evaluations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["decision"].as_bool().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_evaluations_semantic_answers_in_request_order() {
    let Some(schemas) = schemas() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |_| {}).await;
    let mut decided = 0;
    for version in VERSIONS {
        for (semantic, expected) in [
            ("execute_all", vec![true, false, true]),
            ("deny_on_first_deny", vec![true, false]),
            ("permit_on_first_permit", vec![true]),
        ] {
            let request = three(semantic);
            schemas.evaluations_request_ok(&request);
            let answer = post(server.addr, version, EVALUATIONS, &request.to_string()).await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            let answer = answer.json();
            schemas.evaluations_answer_ok(&answer);
            assert_eq!(decisions(&answer), expected, "{semantic}: {answer}");
            assert_eq!(
                answer["evaluations"][1]["context"]["reason"],
                if expected.len() > 1 {
                    json!("forbidden")
                } else {
                    Value::Null
                }
            );
            decided += expected.len();
        }
        // No semantic: execute_all. A first deny does not stop a permit.
        let mut request = three("permit_on_first_permit");
        let entries = request["evaluations"].as_array_mut().unwrap();
        entries.swap(0, 1);
        let answer = post(server.addr, version, EVALUATIONS, &request.to_string())
            .await
            .json();
        assert_eq!(decisions(&answer), [false, true], "{answer}");
        request.as_object_mut().unwrap().remove("options");
        let answer = post(server.addr, version, EVALUATIONS, &request.to_string())
            .await
            .json();
        assert_eq!(decisions(&answer), [false, true, true], "{answer}");
        decided += 5;
        // An entry's own part replaces the default: eve has no scope.
        let mut request = three("execute_all");
        request["evaluations"][2]["subject"] =
            json!({"type": "identity", "id": "eve", "properties": {"tenant": "acme"}});
        let answer = post(server.addr, version, EVALUATIONS, &request.to_string())
            .await
            .json();
        assert_eq!(decisions(&answer), [true, false, false], "{answer}");
        decided += 3;
        // No `evaluations`: a single evaluation, answered as one.
        let answer = post(
            server.addr,
            version,
            EVALUATIONS,
            &search(&["docs:read"]).to_string(),
        )
        .await
        .json();
        schemas.decision_ok(&answer);
        assert_eq!(answer["decision"], true, "{answer}");
        decided += 1;
    }
    // Only what was evaluated was decided: one event each.
    let events = audit_events(&server, &dir).await;
    assert_eq!(events_of(&events, "decision").len(), decided);
    let subjects: Vec<&Value> = events_of(&events, "decision")
        .iter()
        .map(|e| &e["subject"])
        .collect();
    assert!(subjects.contains(&&json!("eve")));
}

/// The JSON examples of the Access Evaluation(s) sections of the spec.
fn spec_examples() -> Option<Vec<Value>> {
    let dir = toolgate::prerequisites::suite_dir("authzen")?;
    let text = std::fs::read_to_string(dir.join("authorization-api-1_0.md")).unwrap();
    let start = text.find("# Access Evaluation API").unwrap();
    let end = text.find("# Search APIs").unwrap();
    let mut examples = Vec::new();
    let mut block: Option<String> = None;
    for line in text[start..end].lines() {
        match (&mut block, line.trim()) {
            (None, l) if l == "~~~json" || l == "~~~ json" => block = Some(String::new()),
            (Some(b), "~~~") => {
                examples.push(serde_json::from_str(b).unwrap());
                block = None;
            }
            (Some(b), _) => {
                b.push_str(line);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    Some(examples)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spec_examples_are_answered_in_the_spec_shape() {
    let (Some(schemas), Some(examples)) = (schemas(), spec_examples()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |_| {}).await;
    // Requests: every example without a decision in it.
    let requests: Vec<&Value> = examples
        .iter()
        .filter(|e| {
            e.get("decision").is_none()
                && !e["evaluations"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x.get("decision").is_some()))
        })
        .collect();
    assert_eq!(requests.len(), 8, "{requests:?}");
    let mut answered = Vec::new();
    for request in requests {
        let answer = post(server.addr, Version::H2, EVALUATIONS, &request.to_string()).await;
        let Some(entries) = request["evaluations"].as_array() else {
            // The single request: a document is not a tool, so toolgate
            // cannot evaluate it (DESIGN §11.1: 400 with a message).
            schemas.request_ok(request);
            assert_eq!(answer.status, 400, "{request}");
            assert_eq!(
                answer.text(),
                "resource type `account` is not a tool (expected `tool` or `mcp_tool`)"
            );
            let single = post(
                server.addr,
                Version::Http1,
                EVALUATION,
                &request.to_string(),
            )
            .await;
            assert_eq!(
                (single.status, single.text()),
                (answer.status, answer.text())
            );
            answered.push("single");
            continue;
        };
        if entries
            .iter()
            .any(|e| e.get("action").is_none() && request.get("action").is_none())
        {
            // The options example omits `action` everywhere: a required
            // attribute is missing, so it is a Bad Request (§ JSON Serialization).
            assert_eq!(answer.status, 400);
            assert_eq!(answer.text(), "evaluations[0]: `action` is required");
            answered.push("bad");
            continue;
        }
        schemas.evaluations_request_ok(request);
        assert_eq!(answer.status, 200, "{request}: {}", answer.text());
        let answer = answer.json();
        schemas.evaluations_answer_ok(&answer);
        // Documents are not tools: each entry is closed, with its error in
        // its place, and the semantic decides how many are answered.
        let semantic = request["options"]["evaluations_semantic"].as_str();
        let expected = match semantic {
            Some("deny_on_first_deny") => 1,
            _ => entries.len(),
        };
        assert_eq!(decisions(&answer), vec![false; expected], "{answer}");
        let first = &answer["evaluations"][0]["context"];
        assert_eq!(first["reason"], "not_a_tool");
        assert_eq!(first["error"]["status"], 400);
        assert_eq!(
            first["error"]["message"],
            "evaluations[0]: resource type `document` is not a tool (expected `tool` or `mcp_tool`)"
        );
        answered.push(semantic.unwrap_or("default"));
    }
    assert_eq!(
        answered,
        [
            "single",
            "default",
            "default",
            "default",
            "bad",
            "execute_all",
            "deny_on_first_deny",
            "permit_on_first_permit"
        ]
    );
    // Nothing was decided; each entry that could not be was a refusal.
    let events = audit_events(&server, &dir).await;
    assert!(events_of(&events, "decision").is_empty());
    // The single one twice, three documents in each of three examples, the
    // example without an action, then 3 + 1 + 3 under the semantics.
    assert_eq!(
        events_of(&events, "request_refused").len(),
        2 + 3 * 3 + 1 + 3 + 1 + 3
    );
}

/// One request of the strictness table: method, path, headers, body; the
/// status, message and audited reason it gets.
type Case = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    String,
    u16,
    String,
    &'static str,
);

/// A duplicate key, a lone surrogate, an oversized body, a wrong content
/// type and method: each a 400 (405) with its message, audited as a
/// refused request, the request id echoed, nothing decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strictness_refuses_the_whole_body_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |c| c.authzen.max_body_bytes = 4096).await;
    let valid = search(&["docs:read"]).to_string();
    let duplicate = valid.replacen(r#""id":"bob""#, r#""id":"bob","id":"admin""#, 1);
    let dup_at = duplicate.find(r#""id":"admin""#).unwrap();
    let surrogate = valid.replacen("refunds", r"\ud800", 1);
    let sur_at = surrogate.find(r"\ud800").unwrap();
    let oversized = valid.replacen("refunds", &"r".repeat(5000), 1);
    let nested_duplicate = valid.replacen(
        r#""query":"refunds""#,
        r#""query":"refunds","query":"all""#,
        1,
    );
    let nested_at = nested_duplicate.find(r#""query":"all""#).unwrap();
    let cases: Vec<Case> = vec![
        (
            "POST",
            EVALUATION,
            &[("content-type", "application/json")],
            duplicate,
            400,
            format!(
                "the request body is not accepted: duplicate object key `/subject/id` at byte {dup_at}"
            ),
            "duplicate_key",
        ),
        (
            "POST",
            EVALUATIONS,
            &[("content-type", "application/json")],
            nested_duplicate,
            400,
            format!(
                "the request body is not accepted: duplicate object key `/resource/properties/arguments/query` at byte {nested_at}"
            ),
            "duplicate_key",
        ),
        (
            "POST",
            EVALUATION,
            &[("content-type", "application/json")],
            surrogate,
            400,
            format!(
                "the request body is not accepted: invalid json at byte {sur_at}: lone_surrogate"
            ),
            "lone_surrogate",
        ),
        (
            "POST",
            EVALUATION,
            &[("content-type", "application/json")],
            oversized,
            400,
            "the request body is over the limit of 4096 bytes".to_owned(),
            "too_large",
        ),
        (
            "POST",
            EVALUATION,
            &[("content-type", "text/plain")],
            valid.clone(),
            400,
            "the request's `Content-Type` must be `application/json`".to_owned(),
            "content_type",
        ),
        (
            "POST",
            EVALUATION,
            &[],
            valid.clone(),
            400,
            "the request's `Content-Type` must be `application/json`".to_owned(),
            "content_type",
        ),
        (
            "GET",
            EVALUATION,
            &[],
            String::new(),
            405,
            "`/access/v1/evaluation` takes POST".to_owned(),
            "method_not_allowed",
        ),
        (
            "PUT",
            EVALUATIONS,
            &[("content-type", "application/json")],
            valid.clone(),
            405,
            "`/access/v1/evaluations` takes POST".to_owned(),
            "method_not_allowed",
        ),
        (
            "POST",
            EVALUATION,
            &[("content-type", "application/json")],
            "[]".to_owned(),
            400,
            "the request body must be a JSON object".to_owned(),
            "not_an_object",
        ),
    ];
    let mut refusals = 0;
    for version in VERSIONS {
        for (i, (method, path, headers, body, status, message, reason)) in cases.iter().enumerate()
        {
            let id = format!("strict-{version:?}-{i}");
            let mut headers = headers.to_vec();
            headers.push(("x-request-id", id.as_str()));
            let answer = send(
                server.addr,
                version,
                method,
                path,
                &headers,
                body.as_bytes(),
            )
            .await;
            assert_eq!(
                (answer.status, answer.text()),
                (*status, message.clone()),
                "{version:?} case {i}"
            );
            assert_eq!(
                answer.header("content-type"),
                Some("text/plain; charset=utf-8")
            );
            assert_eq!(answer.header("x-request-id"), Some(id.as_str()));
            if *status == 405 {
                assert_eq!(answer.header("allow"), Some("POST"));
            }
            refusals += 1;
            let events = audit_events(&server, &dir).await;
            let last = events.last().unwrap();
            assert_eq!(last["event"], "request_refused", "{last}");
            assert_eq!(last["door"], "authzen");
            assert_eq!(last["endpoint"], *path);
            assert_eq!(last["status"], *status);
            assert_eq!(last["reason"], *reason);
            assert_eq!(last["request_id"], id.as_str());
        }
    }
    // Unknown fields are ignored, as the spec requires.
    let mut extra = search(&["docs:read"]);
    extra["subject"]["nickname"] = json!("b");
    extra["unknown_top_level"] = json!({"x": [1, 2]});
    extra["action"]["properties"] = json!({"method": "POST"});
    let answer = post(server.addr, Version::H2, EVALUATION, &extra.to_string()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["decision"], true);
    let events = audit_events(&server, &dir).await;
    assert_eq!(events_of(&events, "request_refused").len(), refusals);
    assert_eq!(events_of(&events, "decision").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_a_tenant_is_refused_unless_one_is_configured() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |_| {}).await;
    let mut request = search(&["docs:read"]);
    request["subject"]["properties"]
        .as_object_mut()
        .unwrap()
        .remove("tenant");
    let answer = post(
        server.addr,
        Version::Http1,
        EVALUATION,
        &request.to_string(),
    )
    .await;
    assert_eq!(
        (answer.status, answer.text()),
        (
            400,
            "the request names no tenant: send `subject.properties.tenant` (no `[authzen] default_tenant` is configured)".to_owned()
        )
    );
    let events = audit_events(&server, &dir).await;
    assert_eq!(events.last().unwrap()["reason"], "no_tenant");

    let dir = tempfile::tempdir().unwrap();
    let server = self::server(&dir, |c| {
        c.authzen.default_tenant = Some("globex".into());
        c.authzen.tenant = "/context/tenant".into();
    })
    .await;
    let answer = post(server.addr, Version::H2, EVALUATION, &request.to_string()).await;
    assert_eq!(answer.json()["decision"], true);
    // The moved pointer is read; the default no longer applies.
    request["context"]["tenant"] = json!("acme");
    let answer = post(server.addr, Version::H2, EVALUATION, &request.to_string()).await;
    assert_eq!(answer.json()["decision"], true);
    let events = audit_events(&server, &dir).await;
    let tenants: Vec<&Value> = events.iter().map(|e| &e["tenant"]).collect();
    assert_eq!(tenants, [&json!("globex"), &json!("acme")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_required_tokens_the_principal_is_the_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |c| c.require_identity_token = true).await;
    let tess = token("tess", "acme", &["treasury"]);
    let bearer = format!("Bearer {tess}");
    // The body names no tenant and no roles: the token does.
    let body = json!({
        "subject": {"type": "identity", "id": "tess"},
        "action": {"name": "tools/call"},
        "resource": {"type": "tool", "id": "wire_funds",
            "properties": {"arguments": {"amount_cents": 500}}},
    });
    let with_token = |body: &Value| {
        let body = body.to_string();
        let bearer = bearer.clone();
        let addr = server.addr;
        async move {
            send(
                addr,
                Version::H2,
                "POST",
                EVALUATION,
                &[
                    ("content-type", "application/json"),
                    ("authorization", &bearer),
                ],
                body.as_bytes(),
            )
            .await
            .json()
        }
    };
    assert_eq!(with_token(&body).await["decision"], true);
    // A body that claims another subject, tenant or roles is not taken.
    let lying = |subject: &str, properties: Value| {
        let mut b = body.clone();
        b["subject"] = json!({"type": "identity", "id": subject, "properties": properties});
        b
    };
    // (The token is the one just allowed: the lie alone is refused.)
    let unauthorized = r#"{"error":{"code":"unauthorized","message":"the caller could not be authenticated","resolution":"reauthenticate","retryable":false}}"#;
    for lie in [
        lying("mallory", json!({})),
        lying("tess", json!({"tenant": "globex"})),
        lying("tess", json!({"roles": ["treasury", "admin"]})),
        lying("tess", json!({"scopes": ["everything"]})),
    ] {
        let answer = with_token(&lie).await;
        assert_eq!(answer["decision"], false, "{lie}");
        assert_eq!(answer["context"]["reason"], "unauthorized");
        assert_eq!(answer["context"]["reason_user"], unauthorized);
    }
    // No token at all: not evaluated, whatever the body says (AuthZEN
    // §12: the PEP did not authenticate), and never a decision.
    let mut claimed = body.clone();
    claimed["subject"]["properties"] = json!({"tenant": "acme", "roles": ["treasury"]});
    let answer = post(
        server.addr,
        Version::Http1,
        EVALUATION,
        &claimed.to_string(),
    )
    .await;
    refused_for_no_token(&answer);
    let events = audit_events(&server, &dir).await;
    let refused = events_of(&events, "request_refused");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0]["status"], 401);
    assert_eq!(refused[0]["reason"], "missing_identity_token");
    let decisions = events_of(&events, "decision");
    assert_eq!(decisions.len(), 5);
    assert!(decisions[1..].iter().all(|d| d["code"] == "unauthorized"));
    assert_eq!(decisions[0]["tenant"], "acme");
    assert_eq!(decisions[0]["subject"], "tess");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authzen_grant_is_enforced() {
    let grant = |services: &[ServiceName], tenants: &[&str]| Grant {
        caller: CallerPattern::Any,
        services: services.iter().copied().collect(),
        tenants: TenantScope::of(tenants.iter().copied()),
    };
    // Granted `authorization` only: the door is closed.
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |c| {
        c.access = AccessPolicy::Grants(vec![grant(&[ServiceName::Authorization], &["acme"])]);
    })
    .await;
    for version in VERSIONS {
        let answer = send(
            server.addr,
            version,
            "POST",
            EVALUATION,
            &[
                ("content-type", "application/json"),
                ("x-request-id", "not-granted"),
            ],
            search(&["docs:read"]).to_string().as_bytes(),
        )
        .await;
        assert_eq!(answer.header("x-request-id"), Some("not-granted"));
        assert_eq!(
            (answer.status, answer.text()),
            (
                403,
                "caller `anonymous` may not call the authzen service".to_owned()
            ),
            "{version:?}"
        );
        let meta = send(server.addr, version, "GET", METADATA, &[], b"").await;
        assert_eq!(meta.status, 403);
    }
    // The gRPC service it was granted still answers.
    let listed = server
        .client()
        .await
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.tools.len(), 2);

    // Granted `authzen` for globex: acme's calls are refused, whole.
    let dir = tempfile::tempdir().unwrap();
    let server = self::server(&dir, |c| {
        c.access = AccessPolicy::Grants(vec![grant(&[ServiceName::Authzen], &["globex"])]);
    })
    .await;
    let answer = post(
        server.addr,
        Version::H2,
        EVALUATION,
        &search(&["docs:read"]).to_string(),
    )
    .await;
    assert_eq!(
        (answer.status, answer.text()),
        (
            403,
            "the caller's grants do not name tenant `acme`: it may not act for it".to_owned()
        )
    );
    let mut globex = three("execute_all");
    globex["subject"]["properties"]["tenant"] = json!("globex");
    globex["evaluations"][2]["subject"] =
        json!({"type": "identity", "id": "bob", "properties": {"tenant": "acme"}});
    let answer = post(server.addr, Version::H2, EVALUATIONS, &globex.to_string()).await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    let events = audit_events(&server, &dir).await;
    assert!(events_of(&events, "decision").is_empty(), "{events:?}");
    assert_eq!(events_of(&events, "request_refused").len(), 2);

    let search = action_search("bob", "acme", &[], &["docs:read"], Value::Null);
    let answer = post(server.addr, Version::Http1, SEARCH_ACTION, &search).await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    // The same entry for globex (bob, without the scope) is decided.
    globex["evaluations"][2]["subject"]["properties"]["tenant"] = json!("globex");
    let answer = post(server.addr, Version::H2, EVALUATIONS, &globex.to_string()).await;
    assert_eq!(decisions(&answer.json()), [true, false, false]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rebinding_guard_applies_to_http1() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |_| {}).await;
    let body = search(&["docs:read"]).to_string();
    let json = ("content-type", "application/json");
    let refused = send(
        server.addr,
        Version::Http1,
        "POST",
        EVALUATION,
        &[json, ("host", "evil.example")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(
        (refused.status, refused.text()),
        (
            403,
            "a plaintext loopback listener serves only requests addressed to a loopback host"
                .to_owned()
        )
    );
    let origin = send(
        server.addr,
        Version::Http1,
        "POST",
        EVALUATION,
        &[json, ("origin", "https://evil.example")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(origin.status, 403);
    let meta = send(
        server.addr,
        Version::Http1,
        "GET",
        METADATA,
        &[("host", "evil.example:80")],
        b"",
    )
    .await;
    assert_eq!(meta.status, 403);
    // A loopback host is served; h2 is no browser and is not checked.
    let served = send(
        server.addr,
        Version::Http1,
        "POST",
        EVALUATION,
        &[json, ("host", "localhost")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(served.json()["decision"], true);
    let h2 = send(
        server.addr,
        Version::H2,
        "POST",
        EVALUATION,
        &[json, ("origin", "https://evil.example")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(h2.json()["decision"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_tools_and_mcp_schema_publish_the_declared_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |c| c.authzen.scopes = "/context/scopes".into()).await;
    let expected = json!({"evaluation": {
        "subject": {"type": "identity", "id": "$token.sub",
            "properties": {"tenant": "$token.tenant", "roles": "$token.?roles"}},
        "action": {"name": "tools/call"},
        "resource": {"type": "tool", "id": "$params.name",
            "properties": {"arguments": "$params.?arguments"}},
        "context": {"agent": "$token.?client_id", "scopes": "$token.?scope"},
    }});
    let listed = server
        .client()
        .await
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    for tool in &listed.tools {
        let mapping: Value = serde_json::from_str(&tool.authzen_mapping_json).unwrap();
        assert_eq!(mapping, expected, "{}", tool.name);
    }

    // The command line: the contract's inputSchema with the mapping of the
    // configuration's `[authzen]`.
    let config = dir.path().join("toolgate.toml");
    std::fs::write(
        &config,
        "[authzen]\nscopes = \"/context/scopes\"\n[identity.claims]\ntenant = \"org\"\n",
    )
    .unwrap();
    let out = crate::sidecar::toolgate()
        .args(["tools", "mcp-schema", "wire_funds", "--config"])
        .arg(&config)
        .arg("--policies")
        .arg(policies())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let contract: Value = serde_json::from_str(
        &std::fs::read_to_string(policies().join("tools/wire_funds.json")).unwrap(),
    )
    .unwrap();
    let mut schema = contract["inputSchema"].clone();
    let mut mapping = expected;
    mapping["evaluation"]["subject"]["properties"]["tenant"] = json!("$token.org");
    schema["x-authzen-mapping"] = mapping;
    assert_eq!(printed, schema);

    let out = crate::sidecar::toolgate()
        .args(["tools", "mcp-schema", "nope", "--config"])
        .arg(&config)
        .arg("--policies")
        .arg(policies())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!("error: no tool `nope` in {}", policies().display())
    );
}

/// An Action Search for `subject` of `tenant` on this MCP server.
fn action_search(
    subject: &str,
    tenant: &str,
    roles: &[&str],
    scopes: &[&str],
    page: Value,
) -> String {
    let mut request = json!({
        "subject": {"type": "identity", "id": subject,
            "properties": {"tenant": tenant, "roles": roles, "scopes": scopes}},
        "resource": {"type": "mcp_server", "id": "https://mcp.example.com"},
        "context": {"agent": "gateway-bot"},
    });
    if !page.is_null() {
        request["page"] = page;
    }
    request.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn action_search_answers_the_tools_a_principal_may_call() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |_| {}).await;
    let names = |answer: &Value| -> Vec<String> {
        answer["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    };
    for version in VERSIONS {
        let search = |body: String| async move {
            let answer = post(server.addr, version, SEARCH_ACTION, &body).await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            answer.json()
        };
        // Each tool for whom some call of it could be allowed; a tool that
        // needs an approval for large calls is shown.
        let both = search(action_search(
            "tess",
            "acme",
            &["treasury"],
            &["docs:read"],
            Value::Null,
        ))
        .await;
        assert_eq!(
            both,
            json!({"results": [{"name": "search_docs"}, {"name": "wire_funds"}]})
        );
        let reader = search(action_search(
            "bob",
            "acme",
            &[],
            &["docs:read"],
            Value::Null,
        ))
        .await;
        assert_eq!(names(&reader), ["search_docs"]);
        let nobody = search(action_search("eve", "acme", &[], &[], Value::Null)).await;
        assert_eq!(nobody, json!({"results": []}));
        // Pages, when asked for.
        let first = search(action_search(
            "tess",
            "acme",
            &["treasury"],
            &["docs:read"],
            json!({"limit": 1}),
        ))
        .await;
        assert_eq!(
            first,
            json!({"page": {"next_token": "tools-from-1", "count": 1, "total": 2},
                "results": [{"name": "search_docs"}]})
        );
        let second = search(action_search(
            "tess",
            "acme",
            &["treasury"],
            &["docs:read"],
            json!({"limit": 1, "token": "tools-from-1"}),
        ))
        .await;
        assert_eq!(
            second,
            json!({"page": {"next_token": "", "count": 1, "total": 2},
                "results": [{"name": "wire_funds"}]})
        );
    }
    // What cannot be searched is refused with a message.
    let forged = action_search("tess", "acme", &[], &[], json!({"token": "page-2"}));
    let answer = post(server.addr, Version::H2, SEARCH_ACTION, &forged).await;
    assert_eq!(
        (answer.status, answer.text()),
        (
            400,
            "`page.token` is not a token toolgate issued".to_owned()
        )
    );
    let no_tenant = json!({"subject": {"type": "identity", "id": "tess"},
        "resource": {"type": "mcp_server", "id": "x"}});
    let answer = post(
        server.addr,
        Version::Http1,
        SEARCH_ACTION,
        &no_tenant.to_string(),
    )
    .await;
    assert_eq!(answer.status, 400);
    let no_resource =
        json!({"subject": {"type": "identity", "id": "tess", "properties": {"tenant": "acme"}}});
    let answer = post(
        server.addr,
        Version::Http1,
        SEARCH_ACTION,
        &no_resource.to_string(),
    )
    .await;
    assert_eq!(
        (answer.status, answer.text()),
        (400, "`resource` is required".to_owned())
    );
    let get = send(server.addr, Version::H2, "GET", SEARCH_ACTION, &[], b"").await;
    assert_eq!(get.status, 405);
    // A search decides nothing: only the refusals are audited.
    let events = audit_events(&server, &dir).await;
    assert!(events_of(&events, "decision").is_empty());
    assert_eq!(events_of(&events, "request_refused").len(), 4);

    // Under required tokens the principal is the token's; none is a 401.
    let dir = tempfile::tempdir().unwrap();
    let server = self::server(&dir, |c| c.require_identity_token = true).await;
    let body = json!({"subject": {"type": "identity", "id": "tess"},
        "resource": {"type": "mcp_server", "id": "x"}})
    .to_string();
    let answer = post(server.addr, Version::H2, SEARCH_ACTION, &body).await;
    refused_for_no_token(&answer);
    let bearer = format!("Bearer {}", token("tess", "acme", &["treasury"]));
    let answer = send(
        server.addr,
        Version::H2,
        "POST",
        SEARCH_ACTION,
        &[
            ("content-type", "application/json"),
            ("authorization", &bearer),
        ],
        body.as_bytes(),
    )
    .await;
    // The token's scope is `approvals`: the docs are not the token's to read.
    assert_eq!(answer.json(), json!({"results": [{"name": "wire_funds"}]}));
}

/// A TLS connection to `addr` as `localhost`, trusting `ca_pem`, with a
/// client certificate; ALPN offers only the one version, as an HTTP/1.1-only
/// client (Python's httpx, `curl --http1.1`) does.
async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
    client: &(String, String),
    version: Version,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(client.0.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(client.1.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = match version {
        Version::H2 => vec![b"h2".to_vec()],
        Version::Http1 => vec![b"http/1.1".to_vec()],
    };
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_both_versions_are_negotiated_and_the_gateway_is_granted() {
    let pki = crate::listeners::Pki::new("toolgate test CA");
    let gateway = pki.issue("mcp-gateway", &[], &[], false);
    let executor = pki.issue("executor", &[], &[], false);
    let pem = tempfile::tempdir().unwrap();
    let tls = pki.server_files(pem.path());
    let grant = |caller: &str, service: ServiceName| Grant {
        caller: CallerPattern::parse(caller).unwrap(),
        services: BTreeSet::from([service]),
        tenants: TenantScope::of(["acme"]),
    };
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |c| {
        c.access = AccessPolicy::Grants(vec![
            grant("cn:mcp-gateway", ServiceName::Authzen),
            grant("cn:executor", ServiceName::Authorization),
        ]);
        c.tls = Some(tls);
    })
    .await;
    let authority = format!("localhost:{}", server.addr.port());
    let body = search(&["docs:read"]).to_string();
    let json = [("content-type", "application/json")];
    for version in VERSIONS {
        // The gateway's certificate is granted the door; the executor's is not.
        for (client, status) in [(&gateway, 200), (&executor, 403)] {
            let io = tls_connect(server.addr, &pki.ca_pem, client, version).await;
            let answer = exchange(
                io,
                "https",
                &authority,
                version,
                "POST",
                EVALUATION,
                &json,
                body.as_bytes(),
            )
            .await;
            assert_eq!(answer.status, status, "{version:?}: {}", answer.text());
            if status == 200 {
                assert_eq!(answer.json()["decision"], true);
            } else {
                assert_eq!(
                    answer.text(),
                    "caller `cn:executor` may not call the authzen service"
                );
            }
        }
        // The metadata names the https endpoints of the listener's own
        // address, not the authority the client wrote (DESIGN §9).
        let io = tls_connect(server.addr, &pki.ca_pem, &gateway, version).await;
        let meta = exchange(io, "https", &authority, version, "GET", METADATA, &[], b"")
            .await
            .json();
        assert_eq!(
            meta["access_evaluation_endpoint"],
            format!("https://{}/access/v1/evaluation", server.addr)
        );
    }
    let events = audit_events(&server, &dir).await;
    let decisions = events_of(&events, "decision");
    assert_eq!(decisions.len(), 2);
    assert!(decisions.iter().all(|d| d["peer"] == "cn:mcp-gateway"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_runs_once_its_approval_is_named() {
    use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir, |_| {}).await;
    // The PEP names the operation, so the retry is the same one.
    let mut call = wire(20_000);
    call["context"]["request_id"] = json!("wire-op-1");
    let required = post(server.addr, Version::H2, EVALUATION, &call.to_string())
        .await
        .json();
    assert_eq!(required["context"]["reason"], "approval_required");
    let approval_id = required["context"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let sha = required["context"]["arguments_sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    // Asked again before anyone decided: the same approval, not a second.
    let again = post(server.addr, Version::Http1, EVALUATION, &call.to_string())
        .await
        .json();
    assert_eq!(again["context"]["approval_id"], approval_id.as_str());

    let decided = ApprovalServiceClient::new(server.channel().await)
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: token("dana", "acme", &["support_admin"]),
            approval_id: approval_id.clone(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: sha.clone(),
            reason: "invoice checked".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);

    call["context"]["approval_id"] = json!(approval_id);
    let allowed = post(server.addr, Version::H2, EVALUATION, &call.to_string())
        .await
        .json();
    assert_eq!(allowed["decision"], true, "{allowed}");
    assert_eq!(allowed["context"]["approval_id"], approval_id.as_str());
    assert_eq!(allowed["context"]["arguments_sha256"], sha.as_str());
    // One argument changed: the approval is not this call's.
    call["resource"]["properties"]["arguments"]["amount_cents"] = json!(20_001);
    let changed = post(server.addr, Version::H2, EVALUATION, &call.to_string())
        .await
        .json();
    assert_eq!(changed["decision"], false);
    assert_eq!(changed["context"]["reason"], "approval_mismatch");
    assert_eq!(changed["context"]["approval_id"], approval_id.as_str());
}
