//! The smaller holes of the gateway security review (issue 29 points 3 and
//! 4), each over a real `toolgate serve` whose listener is a plaintext
//! loopback one with `[[access]] caller = "any"`, as a team that wants to
//! name its services writes it. On 7c5e26b every test here failed: the
//! rebound page was served, the metadata named the client's `Host`, the
//! underscored headers reached the upstream, a missing token was a
//! `200 decision:false`, a repeated console header fell back to the
//! client's own `Authorization`, and messages carried a raw ESC.

use std::path::Path;

use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use serde_json::json;
use toolgate::decode::{Limits, parse_strict};

use crate::authzen::{EVALUATION, Version, refused_for_no_token, send};
use crate::ext_authz::{Told, bearer, bob, check, envoy_check, tools_call, user};
use crate::sidecar::{Sidecar, toolgate};
use crate::support::{fixture, token};

const METADATA: &str = "/.well-known/authzen-configuration";
const PROXY_HEADER: &str = "x-forwarded-access-token";

/// The deployment's `toolgate.toml`: every service granted to every caller
/// on the plaintext loopback listener, tokens required, the console on
/// behind a proxy's token header.
fn config(dir: &Path) {
    std::fs::write(
        dir.join("toolgate.toml"),
        format!(
            "jwks_file = {:?}\nissuer = \"https://idp.test\"\naudience = \"toolgate\"\n\
             require_identity_token = true\n\
             [[access]]\ncaller = \"any\"\n\
             services = [\"authorization\", \"approvals\", \"ledger\", \"policy\", \
             \"reflection\", \"entities\", \"authzen\", \"ext_authz\", \"console\"]\n\
             tenants = [\"*\"]\n\
             [console]\nenabled = true\ntoken_header = \"{PROXY_HEADER}\"\n",
            fixture("keys/jwks.json")
        ),
    )
    .unwrap();
}

fn sidecar(dir: &Path) -> Sidecar {
    config(dir);
    Sidecar::start(dir, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rebinding_guard_holds_under_grants_to_any_caller() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    // check-config says the guard is on.
    let out = toolgate()
        .arg("check-config")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.starts_with(
            "ok: listen Tcp(\"127.0.0.1:50051\"), 1 access grant(s), dns-rebinding guard on,"
        ),
        "{text}"
    );
    let sidecar = Sidecar::start(dir.path(), &[]);
    let port = sidecar.addr.port();
    let rebound = format!("evil.example:{port}");
    let refused = "a plaintext loopback listener serves only requests addressed to a loopback host";
    // The rebound page opens approvals through AuthZEN, and reads the
    // console API: both refused before anything is read.
    let json_ct = ("content-type", "application/json");
    let answer = send(
        sidecar.addr,
        Version::Http1,
        "POST",
        EVALUATION,
        &[json_ct, ("host", &rebound), ("origin", "http://evil.example")],
        br#"{"subject":{"type":"identity","id":"tess"},"action":{"name":"tools/call"},"resource":{"type":"tool","id":"wire_funds"}}"#,
    )
    .await;
    assert_eq!((answer.status, answer.text()), (403, refused.to_owned()));
    let approver = format!("Bearer {}", token("tess", "acme", &["treasury"]));
    let answer = send(
        sidecar.addr,
        Version::Http1,
        "GET",
        "/console/api/approvals",
        &[("host", &rebound), ("authorization", &approver)],
        b"",
    )
    .await;
    assert_eq!((answer.status, answer.text()), (403, refused.to_owned()));
    // A loopback host with a foreign origin: refused too.
    let answer = send(
        sidecar.addr,
        Version::Http1,
        "GET",
        "/console/api/session",
        &[
            ("origin", "http://evil.example"),
            ("authorization", &approver),
        ],
        b"",
    )
    .await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    // What a local client sends is served.
    let answer = send(
        sidecar.addr,
        Version::Http1,
        "GET",
        "/console/api/session",
        &[("authorization", &approver)],
        b"",
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["signed_in"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_names_the_listener_never_the_clients_host() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path());
    let own = format!("http://{}", sidecar.addr);
    // A loopback name that is not this listener over HTTP/1.1, and any
    // authority at all over h2 (which the guard does not check).
    for (version, host) in [
        (Version::Http1, "localhost:9"),
        (Version::H2, "attacker.example"),
    ] {
        let answer = send(
            sidecar.addr,
            version,
            "GET",
            METADATA,
            &[("host", host)],
            b"",
        )
        .await;
        assert_eq!(answer.status, 200, "{version:?}: {}", answer.text());
        assert_eq!(answer.header("cache-control"), Some("no-store"));
        let meta = answer.json();
        assert_eq!(meta["policy_decision_point"], own, "{version:?}");
        assert_eq!(
            meta["access_evaluation_endpoint"],
            format!("{own}/access/v1/evaluation"),
            "{version:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_authz_removes_the_clients_underscored_toolgate_headers() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path());
    let mut client = AuthorizationClient::new(sidecar.channel().await);
    let auth = bearer(&user(
        "bob",
        &["support_agent"],
        "orders:read orders:refund docs:read",
    ));
    let forged = [
        ("toolgate_decision_id", "forged"),
        ("toolgate_idempotency_key", "forged"),
        ("toolgate-arguments_sha256", "forged"),
    ];
    let mut headers = vec![("authorization", auth.as_str())];
    headers.extend(forged);
    // An allowed call and a message that passes alike.
    let call = tools_call(json!(1), "search_docs", r#"{"query":"refunds"}"#);
    let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    for body in [call.as_slice(), list.as_slice()] {
        let told = check(&mut client, envoy_check("POST", &headers, body)).await;
        let Told::Allow { remove, .. } = told else {
            panic!("{told:?}");
        };
        assert_eq!(
            remove,
            [
                "toolgate-arguments_sha256",
                "toolgate_decision_id",
                "toolgate_idempotency_key",
            ],
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authzen_without_an_identity_token_is_401() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path());
    let body = br#"{"subject":{"type":"identity","id":"tess","properties":{"tenant":"acme"}},"action":{"name":"tools/call"},"resource":{"type":"tool","id":"search_docs","properties":{"arguments":{"query":"q"}}}}"#;
    for path in [EVALUATION, "/access/v1/evaluations"] {
        for headers in [
            vec![("content-type", "application/json")],
            // Not a bearer token: none either.
            vec![
                ("content-type", "application/json"),
                ("authorization", "Basic dGVzczpwdw=="),
            ],
        ] {
            let answer = send(sidecar.addr, Version::H2, "POST", path, &headers, body).await;
            refused_for_no_token(&answer);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_refuses_a_token_header_sent_twice() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path());
    let tess = token("tess", "acme", &["treasury"]);
    let mallory = format!("Bearer {}", token("mallory", "acme", &["treasury"]));
    let session = |headers: Vec<(&'static str, String)>| {
        let addr = sidecar.addr;
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            send(
                addr,
                Version::Http1,
                "GET",
                "/console/api/session",
                &headers,
                b"",
            )
            .await
        }
    };
    // Once: the proxy's header is the approver.
    let once = session(vec![
        (PROXY_HEADER, tess.clone()),
        ("authorization", mallory.clone()),
    ])
    .await;
    assert_eq!(
        (
            once.json()["subject"].clone(),
            once.json()["from_proxy"].clone()
        ),
        (json!("tess"), json!(true))
    );
    // Twice: neither is taken, and never the client's own Authorization.
    let twice = session(vec![
        (PROXY_HEADER, tess.clone()),
        (PROXY_HEADER, tess.clone()),
        ("authorization", mallory.clone()),
    ])
    .await;
    assert_eq!(
        (twice.status, twice.text()),
        (
            400,
            format!("the header `{PROXY_HEADER}` is sent more than once: send the token once")
        )
    );
    let twice = session(vec![
        ("authorization", mallory.clone()),
        ("authorization", format!("Bearer {tess}")),
    ])
    .await;
    assert_eq!(twice.status, 400, "{}", twice.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusal_messages_escape_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path());
    // A key that clears the reader's screen and rewrites its line, twice.
    let key = r"\u001b[2J\r\u202e";
    let shown = r"/a\u{1b}[2J\u{d}\u{202e}";
    let body = format!(r#"{{"a{key}":1,"a{key}":2}}"#);
    let token = format!("Bearer {}", token("tess", "acme", &["treasury"]));
    let answer = send(
        sidecar.addr,
        Version::H2,
        "POST",
        EVALUATION,
        &[
            ("content-type", "application/json"),
            ("authorization", &token),
        ],
        body.as_bytes(),
    )
    .await;
    let refusal = parse_strict(body.as_bytes(), &Limits::default()).unwrap_err();
    assert_eq!(
        refusal.to_string(),
        format!("duplicate object key `{shown}` at byte 24")
    );
    assert_eq!(
        (answer.status, answer.text()),
        (400, format!("the request body is not accepted: {refusal}"))
    );
    // The same at the ext_authz door, in the JSON-RPC error's message.
    let mut client = AuthorizationClient::new(sidecar.channel().await);
    let auth = bearer(&bob());
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"search_docs","arguments":{{"q{key}":1,"q{key}":2}}}}}}"#
    );
    let told = check(
        &mut client,
        envoy_check("POST", &[("authorization", &auth)], body.as_bytes()),
    )
    .await;
    let Told::Respond { status, body, .. } = told else {
        panic!("{told:?}");
    };
    assert_eq!(status, 400);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(r"`/params/arguments/q\u{1b}[2J\u{d}\u{202e}`"),
        "{message}"
    );
    assert!(!message.chars().any(char::is_control), "{message:?}");
}
