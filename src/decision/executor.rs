//! The executor's calls around one decision (DESIGN §2, §5, §7): a call
//! decided and then, when asked and allowed, its execution begun under the
//! decision's own principal, key and hash, with its execution ticket; a
//! batch checked whole, decided in request order and scheduled in waves;
//! a tool's result checked against its output contract. The gRPC door
//! translates to and from these and does no step of its own.

use std::sync::Arc;

use super::{AuthorizeInput, AuthorizeOutcome, Decision, ScheduleItem, ToolCallAuthorizer};
use crate::decode;
use crate::envelope::{Envelope, ErrorCode, ExecutorError, RequestError, unknown_tool};
use crate::ledger::BeginAnswer;
use crate::ledger::desk::LedgerDesk;
use crate::tools::Risk;

/// Most calls one `BatchAuthorize` may carry (one model turn).
pub const MAX_BATCH: usize = 128;

/// One call as an executor asks it: the call, and whether to begin its
/// execution once it is allowed.
#[derive(Debug, Clone)]
pub struct ExecutorCall {
    pub input: AuthorizeInput,
    /// Begin the execution in the same step when the call is allowed.
    pub begin_execution: bool,
    /// The lease of that execution (0: the default).
    pub lease_ms: u32,
}

/// One call decided: the outcome, the execution begun (when asked and
/// allowed) and the execution ticket (when allowed with a key).
#[derive(Debug, Clone)]
pub struct DecidedCall {
    pub outcome: AuthorizeOutcome,
    pub execution: Option<BeginAnswer>,
    pub execution_ticket: String,
}

/// A batch decided: each call in request order, and the waves the allowed
/// ones run in (indexes into `calls`).
#[derive(Debug, Clone)]
pub struct DecidedBatch {
    pub calls: Vec<DecidedCall>,
    pub waves: Vec<Vec<usize>>,
}

/// The decision pipeline and the ledger, as an executor's calls use them.
#[derive(Debug, Clone)]
pub struct ExecutorCalls {
    authorizer: Arc<ToolCallAuthorizer>,
    ledger: Arc<LedgerDesk>,
}

impl ExecutorCalls {
    pub(crate) const fn new(authorizer: Arc<ToolCallAuthorizer>, ledger: Arc<LedgerDesk>) -> Self {
        Self { authorizer, ledger }
    }

    /// The pipeline these calls are decided by.
    #[must_use]
    pub fn authorizer(&self) -> &Arc<ToolCallAuthorizer> {
        &self.authorizer
    }

    /// Decides one call, then begins its execution when asked and allowed,
    /// and tickets it.
    ///
    /// # Errors
    /// The executor's [`RequestError`] ([`ToolCallAuthorizer::authorize`]).
    pub async fn authorize(&self, call: ExecutorCall) -> Result<DecidedCall, RequestError> {
        let ExecutorCall {
            input,
            begin_execution,
            lease_ms,
        } = call;
        let outcome = self.authorizer.authorize(&input).await?;
        let allowed = outcome.allowed_call(&input.tool);
        let execution = if begin_execution {
            self.ledger
                .begin_allowed(allowed.as_ref(), lease_ms, &input.peer)
                .await
        } else {
            None
        };
        let execution_ticket = self.ledger.ticket_for(allowed.as_ref()).await;
        Ok(DecidedCall {
            outcome,
            execution,
            execution_ticket,
        })
    }

    /// Decides a batch (`BatchAuthorize`): refused whole, before any call
    /// of it is decided (no approval created, no execution begun), when it
    /// holds more than [`MAX_BATCH`] calls or one would run as a tenant the
    /// caller may not act for or has an executor error; else each call in
    /// request order, and the waves of the allowed ones.
    ///
    /// # Errors
    /// The first entry's [`RequestError`], or the batch's size.
    pub async fn batch(&self, calls: Vec<ExecutorCall>) -> Result<DecidedBatch, RequestError> {
        if calls.len() > MAX_BATCH {
            return Err(ExecutorError::new(
                "requests",
                format!("at most {MAX_BATCH} calls per batch"),
            )
            .into());
        }
        for call in &calls {
            self.authorizer.precheck(&call.input)?;
        }
        let mut decided = Vec::with_capacity(calls.len());
        for call in calls {
            decided.push(self.authorize(call).await?);
        }
        let items: Vec<ScheduleItem> = decided
            .iter()
            .map(|d| ScheduleItem {
                allowed: d.outcome.decision == Decision::Allow,
                conflict_key: d.outcome.conflict_key.clone(),
                // An unknown risk schedules as the most dangerous: it
                // never shares a wave on its key.
                risk: d.outcome.risk.unwrap_or(Risk::Destructive),
                parallel: d.outcome.parallel,
            })
            .collect();
        Ok(DecidedBatch {
            waves: super::schedule(&items),
            calls: decided,
        })
    }

    /// `ValidateResult`: `result_json`, strictly decoded under the
    /// pipeline's limits, against the output contract of `tool` in the live
    /// policy set; at most the pipeline's `violation_cap` violations listed.
    ///
    /// # Errors
    /// `unknown_tool`, or `output_invalid` (not JSON, with the decoder's
    /// `reason`; or the violations).
    pub fn validate_result(&self, tool: &str, result_json: &str) -> Result<(), Envelope> {
        let engine = self.authorizer.engine();
        let Some(contract) = engine.tools().get(tool) else {
            return Err(unknown_tool(tool));
        };
        let config = self.authorizer.config();
        let value = decode::parse_strict(result_json.as_bytes(), &config.limits).map_err(|e| {
            Envelope::new(
                ErrorCode::OutputInvalid,
                format!("the result is not valid JSON: {e}"),
            )
            .with("reason", e.reason())
        })?;
        let violations = contract.validate_output(&value, config.violation_cap);
        crate::envelope::violations(ErrorCode::OutputInvalid, &violations).map_or(Ok(()), Err)
    }
}
