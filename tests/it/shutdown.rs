//! How it stops: the real `toolgate serve` under load from several
//! concurrent executors, and a load balancer watching health, gets SIGTERM.
//! Health turns NOT_SERVING at once — for the watcher too, whose stream then
//! ends with UNAVAILABLE instead of holding the shutdown until the grace
//! period (a minute here) runs out; the metrics endpoint still serves during
//! the drain and shows `toolgate_shutting_down 1`; after the drain no new
//! call is accepted; every call the server decided was answered (each
//! decision's audit line has its response at a client, and the other way
//! round); the audit log is complete; the exit status is 0.

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;

use crate::sidecar::Sidecar;
use crate::support::{request, scrape, series};

const CLIENTS: usize = 6;

type Watch = tonic::Streaming<tonic_health::pb::HealthCheckResponse>;

/// The watch's next message, within 10 s.
async fn next(
    watch: &mut Watch,
) -> Result<Option<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("the health watch said nothing for 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_no_call_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("toolgate.toml");
    std::fs::write(
        &config,
        format!(
            "metrics_listen = \"127.0.0.1:0\"\n[audit]\nsink = {:?}\n\
             [shutdown]\ndrain_ms = 500\ngrace_ms = 60000\n",
            format!("file:{}", audit.display()),
        ),
    )
    .unwrap();
    // Executors refund back to back: more than the example's 500.00 a day.
    let (_policies, policies) =
        crate::support::examples_with_refund_budget(crate::support::GENEROUS);
    let mut sidecar = Sidecar::start_with_policies(
        dir.path(),
        &policies,
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
    // A load balancer's watch, on its own connection.
    let mut watch = HealthClient::new(endpoint.connect().await.unwrap())
        .watch(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = next(&mut watch).await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
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
    // The shutdown is visible in the metrics while it runs.
    let during = scrape(sidecar.metrics_addr.expect("the metrics listener")).await;
    assert_eq!(series(&during, "toolgate_shutting_down"), 1, "{during}");
    let allowed = r#"toolgate_decisions_total{tool="refund_order",decision="allow",code=""}"#;
    assert!(series(&during, allowed) >= 100, "{during}");
    // The watcher hears NOT_SERVING, then the stream ends: it does not hold
    // the shutdown.
    let changed = next(&mut watch).await.unwrap().unwrap();
    assert_eq!(changed.status(), ServingStatus::NotServing);
    let ended = next(&mut watch).await.unwrap_err();
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    let after = next(&mut watch).await;
    assert!(matches!(after, Ok(None)), "{after:?}");

    // Well within the minute of grace: nothing held the shutdown.
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
