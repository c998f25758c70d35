//! What one listener holds at once (issue 18 point 8, issue 19's overload):
//! against a real `toolgate serve` with small `[limits]`, a client that
//! sends its request body slowly holds one call slot for at most the
//! request timeout, and the next call is refused at once with a retryable
//! `RESOURCE_EXHAUSTED` instead of queueing; connections past the limit
//! are closed at once; health watches past theirs are refused; and the
//! server announces its per-connection stream limit in its h2 SETTINGS.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use toolgate::grpc::pb::Decision;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;

use crate::sidecar::Sidecar;
use crate::support::request;

const LIMITS: &str = "metrics_listen = \"127.0.0.1:0\"\n\
[limits]\n\
max_connections = 3\n\
max_concurrent_streams = 7\n\
max_calls_in_flight = 1\n\
request_timeout_ms = 5000\n\
max_health_watches = 1\n";

fn sidecar() -> (tempfile::TempDir, Sidecar) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("toolgate.toml"), LIMITS).unwrap();
    let sidecar = Sidecar::start(dir.path(), &[]);
    (dir, sidecar)
}

/// A gRPC-Web `Authorize` over HTTP/1.1 that announces a 100-byte body and
/// sends 5 of them: the call holds its slot while it waits for the rest.
fn slow_body(sidecar: &Sidecar) -> TcpStream {
    let mut stream = TcpStream::connect(sidecar.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    write!(
        stream,
        "POST /toolgate.v1.AuthorizationService/Authorize HTTP/1.1\r\n\
         host: {}\r\n\
         content-type: application/grpc-web+proto\r\n\
         x-grpc-web: 1\r\n\
         content-length: 100\r\n\r\n",
        sidecar.addr
    )
    .unwrap();
    // The frame header of a 95-byte message, and nothing more.
    stream.write_all(&[0, 0, 0, 0, 95]).unwrap();
    stream.flush().unwrap();
    stream
}

async fn allowed(
    client: &mut AuthorizationServiceClient<tonic::transport::Channel>,
) -> Result<(), tonic::Status> {
    let r = client
        .authorize(request("get_order", r#"{"order_id":"ord_1001"}"#))
        .await?
        .into_inner();
    assert_eq!(r.decision(), Decision::Allow);
    Ok(())
}

/// Whether the slow call's connection has received anything (its answer:
/// the server sends nothing before it) or was closed, without waiting.
fn answered(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let got = match stream.read(&mut buf) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    };
    stream.set_nonblocking(false).unwrap();
    got
}

/// Everything the slow call's connection receives until it closes or
/// `within` passes.
fn read_answer(stream: &mut TcpStream, within: Duration) -> String {
    let until = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(buf.get(..n).unwrap_or_default());
                if String::from_utf8_lossy(&got).contains("grpc-status") {
                    break;
                }
            }
            Err(e) => panic!("reading the slow call's answer: {e}"),
        }
    }
    String::from_utf8_lossy(&got).to_lowercase()
}

#[tokio::test]
async fn a_slow_body_holds_its_slot_only_until_the_timeout_and_the_next_call_is_refused_at_once() {
    let (_dir, sidecar) = sidecar();
    let mut client = AuthorizationServiceClient::new(sidecar.channel().await);
    // The slot is free: a call is decided.
    allowed(&mut client).await.unwrap();

    let started = Instant::now();
    let mut slow = slow_body(&sidecar);
    let mut slow_sent = Instant::now();
    // The slow call holds the one slot: the next call is refused at once,
    // retryably, and nothing is decided for it.
    let refused = loop {
        match allowed(&mut client).await {
            Err(status) => break status,
            // The slow request was not read yet (a loaded machine), or it
            // arrived while this call held the slot and was itself refused:
            // then it is sent again, and takes the slot soon.
            Ok(()) if started.elapsed() < Duration::from_secs(20) => {
                if answered(&mut slow) {
                    slow = slow_body(&sidecar);
                    slow_sent = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(()) => panic!("a second call was decided while the slow call held the only slot"),
        }
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(
        refused.message(),
        "the sidecar is at its limit of calls in flight; nothing was done, retry shortly"
    );

    // At the request timeout the slow call is answered DEADLINE_EXCEEDED
    // (gRPC-Web: the status in the trailers-only headers) and its slot freed.
    let answer =
        tokio::task::spawn_blocking(move || read_answer(&mut slow, Duration::from_secs(15)))
            .await
            .unwrap();
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
    assert!(answer.contains("grpc-status: 4"), "{answer}");
    let took = slow_sent.elapsed();
    assert!(
        took >= Duration::from_millis(4_900) && took < Duration::from_secs(20),
        "the slow call was answered after {took:?}"
    );
    allowed(&mut client).await.unwrap();

    let metrics = crate::support::scrape(sidecar.metrics_addr.expect("metrics")).await;
    assert!(
        crate::support::series(
            &metrics,
            "toolgate_overload_refusals_total{limit=\"calls\"}"
        ) >= 1
    );
    assert_eq!(
        crate::support::series(
            &metrics,
            "toolgate_overload_refusals_total{limit=\"request_timeout\"}"
        ),
        1
    );
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_at_once_and_their_slots_come_back() {
    let (_dir, sidecar) = sidecar();
    // Three idle connections hold every slot.
    let idle: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(sidecar.addr).unwrap())
        .collect();
    // A fourth is accepted and closed at once: the client reads its end.
    let mut fourth = TcpStream::connect(sidecar.addr).unwrap();
    fourth
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    let read = fourth.read(&mut buf);
    assert!(
        matches!(read, Ok(0))
            || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the connection past the limit was not closed: {read:?}"
    );
    // Once one idle connection goes, a client is served again.
    drop(idle);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let attempt = async {
            let channel =
                tonic::transport::Endpoint::from_shared(format!("http://{}", sidecar.addr))
                    .unwrap()
                    .connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(2))
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
            allowed(&mut AuthorizationServiceClient::new(channel))
                .await
                .map_err(|e| e.to_string())
        };
        match attempt.await {
            Ok(()) => break,
            Err(e) if Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no call was served after the idle connections closed: {e}"),
        }
    }
    let metrics = crate::support::scrape(sidecar.metrics_addr.expect("metrics")).await;
    assert!(
        crate::support::series(
            &metrics,
            "toolgate_overload_refusals_total{limit=\"connections\"}"
        ) >= 1
    );
}

#[tokio::test]
async fn health_watches_past_the_limit_are_refused_and_the_first_keeps_running() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let (_dir, sidecar) = sidecar();
    let channel = sidecar.channel().await;
    let mut health = HealthClient::new(channel.clone());
    let mut first = health
        .watch(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(first.message().await.unwrap().is_some());
    let refused = HealthClient::new(channel.clone())
        .watch(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    // Checks are not watches: still answered.
    HealthClient::new(channel.clone())
        .check(HealthCheckRequest::default())
        .await
        .unwrap();
    // The first watch goes; its slot comes back once its task ends.
    drop(first);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match HealthClient::new(channel.clone())
            .watch(HealthCheckRequest::default())
            .await
        {
            Ok(_) => break,
            Err(e) if e.code() == tonic::Code::ResourceExhausted && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no health watch after the first ended: {e:?}"),
        }
    }
}

#[test]
fn the_stream_limit_is_announced_in_the_servers_h2_settings() {
    let (_dir, sidecar) = sidecar();
    let mut stream = TcpStream::connect(sidecar.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // The client preface and an empty SETTINGS frame.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    // The server's preface is its SETTINGS frame: 9-byte header, then
    // 6-byte entries (identifier, value).
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).unwrap();
    let [l0, l1, l2, kind, ..] = header;
    assert_eq!(kind, 0x4, "the server's first frame is not SETTINGS");
    let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).unwrap();
    let settings: Vec<(u16, u32)> = payload
        .chunks_exact(6)
        .map(|e| {
            let id = u16::from_be_bytes([e[0], e[1]]);
            let value = u32::from_be_bytes([e[2], e[3], e[4], e[5]]);
            (id, value)
        })
        .collect();
    // SETTINGS_MAX_CONCURRENT_STREAMS is 0x3.
    assert!(settings.contains(&(0x3, 7)), "{settings:?}");
}
