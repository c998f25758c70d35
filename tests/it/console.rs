//! The approval console (DESIGN §12, issue 16).
//!
//! In a real headless Chromium (Debian's `chromium`, driven by npm's
//! `playwright-core`, axe-core for accessibility: `tests/console/`, set up
//! by `scripts/test.sh`) against a real `toolgate serve` with a real
//! executor: [`the_console_works_in_a_real_browser`]. Each screen's
//! screenshot goes to `target/console-screenshots/`, or to `docs/console/`
//! (the README's) with `TOOLGATE_UPDATE_SCREENSHOTS=1`.
//!
//! Over plain HTTP against the in-process server: off by default, the
//! Content-Security-Policy on every answer, the API refusing other sites'
//! pages, the grant `console`, the proxy's token header, and the live
//! stream's events and end at the token's `exp`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::body::Bytes;
use serde_json::{Value, json};
use toolgate::access::{AccessPolicy, CallerPattern, Grant, ServiceName, TenantScope};

use crate::prerequisites;
use crate::sidecar::{Kept, Sidecar, toolgate};
use crate::support::{TestServer, copy_of_examples, fixture, request, token, token_valid_for};

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One HTTP/1.1 answer, its body read whole.
struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// Sends one HTTP/1.1 request on a fresh connection; the response, its
/// body not yet read.
async fn open(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> http::Response<hyper::body::Incoming> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(http_body_util::Full::new(Bytes::copy_from_slice(body)))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async move {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(request).await.unwrap()
    })
    .await
    .unwrap()
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let response = open(addr, method, path, headers, body).await;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    send(addr, "GET", path, headers, b"").await
}

/// The next Server-Sent Events frame of a live stream (bounded: 10 s).
async fn next_frame(body: &mut hyper::body::Incoming, buffer: &mut String) -> (String, Value) {
    loop {
        if let Some(cut) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..cut + 2).collect();
            if frame.starts_with(':') {
                continue;
            }
            let event = frame
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap()
                .to_owned();
            let data = frame
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            return (event, serde_json::from_str(data).unwrap());
        }
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("no event within 10 s")
            .expect("the stream ended")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            buffer.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
}

async fn console_server(edit: impl FnOnce(&mut toolgate::config::Config)) -> TestServer {
    TestServer::start_setup(|c| {
        c.console.enabled = true;
        edit(c);
    })
    .await
}

/// A refund of 250.00 by bob: over 100.00, so it waits for a human.
async fn pending_refund(server: &TestServer, request_id: &str) -> String {
    let mut client = server.client().await;
    let mut req = request(
        "refund_order",
        r#"{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}"#,
    );
    req.request_id = request_id.to_owned();
    let r = client.authorize(req).await.unwrap().into_inner();
    r.approval.unwrap().approval_id
}

#[tokio::test]
async fn the_console_is_off_unless_enabled() {
    let server = TestServer::start().await;
    for path in ["/console/", "/console/api/session", "/console/app.js"] {
        let a = get(server.addr, path, &[]).await;
        assert_eq!(a.status, 404, "{path}");
        assert_eq!(
            a.text(),
            "the approval console is not enabled (set `[console] enabled = true`)"
        );
        assert_eq!(a.header("content-security-policy"), Some(CSP));
    }
    server.stop().await;
}

#[tokio::test]
async fn every_console_answer_carries_the_policy_and_the_api_answers_only_its_own_page() {
    let server = console_server(|_| {}).await;
    let addr = server.addr;
    let page = get(addr, "/console/", &[]).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.text()
            .contains(r#"<script type="module" src="app.js"></script>"#)
    );
    let redirect = get(addr, "/console", &[]).await;
    assert_eq!(
        (redirect.status, redirect.header("location")),
        (301, Some("console/"))
    );
    for (path, status, kind) in [
        ("/console/app.js", 200, "text/javascript; charset=utf-8"),
        ("/console/console.css", 200, "text/css; charset=utf-8"),
        ("/console/favicon.svg", 200, "image/svg+xml"),
        ("/console/api/session", 200, "application/json"),
        ("/console/nope.js", 404, "text/plain; charset=utf-8"),
        ("/console/api/nope", 404, "text/plain; charset=utf-8"),
    ] {
        let a = get(addr, path, &[]).await;
        assert_eq!(
            (a.status, a.header("content-type")),
            (status, Some(kind)),
            "{path}"
        );
        assert_eq!(a.header("content-security-policy"), Some(CSP), "{path}");
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(a.header("x-frame-options"), Some("DENY"));
        assert_eq!(a.header("referrer-policy"), Some("no-referrer"));
    }

    // Another site's page gets nothing from the API, whatever cookie a
    // proxy in front relies on.
    let dana = token("dana", "acme", &["support_admin"]);
    let bearer = format!("Bearer {dana}");
    for site in ["cross-site", "same-site"] {
        let a = get(
            addr,
            "/console/api/approvals",
            &[("authorization", &bearer), ("sec-fetch-site", site)],
        )
        .await;
        assert_eq!(a.status, 403);
        assert_eq!(
            a.text(),
            "the console API answers only the console's own page"
        );
        assert_eq!(a.header("content-security-policy"), Some(CSP));
    }
    let ours = get(
        addr,
        "/console/api/approvals",
        &[
            ("authorization", &bearer),
            ("sec-fetch-site", "same-origin"),
        ],
    )
    .await;
    assert_eq!(ours.json(), json!({"approvals": [], "complete": true}));

    // A decision is JSON, POSTed; anything else is refused before the desk.
    let id = pending_refund(&server, "console-http-1").await;
    let path = format!("/console/api/approvals/{id}/decision");
    let form = send(
        addr,
        "POST",
        &path,
        &[("authorization", &bearer), ("content-type", "text/plain")],
        br#"{"verdict":"approve","arguments_sha256":"x","reason":""}"#,
    )
    .await;
    assert_eq!(form.status, 415);
    let wrong_method = get(addr, &path, &[("authorization", &bearer)]).await;
    assert_eq!(
        (wrong_method.status, wrong_method.header("allow")),
        (405, Some("POST"))
    );
    // A hash the approver was not shown is refused, as data.
    let mismatch = send(
        addr,
        "POST",
        &path,
        &[
            ("authorization", &bearer),
            ("content-type", "application/json"),
        ],
        br#"{"verdict":"approve","arguments_sha256":"00","reason":""}"#,
    )
    .await;
    assert_eq!(mismatch.status, 200);
    assert_eq!(mismatch.json()["error"]["code"], "approval_mismatch");
    let reject = send(
        addr,
        "POST",
        &path,
        &[
            ("authorization", &bearer),
            ("content-type", "application/json"),
        ],
        br#"{"verdict":"reject","arguments_sha256":"00","reason":" "}"#,
    )
    .await;
    assert_eq!(
        reject.json()["error"],
        json!({"code": "invalid_arguments", "message": "a rejection needs a reason", "details": {"field": "reason"}})
    );
    let shown = get(
        addr,
        &format!("/console/api/approvals/{id}"),
        &[("authorization", &bearer)],
    )
    .await
    .json();
    assert_eq!(shown["approval"]["status"], "PENDING");
    server.stop().await;
}

#[tokio::test]
async fn the_console_is_a_grant_of_its_own() {
    let grants = |services: &[ServiceName]| {
        AccessPolicy::Grants(vec![Grant {
            caller: CallerPattern::Any,
            services: services.iter().copied().collect(),
            tenants: TenantScope::Any,
        }])
    };
    let server = console_server(|c| c.access = grants(&[ServiceName::Approvals])).await;
    let a = get(server.addr, "/console/", &[]).await;
    assert_eq!(a.status, 403);
    assert_eq!(
        a.text(),
        "caller `anonymous` may not call the console service"
    );
    assert_eq!(a.header("content-security-policy"), Some(CSP));
    server.stop().await;
    let server = console_server(|c| c.access = grants(&[ServiceName::Console])).await;
    assert_eq!(get(server.addr, "/console/", &[]).await.status, 200);
    server.stop().await;
}

#[tokio::test]
async fn behind_a_proxy_the_token_comes_from_its_header_and_the_live_stream_ends_at_exp() {
    let server =
        console_server(|c| c.console.token_header = "x-forwarded-access-token".into()).await;
    let addr = server.addr;
    let none = get(addr, "/console/api/session", &[]).await.json();
    assert_eq!(
        none,
        json!({"signed_in": false, "error": {"code": "unauthorized", "message": "no identity token", "details": {"reason": "missing"}}})
    );
    let dana = token_valid_for("dana", "acme", &["support_admin"], 3);
    let session = get(
        addr,
        "/console/api/session",
        &[("x-forwarded-access-token", &dana)],
    )
    .await
    .json();
    assert_eq!(session["signed_in"], true);
    assert_eq!(session["subject"], "dana");
    assert_eq!(session["tenant"], "acme");
    assert_eq!(session["from_proxy"], true);

    let response = open(
        addr,
        "GET",
        "/console/api/events",
        &[("x-forwarded-access-token", &dana)],
        b"",
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut body = response.into_body();
    let mut buffer = String::new();
    assert_eq!(
        next_frame(&mut body, &mut buffer).await,
        ("ready".to_owned(), json!({"subject": "dana"}))
    );
    let id = pending_refund(&server, "console-http-2").await;
    let (event, data) = next_frame(&mut body, &mut buffer).await;
    assert_eq!(event, "approval");
    assert_eq!(data["kind"], "created");
    assert_eq!(data["approval"]["approval_id"], id.as_str());
    assert_eq!(data["approval"]["requester"], "bob");
    // The token's exp ends the stream: the page goes back to sign-in.
    assert_eq!(
        next_frame(&mut body, &mut buffer).await,
        (
            "end".to_owned(),
            json!({"code": "unauthorized", "message": "the identity token expired"})
        )
    );
    // Without a token, the stream says why at once.
    let mut body = open(addr, "GET", "/console/api/events", &[], b"")
        .await
        .into_body();
    let mut buffer = String::new();
    assert_eq!(
        next_frame(&mut body, &mut buffer).await,
        (
            "end".to_owned(),
            json!({"code": "unauthorized", "message": "no identity token"})
        )
    );
    server.stop().await;
}

#[tokio::test]
async fn the_live_stream_tells_of_approvals_decided_and_expired() {
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let clock = toolgate::clock::ManualClock::new(now);
    let server = TestServer::configured(
        crate::support::Backend::Sqlite,
        std::sync::Arc::new(clock.clone()),
        |c| c.console.enabled = true,
    )
    .await;
    let addr = server.addr;
    // The test clock runs an hour ahead: the token must outlive it.
    let dana = format!(
        "Bearer {}",
        token_valid_for("dana", "acme", &["support_admin"], 86_400)
    );
    let mut body = open(
        addr,
        "GET",
        "/console/api/events",
        &[("authorization", &dana)],
        b"",
    )
    .await
    .into_body();
    let mut buffer = String::new();
    assert_eq!(next_frame(&mut body, &mut buffer).await.0, "ready");
    let first = pending_refund(&server, "console-expiry-1").await;
    let second = pending_refund(&server, "console-expiry-2").await;
    for id in [&first, &second] {
        let (_, data) = next_frame(&mut body, &mut buffer).await;
        assert_eq!(
            (
                data["kind"].as_str(),
                data["approval"]["approval_id"].as_str()
            ),
            (Some("created"), Some(id.as_str()))
        );
    }
    let hash = get(
        addr,
        &format!("/console/api/approvals/{second}"),
        &[("authorization", &dana)],
    )
    .await
    .json()["approval"]["arguments_sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let decided = send(
        addr,
        "POST",
        &format!("/console/api/approvals/{second}/decision"),
        &[
            ("authorization", &dana),
            ("content-type", "application/json"),
        ],
        json!({"verdict": "approve", "arguments_sha256": hash, "reason": ""})
            .to_string()
            .as_bytes(),
    )
    .await
    .json();
    assert_eq!(decided["approval"]["status"], "APPROVED");
    assert_eq!(decided["approval"]["decided_by"], "dana");
    let (_, data) = next_frame(&mut body, &mut buffer).await;
    assert_eq!(
        (data["kind"].as_str(), data["approval"]["status"].as_str()),
        (Some("decided"), Some("APPROVED"))
    );
    // Pending approvals expire after an hour (`pending_approval_ttl_seconds`),
    // an approved one unused after the tool's `approvalTtlSeconds`.
    clock.advance(3_600_001);
    let mut expired = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let (_, data) = next_frame(&mut body, &mut buffer).await;
        assert_eq!(
            (data["kind"].as_str(), data["approval"]["status"].as_str()),
            (Some("expired"), Some("EXPIRED"))
        );
        expired.insert(data["approval"]["approval_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        expired,
        [first.clone(), second.clone()].into_iter().collect()
    );
    // The history holds both, latest first (the approved one was decided
    // before the other's expiry); the queue neither.
    let history = get(
        addr,
        "/console/api/approvals?view=history",
        &[("authorization", &dana)],
    )
    .await
    .json();
    let shown: Vec<_> = history["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["approval_id"].as_str().unwrap().to_owned(),
                a["decided_by"].clone(),
            )
        })
        .collect();
    assert_eq!(shown, [(first, Value::Null), (second, json!("dana"))]);
    let queue = get(addr, "/console/api/approvals", &[("authorization", &dana)])
        .await
        .json();
    assert_eq!(queue, json!({"approvals": [], "complete": true}));
    server.stop().await;
}

/// The browser test's deployment in a fresh folder: the example
/// policies, with the refund's `note` marked sensitive (so the page shows a
/// redacted field), and a `toolgate.toml` with the console on.
fn browser_deployment() -> (tempfile::TempDir, PathBuf) {
    let (dir, policies) = copy_of_examples();
    let contract = policies.join("tools/refund_order.json");
    let mut refund: Value =
        serde_json::from_str(&std::fs::read_to_string(&contract).unwrap()).unwrap();
    refund["sensitive"] = json!(["/note"]);
    std::fs::write(&contract, refund.to_string()).unwrap();
    std::fs::write(
        dir.path().join("toolgate.toml"),
        format!(
            "jwks_file = {:?}\nissuer = \"https://idp.test\"\naudience = \"toolgate\"\n\n\
             [identity]\nleeway_seconds = 1\n\n[console]\nenabled = true\n",
            fixture("keys/jwks.json")
        ),
    )
    .unwrap();
    (dir, policies)
}

/// How many top-level `test(` the browser test file defines: what must pass.
fn defined_tests(file: &std::path::Path) -> usize {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("test("))
        .count()
}

fn tap_count(tap: &str, key: &str) -> Option<u64> {
    let prefix = format!("# {key} ");
    tap.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_a_real_browser() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tests_dir = root.join("tests/console");
    let Some((node, chromium)) = prerequisites::browser(&tests_dir, &root.join("clients/node"))
    else {
        return;
    };
    let (dir, policies) = browser_deployment();
    let mut command = toolgate();
    command
        .arg("serve")
        .arg("--policies")
        .arg(&policies)
        .args(["--listen", "127.0.0.1:0"])
        .arg("--store")
        .arg(format!(
            "sqlite://{}",
            dir.path().join("toolgate.db").display()
        ))
        .current_dir(dir.path());
    let log: Kept = Kept::default();
    let sidecar = Sidecar::spawn_logged(command, "debug", Some(log.clone()));
    let screenshots = if std::env::var("TOOLGATE_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
        root.join("docs/console")
    } else {
        root.join("target/console-screenshots")
    };
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let file = tests_dir.join("console.test.js");
    let expected = defined_tests(&file) as u64;
    assert!(expected >= 10, "the browser tests are missing");
    let addr = sidecar.addr;
    let run = {
        let out = out.clone();
        let root = root.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(node)
                .args(["--test", "--test-reporter=tap"])
                .arg(&file)
                .current_dir(&tests_dir)
                .env("TOOLGATE_CONSOLE_URL", format!("http://{addr}/console/"))
                .env("TOOLGATE_ADDR", addr.to_string())
                .env("TOOLGATE_PROTO_DIR", root.join("proto"))
                .env("TOOLGATE_CHROMIUM", chromium)
                .env("TOOLGATE_TEST_KEY", fixture("keys/ec.pem"))
                .env("TOOLGATE_SCREENSHOTS", &screenshots)
                .env("TOOLGATE_TEST_OUT", &out)
                .output()
                .unwrap()
        })
    };
    let output = run.await.unwrap();
    let tap = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{tap}");
    let n = Some(expected);
    assert_eq!(
        ["tests", "pass", "fail", "cancelled", "skipped", "todo"].map(|k| tap_count(&tap, k)),
        [n, n, Some(0), Some(0), Some(0), Some(0)],
        "{tap}"
    );
    // No token the browser used reached the sidecar's log, at debug level.
    let tokens: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokens.json")).unwrap()).unwrap();
    assert!(tokens.len() >= 6);
    let lines = log.lock().unwrap().clone();
    assert!(lines.len() > 10, "the sidecar logged nothing");
    for (_, line) in &lines {
        for t in &tokens {
            let signature = t.rsplit('.').next().unwrap();
            assert!(
                !line.contains(signature),
                "a token in the sidecar's log: {line}"
            );
        }
    }
    drop(sidecar);
}
