//! Sessions (DESIGN §13.2) as every backend must keep them: labels and
//! tools joined, each operation counted once, a call added only on the
//! version its decision read, tenants apart, an idle session forgotten;
//! and, across connections, a check of what the session holds that no two
//! concurrent calls both pass on a state neither saw. Run through
//! `store_suite!`.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::suite::{Backend, at_once};
use crate::budgets::{SessionRecord, SessionState};
use crate::store::Store;

const KEY: &str = r#"["tenant","acme","subject","dana","session","s-7"]"#;

fn record(tool: &str, labels: &[&str], seen_version: Option<i64>) -> SessionRecord {
    SessionRecord {
        key: KEY.into(),
        tool: tool.into(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        seen_version,
        idle_ms: 1_000,
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|i| (*i).to_owned()).collect()
}

fn state(
    labels: &[&str],
    tools: &[&str],
    calls: i64,
    version: i64,
    recorded: bool,
) -> SessionState {
    SessionState {
        labels: set(labels),
        tools: set(tools),
        calls,
        version,
        recorded,
    }
}

/// Joined, counted once, a stale record refused, the asking operation
/// left out of what it is shown, tenants apart, forgotten when idle.
pub async fn sessions_join_count_once_and_forget_when_idle(backend: &dyn Backend) {
    let store = &*backend.open().await;
    assert_eq!(
        store.session_state("acme", KEY, "op1", 100).await.unwrap(),
        SessionState::default()
    );
    let secret = record("read_secret", &["read_secret"], None);
    assert!(
        store
            .record_session("acme", "op1", &secret, 100)
            .await
            .unwrap()
    );
    // A retry of op1 is not counted again.
    assert!(
        store
            .record_session("acme", "op1", &secret, 150)
            .await
            .unwrap()
    );
    assert_eq!(
        store.session_state("acme", KEY, "op2", 200).await.unwrap(),
        state(&["read_secret"], &["read_secret"], 1, 1, false)
    );
    // op1 is told its session without itself.
    assert_eq!(
        store.session_state("acme", KEY, "op1", 200).await.unwrap(),
        state(&[], &[], 0, 1, true)
    );
    // A record on a version that moved writes nothing.
    let email = record("send_email", &[], Some(0));
    assert!(
        !store
            .record_session("acme", "op2", &email, 200)
            .await
            .unwrap()
    );
    assert_eq!(
        store.session_state("acme", KEY, "op9", 200).await.unwrap(),
        state(&["read_secret"], &["read_secret"], 1, 1, false)
    );
    let email = record("send_email", &[], Some(1));
    assert!(
        store
            .record_session("acme", "op2", &email, 300)
            .await
            .unwrap()
    );
    let fetch = record("fetch", &["untrusted_content", "read_secret"], Some(2));
    assert!(
        store
            .record_session("acme", "op3", &fetch, 400)
            .await
            .unwrap()
    );
    assert_eq!(
        store.session_state("acme", KEY, "op9", 400).await.unwrap(),
        state(
            &["read_secret", "untrusted_content"],
            &["fetch", "read_secret", "send_email"],
            3,
            3,
            false
        )
    );
    // op1 again: the others' labels, not its own (read_secret is op3's too).
    assert_eq!(
        store.session_state("acme", KEY, "op1", 400).await.unwrap(),
        state(
            &["read_secret", "untrusted_content"],
            &["fetch", "send_email"],
            2,
            3,
            true
        )
    );
    // Another tenant's session of the same key is another session.
    assert_eq!(
        store
            .session_state("globex", KEY, "op9", 400)
            .await
            .unwrap(),
        SessionState::default()
    );
    // Idle for 1,000 ms after its last call (at 400): forgotten, its
    // version kept, so a decision that read it before still sees it moved.
    assert_eq!(
        store
            .session_state("acme", KEY, "op9", 1_399)
            .await
            .unwrap(),
        state(
            &["read_secret", "untrusted_content"],
            &["fetch", "read_secret", "send_email"],
            3,
            3,
            false
        )
    );
    assert_eq!(
        store
            .session_state("acme", KEY, "op9", 1_400)
            .await
            .unwrap(),
        state(&[], &[], 0, 3, false)
    );
    // The next call starts it again, alone; op1 is no longer one of it.
    let search = record("search_docs", &[], Some(3));
    assert!(
        store
            .record_session("acme", "op4", &search, 1_500)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .session_state("acme", KEY, "op1", 1_500)
            .await
            .unwrap(),
        state(&[], &["search_docs"], 1, 4, false)
    );
}

/// 32 calls over two connections, each allowed only while the session
/// holds fewer than 5 calls, each added on the version it read: exactly 5
/// are added, never a sixth on a state that had 5.
pub async fn concurrent_session_checks_never_pass_on_a_state_they_did_not_see(
    backend: &dyn Backend,
) {
    let stores = [backend.open().await, backend.open().await];
    let added = at_once(&stores, 32, |store: Arc<dyn Store>, i| async move {
        let op = format!("op{i}");
        for _ in 0..200 {
            let seen = store.session_state("acme", KEY, &op, 500).await.unwrap();
            if seen.calls >= 5 {
                return false;
            }
            let call = SessionRecord {
                seen_version: Some(seen.version),
                ..record("send_email", &["sent"], None)
            };
            if store.record_session("acme", &op, &call, 500).await.unwrap() {
                return true;
            }
        }
        panic!("{op} never got a stable read in 200 rounds");
    })
    .await;
    assert_eq!(added.iter().filter(|a| **a).count(), 5);
    assert_eq!(
        stores[0]
            .session_state("acme", KEY, "none", 500)
            .await
            .unwrap(),
        state(&["sent"], &["send_email"], 5, 5, false)
    );
}
