//! The file's schema: versioned migrations, applied in order on open.

use crate::store::StoreError;
use rusqlite::{Connection, TransactionBehavior};

/// Versioned migrations; index + 1 is the schema version they produce.
pub(super) const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE approvals (
    approval_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    requester_subject_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    risk TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    display_arguments TEXT NOT NULL,
    request_id TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    decided_by TEXT,
    decided_at INTEGER,
    reason TEXT,
    consumed_by_idempotency_key TEXT
);
CREATE UNIQUE INDEX approvals_one_pending_per_call
    ON approvals (tenant_id, requester_subject_id, tool, arguments_sha256, request_id)
    WHERE status = 'PENDING';
CREATE INDEX approvals_by_tenant_status ON approvals (tenant_id, status, created_at);
",
    r"
CREATE TABLE executions (
    tenant_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('IN_PROGRESS', 'SUCCEEDED', 'FAILED_RETRYABLE', 'UNKNOWN', 'FAILED_FINAL')),
    attempt INTEGER NOT NULL CHECK (attempt >= 1),
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    fencing_token INTEGER NOT NULL CHECK (fencing_token >= 1),
    lease_expires_at INTEGER NOT NULL,
    result_json TEXT,
    error_json TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    revision INTEGER NOT NULL CHECK (revision >= 1),
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE INDEX executions_by_updated_at ON executions (updated_at);
CREATE TABLE ledger_fencing (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    last_token INTEGER NOT NULL CHECK (last_token >= 0)
);
INSERT INTO ledger_fencing (singleton, last_token) VALUES (1, 0);
",
    // One PENDING per whole call: tool version and risk too (DESIGN §4).
    r"
DROP INDEX approvals_one_pending_per_call;
CREATE UNIQUE INDEX approvals_one_pending_per_call ON approvals
    (tenant_id, requester_subject_id, tool, tool_version, risk, arguments_sha256, request_id)
    WHERE status = 'PENDING';
",
    // A gateway call finds its approvals by the call minus its request id
    // (DESIGN §11.3), oldest or latest first.
    r"
CREATE INDEX approvals_by_call ON approvals
    (tenant_id, requester_subject_id, tool, arguments_sha256, created_at);
",
    // The entity store (DESIGN §11.6).
    super::entities::MIGRATION,
    // Execution tickets' keys (DESIGN §5, a record belongs to a decision);
    // fencing tokens are random secrets now, so the counter goes.
    LEDGER_SECRETS,
    // Budget keys and their charges (DESIGN §13.1).
    super::budgets::MIGRATION,
    // Sessions and the calls allowed in them (DESIGN §13.2).
    super::sessions::MIGRATION,
    // Why an approval was asked (DESIGN §14): `{}` for the older ones.
    "ALTER TABLE approvals ADD COLUMN why TEXT NOT NULL DEFAULT '{}';",
];

/// Migration 6: the ticket keys, versioned for rotation; the fencing
/// counter is gone (tokens are random, the attempt is the fence).
pub(super) const LEDGER_SECRETS: &str = r"
CREATE TABLE ledger_ticket_keys (
    version INTEGER PRIMARY KEY CHECK (version >= 1),
    secret BLOB NOT NULL CHECK (length(secret) = 32),
    created_at INTEGER NOT NULL
);
DROP TABLE ledger_fencing;
";

pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
    let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if current > known {
        return Err(StoreError::SchemaTooNew {
            found: current,
            known,
        });
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(current).unwrap_or(0))
    {
        tx.execute_batch(sql)?;
        tx.pragma_update(
            None,
            "user_version",
            i64::try_from(i + 1).unwrap_or(i64::MAX),
        )?;
    }
    tx.commit()?;
    Ok(())
}
