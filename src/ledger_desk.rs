//! The ledger desk: what `LedgerService`, and `Authorize` with
//! `begin_execution`, ask of the execution ledger (DESIGN §5).
//!
//! It checks the executor's request (auth context, key, hash, token, the
//! shape of results and errors), looks the tool's contract up for its lease
//! and retry budget, strictly decodes results, and has the store run the
//! ledger's transitions, one transaction each. The state machine itself is
//! [`crate::ledger`]; this module holds no rule of it, and knows nothing of
//! gRPC. Records are found by the caller's tenant only.
//!
//! Fail closed: a store failure is an `internal_error` answer (retryable
//! with the same key, since nothing was written), never an ACQUIRED.

use std::sync::Arc;

use arc_swap::ArcSwap;
use serde_json::Value;

use crate::authorizer::{AuthorizeOutcome, Decision, ExecutorError, require_caller, unknown_tool};
use crate::clock::Clock;
use crate::decode::{self, Limits};
use crate::envelope::{Envelope, ErrorCode};
use crate::identity::Caller;
use crate::ledger::{
    Begin, BeginAnswer, Collect, Complete, Completion, ExecutionId, ExecutionRecord, LedgerConfig,
    OutputSchemas, Reconcile, RecordedError, Settled, Verdict,
};
use crate::policy::PolicyEngine;
use crate::store::{Store, StoreError};
use crate::tools::Violation;

/// The tracing target of ledger transitions.
pub const LEDGER_TARGET: &str = "toolgate::ledger";

/// The longest idempotency key accepted (ours are the tool name, a colon
/// and 64 hex digits).
const MAX_KEY_BYTES: usize = 256;
/// The largest executor-reported error kept, all its fields together.
pub const MAX_ERROR_BYTES: usize = 16 * 1024;
/// How many batches one collection sweep deletes at most; the next sweep
/// goes on where it stopped.
const MAX_BATCHES_PER_SWEEP: usize = 100;

/// Why a desk call could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The executor's request is malformed.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// The store failed; nothing was changed.
    #[error("the execution ledger is unavailable")]
    Unavailable,
}

/// A `BeginExecution`, as the executor sent it.
#[derive(Debug, Clone, Default)]
pub struct BeginRequest {
    pub caller: Option<Caller>,
    pub idempotency_key: String,
    pub arguments_sha256: String,
    pub tool: String,
    /// 0: the tool's timeout plus the configured margin.
    pub lease_ms: u32,
}

/// How the executor says the attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionStatus {
    Succeeded,
    FailedRetryable,
    FailedFinal,
    Unknown,
}

/// A `CompleteExecution`, as the executor sent it.
#[derive(Debug, Clone, Default)]
pub struct CompleteRequest {
    pub caller: Option<Caller>,
    pub idempotency_key: String,
    pub fencing_token: u64,
    /// `None`: the executor sent none.
    pub status: Option<CompletionStatus>,
    /// Required with SUCCEEDED, refused otherwise.
    pub result_json: String,
    /// The tool's own error; refused with SUCCEEDED.
    pub error: Option<RecordedError>,
}

/// A `ReconcileExecution`, as sent.
#[derive(Debug, Clone, Default)]
pub struct ReconcileRequest {
    pub caller: Option<Caller>,
    pub idempotency_key: String,
    pub applied: bool,
    /// Required when applied, refused otherwise.
    pub result_json: String,
}

/// The ledger desk.
#[derive(Debug)]
pub struct LedgerDesk {
    engine: Arc<ArcSwap<PolicyEngine>>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: LedgerConfig,
    limits: Limits,
    violation_cap: usize,
}

impl LedgerDesk {
    /// A desk over the live policy engine (for tool contracts). Results are
    /// decoded under `limits`, and at most `violation_cap` output violations
    /// are listed.
    #[must_use]
    pub fn new(
        engine: Arc<ArcSwap<PolicyEngine>>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: LedgerConfig,
        limits: Limits,
        violation_cap: usize,
    ) -> Self {
        Self {
            engine,
            store,
            clock,
            config,
            limits,
            violation_cap,
        }
    }

    /// The ledger's settings.
    #[must_use]
    pub const fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// `BeginExecution`.
    ///
    /// # Errors
    /// [`ExecutorError`] for a malformed request (auth, key, hash, tool).
    pub async fn begin(&self, req: BeginRequest) -> Result<BeginAnswer, ExecutorError> {
        let BeginRequest {
            caller,
            idempotency_key,
            arguments_sha256,
            tool,
            lease_ms,
        } = req;
        let id = execution_id(caller.as_ref(), idempotency_key)?;
        let is_sha = arguments_sha256.len() == 64
            && arguments_sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !is_sha {
            return Err(ExecutorError::new(
                "arguments_sha256",
                "must be the 64 lowercase hex digits Authorize returned",
            ));
        }
        if tool.is_empty() {
            return Err(ExecutorError::new("tool", "must not be empty"));
        }
        Ok(self
            .begin_checked(id, &tool, arguments_sha256, lease_ms)
            .await)
    }

    /// `Authorize` with `begin_execution`: begins the allowed call under the
    /// decision's own key and hash; `None` when the decision is not ALLOW.
    pub async fn begin_allowed(
        &self,
        caller: Option<&Caller>,
        tool: &str,
        outcome: &AuthorizeOutcome,
        lease_ms: u32,
    ) -> Option<BeginAnswer> {
        if outcome.decision != Decision::Allow {
            return None;
        }
        let id = ExecutionId {
            tenant_id: caller?.tenant_id.clone(),
            idempotency_key: outcome.idempotency_key.clone(),
        };
        Some(
            self.begin_checked(id, tool, outcome.arguments_sha256.clone(), lease_ms)
                .await,
        )
    }

    async fn begin_checked(
        &self,
        id: ExecutionId,
        tool: &str,
        arguments_sha256: String,
        lease_ms: u32,
    ) -> BeginAnswer {
        let engine = self.engine.load_full();
        let Some(contract) = engine.tools().get(tool) else {
            return BeginAnswer::refused(&unknown_tool(tool));
        };
        let step = Begin {
            id,
            tool: contract.name.clone(),
            arguments_sha256,
            lease_ms: self.config.lease_ms(lease_ms, contract.timeout_ms),
            max_attempts: self.config.max_attempts(contract.max_attempts),
            now: self.clock.now_ms(),
        };
        let (tenant, key, sha) = (
            step.id.tenant_id.clone(),
            step.id.idempotency_key.clone(),
            step.arguments_sha256.clone(),
        );
        match self.store.begin_execution(step).await {
            Ok(answer) => {
                tracing::info!(
                    target: LEDGER_TARGET,
                    tenant = %tenant,
                    idempotency_key = %key,
                    tool = %tool,
                    arguments_sha256 = %sha,
                    outcome = ?answer.outcome,
                    state = answer.state.map_or("", |s| s.as_str()),
                    attempt = answer.attempt,
                    fencing_token = answer.fencing_token,
                    code = code(answer.error.as_ref()),
                    "execution begin"
                );
                answer
            }
            Err(e) => BeginAnswer::refused(&store_failure(&e)),
        }
    }

    /// `CompleteExecution`.
    ///
    /// # Errors
    /// [`ExecutorError`] for a malformed request: auth, key, a zero token, no
    /// status, a success without a strictly valid JSON result, a result or
    /// error with a status that takes none, an oversized error.
    pub async fn complete(&self, req: CompleteRequest) -> Result<Settled, ExecutorError> {
        let CompleteRequest {
            caller,
            idempotency_key,
            fencing_token,
            status,
            result_json,
            error,
        } = req;
        let id = execution_id(caller.as_ref(), idempotency_key)?;
        if fencing_token == 0 {
            return Err(ExecutorError::new(
                "fencing_token",
                "is required: the token BeginExecution returned with ACQUIRED",
            ));
        }
        let status = status.ok_or_else(|| {
            ExecutorError::new("status", "must be one of the COMPLETION_STATUS_ values")
        })?;
        let error = check_error(error, &self.limits)?;
        if status == CompletionStatus::Succeeded && error.is_some() {
            return Err(ExecutorError::new(
                "error",
                "not with COMPLETION_STATUS_SUCCEEDED",
            ));
        }
        if status != CompletionStatus::Succeeded {
            no_result(&result_json, "only with COMPLETION_STATUS_SUCCEEDED")?;
        }
        let completion = match status {
            CompletionStatus::Succeeded => {
                let (result_json, result) = self.result(result_json)?;
                Completion::Succeeded {
                    result_json,
                    result,
                }
            }
            CompletionStatus::FailedRetryable => Completion::FailedRetryable(error),
            CompletionStatus::FailedFinal => Completion::FailedFinal(error),
            CompletionStatus::Unknown => Completion::Unknown(error),
        };
        let step = Complete {
            id,
            fencing_token,
            completion,
            now: self.clock.now_ms(),
            outputs: self.outputs(),
        };
        let (tenant, key) = (step.id.tenant_id.clone(), step.id.idempotency_key.clone());
        Ok(match self.store.complete_execution(step).await {
            Ok(settled) => {
                log_settled("execution complete", &tenant, &key, &settled, fencing_token);
                settled
            }
            Err(e) => unsettled(&e),
        })
    }

    /// `ReconcileExecution`; `Ok(None)` when the caller's tenant has no such record.
    ///
    /// # Errors
    /// [`ExecutorError`] for a malformed request: auth, key, applied without
    /// a strictly valid JSON result, not applied with one.
    pub async fn reconcile(&self, req: ReconcileRequest) -> Result<Option<Settled>, ExecutorError> {
        let ReconcileRequest {
            caller,
            idempotency_key,
            applied,
            result_json,
        } = req;
        let id = execution_id(caller.as_ref(), idempotency_key)?;
        let verdict = if applied {
            let (result_json, result) = self.result(result_json)?;
            Verdict::Applied {
                result_json,
                result,
            }
        } else {
            no_result(&result_json, "only when applied")?;
            Verdict::NotApplied
        };
        let step = Reconcile {
            id,
            verdict,
            now: self.clock.now_ms(),
            outputs: self.outputs(),
        };
        let (tenant, key) = (step.id.tenant_id.clone(), step.id.idempotency_key.clone());
        Ok(match self.store.reconcile_execution(step).await {
            Ok(Some(settled)) => {
                log_settled("execution reconcile", &tenant, &key, &settled, 0);
                Some(settled)
            }
            Ok(None) => None,
            Err(e) => Some(unsettled(&e)),
        })
    }

    /// `GetExecution`: the caller's tenant's record of this key, if any.
    ///
    /// # Errors
    /// [`LedgerError::Executor`] for a malformed request,
    /// [`LedgerError::Unavailable`] when the store fails.
    pub async fn get(
        &self,
        caller: Option<&Caller>,
        idempotency_key: &str,
    ) -> Result<Option<ExecutionRecord>, LedgerError> {
        let id = execution_id(caller, idempotency_key.to_owned())?;
        self.store
            .get_execution(&id.tenant_id, &id.idempotency_key)
            .await
            .map_err(|e| {
                store_failure(&e);
                LedgerError::Unavailable
            })
    }

    /// Deletes the records past retention, in batches of the configured
    /// size, each its own short transaction; returns how many.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    pub async fn collect_due(&self) -> Result<usize, StoreError> {
        let mut total = 0;
        for _ in 0..MAX_BATCHES_PER_SWEEP {
            let collect = Collect::new(
                self.clock.now_ms(),
                self.config.retention,
                self.config.collect_batch,
            );
            let n = self.store.collect_executions(collect).await?;
            total += n;
            if n < collect.limit {
                break;
            }
            // Let waiting requests in between two batches.
            tokio::task::yield_now().await;
        }
        if total > 0 {
            tracing::info!(target: LEDGER_TARGET, collected = total, "execution records past retention collected");
        }
        Ok(total)
    }

    /// A result, strictly decoded (the executor's text is what is stored).
    fn result(&self, text: String) -> Result<(String, Value), ExecutorError> {
        if text.is_empty() {
            return Err(ExecutorError::new(
                "result_json",
                "is required when the side effect happened (`null` for a tool that returns nothing)",
            ));
        }
        let value = decode::parse_strict(text.as_bytes(), &self.limits)
            .map_err(|e| ExecutorError::new("result_json", format!("not valid JSON: {e}")))?;
        Ok((text, value))
    }

    fn outputs(&self) -> Arc<dyn OutputSchemas> {
        Arc::new(ContractOutputs {
            engine: self.engine.load_full(),
            cap: self.violation_cap,
        })
    }
}

/// The output schemas of the contracts of one loaded policy set.
#[derive(Debug)]
struct ContractOutputs {
    engine: Arc<PolicyEngine>,
    cap: usize,
}

impl OutputSchemas for ContractOutputs {
    fn check(&self, tool: &str, result: &Value) -> Option<Vec<Violation>> {
        self.engine
            .tools()
            .get(tool)
            .map(|contract| contract.validate_output(result, self.cap))
    }
}

/// The record an executor's request names: its caller's tenant and the key.
fn execution_id(
    caller: Option<&Caller>,
    idempotency_key: String,
) -> Result<ExecutionId, ExecutorError> {
    let caller = require_caller(caller)?;
    if idempotency_key.is_empty() {
        return Err(ExecutorError::new("idempotency_key", "must not be empty"));
    }
    if idempotency_key.len() > MAX_KEY_BYTES {
        return Err(ExecutorError::new(
            "idempotency_key",
            format!("at most {MAX_KEY_BYTES} bytes"),
        ));
    }
    Ok(ExecutionId {
        tenant_id: caller.tenant_id.clone(),
        idempotency_key,
    })
}

fn no_result(result_json: &str, when: &str) -> Result<(), ExecutorError> {
    if result_json.is_empty() {
        Ok(())
    } else {
        Err(ExecutorError::new("result_json", when))
    }
}

/// An executor's report of a failure, bounded in size, with details that
/// are a JSON object (empty details become `{}`).
fn check_error(
    error: Option<RecordedError>,
    limits: &Limits,
) -> Result<Option<RecordedError>, ExecutorError> {
    let Some(mut e) = error else {
        return Ok(None);
    };
    if e.code.is_empty() {
        return Err(ExecutorError::new("error.code", "must not be empty"));
    }
    let size = e.code.len()
        + e.category.len()
        + e.message.len()
        + e.resolution.len()
        + e.details_json.len();
    if size > MAX_ERROR_BYTES {
        return Err(ExecutorError::new(
            "error",
            format!("at most {MAX_ERROR_BYTES} bytes in all"),
        ));
    }
    if e.details_json.is_empty() {
        "{}".clone_into(&mut e.details_json);
    } else {
        let details = decode::parse_strict(e.details_json.as_bytes(), limits).ok();
        if !details.is_some_and(|d| d.is_object()) {
            return Err(ExecutorError::new(
                "error.details_json",
                "must be a JSON object",
            ));
        }
    }
    Ok(Some(e))
}

fn code(e: Option<&RecordedError>) -> &str {
    e.map_or("", |e| e.code.as_str())
}

fn log_settled(what: &'static str, tenant: &str, key: &str, s: &Settled, token: u64) {
    tracing::info!(
        target: LEDGER_TARGET,
        tenant = %tenant,
        idempotency_key = %key,
        state = s.state.map_or("", |s| s.as_str()),
        fencing_token = token,
        code = code(s.error.as_ref()),
        "{what}"
    );
}

/// The answer to a completion or reconciliation the store could not run.
fn unsettled(e: &StoreError) -> Settled {
    Settled {
        state: None,
        error: Some((&store_failure(e)).into()),
    }
}

fn store_failure(e: &StoreError) -> Envelope {
    tracing::error!(target: LEDGER_TARGET, error = %e, "ledger store failure (fail closed)");
    Envelope::new(
        ErrorCode::InternalError,
        "the execution ledger could not be reached; nothing was changed, retry with the same key",
    )
}
