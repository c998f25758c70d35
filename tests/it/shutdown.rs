//! How it stops: the real `toolgate serve` under load from several
//! concurrent executors gets SIGTERM. Health turns NOT_SERVING at once; after
//! the drain no new call is accepted; every call the server decided was
//! answered (each decision's audit line has its response at a client, and
//! the other way round); the audit log is complete; the exit status is 0.

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;

use crate::sidecar::Sidecar;
use crate::support::request;

const CLIENTS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_no_call_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("toolgate.toml");
    std::fs::write(
        &config,
        format!(
            "[audit]\nsink = {:?}\n[shutdown]\ndrain_ms = 300\ngrace_ms = 5000\n",
            format!("file:{}", audit.display()),
        ),
    )
    .unwrap();
    let mut sidecar = Sidecar::start(
        dir.path(),
        &[OsString::from("--config"), config.into_os_string()],
    );
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", sidecar.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));

    // Executors, each on its own connection, calling back to back until the
    // server stops answering.
    let answered = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let channel = endpoint.connect().await.unwrap();
        let answered = Arc::clone(&answered);
        clients.push(tokio::spawn(async move {
            let mut client = AuthorizationServiceClient::new(channel);
            for i in 0..20_000 {
                let mut r = request(
                    "refund_order",
                    r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#,
                );
                r.request_id = format!("c{c}-{i}");
                match client.authorize(r).await {
                    Ok(_) => {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(status) => return status,
                }
            }
            panic!("client {c} was never refused: the server did not stop");
        }));
    }
    let mut health = HealthClient::new(endpoint.connect().await.unwrap());
    let started = Instant::now();
    while answered.load(Ordering::SeqCst) < 100 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no load reached the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    sidecar.signal("TERM");
    // NOT_SERVING at once, while calls are still accepted (the drain).
    let mut not_serving = false;
    for _ in 0..100 {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|r| r.into_inner().status());
        if status
            .as_ref()
            .is_ok_and(|s| *s == ServingStatus::NotServing)
        {
            not_serving = true;
            break;
        }
        assert_eq!(
            status.as_ref().ok(),
            Some(&ServingStatus::Serving),
            "{status:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        not_serving,
        "health never said NOT_SERVING during the drain"
    );

    let exited = tokio::task::spawn_blocking(move || sidecar.wait_exit(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(exited.success(), "exit status {exited:?}");

    for client in clients {
        let refusal = client.await.unwrap();
        // Refused before it was accepted: the connection was going or gone.
        assert!(
            matches!(
                refusal.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled
            ),
            "{refusal:?}"
        );
    }
    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(text.ends_with('\n'), "the last audit line is complete");
    let decisions = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter(|e| e["event"] == "decision")
        .count();
    assert_eq!(
        decisions,
        answered.load(Ordering::SeqCst),
        "every decision made was answered, and every answer audited"
    );
}
