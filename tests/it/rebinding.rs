//! DNS rebinding against the open loopback listener (issue 18.10), over a
//! real socket: a browser page of `evil.example` whose name an attacker
//! made resolve to 127.0.0.1 posts gRPC-Web over HTTP/1.1. To the browser
//! that is a same-origin request, so CORS never stops it; only its `Host`
//! (and `Origin`) show where it comes from. On 5bb0032 every one of these
//! requests was served (`grpc-status: 0`).

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::TestServer;

const ALLOWED_ORIGIN: &str = "https://approvals.example.com";

/// One gRPC-Web `ListTools` over HTTP/1.1 with these extra header lines;
/// the raw response.
async fn list_tools_http1(server: &TestServer, headers: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    // An empty ListToolsRequest: one uncompressed frame of length 0.
    let body = [0u8, 0, 0, 0, 0];
    let head = format!(
        "POST /toolgate.v1.AuthorizationService/ListTools HTTP/1.1\r\n{headers}\
         content-type: application/grpc-web+proto\r\nx-grpc-web: 1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

/// The response lowercased, spaces removed, for header matching.
fn folded(response: &str) -> String {
    response.to_ascii_lowercase().replace(' ', "")
}

fn served(response: &str) -> bool {
    folded(response).contains("grpc-status:0") && response.contains("refund_order")
}

/// Refused with `PERMISSION_DENIED` and this `ErrorInfo` reason (which
/// travels base64-encoded, as a `google.rpc.Status`, in the details).
fn refused(response: &str, reason: &str) -> bool {
    use base64::Engine as _;
    let details = response
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("grpc-status-details-bin")
                .then(|| value.trim().to_owned())
        })
        .and_then(|v| {
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(v.trim_end_matches('='))
                .ok()
        })
        .unwrap_or_default();
    folded(response).contains("grpc-status:7")
        && !response.contains("refund_order")
        && details
            .windows(reason.len())
            .any(|w| w == reason.as_bytes())
}

#[tokio::test]
async fn a_rebound_host_or_a_foreign_origin_is_refused_on_the_open_listener() {
    let server =
        TestServer::start_setup(|c| c.cors_origins = vec![ALLOWED_ORIGIN.to_owned()]).await;
    let port = server.addr.port();

    // Each request's extra header lines, and the refusal it gets (`None`:
    // served) with a word of its message.
    let loopback = format!("host: 127.0.0.1:{port}\r\n");
    let cases: Vec<(String, Option<(&str, &str)>)> = vec![
        // What a local client sends is served.
        (loopback.clone(), None),
        (format!("host: localhost:{port}\r\n"), None),
        ("host: [::1]\r\n".to_owned(), None),
        (format!("{loopback}origin: http://localhost:5173\r\n"), None),
        (format!("{loopback}origin: {ALLOWED_ORIGIN}\r\n"), None),
        // The rebound page: its own name in Host (and in Origin).
        (
            format!("host: evil.example:{port}\r\norigin: http://evil.example:{port}\r\n"),
            Some(("host_not_loopback", "loopback%20host")),
        ),
        // A name that resolves to loopback is still the attacker's name.
        (
            format!("host: 127.0.0.1.nip.io:{port}\r\n"),
            Some(("host_not_loopback", "loopback%20host")),
        ),
        // Two Host headers say two things: neither is taken.
        (
            format!("{loopback}host: evil.example\r\n"),
            Some(("host_not_loopback", "loopback%20host")),
        ),
        // A loopback Host but a foreign page's Origin.
        (
            format!("{loopback}origin: http://evil.example\r\n"),
            Some(("origin_not_allowed", "loopback%20origin")),
        ),
    ];
    for (headers, refusal) in &cases {
        let r = list_tools_http1(&server, headers).await;
        match refusal {
            None => assert!(served(&r), "{headers}: {r}"),
            Some((reason, words)) => {
                assert!(refused(&r, reason), "{headers}: {r}");
                assert!(r.contains(words), "{headers}: {r}");
            }
        }
    }

    // The refusals are counted as access refusals of the service.
    let metrics = server.metrics_endpoint().scrape().await;
    assert!(
        metrics.contains(r#"toolgate_access_denied_total{service="authorization"} 4"#),
        "{metrics}"
    );

    // gRPC over h2 (never a browser on plain text) is untouched.
    let tools = server
        .client()
        .await
        .list_tools(toolgate::grpc::pb::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(tools.tools.iter().any(|t| t.name == "refund_order"));
    server.stop().await;
}
