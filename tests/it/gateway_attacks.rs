//! The gateway doors under attack (issue 29), over a real `toolgate serve`.
//!
//! Case-folded key smuggling: a body that holds `"name"` and `"Name"`, or
//! `"params"` and `"param\u{17f}"`, means one call to toolgate and another
//! to an upstream whose JSON reader matches keys ignoring case and takes the
//! last (Go's `encoding/json`, so the Go MCP SDKs; .NET; Jackson). The
//! upstream here is Go's own `encoding/json` (`fixtures/go_upstream`, built
//! with Debian's `golang-go`), standing behind the ext_authz door as Envoy
//! would put it: it receives only what toolgate allowed, and for every such
//! body it must run the tool and arguments toolgate decided. Each smuggling
//! body is first sent to Go directly, to show it really reads another call.
//!
//! One approval, one execution: at the gateway doors no ledger stands
//! between the allow and the tool, and the client controls the
//! `idempotency-key` header and AuthZEN's `context.request_id`, so an
//! approval allows exactly one request (DESIGN §11.3).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use serde_json::{Value, json};
use toolgate::decode::{Limits, canonical_json, parse_strict, sha256_hex};
use toolgate::grpc::pb;
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::entity_service_client::EntityServiceClient;

use crate::authzen::{EVALUATION, Version, post, wire};
use crate::ext_authz::{
    BIG_REFUND, ORDERS, Told, bearer, bob, check, envoy_check, rpc_error, set_header, tool_error,
    tools_call, user,
};
use crate::sidecar::Sidecar;
use crate::support::{agent_bob, fixture, identity_args, request, token};

/// Go, if the machine has it (`TOOLGATE_GO`, else `go`): `scripts/test.sh`
/// installs Debian's `golang-go`. Otherwise the test fails naming it, or
/// skips where skips are allowed.
fn go() -> Option<String> {
    let go = std::env::var("TOOLGATE_GO").unwrap_or_else(|_| "go".into());
    let found = Command::new(&go)
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(go);
    }
    crate::prerequisites::skip_or_fail(
        &format!("Go (`{go}`) is not found"),
        "run ./scripts/test.sh (it installs Debian's golang-go), or install it \
         (apt-get install golang-go), or set TOOLGATE_GO",
    );
    None
}

/// The Go upstream, running; stopped (stdin closed, then killed) on drop.
struct GoUpstream {
    child: Child,
    addr: SocketAddr,
}

impl GoUpstream {
    /// Builds `fixtures/go_upstream/main.go` into `dir` and starts it
    /// (bounded: the build and its first line within 120 s).
    fn start(go: &str, dir: &Path) -> Self {
        let binary = dir.join("go_upstream");
        let built = Command::new(go)
            .arg("build")
            .arg("-o")
            .arg(&binary)
            .arg("main.go")
            .current_dir(fixture("go_upstream"))
            .env("GOCACHE", dir.join("gocache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GO111MODULE", "off")
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "go build: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        let mut child = Command::new(&binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(120)).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("go upstream said {line:?}"))
            .parse()
            .unwrap();
        Self { child, addr }
    }

    /// What Go reads `body` as: `{method, tool, arguments, error?}`.
    fn reading(&self, body: &[u8]) -> Value {
        let mut stream = std::net::TcpStream::connect(self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.addr,
            body.len()
        )
        .unwrap();
        stream.write_all(body).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let text = String::from_utf8(answer).unwrap();
        let (head, json) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        serde_json::from_str(json).unwrap()
    }
}

impl Drop for GoUpstream {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real `toolgate serve` with the example policies, the test key set and
/// the example orders in its entity store.
async fn sidecar(dir: &Path) -> Sidecar {
    let sidecar = Sidecar::start(dir, &identity_args());
    EntityServiceClient::new(sidecar.channel().await)
        .upsert_entities(pb::UpsertEntitiesRequest {
            tenant_id: "acme".into(),
            entities_json: ORDERS.into(),
        })
        .await
        .unwrap();
    sidecar
}

/// toolgate's own reading of a body it allowed: the method, the tool and
/// the canonical arguments, by its strict decoder (exact keys).
fn strict_reading(body: &[u8]) -> (String, String, String) {
    let value = parse_strict(body, &Limits::default()).unwrap();
    (
        value["method"].as_str().unwrap_or_default().to_owned(),
        value["params"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        canonical_json(&value["params"]["arguments"]).unwrap(),
    )
}

/// Go's reading of a body, in the same terms.
fn go_reading(go: &Value) -> (String, String, String) {
    assert_eq!(go.get("error"), None, "{go}");
    (
        go["method"].as_str().unwrap().to_owned(),
        go["tool"].as_str().unwrap().to_owned(),
        canonical_json(&go["arguments"]).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_folded_key_smuggles_no_call_past_the_ext_authz_door() {
    let Some(go) = go() else { return };
    let dir = tempfile::tempdir().unwrap();
    let upstream = GoUpstream::start(&go, dir.path());
    let sidecar = sidecar(dir.path()).await;
    let mut c = AuthorizationClient::new(sidecar.channel().await);
    let auth = bearer(&user(
        "bob",
        &["support_agent"],
        "orders:read orders:refund docs:read",
    ));

    let delete = r#"{"customer_id":"cus_42","confirm":true,"reason":"asked"}"#;
    // (what it is, the body, whether a bearer token is sent, the tool Go runs)
    let smuggled: Vec<(&str, String, bool, &str)> = vec![
        (
            "a second `Name`",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_docs","arguments":{"query":"refund policy"},"Name":"delete_account"}}"#
                .to_string(),
            true,
            "delete_account",
        ),
        (
            "a second `Method`, and no token",
            format!(
                r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list","Method":"tools/call","params":{{"name":"delete_account","arguments":{delete}}}}}"#
            ),
            false,
            "delete_account",
        ),
        (
            "`param\u{17f}` (U+017F folds onto s) beside `params`",
            format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"search_docs","arguments":{{"query":"q"}}}},"paramſ":{{"name":"delete_account","arguments":{delete}}}}}"#
            ),
            true,
            "delete_account",
        ),
        (
            "`NAME` spelled with an escape",
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"search_docs","arguments":{"query":"q"},"\u004eAME":"delete_account"}}"#
                .to_string(),
            true,
            "delete_account",
        ),
    ];
    for (what, body, with_token, go_runs) in &smuggled {
        // The attack is real: Go runs another tool than the first key names.
        let go = go_reading(&upstream.reading(body.as_bytes()));
        assert_eq!(go.1, *go_runs, "{what}: Go read {go:?}");
        let headers: Vec<(&str, &str)> = if *with_token {
            vec![("authorization", &auth)]
        } else {
            vec![]
        };
        let e = parse_strict(body.as_bytes(), &Limits::default()).unwrap_err();
        assert_eq!(e.reason(), "duplicate_key", "{what}");
        assert_eq!(
            check(&mut c, envoy_check("POST", &headers, body.as_bytes())).await,
            rpc_error(
                400,
                Value::Null,
                -32700,
                &format!("the request body is not accepted: {e}")
            ),
            "{what}"
        );
    }

    // A typed argument smuggled beside its lower-case twin, and a key with
    // a trailing U+0000 (the MCP Go SDK's GHSA-q382-vc8q-7jhj): refused.
    let refused: [(&str, &str); 2] = [
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"refund_order","arguments":{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late","Amount_Cents":2500000}}}"#,
            "/params/arguments/Amount_Cents",
        ),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"search_docs","name\u0000":"delete_account","arguments":{"query":"q"}}}"#,
            // (NUL shown escaped: a message never carries a control character.)
            r"/params/name\u{0}",
        ),
    ];
    for (body, pointer) in refused {
        let e = parse_strict(body.as_bytes(), &Limits::default()).unwrap_err();
        assert_eq!(
            (e.reason(), e.to_string().contains(&format!("`{pointer}`"))),
            ("duplicate_key", true),
            "{e}"
        );
        assert_eq!(
            check(
                &mut c,
                envoy_check("POST", &[("authorization", &auth)], body.as_bytes())
            )
            .await,
            rpc_error(
                400,
                Value::Null,
                -32700,
                &format!("the request body is not accepted: {e}")
            )
        );
    }

    // What toolgate allows reaches Go, and Go runs exactly that: the same
    // method, tool and arguments, whose hash is the header toolgate set.
    let allowed = [
        tools_call(json!(7), "search_docs", r#"{"query":"refund policy"}"#),
        tools_call(
            json!(8),
            "refund_order",
            r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#,
        ),
        // Keys that fold apart stay apart: `é` and `e` + U+0301 are two.
        tools_call(
            json!(9),
            "search_docs",
            r#"{"query":"caf\u00e9","limit":3}"#,
        ),
    ];
    for body in allowed {
        let told = check(
            &mut c,
            envoy_check("POST", &[("authorization", &auth)], &body),
        )
        .await;
        assert!(matches!(told, Told::Allow { .. }), "{told:?}");
        let go = go_reading(&upstream.reading(&body));
        let mine = strict_reading(&body);
        assert_eq!(go, mine);
        assert_eq!(
            set_header(&told, "toolgate-arguments-sha256"),
            sha256_hex(go.2.as_bytes())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_folded_duplicates_are_refused_at_the_authzen_and_executor_doors() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar =
        Sidecar::start_with_policies(dir.path(), &fixture("authzen-policies"), &identity_args());
    // AuthZEN: a second resource `ID` would name another tool to a PEP or
    // PDP client that reads keys ignoring case.
    let mut smuggled = wire(100).to_string();
    smuggled = smuggled.replacen(
        r#""id":"wire_funds""#,
        r#""id":"wire_funds","ID":"delete_account""#,
        1,
    );
    let e = parse_strict(smuggled.as_bytes(), &Limits::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "duplicate object key `/resource/ID` at byte 182"
    );
    let answer = post(sidecar.addr, Version::Http1, EVALUATION, &smuggled).await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert!(
        answer
            .text()
            .contains("duplicate object key `/resource/ID`"),
        "{}",
        answer.text()
    );
    drop(sidecar);

    // The executor door: the arguments themselves (an executor in Go or
    // .NET decodes them the same way).
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(dir.path(), &identity_args());
    let mut client = AuthorizationServiceClient::new(sidecar.channel().await);
    let mut req = request("search_docs", r#"{"query":"refunds","QUERY":"anything"}"#);
    req.auth = Some(agent_bob());
    let r = client.authorize(req).await.unwrap().into_inner();
    let error = r.error.unwrap();
    assert_eq!(
        (
            error.code.as_str(),
            error.message.as_str(),
            serde_json::from_str::<Value>(&error.details_json).unwrap()
        ),
        (
            "invalid_json",
            "duplicate object key `/QUERY` at byte 19",
            json!({"reason": "duplicate_key", "position": 19, "pointer": "/QUERY"})
        )
    );
}

/// bob's big refund through the ext_authz door under a fixed
/// `idempotency-key` (a header the client controls).
fn replayed_refund(auth: &str, id: i64) -> envoy_types::ext_authz::v3::pb::CheckRequest {
    envoy_check(
        "POST",
        &[
            ("authorization", auth),
            ("idempotency-key", "refund-ord_1001-1"),
        ],
        &tools_call(json!(id), "refund_order", BIG_REFUND),
    )
}

/// Approves `approval_id` for `sha` as dana, a support admin of acme.
async fn approve(sidecar: &Sidecar, approval_id: &str, sha: &str) {
    let decided = ApprovalServiceClient::new(sidecar.channel().await)
        .decide_approval(pb::DecideApprovalRequest {
            identity_token: token("dana", "acme", &["support_admin"]),
            approval_id: approval_id.into(),
            verdict: pb::Verdict::Approve.into(),
            arguments_sha256: sha.into(),
            reason: "checked".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_approval_allows_one_request_through_ext_authz_whatever_the_client_replays() {
    let Some(go) = go() else { return };
    let dir = tempfile::tempdir().unwrap();
    let upstream = GoUpstream::start(&go, dir.path());
    let sidecar = sidecar(dir.path()).await;
    let mut c = AuthorizationClient::new(sidecar.channel().await);
    let auth = bearer(&bob());

    let first = tool_error(&check(&mut c, replayed_refund(&auth, 1)).await, &json!(1));
    assert_eq!(first["error"]["code"], "approval_required", "{first}");
    let approval_id = first["error"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let sha = sha256_hex(
        canonical_json(&serde_json::from_str::<Value>(BIG_REFUND).unwrap())
            .unwrap()
            .as_bytes(),
    );
    approve(&sidecar, &approval_id, &sha).await;

    // The same request, replayed ten times with the same key: one reaches
    // the upstream; the others are told the approval was used.
    let mut forwarded = 0;
    let mut codes = Vec::new();
    for id in 2..12 {
        let told = check(&mut c, replayed_refund(&auth, id)).await;
        if let Told::Allow { .. } = told {
            let body = tools_call(json!(id), "refund_order", BIG_REFUND);
            let go = go_reading(&upstream.reading(&body));
            assert_eq!(go.1, "refund_order");
            forwarded += 1;
            codes.push("allow".to_owned());
        } else {
            let refusal = tool_error(&told, &json!(id));
            assert_eq!(refusal["error"]["details"]["approval_id"], approval_id);
            codes.push(refusal["error"]["code"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(forwarded, 1);
    let mut expected = vec!["allow".to_owned()];
    expected.extend(std::iter::repeat_n("approval_consumed".to_owned(), 9));
    assert_eq!(codes, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_approval_allows_one_authzen_evaluation_with_a_fixed_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar =
        Sidecar::start_with_policies(dir.path(), &fixture("authzen-policies"), &identity_args());
    let mut call = wire(20_000);
    call["context"]["request_id"] = json!("wire-op-1");
    let required = post(sidecar.addr, Version::Http1, EVALUATION, &call.to_string())
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
    approve(&sidecar, &approval_id, &sha).await;

    // Named by the PEP or found by the call, the approval allows one
    // evaluation; the same one again, ten times, is `approval_consumed`.
    for named in [false, true] {
        let mut call = call.clone();
        if named {
            call["context"]["approval_id"] = json!(approval_id);
        }
        let mut answers = Vec::new();
        for _ in 0..if named { 5 } else { 10 } {
            let answer = post(sidecar.addr, Version::Http1, EVALUATION, &call.to_string())
                .await
                .json();
            assert_eq!(answer["context"]["approval_id"], approval_id.as_str());
            answers.push((
                answer["decision"].as_bool().unwrap(),
                answer["context"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ));
        }
        let mut expected = Vec::new();
        if !named {
            expected.push((true, String::new()));
        }
        while expected.len() < answers.len() {
            expected.push((false, "approval_consumed".to_owned()));
        }
        assert_eq!(answers, expected, "named: {named}");
    }
}
