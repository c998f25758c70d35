//! The PostgreSQL backend against the test server: the store suite, migrations
//! across replicas, row-rights-only roles, timeouts, conflicts and the relay.

use super::*;
use crate::ledger::{Begin, ExecutionId};
use crate::store::scratch::{self, ScratchSchema};
use crate::store::suite::{self, Backend, new_approval};

/// A fresh schema of the test server; every store opened on it is
/// another replica's pool.
struct Schema(ScratchSchema);

#[async_trait]
impl Backend for Schema {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(connect(self.0.url()).await)
    }
}

async fn connect(url: &str) -> PostgresStore {
    PostgresStore::connect(url, StoreSettings::default())
        .await
        .unwrap()
}

/// A fresh schema; when no server answers, a failed test, or `None`
/// (the skip recorded) where skips are allowed: `conformance::skip_or_fail`.
async fn schema() -> Option<Schema> {
    match ScratchSchema::create(&scratch::test_url()).await {
        Ok(s) => Some(Schema(s)),
        Err(e) => {
            crate::prerequisites::skip_or_fail(
                &format!(
                    "no PostgreSQL test server at {} (default `{}`): {e}",
                    scratch::TEST_URL_VAR,
                    scratch::DEFAULT_TEST_URL
                ),
                "start it, or set TOOLGATE_TEST_POSTGRES to a server where this user \
                 may create schemas and roles",
            );
            None
        }
    }
}

mod suite_on_postgres {
    crate::store::suite::store_suite!(super::schema);
}

async fn version(schema: &Schema) -> i64 {
    let admin = schema.0.admin().await.unwrap();
    admin
        .query_one(
            &format!("SELECT version FROM {}.schema_version", schema.0.name()),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_together_migrate_once_and_a_newer_schema_is_refused() {
    let Some(schema) = schema().await else { return };
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let url = schema.0.url().to_owned();
            tokio::spawn(
                async move { PostgresStore::connect(&url, StoreSettings::default()).await },
            )
        })
        .collect();
    for s in starts {
        s.await.unwrap().unwrap();
    }
    assert_eq!(version(&schema).await, 8);
    // Data written, then a restart: kept, not migrated again.
    let store = connect(schema.0.url()).await;
    store
        .pending_approval_for_call(new_approval("a1", 0), 0)
        .await
        .unwrap();
    let again = connect(schema.0.url()).await;
    assert!(again.get_approval("t1", "a1").await.unwrap().is_some());
    let admin = schema.0.admin().await.unwrap();
    admin
        .execute(
            &format!("UPDATE {}.schema_version SET version = 99", schema.0.name()),
            &[],
        )
        .await
        .unwrap();
    let err = PostgresStore::connect(schema.0.url(), StoreSettings::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SchemaTooNew {
                found: 99,
                known: 8
            }
        ),
        "{err}"
    );
}

/// The split docs/deployment.md describes: a role that owns the schema migrates it, the
/// fleet runs as a role with row rights only, and serves.
#[tokio::test]
async fn a_role_with_row_rights_only_serves_a_schema_another_role_migrated() {
    if schema().await.is_none() {
        return;
    }
    let mut owned = ScratchSchema::create_with_role(&scratch::test_url())
        .await
        .unwrap();
    let owner = connect(owned.url()).await;
    drop(owner);
    let app_url = owned.create_app_role().await.unwrap();
    let app = connect(&app_url).await;
    let events = Arc::new(ApprovalEvents::default());
    let relay = app.relay_approval_events(events).await.unwrap().unwrap();
    let (approval, created) = app
        .pending_approval_for_call(new_approval("a1", 0), 0)
        .await
        .unwrap();
    assert!(created);
    assert_eq!(approval.status, ApprovalStatus::Pending);
    let begun = app
        .begin_execution(Begin {
            id: ExecutionId {
                tenant_id: "acme".into(),
                idempotency_key: "k".into(),
            },
            tool: "t".into(),
            arguments_sha256: "aa".into(),
            lease_ms: 10,
            max_attempts: 1,
            now: 0,
        })
        .await
        .unwrap();
    assert_eq!(begun.outcome, crate::ledger::BeginOutcome::Acquired);
    // And it may not change the schema.
    let admin = owned.admin().await.unwrap();
    let can_create: bool = admin
        .query_one(
            "SELECT has_schema_privilege($1, $2, 'CREATE')",
            &[&format!("{}_app", owned.name()), &owned.name()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!can_create);
    // The relay's session is the app role's, not the owner's.
    let sessions: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
            &[&format!("{}_app", owned.name())],
        )
        .await
        .unwrap()
        .get(0);
    assert!(sessions >= 1);
    relay.abort();
}

#[tokio::test]
async fn urls_asking_for_verified_tls_without_a_ca_or_not_parsing_are_refused_without_echoing_them()
{
    for url in [
        "postgres://u:secret@127.0.0.1/db?sslmode=verify-full",
        "postgres://u:secret@127.0.0.1/db?sslmode=nonsense",
    ] {
        let err = PostgresStore::connect(url, StoreSettings::default())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::PostgresUrl(_)), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
    let err = PostgresStore::connect(
        "postgres://postgres@127.0.0.1/db?options=-csearch_path%3Dno_such_schema_here",
        StoreSettings::default(),
    )
    .await;
    // Refused either way: no schema to migrate into, or no server.
    assert!(err.is_err());
}

fn short() -> StoreSettings {
    StoreSettings {
        connect_timeout: Duration::from_millis(300),
        statement_timeout: Duration::from_millis(500),
        ..StoreSettings::default()
    }
}

#[tokio::test]
async fn a_server_that_never_answers_fails_within_the_connect_timeout() {
    // Accepts the TCP connection, then says nothing: the login hangs.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let started = std::time::Instant::now();
    let err = PostgresStore::connect(
        &format!("postgres://postgres@127.0.0.1:{port}/test"),
        short(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Postgres(_) | StoreError::Pool(_) | StoreError::Timeout { .. }
        ),
        "{err}"
    );
    assert!(
        started.elapsed() < short().call_bound() * 2,
        "{:?}",
        started.elapsed()
    );
    held.abort();
}

#[tokio::test]
async fn a_transaction_stuck_on_a_lock_ends_at_the_statement_timeout() {
    let Some(schema) = schema().await else { return };
    let store = PostgresStore::connect(schema.0.url(), short())
        .await
        .unwrap();
    let mut admin = schema.0.admin().await.unwrap();
    let blocker = admin.transaction().await.unwrap();
    blocker
        .batch_execute(&format!(
            "LOCK TABLE {0}.executions, {0}.approvals IN ACCESS EXCLUSIVE MODE",
            schema.0.name()
        ))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let err = store
        .begin_execution(Begin {
            id: ExecutionId {
                tenant_id: "acme".into(),
                idempotency_key: "k".into(),
            },
            tool: "t".into(),
            arguments_sha256: "aa".into(),
            lease_ms: 10,
            max_attempts: 1,
            now: 0,
        })
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&err, StoreError::Postgres(e) if e.code() == Some(&SqlState::QUERY_CANCELED)),
        "{err}"
    );
    assert!(
        took >= Duration::from_millis(450) && took < short().call_bound() * 2,
        "{took:?}"
    );
    let err = store.get_approval("t1", "a1").await.unwrap_err();
    assert!(matches!(err, StoreError::Postgres(_)), "{err}");
    blocker.rollback().await.unwrap();
    // Served again once the lock is gone. The store's own bound is short
    // (800 ms with the pool's wait), so a loaded machine may time a first
    // read out: the store must recover within a few seconds, not at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let read = loop {
        match store.get_approval("t1", "a1").await {
            Ok(found) => break found,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("not served yet after the lock: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("still not served 10 s after the lock was released: {e}"),
        }
    };
    assert_eq!(read, None);
}

#[tokio::test]
async fn an_update_of_a_changed_record_is_a_conflict_and_writes_nothing() {
    let Some(schema) = schema().await else { return };
    let store = connect(schema.0.url()).await;
    let (stale, first) = suite::stale_target(&store).await;
    let err = store
        .run(|client| transition(client, &stale))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { expected: 98 }),
        "{err}"
    );
    let r = store.get_execution("acme", "k").await.unwrap().unwrap();
    assert_eq!((r.revision, r.fencing_token), (1, first));
    let admin = schema.0.admin().await.unwrap();
    let err = admin
        .execute(
            &format!(
                "INSERT INTO {}.executions (tenant_id, idempotency_key, tool, arguments_sha256, state, \
                 attempt, max_attempts, fencing_token, lease_expires_at, created_at, updated_at, revision) \
                 VALUES ('t', 'k', 'x', 'aa', 'DONE', 1, 1, 1, 0, 0, 0, 1)",
                schema.0.name()
            ),
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::CHECK_VIOLATION), "{err}");
}

#[tokio::test]
async fn another_replicas_events_are_relayed_and_its_own_are_not() {
    let Some(schema) = schema().await else { return };
    let here = connect(schema.0.url()).await;
    let there = connect(schema.0.url()).await;
    let events = Arc::new(ApprovalEvents::default());
    let mut seen = events.subscribe();
    let relay = here
        .relay_approval_events(Arc::clone(&events))
        .await
        .unwrap()
        .unwrap();
    // Ours: published by the desk that caused it, never relayed.
    here.pending_approval_for_call(new_approval("mine", 0), 0)
        .await
        .unwrap();
    let mut theirs = new_approval("theirs", 0);
    theirs.request_id = "r2".into();
    there.pending_approval_for_call(theirs, 0).await.unwrap();
    there
        .decide_approval(
            "t1",
            "theirs",
            ApprovalDecision {
                approve: true,
                decided_by: "dana".into(),
                reason: "ok".into(),
                decided_at: 1,
                approved_expires_at: 500,
            },
        )
        .await
        .unwrap();
    there
        .consume_approval("t1", "theirs", "k1", 2)
        .await
        .unwrap();
    there.expire_due(100_000).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        let e = tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await
            .unwrap()
            .unwrap();
        got.push((e.kind, e.approval.approval_id.clone()));
    }
    let theirs = |k| (k, "theirs".to_owned());
    assert_eq!(
        got,
        vec![
            theirs(ApprovalEventKind::Created),
            theirs(ApprovalEventKind::Decided),
            theirs(ApprovalEventKind::Consumed),
            (ApprovalEventKind::Expired, "mine".to_owned()),
        ]
    );
    relay.abort();
}

#[tokio::test]
async fn a_burst_past_the_relays_queue_is_dropped_and_announced_as_a_gap() {
    let Some(schema) = schema().await else { return };
    let here = connect(schema.0.url()).await;
    let events = Arc::new(ApprovalEvents::default());
    let mut gaps = events.gaps();
    let first = here.listen(4).await.unwrap();
    let relay = here.relay(Arc::clone(&events), first, 4);
    // Another replica's burst: 200 notifications in one commit, each of
    // which the relay reads back from the database one at a time.
    let admin = schema.0.admin().await.unwrap();
    admin
        .execute(
            &format!(
                "SELECT pg_notify('{CHANNEL}', 'created elsewhere ' || g) FROM generate_series(1, 200) g"
            ),
            &[],
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), gaps.changed())
        .await
        .unwrap()
        .unwrap();
    relay.abort();
}

#[tokio::test]
async fn a_lost_relay_connection_is_announced_as_a_gap_and_the_relay_comes_back() {
    let Some(schema) = schema().await else { return };
    let here = connect(schema.0.url()).await;
    let there = connect(schema.0.url()).await;
    let events = Arc::new(ApprovalEvents::default());
    let mut gaps = events.gaps();
    let mut seen = events.subscribe();
    let relay = here
        .relay_approval_events(Arc::clone(&events))
        .await
        .unwrap()
        .unwrap();
    let admin = schema.0.admin().await.unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1 AND query LIKE 'LISTEN%'",
            &[&schema.0.name()],
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), gaps.changed())
        .await
        .unwrap()
        .unwrap();
    // Listening again, it announces the gap once more, then relays.
    tokio::time::timeout(Duration::from_secs(10), gaps.changed())
        .await
        .unwrap()
        .unwrap();
    there
        .pending_approval_for_call(new_approval("after", 0), 0)
        .await
        .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), seen.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (e.kind, e.approval.approval_id.as_str()),
        (ApprovalEventKind::Created, "after")
    );
    relay.abort();
}
