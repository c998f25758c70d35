//! The PostgreSQL backend: one database shared by many sidecar replicas.
//!
//! Every call takes a connection from a bounded pool (`deadpool-postgres`
//! over `tokio-postgres`: plain TCP or a Unix socket, or TLS with rustls as
//! the URL's `sslmode` asks, see `tls`) and runs one transaction. Correctness across processes comes from the database, never
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
//!
//! Here: the pool, the retry of a transaction that lost a race, and the
//! [`Store`] calls; `migrations` (the schema), `transition` (one ledger
//! transition under its row lock), `gateway` (the approval a gateway call
//! finds, DESIGN §11.3), `relay` (the event bridge), `rows` (rows to
//! records), `tls` (`sslmode` and the rustls connector).

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use super::{
    APPROVAL_COLUMNS, ApprovalDecision, ApprovalUse, DecideOutcome, EXECUTION_COLUMNS,
    GatewayApproval, Store, StoreError, StoreSettings, collectable_states_sql,
};
use crate::approvals::{
    ApprovalEventKind, ApprovalEvents, ApprovalRecord, ApprovalStatus, NewApproval, PendingScope,
};
use crate::budgets::{BudgetKey, Charge, SessionRecord, SessionState, Usage};
use crate::clock::UnixMillis;
use crate::entities::{EntityKey, EntityWalk, StoredEntity};
use crate::ledger::{
    self, BeginAnswer, Collect, ExecutionRecord, Lapse, Lapsed, Settled, TicketKey,
};

mod budgets;
mod entities;
mod gateway;
mod migrations;
mod relay;
mod rows;
mod sessions;
#[cfg(test)]
mod tests;
mod tls;
mod transition;

use migrations::migrate;
use rows::{approval_from_row, approval_rows, execution_from_row, kind_from_name, kind_name};
use transition::transition;

/// The `NOTIFY` channel of approval events.
const CHANNEL: &str = "toolgate_approvals";
/// The advisory lock's first key ("tg" + 1); the second is the schema's hash.
const MIGRATION_LOCK: i32 = 0x7467_0001;
/// How many times a transaction that lost a race is run in all.
const MAX_TRIES: u32 = 8;
/// `Collect::covers` in PostgreSQL: settled records, last changed at or
/// before `$1`, at most `$2` of them; a record a transition holds right now
/// is left for the next sweep.
static COLLECT_EXECUTIONS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM executions WHERE (tenant_id, idempotency_key) IN \
         (SELECT tenant_id, idempotency_key FROM executions WHERE updated_at <= $1 \
         AND state IN ({}) LIMIT $2 FOR UPDATE SKIP LOCKED)",
        collectable_states_sql()
    )
});

/// PostgreSQL behind a connection pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// How to open the relay's own connection.
    config: tokio_postgres::Config,
    /// Plain or TLS, as `sslmode` asked; the relay's connection too.
    tls: tls::Tls,
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
        let (url, mode, ca) = tls::split_url(url)?;
        let config = connection_config(&url, &settings)?;
        let tls = tls::connector(mode, ca.as_deref())?;
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            tls::Tls::Off => Manager::from_config(config.clone(), NoTls, manager_config),
            tls::Tls::Rustls(connect) => {
                Manager::from_config(config.clone(), connect.clone(), manager_config)
            }
        };
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
            tls,
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

/// The whole call an approval is bound to (DESIGN §4), parameters $1–$7.
const SAME_CALL: &str = "tenant_id = $1 AND requester_subject_id = $2 AND tool = $3 \
     AND tool_version = $4 AND risk = $5 AND arguments_sha256 = $6 AND request_id = $7";

/// `new`'s whole call as the parameters $1–$7 of [`SAME_CALL`].
fn call_params<'a>(
    new: &'a NewApproval,
    risk: &'a &'static str,
) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 7] {
    [
        &new.tenant_id,
        &new.requester_subject_id,
        &new.tool,
        &new.tool_version,
        risk,
        &new.arguments_sha256,
        &new.request_id,
    ]
}

/// The first step of creating an approval, in this order in every
/// transaction that may create one (so that two of them never wait for
/// each other's locks in a cycle): a PENDING approval of exactly this call
/// past its expiry is marked expired (its row locked), then the tenant's
/// creator lock is taken: one creator per tenant at a time, so the caps of
/// [`pending_after_lock`] count what no concurrent transaction is about to
/// add.
async fn lock_call(
    tx: &tokio_postgres::Transaction<'_>,
    new: &NewApproval,
    now: UnixMillis,
) -> Result<(), Failure> {
    let risk = new.risk.as_str();
    tx.execute(
        &format!(
            "UPDATE approvals SET status = 'EXPIRED' \
             WHERE status = 'PENDING' AND expires_at <= $8 AND {SAME_CALL}"
        ),
        &[call_params(new, &risk).as_slice(), &[&now]].concat(),
    )
    .await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('toolgate.approvals:' || $1::text))",
        &[&new.tenant_id],
    )
    .await?;
    Ok(())
}

/// The PENDING approval bound to exactly this call, else a new one under
/// the caps (see [`Store::pending_approval_for_call`]), after
/// [`lock_call`] in the same transaction; the caller commits.
async fn pending_after_lock(
    tx: &tokio_postgres::Transaction<'_>,
    new: &NewApproval,
    now: UnixMillis,
    origin: &str,
) -> Result<(ApprovalRecord, bool), Failure> {
    let risk = new.risk.as_str();
    let call_params = call_params(new, &risk);
    let existing = tx
        .query_opt(
            &format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE status = 'PENDING' AND {SAME_CALL}"
            ),
            &call_params,
        )
        .await?;
    if let Some(row) = existing {
        return Ok((approval_from_row(&row)?, false));
    }
    let counts = tx
        .query_one(
            &super::pending_counts_sql('$'),
            &[&new.tenant_id, &new.requester_subject_id, &now],
        )
        .await?;
    let (subject, tenant): (i64, i64) = (counts.try_get(0)?, counts.try_get(1)?);
    if let Some(scope) = PendingScope::exceeded(new.limits, subject, tenant) {
        return Err(Failure::Store(StoreError::PendingLimit(scope)));
    }
    // The partial unique index admits one PENDING per call: of two
    // racing inserts, the second waits for the first and writes
    // nothing.
    let insert = format!(
        "WITH created AS (INSERT INTO approvals ({APPROVAL_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'PENDING', $11, $12, NULL, NULL, NULL, NULL, $14) \
         ON CONFLICT (tenant_id, requester_subject_id, tool, tool_version, risk, arguments_sha256, request_id) \
         WHERE status = 'PENDING' DO NOTHING RETURNING *) \
         SELECT {APPROVAL_COLUMNS}, {} FROM created",
        PostgresStore::announce(ApprovalEventKind::Created, "$13")
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
                &risk,
                &new.arguments_sha256,
                &new.display_arguments,
                &new.request_id,
                &new.created_at,
                &new.expires_at,
                &origin,
                &new.why.to_stored(),
            ],
        )
        .await?;
    if let Some(row) = created {
        return Ok((approval_from_row(&row)?, true));
    }
    let existing = tx
        .query_opt(
            &format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE status = 'PENDING' AND {SAME_CALL}"
            ),
            &call_params,
        )
        .await?;
    match existing {
        Some(row) => Ok((approval_from_row(&row)?, false)),
        // Decided between our insert and this read: again.
        None => Err(Failure::Retry),
    }
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
            let tx = client.transaction().await?;
            lock_call(&tx, new, now).await?;
            let answer = pending_after_lock(&tx, new, now, origin).await?;
            tx.commit().await?;
            Ok(answer)
        })
        .await
    }

    async fn approval_for_gateway_call(
        &self,
        new: NewApproval,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<GatewayApproval, StoreError> {
        let new = &new;
        let origin = &*self.origin;
        self.run(|client| {
            gateway::approval_for_gateway_call(client, new, idempotency_key, now, origin)
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

    async fn session_state(
        &self,
        tenant_id: &str,
        key: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<SessionState, StoreError> {
        self.run(|client| async move {
            sessions::state(&client, tenant_id, key, idempotency_key, now).await
        })
        .await
    }

    async fn record_session(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        record: &SessionRecord,
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        self.run(|client| sessions::record(client, tenant_id, idempotency_key, record, now))
            .await
    }

    async fn budget_usage(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        keys: &[BudgetKey],
        now: UnixMillis,
    ) -> Result<Vec<Usage>, StoreError> {
        self.run(|client| async move {
            budgets::usage(&client, tenant_id, idempotency_key, keys, now).await
        })
        .await
    }

    async fn charge_budgets(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        charges: &[Charge],
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        self.run(|client| budgets::charge(client, tenant_id, idempotency_key, charges, now))
            .await
    }

    async fn release_charges(
        &self,
        tenant_id: &str,
        idempotency_key: &str,
        now: UnixMillis,
    ) -> Result<Vec<String>, StoreError> {
        self.run(|client| async move {
            let stmt = client.prepare_cached(budgets::RELEASE).await?;
            let rows = client
                .query(&stmt, &[&tenant_id, &idempotency_key, &now])
                .await?;
            let mut names = rows
                .iter()
                .map(|r| r.try_get::<_, String>(0))
                .collect::<Result<Vec<_>, _>>()?;
            names.sort();
            Ok(names)
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

    async fn lapse_executions(&self, lapse: Lapse) -> Result<Vec<Lapsed>, StoreError> {
        let limit = i64::try_from(lapse.limit).unwrap_or(i64::MAX);
        self.run(|mut client| async move {
            // A record a transition holds (FOR UPDATE) is skipped; one this
            // sweep holds makes that transition wait and read FAILED_FINAL.
            let sql = super::lapse_sql('$', " FOR UPDATE SKIP LOCKED");
            let tx = client.transaction().await?;
            let rows = tx
                .query(&sql, &[&lapse.updated_at_or_before, &limit])
                .await?;
            let release = tx.prepare_cached(budgets::RELEASE).await?;
            let mut lapsed = Vec::with_capacity(rows.len());
            for row in &rows {
                let tenant_id: String = row.try_get(0)?;
                let idempotency_key: String = row.try_get(1)?;
                let attempt: i64 = row.try_get(4)?;
                let mut released = tx
                    .query(&release, &[&tenant_id, &idempotency_key, &lapse.now])
                    .await?
                    .iter()
                    .map(|r| r.try_get::<_, String>(0))
                    .collect::<Result<Vec<_>, _>>()?;
                released.sort();
                lapsed.push(Lapsed {
                    tenant_id,
                    idempotency_key,
                    tool: row.try_get(2)?,
                    arguments_sha256: row.try_get(3)?,
                    attempt: u32::try_from(attempt)
                        .map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))?,
                    released,
                });
            }
            tx.commit().await?;
            lapsed.sort_by(|a, b| {
                (&a.tenant_id, &a.idempotency_key).cmp(&(&b.tenant_id, &b.idempotency_key))
            });
            Ok(lapsed)
        })
        .await
    }

    async fn collect_executions(&self, collect: Collect) -> Result<usize, StoreError> {
        let limit = i64::try_from(collect.limit).unwrap_or(i64::MAX);
        self.run(|client| async move {
            // Exactly `Collect::covers`, at most `limit` rows; a record a
            // transition holds right now is left for the next sweep.
            let stmt = client.prepare_cached(&COLLECT_EXECUTIONS).await?;
            let n = client
                .execute(&stmt, &[&collect.updated_at_or_before, &limit])
                .await?;
            // Charges whose window ended as long ago count for nothing.
            let charges = client.prepare_cached(budgets::COLLECT).await?;
            client
                .execute(&charges, &[&collect.updated_at_or_before, &limit])
                .await?;
            // Sessions idle since as long ago are forgotten.
            for collect_sessions in [sessions::COLLECT_SESSIONS, sessions::COLLECT_CALLS] {
                let stmt = client.prepare_cached(collect_sessions).await?;
                client
                    .execute(&stmt, &[&collect.updated_at_or_before, &limit])
                    .await?;
            }
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

    async fn ticket_keys(&self, candidate: TicketKey) -> Result<Vec<TicketKey>, StoreError> {
        let secret = candidate.secret.to_vec();
        let secret = &secret;
        self.run(|client| async move {
            // Version 1 only if there is no key yet; a racing first start
            // of another replica loses on the primary key or sees its row.
            client
                .execute(
                    "INSERT INTO ledger_ticket_keys (version, secret, created_at) \
                     SELECT 1, $1, (extract(epoch FROM now()) * 1000)::BIGINT \
                     WHERE NOT EXISTS (SELECT 1 FROM ledger_ticket_keys) \
                     ON CONFLICT (version) DO NOTHING",
                    &[secret],
                )
                .await?;
            let rows = client
                .query(
                    "SELECT version, secret FROM ledger_ticket_keys ORDER BY version",
                    &[],
                )
                .await?;
            let mut keys = Vec::with_capacity(rows.len());
            for row in rows {
                let version: i64 = row.try_get(0)?;
                let secret: Vec<u8> = row.try_get(1)?;
                keys.push(super::stored_ticket_key(version, &secret)?);
            }
            Ok(keys)
        })
        .await
    }

    // ---- The entity store (DESIGN §11.6): see `entities.rs`.

    async fn upsert_entities(
        &self,
        tenant_id: &str,
        entities: Vec<StoredEntity>,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let entities = &entities;
        self.run(|client| entities::upsert(client, tenant_id, entities, now))
            .await
    }

    async fn delete_entities(
        &self,
        tenant_id: &str,
        uids: Vec<EntityKey>,
    ) -> Result<usize, StoreError> {
        let uids = &uids;
        self.run(|client| entities::delete(client, tenant_id, uids))
            .await
    }

    async fn get_entities(
        &self,
        tenant_id: &str,
        uids: Vec<EntityKey>,
    ) -> Result<Vec<(EntityKey, String)>, StoreError> {
        let uids = &uids;
        self.run(|client| entities::get(client, tenant_id, uids))
            .await
    }

    async fn walk_entities(
        &self,
        tenant_id: &str,
        root: EntityKey,
        max_walk: usize,
    ) -> Result<EntityWalk, StoreError> {
        let root = &root;
        self.run(|client| entities::walk(client, tenant_id, root, max_walk))
            .await
    }

    async fn relay_approval_events(
        &self,
        events: Arc<ApprovalEvents>,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, StoreError> {
        let first = self.listen(relay::RELAY_QUEUE).await?;
        Ok(Some(self.relay(events, first, relay::RELAY_QUEUE)))
    }
}
