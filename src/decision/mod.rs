//! One decision: the pipeline of DESIGN §2 ([`ToolCallAuthorizer`]), what
//! it takes and gives ([`AuthorizeInput`], [`AuthorizeOutcome`]), the wave
//! schedule of a batch ([`schedule`]), and the executor's calls around a
//! decision ([`ExecutorCalls`]: begin and ticket after an allow, a batch,
//! a result checked).
//!
//! `pipeline` and `executor` do IO through the store, the ledger and the
//! audit log; `outcome` and `schedule` are plain data and rules. None of it
//! knows of gRPC or SQL.

mod executor;
mod outcome;
mod pipeline;
mod schedule;

use std::time::Duration;

use crate::decode::Limits;

pub use executor::{DecidedBatch, DecidedCall, ExecutorCall, ExecutorCalls, MAX_BATCH};
pub use outcome::{AuthorizeInput, AuthorizeOutcome, Decision, Door};
pub(crate) use pipeline::AuthorizerParts;
pub use pipeline::{CallableTools, ToolCallAuthorizer};
pub use schedule::{ScheduleItem, schedule};

/// The default size cap of `entities_json` (2 MiB): twice the arguments'
/// and under gRPC's 4 MiB message cap, so this limit is the one that answers.
pub const DEFAULT_MAX_ENTITIES_BYTES: usize = 2 * 1_048_576;

/// Settings of the pipeline.
#[derive(Debug, Clone)]
pub struct AuthorizerConfig {
    pub limits: Limits,
    /// The limits of `entities_json`, decoded as strictly as the arguments
    /// (an executor's list of Cedar entities is legitimately larger than one
    /// call's arguments, so its size cap is its own; the depth is shared).
    pub entity_limits: Limits,
    /// How many schema violations one answer lists.
    pub violation_cap: usize,
    /// Time kept back from the caller's deadline for the executor's own work.
    pub deadline_margin: Duration,
    /// How long a PENDING approval waits for a human.
    pub pending_approval_ttl: Duration,
    /// The caps on PENDING approvals.
    pub pending_limits: crate::approvals::PendingLimits,
    /// The bounds of the entity store: its requests and the ancestor walk
    /// a decision makes when the caller gives no `entities_json`.
    pub entity_store: crate::entities::EntityLimits,
    /// How long a session idle is remembered (`[sessions] idle_seconds`,
    /// DESIGN §13.2).
    pub session_idle: Duration,
}

impl Default for AuthorizerConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            entity_limits: Limits {
                max_bytes: DEFAULT_MAX_ENTITIES_BYTES,
                ..Limits::default()
            },
            violation_cap: 20,
            deadline_margin: Duration::from_millis(50),
            pending_approval_ttl: Duration::from_secs(3600),
            pending_limits: crate::approvals::PendingLimits::default(),
            entity_store: crate::entities::EntityLimits::default(),
            session_idle: Duration::from_secs(86_400),
        }
    }
}
