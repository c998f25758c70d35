//! The PostgreSQL backend: one database shared by many sidecar replicas.
//!
//! Every call takes a connection from a bounded pool (`deadpool-postgres`
//! over `tokio-postgres`, no TLS: plain TCP or a Unix socket) and runs one
//! transaction. Correctness across processes comes from the database, never
//! from a lock in this process:
//!
//! - a ledger transition reads its record with `SELECT … FOR UPDATE`, so no
//!   other transition on that record interleaves; an insert that races
//!   another insert of the same key (`INSERT … ON CONFLICT DO NOTHING`
//!   writes nothing) runs the whole transaction again and then sees the
//!   winner's row. Fencing tokens come from a SEQUENCE read after the row
//!   lock: strictly increasing for every acquisition of a key, and never
//!   reused across the whole database;
//! - approvals change by conditional `UPDATE … WHERE status = …`: one
//!   PENDING per call (a partial unique index), the first decision wins,
//!   consumed once; an expiry sweep locks with `SKIP LOCKED` and its
//!   `UPDATE … RETURNING` decides which replica announces an expiry;
//! - serialization failures and deadlocks (SQLSTATE 40001, 40P01) roll the
//!   transaction back whole, so it is run again, a bounded number of times
//!   with a short jittered backoff. Nothing else is retried: a connection
//!   lost around a COMMIT may or may not have committed.
//!
//! Every change to an approval sends a `NOTIFY` in its own transaction
//! (delivered only if it commits) naming the kind, this store's origin id
//! and the approval id. [`Store::relay_approval_events`] LISTENs on a
//! dedicated connection and publishes the other replicas' events into this
//! process's hub; a lost connection is a gap, announced, never silent.
//!
//! Outages: a call never waits longer than `connect_timeout` for a
//! connection plus `statement_timeout` for its transaction (set on the
//! server as well, so a lock wait ends there too), then fails with a
//! [`StoreError`] the desks turn into a retryable `internal_error`.
//!
//! Migrations run at start in one transaction under an advisory lock (two
//! replicas starting together do not race), recorded in `schema_version`;
//! a schema newer than this binary knows is refused.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
};
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, NoTls, Row};

use super::{
    APPROVAL_COLUMNS, ApprovalDecision, ApprovalUse, DecideOutcome, EXECUTION_COLUMNS, Store,
    StoreError, StoreSettings, error_to_json, signed, stored_error, stored_risk, stored_state,
    stored_status, stored_unsigned,
};
use crate::approvals::{
    ApprovalEventKind, ApprovalEvents, ApprovalRecord, ApprovalStatus, NewApproval,
};
use crate::clock::UnixMillis;
use crate::ledger::{self, BeginAnswer, Collect, ExecutionRecord, Settled, Transition, Write};

/// Versioned migrations; index + 1 is the schema version they produce.
/// Text keys that are ordered (approval ids, for pagination) use the "C"
/// collation: byte order, as in SQLite, whatever the database's locale.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE approvals (
    approval_id TEXT COLLATE "C" PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    requester_subject_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    risk TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    display_arguments TEXT NOT NULL,
    request_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('PENDING', 'APPROVED', 'REJECTED', 'EXPIRED')),
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    decided_by TEXT,
    decided_at BIGINT,
    reason TEXT,
    consumed_by_idempotency_key TEXT
);
CREATE UNIQUE INDEX approvals_one_pending_per_call
    ON approvals (tenant_id, requester_subject_id, tool, arguments_sha256, request_id)
    WHERE status = 'PENDING';
CREATE INDEX approvals_by_tenant ON approvals (tenant_id, approval_id);
CREATE INDEX approvals_due ON approvals (expires_at)
    WHERE status = 'PENDING' OR (status = 'APPROVED' AND consumed_by_idempotency_key IS NULL);
CREATE TABLE executions (
    tenant_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('IN_PROGRESS', 'SUCCEEDED', 'FAILED_RETRYABLE', 'UNKNOWN', 'FAILED_FINAL')),
    attempt BIGINT NOT NULL CHECK (attempt >= 1),
    max_attempts BIGINT NOT NULL CHECK (max_attempts >= 1),
    fencing_token BIGINT NOT NULL CHECK (fencing_token >= 1),
    lease_expires_at BIGINT NOT NULL,
    result_json TEXT,
    error_json TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    revision BIGINT NOT NULL CHECK (revision >= 1),
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE INDEX executions_by_updated_at ON executions (updated_at);
CREATE SEQUENCE ledger_fencing AS BIGINT MINVALUE 1 START 1 NO CYCLE;
"#];

/// The `NOTIFY` channel of approval events.
const CHANNEL: &str = "toolgate_approvals";
/// The advisory lock's first key ("tg" + 1); the second is the schema's hash.
const MIGRATION_LOCK: i32 = 0x7467_0001;
/// How many times a transaction that lost a race is run in all.
const MAX_TRIES: u32 = 8;
/// The longest wait before reconnecting the event relay.
const MAX_RELAY_BACKOFF: Duration = Duration::from_secs(5);

/// PostgreSQL behind a connection pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// How to open the relay's own connection.
    config: tokio_postgres::Config,
    settings: StoreSettings,
    /// Names this store in the events it sends, so its own relay skips them.
    origin: Arc<str>,
}

impl fmt::Debug for PostgresStore {
    // The connection settings may hold a password: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("origin", &self.origin)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Why one run of a transaction did not answer.
enum Failure {
    Db(tokio_postgres::Error),
    /// It lost a race that the database resolved (an insert beside a
    /// concurrent one): run it again.
    Retry,
    Store(StoreError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl PostgresStore {
    /// Connects to the database a `postgres://` URL names and brings its
    /// schema up to date. `settings` bound every wait.
    ///
    /// # Errors
    /// [`StoreError`] for an invalid URL (or one asking for TLS), a
    /// database that cannot be reached in time, a failed migration, or a
    /// schema newer than this binary knows.
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self, StoreError> {
        let config = connection_config(url, &settings)?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size.max(1))
            .wait_timeout(Some(settings.connect_timeout))
            .create_timeout(Some(settings.connect_timeout))
            .recycle_timeout(Some(settings.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Pool(e.to_string()))?;
        let store = Self {
            pool,
            config,
            settings,
            origin: uuid::Uuid::new_v4().simple().to_string().into(),
        };
        store.run(migrate).await?;
        Ok(store)
    }

    /// Runs `attempt` on a pooled connection, again when it lost a race or
    /// hit a serialization failure or deadlock (each rolled back whole),
    /// at most [`MAX_TRIES`] times; the whole call bounded by
    /// [`StoreSettings::call_bound`].
    async fn run<T, F, Fut>(&self, mut attempt: F) -> Result<T, StoreError>
    where
        F: FnMut(Object) -> Fut + Send,
        Fut: Future<Output = Result<T, Failure>> + Send,
    {
        let work = async {
            let mut tries = 0;
            loop {
                tries += 1;
                let client = self.pool.get().await.map_err(pool_error)?;
                let again = match attempt(client).await {
                    Ok(v) => return Ok(v),
                    Err(Failure::Retry) => StoreError::Contended { tries },
                    Err(Failure::Db(e)) if is_transient(&e) => StoreError::Postgres(e),
                    Err(Failure::Db(e)) => return Err(StoreError::Postgres(e)),
                    Err(Failure::Store(e)) => return Err(e),
                };
                if tries >= MAX_TRIES {
                    return Err(match again {
                        StoreError::Postgres(_) => StoreError::Contended { tries },
                        other => other,
                    });
                }
                tokio::time::sleep(backoff(tries)).await;
            }
        };
        let bound = self.settings.call_bound();
        tokio::time::timeout(bound, work)
            .await
            .map_err(|_| StoreError::Timeout {
                ms: bound.as_millis(),
            })?
    }

    /// The approval with this id, whatever its tenant: for the relay, which
    /// publishes it to the watchers of its own tenant only.
    async fn approval_by_id(
        &self,
        approval_id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        self.run(|client| async move {
            let sql = format!("SELECT {APPROVAL_COLUMNS} FROM approvals WHERE approval_id = $1");
            let stmt = client.prepare_cached(&sql).await?;
            let row = client.query_opt(&stmt, &[&approval_id]).await?;
            Ok(row.as_ref().map(approval_from_row).transpose()?)
        })
        .await
    }

    /// The payload that announces `kind` of an approval, as SQL: this
    /// store's origin is the statement's parameter `$origin`.
    fn announce(kind: ApprovalEventKind, origin_param: &str) -> String {
        format!(
            "pg_notify('{CHANNEL}', '{} ' || {origin_param}::text || ' ' || approval_id)::text",
            kind_name(kind)
        )
    }

    /// Listens on a connection of its own; returns the client (which must
    /// be kept: dropping it closes the connection) and the notifications
    /// until the connection ends.
    async fn listen(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
        ),
        StoreError,
    > {
        let (client, mut connection) = self.config.connect(NoTls).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if tx.send(n).is_err() {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    // Terminal: the connection is gone; dropping `tx` says so.
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "the approval event relay lost its connection");
                        return;
                    }
                    None => return,
                }
            }
        });
        let listen = format!("LISTEN {CHANNEL}");
        tokio::time::timeout(
            self.settings.statement_timeout,
            client.batch_execute(&listen),
        )
        .await
        .map_err(|_| StoreError::Timeout {
            ms: self.settings.statement_timeout.as_millis(),
        })??;
        Ok((client, rx))
    }

    /// Publishes one other replica's event, read back from the database.
    async fn relay_one(&self, events: &ApprovalEvents, payload: &str) {
        let mut parts = payload.splitn(3, ' ');
        let (Some(kind), Some(origin), Some(approval_id)) = (
            parts.next().and_then(kind_from_name),
            parts.next(),
            parts.next(),
        ) else {
            tracing::warn!("an approval event notification is malformed; ignored");
            return;
        };
        if origin == &*self.origin {
            return;
        }
        match self.approval_by_id(approval_id).await {
            Ok(Some(record)) => events.relay(kind, &record),
            // Deleted since: nothing to show.
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "cannot read a relayed approval event; watchers must re-list");
                events.announce_gap();
            }
        }
    }
}

/// The connection settings of `url`, with this sidecar's timeouts added.
fn connection_config(
    url: &str,
    settings: &StoreSettings,
) -> Result<tokio_postgres::Config, StoreError> {
    // The parser's message may quote the URL, password and all: not shown.
    let mut config = tokio_postgres::Config::from_str(url).map_err(|_| {
        StoreError::PostgresUrl(
            "it does not parse as a postgres:// URL (see the PostgreSQL connection URI format)"
                .into(),
        )
    })?;
    match config.get_ssl_mode() {
        SslMode::Disable | SslMode::Prefer => {}
        _ => {
            return Err(StoreError::PostgresUrl(
                "sslmode=require: this build connects without TLS (use a Unix socket or a private network, and sslmode=disable or prefer)"
                    .into(),
            ));
        }
    }
    let ms = |d: Duration| d.as_millis();
    // Server-side bounds: a statement (lock waits included) ends at the
    // statement timeout, and a session that stopped mid-transaction does
    // not hold its row locks for longer than twice that.
    let bounds = format!(
        "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
        ms(settings.statement_timeout).max(1),
        ms(settings.statement_timeout.saturating_mul(2)).max(1)
    );
    let options = match config.get_options() {
        Some(given) if !given.trim().is_empty() => format!("{given} {bounds}"),
        _ => bounds,
    };
    config.options(options);
    if config.get_application_name().is_none() {
        config.application_name("toolgate");
    }
    config.connect_timeout(settings.connect_timeout);
    // A peer that vanished without a word (no FIN) is noticed in about a
    // minute, not the system default of two hours.
    config.keepalives_idle(Duration::from_secs(30));
    Ok(config)
}

fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => StoreError::Postgres(e),
        other => StoreError::Pool(other.to_string()),
    }
}

/// A serialization failure or a deadlock: the database rolled the whole
/// transaction back, so running it again is safe.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// 2, 4, 8 … ms (at most 128), plus up to as much again at random, so
/// that the losers of one race do not meet again.
fn backoff(tries: u32) -> Duration {
    let base = 1u64 << tries.min(7);
    let jitter = u64::try_from(uuid::Uuid::new_v4().as_u128() % u128::from(base)).unwrap_or(0);
    Duration::from_millis(base + jitter)
}

async fn migrate(mut client: Object) -> Result<(), Failure> {
    let tx = client.transaction().await?;
    let schema: Option<String> = tx.query_one("SELECT current_schema()", &[]).await?.get(0);
    if schema.is_none() {
        return Err(StoreError::PostgresUrl(
            "no schema of the search_path exists: create it, or name one that does".into(),
        )
        .into());
    }
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))",
        &[&MIGRATION_LOCK],
    )
    .await?;
    // Created only when missing, so a role without CREATE rights can start
    // on a schema another role migrated.
    let exists: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_tables \
             WHERE schemaname = current_schema() AND tablename = 'schema_version')",
            &[],
        )
        .await?
        .get(0);
    if !exists {
        tx.batch_execute(
            "CREATE TABLE schema_version (\
             singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton), version BIGINT NOT NULL)",
        )
        .await?;
    }
    let current: i64 = tx
        .query_opt("SELECT version FROM schema_version", &[])
        .await?
        .map_or(0, |r| r.get(0));
    let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
    if current > known {
        return Err(StoreError::SchemaTooNew {
            found: current,
            known,
        }
        .into());
    }
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(current).unwrap_or(0))
    {
        tx.batch_execute(sql).await?;
        let version = i64::try_from(i + 1).unwrap_or(i64::MAX);
        tx.execute(
            "INSERT INTO schema_version (singleton, version) VALUES (TRUE, $1) \
             ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version",
            &[&version],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

const fn kind_name(kind: ApprovalEventKind) -> &'static str {
    match kind {
        ApprovalEventKind::Created => "created",
        ApprovalEventKind::Decided => "decided",
        ApprovalEventKind::Expired => "expired",
        ApprovalEventKind::Consumed => "consumed",
    }
}

fn kind_from_name(name: &str) -> Option<ApprovalEventKind> {
    [
        ApprovalEventKind::Created,
        ApprovalEventKind::Decided,
        ApprovalEventKind::Expired,
        ApprovalEventKind::Consumed,
    ]
    .into_iter()
    .find(|k| kind_name(*k) == name)
}

fn approval_from_row(row: &Row) -> Result<ApprovalRecord, StoreError> {
    Ok(ApprovalRecord {
        approval_id: row.try_get(0)?,
        tenant_id: row.try_get(1)?,
        requester_subject_id: row.try_get(2)?,
        agent_id: row.try_get(3)?,
        tool: row.try_get(4)?,
        tool_version: row.try_get(5)?,
        risk: stored_risk(row.try_get(6)?)?,
        arguments_sha256: row.try_get(7)?,
        display_arguments: row.try_get(8)?,
        request_id: row.try_get(9)?,
        status: stored_status(row.try_get(10)?)?,
        created_at: row.try_get(11)?,
        expires_at: row.try_get(12)?,
        decided_by: row.try_get(13)?,
        decided_at: row.try_get(14)?,
        reason: row.try_get(15)?,
        consumed_by_idempotency_key: row.try_get(16)?,
    })
}

fn approval_rows(rows: &[Row]) -> Result<Vec<ApprovalRecord>, StoreError> {
    rows.iter().map(approval_from_row).collect()
}

fn execution_from_row(row: &Row) -> Result<ExecutionRecord, StoreError> {
    let small = |i: usize| -> Result<u32, StoreError> {
        let v: i64 = row.try_get(i)?;
        u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} is out of range")))
    };
    Ok(ExecutionRecord {
        tenant_id: row.try_get(0)?,
        idempotency_key: row.try_get(1)?,
        tool: row.try_get(2)?,
        arguments_sha256: row.try_get(3)?,
        state: stored_state(row.try_get(4)?)?,
        attempt: small(5)?,
        max_attempts: small(6)?,
        fencing_token: stored_unsigned(row.try_get(7)?)?,
        lease_expires_at: row.try_get(8)?,
        result_json: row.try_get(9)?,
        error: stored_error(row.try_get(10)?)?,
        created_at: row.try_get(11)?,
        updated_at: row.try_get(12)?,
        revision: stored_unsigned(row.try_get(13)?)?,
    })
}

/// One run of a ledger transition (see [`Store::begin_execution`]).
async fn transition<T: Transition>(mut client: Object, step: &T) -> Result<T::Answer, Failure> {
    let read = client
        .prepare_cached(&format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions \
             WHERE tenant_id = $1 AND idempotency_key = $2 FOR UPDATE"
        ))
        .await?;
    let token = client
        .prepare_cached("SELECT nextval('ledger_fencing')")
        .await?;
    let tx = client.transaction().await?;
    let id = step.id();
    // Sent together, run in order: the token is drawn after the row lock,
    // so it exceeds every token of this key committed before.
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id.tenant_id, &id.idempotency_key];
    let (row, next) = tokio::try_join!(tx.query_opt(&read, &key), tx.query_one(&token, &[]))?;
    let current = row.as_ref().map(execution_from_row).transpose()?;
    let next_token = stored_unsigned(next.try_get(0)?)?;
    let (answer, write) = step.apply(current.as_ref(), next_token);
    match &write {
        Write::Nothing => {}
        Write::Insert(r) => {
            let insert = tx
                .prepare_cached(&format!(
                    "INSERT INTO executions ({EXECUTION_COLUMNS}) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
                     ON CONFLICT (tenant_id, idempotency_key) DO NOTHING"
                ))
                .await?;
            let inserted = tx
                .execute(
                    &insert,
                    &[
                        &r.tenant_id,
                        &r.idempotency_key,
                        &r.tool,
                        &r.arguments_sha256,
                        &r.state.as_str(),
                        &i64::from(r.attempt),
                        &i64::from(r.max_attempts),
                        &signed(r.fencing_token)?,
                        &r.lease_expires_at,
                        &r.result_json,
                        &r.error.as_ref().map(error_to_json),
                        &r.created_at,
                        &r.updated_at,
                        &signed(r.revision)?,
                    ],
                )
                .await?;
            if inserted != 1 {
                // A concurrent transition inserted this key first: read it.
                return Err(Failure::Retry);
            }
        }
        Write::Update {
            record: r,
            previous_revision,
        } => {
            // The identity, tool and hash of a record never change.
            let update = tx
                .prepare_cached(
                    "UPDATE executions SET state = $3, attempt = $4, max_attempts = $5, \
                     fencing_token = $6, lease_expires_at = $7, result_json = $8, error_json = $9, \
                     updated_at = $10, revision = $11 \
                     WHERE tenant_id = $1 AND idempotency_key = $2 AND revision = $12",
                )
                .await?;
            let changed = tx
                .execute(
                    &update,
                    &[
                        &r.tenant_id,
                        &r.idempotency_key,
                        &r.state.as_str(),
                        &i64::from(r.attempt),
                        &i64::from(r.max_attempts),
                        &signed(r.fencing_token)?,
                        &r.lease_expires_at,
                        &r.result_json,
                        &r.error.as_ref().map(error_to_json),
                        &r.updated_at,
                        &signed(r.revision)?,
                        &signed(*previous_revision)?,
                    ],
                )
                .await?;
            if changed != 1 {
                return Err(StoreError::Conflict {
                    expected: *previous_revision,
                }
                .into());
            }
        }
    }
    tx.commit().await?;
    Ok(answer)
}

#[async_trait]
impl Store for PostgresStore {
    async fn pending_approval_for_call(
        &self,
        new: NewApproval,
        now: UnixMillis,
    ) -> Result<(ApprovalRecord, bool), StoreError> {
        let new = &new;
        let origin = &*self.origin;
        self.run(|mut client| async move {
            let call = "tenant_id = $1 AND requester_subject_id = $2 AND tool = $3 \
                        AND arguments_sha256 = $4 AND request_id = $5";
            let tx = client.transaction().await?;
            // A pending approval past its expiry is no longer pending.
            tx.execute(
                &format!(
                    "UPDATE approvals SET status = 'EXPIRED' \
                     WHERE status = 'PENDING' AND expires_at <= $6 AND {call}"
                ),
                &[
                    &new.tenant_id,
                    &new.requester_subject_id,
                    &new.tool,
                    &new.arguments_sha256,
                    &new.request_id,
                    &now,
                ],
            )
            .await?;
            // The partial unique index admits one PENDING per call: of two
            // racing inserts, the second waits for the first and writes
            // nothing.
            let insert = format!(
                "WITH created AS (INSERT INTO approvals ({APPROVAL_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'PENDING', $11, $12, NULL, NULL, NULL, NULL) \
                 ON CONFLICT (tenant_id, requester_subject_id, tool, arguments_sha256, request_id) \
                 WHERE status = 'PENDING' DO NOTHING RETURNING *) \
                 SELECT {APPROVAL_COLUMNS}, {} FROM created",
                Self::announce(ApprovalEventKind::Created, "$13")
            );
            let created = tx
                .query_opt(
                    &insert,
                    &[
                        &new.approval_id,
                        &new.tenant_id,
                        &new.requester_subject_id,
                        &new.agent_id,
                        &new.tool,
                        &new.tool_version,
                        &new.risk.as_str(),
                        &new.arguments_sha256,
                        &new.display_arguments,
                        &new.request_id,
                        &new.created_at,
                        &new.expires_at,
                        &origin,
                    ],
                )
                .await?;
            let answer = match created {
                Some(row) => (approval_from_row(&row)?, true),
                None => {
                    let existing = tx
                        .query_opt(
                            &format!(
                                "SELECT {APPROVAL_COLUMNS} FROM approvals \
                                 WHERE status = 'PENDING' AND {call}"
                            ),
                            &[
                                &new.tenant_id,
                                &new.requester_subject_id,
                                &new.tool,
                                &new.arguments_sha256,
                                &new.request_id,
                            ],
                        )
                        .await?;
                    match existing {
                        Some(row) => (approval_from_row(&row)?, false),
                        // Decided between our insert and this read: again.
                        None => return Err(Failure::Retry),
                    }
                }
            };
            tx.commit().await?;
            Ok(answer)
        })
        .await
    }

    async fn get_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        self.run(|client| async move {
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tenant_id = $1 AND approval_id = $2"
                ))
                .await?;
            let row = client.query_opt(&stmt, &[&tenant_id, &approval_id]).await?;
            Ok(row.as_ref().map(approval_from_row).transpose()?)
        })
        .await
    }

    async fn consume_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<ApprovalUse, StoreError> {
        let origin = &*self.origin;
        self.run(|client| async move {
            // One conditional statement: the first key wins.
            let consume = client
                .prepare_cached(&format!(
                    "WITH used AS (UPDATE approvals SET consumed_by_idempotency_key = $3 \
                     WHERE tenant_id = $1 AND approval_id = $2 AND status = 'APPROVED' \
                     AND expires_at > $4 AND consumed_by_idempotency_key IS NULL RETURNING approval_id) \
                     SELECT {} FROM used",
                    Self::announce(ApprovalEventKind::Consumed, "$5")
                ))
                .await?;
            let first = client
                .query(
                    &consume,
                    &[&tenant_id, &approval_id, &idempotency_key, &now, &origin],
                )
                .await?;
            if !first.is_empty() {
                return Ok(ApprovalUse::Consumed { first: true });
            }
            let state = client
                .prepare_cached(
                    "SELECT status, expires_at, consumed_by_idempotency_key FROM approvals \
                     WHERE tenant_id = $1 AND approval_id = $2",
                )
                .await?;
            let Some(row) = client.query_opt(&state, &[&tenant_id, &approval_id]).await? else {
                return Ok(ApprovalUse::NotUsable);
            };
            let status: &str = row.try_get(0)?;
            let expires_at: i64 = row.try_get(1)?;
            let by: Option<&str> = row.try_get(2)?;
            Ok(match by {
                Some(k) if k == idempotency_key && status == "APPROVED" && expires_at > now => {
                    ApprovalUse::Consumed { first: false }
                }
                Some(k) if k != idempotency_key => ApprovalUse::ConsumedByOther,
                _ => ApprovalUse::NotUsable,
            })
        })
        .await
    }

    async fn list_approvals(
        &self,
        tenant_id: &str,
        status: Option<ApprovalStatus>,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let status = status.map(ApprovalStatus::as_str);
        let after = after.as_deref();
        self.run(|client| async move {
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tenant_id = $1 \
                     AND ($2::text IS NULL OR status = $2::text) \
                     AND ($3::text IS NULL OR approval_id > $3::text) \
                     ORDER BY approval_id LIMIT $4"
                ))
                .await?;
            let rows = client
                .query(&stmt, &[&tenant_id, &status, &after, &limit])
                .await?;
            Ok(approval_rows(&rows)?)
        })
        .await
    }

    async fn decide_approval(
        &self,
        tenant_id: &str,
        approval_id: &str,
        d: ApprovalDecision,
    ) -> Result<DecideOutcome, StoreError> {
        let d = &d;
        let origin = &*self.origin;
        self.run(|client| async move {
            let status = if d.approve { "APPROVED" } else { "REJECTED" };
            // The condition on PENDING makes the first decision win.
            let decide = client
                .prepare_cached(&format!(
                    "WITH decided AS (UPDATE approvals SET status = $3::text, decided_by = $4, \
                     decided_at = $5, reason = $6, \
                     expires_at = CASE WHEN $3::text = 'APPROVED' THEN $7 ELSE expires_at END \
                     WHERE tenant_id = $1 AND approval_id = $2 AND status = 'PENDING' \
                     AND expires_at > $5 RETURNING *) \
                     SELECT {APPROVAL_COLUMNS}, {} FROM decided",
                    Self::announce(ApprovalEventKind::Decided, "$8")
                ))
                .await?;
            let decided = client
                .query_opt(
                    &decide,
                    &[
                        &tenant_id,
                        &approval_id,
                        &status,
                        &d.decided_by,
                        &d.decided_at,
                        &d.reason,
                        &d.approved_expires_at,
                        &origin,
                    ],
                )
                .await?;
            if let Some(row) = decided {
                return Ok(DecideOutcome::Decided(approval_from_row(&row)?));
            }
            let read = client
                .prepare_cached(&format!(
                    "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tenant_id = $1 AND approval_id = $2"
                ))
                .await?;
            Ok(
                match client.query_opt(&read, &[&tenant_id, &approval_id]).await? {
                    Some(row) => DecideOutcome::AlreadyDecided(approval_from_row(&row)?),
                    None => DecideOutcome::NotFound,
                },
            )
        })
        .await
    }

    async fn expire_due(&self, now: UnixMillis) -> Result<Vec<ApprovalRecord>, StoreError> {
        let origin = &*self.origin;
        self.run(|client| async move {
            // Rows another transaction holds (a decision, a consumption, a
            // sweep on another replica) are skipped, not waited for; the
            // replica whose UPDATE returns a row is the one that announces it.
            let expire = client
                .prepare_cached(&format!(
                    "WITH due AS (SELECT approval_id FROM approvals WHERE expires_at <= $1 \
                     AND (status = 'PENDING' OR (status = 'APPROVED' AND consumed_by_idempotency_key IS NULL)) \
                     ORDER BY approval_id FOR UPDATE SKIP LOCKED), \
                     expired AS (UPDATE approvals SET status = 'EXPIRED' \
                     WHERE approval_id IN (SELECT approval_id FROM due) RETURNING *) \
                     SELECT {APPROVAL_COLUMNS}, {} FROM expired ORDER BY approval_id",
                    Self::announce(ApprovalEventKind::Expired, "$2")
                ))
                .await?;
            let rows = client.query(&expire, &[&now, &origin]).await?;
            Ok(approval_rows(&rows)?)
        })
        .await
    }

    async fn begin_execution(&self, step: ledger::Begin) -> Result<BeginAnswer, StoreError> {
        self.run(|client| transition(client, &step)).await
    }

    async fn complete_execution(&self, step: ledger::Complete) -> Result<Settled, StoreError> {
        self.run(|client| transition(client, &step)).await
    }

    async fn reconcile_execution(
        &self,
        step: ledger::Reconcile,
    ) -> Result<Option<Settled>, StoreError> {
        self.run(|client| transition(client, &step)).await
    }

    async fn get_execution(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
    ) -> Result<Option<ExecutionRecord>, StoreError> {
        self.run(|client| async move {
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT {EXECUTION_COLUMNS} FROM executions \
                     WHERE tenant_id = $1 AND idempotency_key = $2"
                ))
                .await?;
            let row = client
                .query_opt(&stmt, &[&tenant_id, &idempotency_key])
                .await?;
            Ok(row.as_ref().map(execution_from_row).transpose()?)
        })
        .await
    }

    async fn collect_executions(&self, collect: Collect) -> Result<usize, StoreError> {
        let limit = i64::try_from(collect.limit).unwrap_or(i64::MAX);
        self.run(|client| async move {
            // Exactly `Collect::covers`, at most `limit` rows; a record a
            // transition holds right now is left for the next sweep.
            let stmt = client
                .prepare_cached(
                    "DELETE FROM executions WHERE (tenant_id, idempotency_key) IN \
                     (SELECT tenant_id, idempotency_key FROM executions WHERE updated_at <= $1 \
                     AND NOT (state = 'IN_PROGRESS' AND lease_expires_at > $2) \
                     LIMIT $3 FOR UPDATE SKIP LOCKED)",
                )
                .await?;
            let n = client
                .execute(
                    &stmt,
                    &[&collect.updated_at_or_before, &collect.now, &limit],
                )
                .await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.run(|client| async move {
            client.simple_query("SELECT 1").await?;
            Ok(())
        })
        .await
    }

    async fn relay_approval_events(
        &self,
        events: Arc<ApprovalEvents>,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, StoreError> {
        let first = self.listen().await?;
        let store = self.clone();
        Ok(Some(tokio::spawn(async move {
            let mut listening = Some(first);
            let mut failures: u32 = 0;
            loop {
                if let Some((client, mut notifications)) = listening.take() {
                    failures = 0;
                    while let Some(n) = notifications.recv().await {
                        store.relay_one(&events, n.payload()).await;
                    }
                    drop(client);
                    // Whatever was sent from now until we listen again is lost.
                    events.announce_gap();
                }
                failures = failures.saturating_add(1);
                let wait = Duration::from_millis(100u64 << failures.min(6)).min(MAX_RELAY_BACKOFF);
                tokio::time::sleep(wait).await;
                match store.listen().await {
                    Ok(again) => {
                        tracing::info!("the approval event relay listens again");
                        // Watchers that came while it was down missed events too.
                        events.announce_gap();
                        listening = Some(again);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the approval event relay cannot listen yet");
                    }
                }
            }
        })))
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(version(&schema).await, 1);
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
                    known: 1
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
    async fn urls_asking_for_tls_or_not_parsing_are_refused_without_echoing_them() {
        for url in [
            "postgres://u:secret@127.0.0.1/db?sslmode=require",
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
        assert_eq!(store.get_approval("t1", "a1").await.unwrap(), None);
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
}
