//! The schema: versioned migrations, run at start in one transaction under
//! an advisory lock, recorded in `schema_version`.

use deadpool_postgres::Object;

use super::super::StoreError;
use super::{Failure, MIGRATION_LOCK};

/// Versioned migrations; index + 1 is the schema version they produce.
/// Text keys that are ordered (approval ids, for pagination) use the "C"
/// collation: byte order, as in SQLite, whatever the database's locale.
const MIGRATIONS: &[&str] = &[
    r#"
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
"#,
    // One PENDING per whole call: tool version and risk too (DESIGN §4).
    r#"
DROP INDEX approvals_one_pending_per_call;
CREATE UNIQUE INDEX approvals_one_pending_per_call ON approvals
    (tenant_id, requester_subject_id, tool, tool_version, risk, arguments_sha256, request_id)
    WHERE status = 'PENDING';
"#,
    // A gateway call finds its approvals by the call minus its request id
    // (DESIGN §11.3), oldest or latest first, without reading the tenant's
    // whole history under the tenant's creator lock.
    r#"
CREATE INDEX approvals_by_call ON approvals
    (tenant_id, requester_subject_id, tool, arguments_sha256, created_at);
"#,
    // The entity store (DESIGN §11.6).
    ENTITIES,
    // Execution tickets' keys (DESIGN §5, a record belongs to a decision);
    // fencing tokens are random secrets now, so the sequence goes.
    r#"
CREATE TABLE ledger_ticket_keys (
    version BIGINT PRIMARY KEY CHECK (version >= 1),
    secret BYTEA NOT NULL CHECK (octet_length(secret) = 32),
    created_at BIGINT NOT NULL
);
DROP SEQUENCE ledger_fencing;
"#,
    // Budget keys and their charges (DESIGN §13.1).
    BUDGETS,
    // Sessions and the calls allowed in them (DESIGN §13.2).
    SESSIONS,
    // Why an approval was asked (DESIGN §14): `{}` for the older ones.
    "ALTER TABLE approvals ADD COLUMN why TEXT NOT NULL DEFAULT '{}';",
];

/// Entities and the parent edges the ancestor walk follows; a parent edge
/// goes with its entity. Keys compare bytewise ("C"), as in SQLite.
const ENTITIES: &str = r#"
CREATE TABLE entities (
    tenant_id TEXT COLLATE "C" NOT NULL,
    entity_type TEXT COLLATE "C" NOT NULL,
    entity_id TEXT COLLATE "C" NOT NULL,
    entity_json TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, entity_type, entity_id)
);
CREATE TABLE entity_parents (
    tenant_id TEXT COLLATE "C" NOT NULL,
    entity_type TEXT COLLATE "C" NOT NULL,
    entity_id TEXT COLLATE "C" NOT NULL,
    parent_type TEXT COLLATE "C" NOT NULL,
    parent_id TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant_id, entity_type, entity_id, parent_type, parent_id),
    FOREIGN KEY (tenant_id, entity_type, entity_id)
        REFERENCES entities (tenant_id, entity_type, entity_id) ON DELETE CASCADE
);
"#;

pub(super) async fn migrate(mut client: Object) -> Result<(), Failure> {
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

/// Migration 7: budget keys and their charges.
const BUDGETS: &str = r#"
CREATE TABLE budget_keys (
    tenant_id TEXT COLLATE "C" NOT NULL,
    budget TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    version BIGINT NOT NULL CHECK (version >= 1),
    PRIMARY KEY (tenant_id, budget, key)
);
CREATE TABLE budget_charges (
    tenant_id TEXT COLLATE "C" NOT NULL,
    budget TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    idempotency_key TEXT COLLATE "C" NOT NULL,
    amount BIGINT NOT NULL CHECK (amount >= 0),
    charged_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    released_at BIGINT,
    PRIMARY KEY (tenant_id, budget, key, idempotency_key)
);
CREATE INDEX budget_charges_window ON budget_charges (tenant_id, budget, key, charged_at);
CREATE INDEX budget_charges_of_call ON budget_charges (tenant_id, idempotency_key);
CREATE INDEX budget_charges_expiry ON budget_charges (expires_at);
"#;

/// Migration 7 (schema version 7): sessions and the calls allowed in them.
const SESSIONS: &str = r#"
CREATE TABLE sessions (
    tenant_id TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    labels TEXT NOT NULL,
    tools TEXT NOT NULL,
    calls BIGINT NOT NULL CHECK (calls >= 0),
    version BIGINT NOT NULL CHECK (version >= 0),
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX sessions_expiry ON sessions (expires_at);
CREATE TABLE session_calls (
    tenant_id TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    idempotency_key TEXT COLLATE "C" NOT NULL,
    tool TEXT NOT NULL,
    labels TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key, idempotency_key)
);
CREATE INDEX session_calls_expiry ON session_calls (expires_at);
"#;
