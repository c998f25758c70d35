//! The SQLite backend's own tests, and the store suite on it.

use std::sync::Arc;

use super::executions::transition;
use super::schema::MIGRATIONS;
use super::*;
use crate::store::EXECUTION_COLUMNS;
use crate::store::suite::{self, Backend, new_approval};

/// A fresh SQLite file; every store opened on it is another connection.
struct File(tempfile::TempDir);

#[async_trait]
impl Backend for File {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(SqliteStore::open(&self.0.path().join("s.db")).unwrap())
    }
}

async fn file() -> Option<File> {
    Some(File(tempfile::tempdir().unwrap()))
}

mod suite_on_sqlite {
    crate::store::suite::store_suite!(super::file);
}

fn store(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(&dir.path().join("s.db")).unwrap()
}

#[tokio::test]
async fn records_survive_a_reopen_of_the_file() {
    let backend = file().await.unwrap();
    suite::transitions_round_trip(&backend).await;
    let again = store(&backend.0);
    let r = again.get_execution("acme", "k1").await.unwrap().unwrap();
    assert_eq!(r.state, crate::ledger::ExecutionState::Succeeded);
}

#[tokio::test]
async fn an_update_of_a_changed_record_is_a_conflict_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let (stale, first) = suite::stale_target(&store).await;
    let err = store
        .with(move |conn| transition(conn, &stale))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { expected: 98 }),
        "{err}"
    );
    let r = store.get_execution("acme", "k").await.unwrap().unwrap();
    assert_eq!((r.revision, r.fencing_token), (1, first));
}

#[tokio::test]
async fn the_schema_refuses_an_unknown_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let conn = store.conn.lock().unwrap();
    let err = conn
        .execute(
            "INSERT INTO executions (tenant_id, idempotency_key, tool, arguments_sha256, state, attempt, \
             max_attempts, fencing_token, lease_expires_at, created_at, updated_at, revision) \
             VALUES ('t', 'k', 'x', 'aa', 'DONE', 1, 1, 1, 0, 0, 0, 1)",
            [],
        )
        .unwrap_err();
    assert!(err.to_string().contains("CHECK constraint failed"), "{err}");
}

#[tokio::test]
async fn a_version_1_file_is_migrated_and_keeps_its_approvals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            &format!("INSERT INTO approvals ({}) VALUES ('a1', 't1', 'alice', 'agent', \
             'refund_order', '1', 'financial', 'ab', '{{}}', 'r1', 'PENDING', 0, 1000, NULL, NULL, NULL, NULL)", APPROVAL_COLUMNS.trim_end_matches(", why")),
            [],
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let version: i64 = store
        .conn
        .lock()
        .unwrap()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 9);
    assert_eq!(
        store
            .get_approval("t1", "a1")
            .await
            .unwrap()
            .unwrap()
            .status,
        ApprovalStatus::Pending
    );
    assert_eq!(store.get_execution("t1", "k").await.unwrap(), None);
}

#[tokio::test]
async fn reopening_keeps_the_data_and_refuses_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/s.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        store
            .pending_approval_for_call(new_approval("a1", 0), 0)
            .await
            .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert!(store.get_approval("t1", "a1").await.unwrap().is_some());
    drop(store);
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    assert!(matches!(
        SqliteStore::open(&path),
        Err(StoreError::SchemaTooNew {
            found: 99,
            known: 9
        })
    ));
}

pub(super) fn begin_of(key: &str) -> ledger::Begin {
    ledger::Begin {
        id: ledger::ExecutionId {
            tenant_id: "acme".into(),
            idempotency_key: key.into(),
        },
        tool: "refund_order".into(),
        arguments_sha256: "aa".into(),
        lease_ms: 60_000,
        max_attempts: 3,
        now: 1_000,
    }
}

/// Holds the store's connection on another thread until told to let go,
/// so that transitions queue up behind it.
fn hold_connection(
    store: &SqliteStore,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held, is_held) = std::sync::mpsc::channel::<()>();
    let conn = Arc::clone(&store.conn);
    let holder = std::thread::spawn(move || {
        let _guard = conn.lock().unwrap();
        held.send(()).unwrap();
        // Bounded: a test that fails never leaves the connection held.
        let _ = released.recv_timeout(std::time::Duration::from_secs(20));
    });
    is_held
        .recv_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    (release, holder)
}

async fn until_queued(store: &SqliteStore, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.ledger.waiting() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {n} transitions queued",
            store.ledger.waiting()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_transitions_are_one_commit_in_their_serial_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let (release, holder) = hold_connection(&store);
    let mut calls = Vec::new();
    for i in 0..30 {
        let store = store.clone();
        calls.push(tokio::spawn(async move {
            store.begin_execution(begin_of(&format!("k{i}"))).await
        }));
    }
    // Two executors racing for one key inside the same batch.
    for _ in 0..2 {
        let store = store.clone();
        calls.push(tokio::spawn(async move {
            store.begin_execution(begin_of("dup")).await
        }));
    }
    until_queued(&store, 32).await;
    assert_eq!(
        store
            .ledger
            .commits
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    release.send(()).unwrap();
    holder.join().unwrap();
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await.unwrap().unwrap().outcome);
    }
    assert_eq!(
        store
            .ledger
            .commits
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(
        outcomes[..30]
            .iter()
            .all(|o| *o == ledger::BeginOutcome::Acquired)
    );
    let mut dup = outcomes[30..].to_vec();
    dup.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(
        dup,
        [
            ledger::BeginOutcome::Acquired,
            ledger::BeginOutcome::InProgress
        ]
    );
    // Committed: another connection to the file reads every record.
    let other = SqliteStore::open(&dir.path().join("s.db")).unwrap();
    for i in 0..30 {
        let r = other
            .get_execution("acme", &format!("k{i}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.state, r.attempt),
            (ledger::ExecutionState::InProgress, 1)
        );
    }
    let r = other.get_execution("acme", "dup").await.unwrap().unwrap();
    assert_eq!((r.attempt, r.revision), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_transition_rolls_back_alone_and_the_rest_of_its_batch_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    // A record whose stored error is not JSON: reading it is an error.
    store
        .with(|conn| {
            conn.execute(
                &format!(
                    "INSERT INTO executions ({EXECUTION_COLUMNS}) VALUES \
                     ('acme', 'bad', 'refund_order', 'aa', 'FAILED_FINAL', 1, 3, 7, 0, NULL, \
                     'not json', 0, 0, 1)"
                ),
                [],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let (release, holder) = hold_connection(&store);
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.begin_execution(begin_of("before")).await })
    };
    until_queued(&store, 1).await;
    let bad = {
        let store = store.clone();
        tokio::spawn(async move { store.begin_execution(begin_of("bad")).await })
    };
    until_queued(&store, 2).await;
    let last = {
        let store = store.clone();
        tokio::spawn(async move { store.begin_execution(begin_of("after")).await })
    };
    until_queued(&store, 3).await;
    release.send(()).unwrap();
    holder.join().unwrap();
    let bad = bad.await.unwrap().unwrap_err();
    assert!(matches!(bad, StoreError::Corrupt(_)), "{bad}");
    for (call, key) in [(first, "before"), (last, "after")] {
        let answer = call.await.unwrap().unwrap();
        assert_eq!(answer.outcome, ledger::BeginOutcome::Acquired, "{key}");
        let r = store.get_execution("acme", key).await.unwrap().unwrap();
        assert_eq!(r.fencing_token, answer.fencing_token, "{key}");
    }
    assert_eq!(
        store
            .ledger
            .commits
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // The corrupt record is as it was.
    let text: String = store
        .with(|conn| {
            Ok(conn.query_row(
                "SELECT error_json FROM executions WHERE idempotency_key = 'bad'",
                [],
                |row| row.get(0),
            )?)
        })
        .await
        .unwrap();
    assert_eq!(text, "not json");
}
