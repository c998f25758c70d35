//! Hot reload against running servers: an edit goes live and changes
//! `policy_version`; a broken edit keeps the last good set, and the error is
//! visible through `PolicyService` and identical to `toolgate check`'s; a
//! fix goes live; thousands of decisions across repeated reloads all
//! succeed; and `SIGHUP` reloads a real `toolgate serve` process, whose
//! metrics endpoint counts each reload by result and shows the live
//! `policy_version`.

use std::future::Future;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::policy_service_client::PolicyServiceClient;
use toolgate::grpc::pb::{self, Decision};
use toolgate::policy::{PolicyEngine, ReloadOutcome};

use crate::sidecar::Sidecar;
use crate::support::{TestServer, copy_of_examples, request, scrape, series};

/// A refund of 25.00: allowed by the examples, approval-required once the
/// approval threshold is lowered to 10.00.
const REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#;

/// The acceptance bound: decisions follow an edit within 2 s.
const FOLLOW_WITHIN: Duration = Duration::from_secs(2);

/// Rewrites the approval threshold of `large-refund-needs-approval`.
fn set_threshold(dir: &Path, cents: u32) {
    let path = dir.join("orders.cedar");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("amount_cents > ").unwrap() + "amount_cents > ".len();
    // The second comparison is the threshold (the first is the order total).
    let start = text[start..]
        .find("amount_cents > ")
        .map(|i| start + i + "amount_cents > ".len())
        .unwrap();
    let end = start + text[start..].find(' ').unwrap();
    let edited = format!("{}{cents}{}", &text[..start], &text[end..]);
    write_atomically(&path, &edited);
}

/// Writes through a temporary file and a rename, as editors and config
/// systems do, so no reload ever reads half a file.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp-edit");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Polls `probe` every 20 ms until it returns `Some`, for at most `within`.
async fn eventually<T, F, Fut>(within: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn refund(channel: &Channel) -> pb::AuthorizeResponse {
    AuthorizationServiceClient::new(channel.clone())
        .authorize(request("refund_order", REFUND))
        .await
        .unwrap()
        .into_inner()
}

async fn status(channel: &Channel) -> pb::GetPolicyStatusResponse {
    PolicyServiceClient::new(channel.clone())
        .get_policy_status(pb::GetPolicyStatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

fn check_output(dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["check", "--policies"])
        .arg(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_goes_live_a_broken_one_is_refused_visibly_and_a_fix_goes_live() {
    let (_tmp, dir) = copy_of_examples();
    let server = TestServer::start_reloading(&dir).await;
    let channel = server.channel().await;

    let first = refund(&channel).await;
    assert_eq!(first.decision(), Decision::Allow);
    let v0 = status(&channel).await;
    assert_eq!(v0.policy_version, first.policy_version);
    assert_eq!(v0.last_reload_error, None);

    // 1. An edit: decisions follow within 2 s, under a new policy_version.
    let edited_at = Instant::now();
    set_threshold(&dir, 1000);
    let followed = eventually(FOLLOW_WITHIN, "decisions follow the edit", || async {
        let r = refund(&channel).await;
        (r.decision() == Decision::ApprovalRequired).then_some(r)
    })
    .await;
    eprintln!("the edit went live after {:?}", edited_at.elapsed());
    assert_ne!(followed.policy_version, v0.policy_version);
    let v1 = status(&channel).await;
    assert_eq!(v1.policy_version, followed.policy_version);
    assert_eq!(
        v1.policy_version,
        PolicyEngine::load(&dir).unwrap().version(),
        "policy_version is the hash of the files as they are now"
    );
    assert!(v1.reloads_succeeded >= 1);

    // 2. A broken edit: refused, visible with file:line, the last good set decides.
    let orders = dir.join("orders.cedar");
    let good = std::fs::read_to_string(&orders).unwrap();
    assert!(good.lines().nth(3).unwrap().starts_with("permit ("));
    write_atomically(&orders, &good.replacen("action ==", "action ===", 1));
    let refused = eventually(FOLLOW_WITHIN, "the reload error is visible", || async {
        status(&channel).await.last_reload_error
    })
    .await;
    let [d] = refused.diagnostics.as_slice() else {
        panic!("one problem expected: {refused:?}");
    };
    assert_eq!(
        (d.file.as_str(), d.line, d.column, d.code.as_str()),
        (orders.to_str().unwrap(), 4, 29, "cedar::parse")
    );
    assert_eq!(d.severity(), pb::DiagnosticSeverity::Error);
    let after = status(&channel).await;
    assert_eq!(after.policy_version, v1.policy_version);
    assert!(after.reloads_failed >= 1);
    let still = refund(&channel).await;
    assert_eq!(still.decision(), Decision::ApprovalRequired);
    assert_eq!(still.policy_version, v1.policy_version);
    // `toolgate check` reports the very same problem, at the same place.
    let (code, out) = check_output(&dir);
    assert_eq!(code, 1, "{out}");
    let same = format!("{}:{}:{}: {}", d.file, d.line, d.column, d.message);
    assert!(out.contains(&same), "`{same}` not in:\n{out}");

    // 3. The fix (with the threshold back at 100.00) goes live and clears the error.
    write_atomically(&orders, &good.replace("> 1000 ", "> 10000 "));
    let fixed = eventually(FOLLOW_WITHIN, "the fix goes live", || async {
        let s = status(&channel).await;
        (s.last_reload_error.is_none() && s.policy_version != v1.policy_version).then_some(s)
    })
    .await;
    assert_eq!(
        fixed.policy_version, v0.policy_version,
        "same files, same version"
    );
    let back = refund(&channel).await;
    assert_eq!(back.decision(), Decision::Allow);
    assert_eq!(back.policy_version, v0.policy_version);
    server.stop().await;
}

/// Grants or withdraws the scope that `search-docs` asks for.
fn set_docs_scope(dir: &Path, scope: &str) {
    let text = format!(
        "@id(\"search-docs\")\npermit (principal, action == Action::\"search_docs\", resource)\nwhen {{ context.scopes.contains(\"{scope}\") }};\n"
    );
    write_atomically(&dir.join("docs.cedar"), &text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_continuous_traffic_fail_no_decision() {
    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 500;

    let (_tmp, dir) = copy_of_examples();
    // The two sets the reloads alternate between, and what each decides
    // for bob's search (he holds `docs:read`, not `docs:admin`).
    set_docs_scope(&dir, "docs:admin");
    let closed = PolicyEngine::load(&dir).unwrap().version().to_owned();
    set_docs_scope(&dir, "docs:read");
    let open = PolicyEngine::load(&dir).unwrap().version().to_owned();
    let server = TestServer::start_reloading(&dir).await;
    let channel = server.channel().await;

    let done = Arc::new(AtomicBool::new(false));
    // Reloads, one every ~200 ms plus the load: every file edit is followed
    // by a direct reload, and the watch reloads on its own as well.
    let reloads = {
        let (reloader, done, dir) = (Arc::clone(&server.policies), Arc::clone(&done), dir.clone());
        tokio::spawn(async move {
            let mut edits = 0u32;
            while !done.load(Ordering::Relaxed) {
                let scope = if edits.is_multiple_of(2) {
                    "docs:admin"
                } else {
                    "docs:read"
                };
                set_docs_scope(&dir, scope);
                edits += 1;
                let r = Arc::clone(&reloader);
                // Swapped, or Unchanged when the watch got there first.
                let outcome = tokio::task::spawn_blocking(move || r.reload())
                    .await
                    .unwrap();
                if let ReloadOutcome::Failed { diagnostics, .. } = outcome {
                    panic!("a valid set was refused: {diagnostics:?}");
                }
                // Leaves the decisions some of the two cores.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            edits
        })
    };

    // The search carries no entities: the decisions stay cheap, so the
    // suite stays fast while thousands of them cross the reloads.
    let mut search = request("search_docs", r#"{"query":"refund policy"}"#);
    search.entities_json.clear();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (channel, search) = (channel.clone(), search.clone());
        let (closed, open) = (closed.clone(), open.clone());
        clients.push(tokio::spawn(async move {
            let mut seen = (0usize, 0usize);
            let mut client = AuthorizationServiceClient::new(channel);
            for i in 0..PER_CLIENT {
                let r = client
                    .authorize(search.clone())
                    .await
                    .unwrap_or_else(|s| panic!("decision {i} failed: {s:?}"))
                    .into_inner();
                // Each decision is the one its own policy set makes.
                if r.policy_version == closed {
                    assert_eq!(
                        (r.decision(), r.error.as_ref().map(|e| e.code.as_str())),
                        (Decision::Deny, Some("forbidden")),
                        "{r:?}"
                    );
                    seen.0 += 1;
                } else if r.policy_version == open {
                    assert_eq!(r.decision(), Decision::Allow, "{r:?}");
                    seen.1 += 1;
                } else {
                    panic!("decided by an unknown set {}", r.policy_version);
                }
            }
            seen
        }));
    }
    let mut seen = (0, 0);
    for c in clients {
        let (s, l) = c.await.unwrap();
        seen = (seen.0 + s, seen.1 + l);
    }
    done.store(true, Ordering::Relaxed);
    let edits = reloads.await.unwrap();
    assert_eq!(seen.0 + seen.1, CLIENTS * PER_CLIENT);
    assert!(
        seen.0 > 0 && seen.1 > 0 && edits >= 4,
        "the traffic must span several reloads: {seen:?} decisions, {edits} edits"
    );
    assert_eq!(server.policies.metrics().failed(), 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_a_running_toolgate_serve() {
    let (tmp, dir) = copy_of_examples();
    // No watch: only SIGHUP can make this server reload.
    std::fs::write(
        tmp.path().join("toolgate.toml"),
        "[reload]\nwatch = false\n",
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .arg("serve")
        .arg("--policies")
        .arg(&dir)
        .args(["--listen", "127.0.0.1:0"])
        .arg("--store")
        .arg(format!(
            "sqlite://{}",
            tmp.path().join("toolgate.db").display()
        ))
        .args(["--metrics-listen", "127.0.0.1:0"])
        .current_dir(tmp.path());
    let mut sidecar = Sidecar::spawn(command);
    let channel = sidecar.channel().await;
    let metrics = sidecar.metrics_addr.expect("the metrics listener");
    let succeeded = r#"toolgate_policy_reloads_total{result="succeeded"}"#;
    let failed = r#"toolgate_policy_reloads_total{result="failed"}"#;
    let live = |v: &str| format!(r#"toolgate_policy_version_info{{policy_version="{v}"}}"#);
    let first = scrape(metrics).await;
    assert_eq!(
        (series(&first, succeeded), series(&first, failed)),
        (0, 0),
        "{first}"
    );

    let before = refund(&channel).await;
    assert_eq!(before.decision(), Decision::Allow);
    set_threshold(&dir, 1000);
    // Without a trigger nothing changes.
    let unchanged = refund(&channel).await;
    assert_eq!(
        (unchanged.decision(), &unchanged.policy_version),
        (Decision::Allow, &before.policy_version)
    );

    sidecar.signal("HUP");
    let after = eventually(Duration::from_secs(10), "SIGHUP reloads", || async {
        let r = refund(&channel).await;
        (r.decision() == Decision::ApprovalRequired).then_some(r)
    })
    .await;
    assert_ne!(after.policy_version, before.policy_version);
    let s = status(&channel).await;
    assert_eq!((s.reloads_succeeded, s.reloads_failed), (1, 0));
    assert_eq!(series(&first, &live(&before.policy_version)), 1, "{first}");
    let reloaded = scrape(metrics).await;
    assert_eq!(
        (series(&reloaded, succeeded), series(&reloaded, failed)),
        (1, 0),
        "{reloaded}"
    );
    assert_eq!(
        series(&reloaded, &live(&after.policy_version)),
        1,
        "{reloaded}"
    );
    assert!(!reloaded.contains(&before.policy_version), "{reloaded}");

    // A broken set on SIGHUP: refused, the process lives on, the set stays.
    std::fs::write(dir.join("docs.cedar"), "permit (").unwrap();
    sidecar.signal("HUP");
    let refused = eventually(
        Duration::from_secs(10),
        "the refusal is visible",
        || async { status(&channel).await.last_reload_error },
    )
    .await;
    assert_eq!(
        refused.diagnostics[0].file,
        dir.join("docs.cedar").to_str().unwrap()
    );
    assert!(sidecar.is_running());
    let kept = refund(&channel).await;
    assert_eq!(
        (kept.decision(), &kept.policy_version),
        (Decision::ApprovalRequired, &after.policy_version)
    );
    let refused = scrape(metrics).await;
    assert_eq!(
        (series(&refused, succeeded), series(&refused, failed)),
        (1, 1),
        "{refused}"
    );
    assert_eq!(
        series(&refused, &live(&after.policy_version)),
        1,
        "{refused}"
    );
    sidecar.kill();
}

/// Reading the folder is not a change: neither an operator's read nor a
/// reload's own reads set off a reload, so one edit is exactly one reload.
/// (A watch that counted reads reloaded forever after the first read.)
#[tokio::test]
async fn reads_never_reload_and_one_edit_reloads_once() {
    let (_tmp, dir) = copy_of_examples();
    let server = TestServer::start_reloading(&dir).await;
    let channel = server.channel().await;
    let counts = |s: pb::GetPolicyStatusResponse| (s.reloads_succeeded, s.reloads_failed);

    // Everything is read, as `toolgate check` or a backup would.
    for entry in walk(&dir) {
        let _ = std::fs::read(entry).unwrap();
    }
    // Nothing can be seen to happen in less than many debounce periods (50 ms).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(counts(status(&channel).await), (0, 0));

    set_threshold(&dir, 1000);
    eventually(FOLLOW_WITHIN, "the edit is reloaded", || async {
        (counts(status(&channel).await) == (1, 0)).then_some(())
    })
    .await;
    // The reload read every file again; that is not another change.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(counts(status(&channel).await), (1, 0));
    server.stop().await;
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
