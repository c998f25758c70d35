//! The ledger desk: what `LedgerService`, and `Authorize` with
//! `begin_execution`, ask of the execution ledger (DESIGN §5).
//!
//! It checks the executor's request (auth context, key, hash, token, the
//! shape of results and errors), looks the tool's contract up for its lease
//! and retry budget, strictly decodes results, and has the store run the
//! ledger's transitions, one transaction each. The state machine itself is
//! [`crate::ledger`]; this module holds no rule of it, and knows nothing of
//! gRPC. Records are found by the principal's tenant only; the principal is
//! established as for decisions ([`Principals`]: from the verified identity
//! token when the deployment requires one).
//!
//! Every begin, completion and reconciliation is one audit event and one
//! count of `toolgate_ledger_transitions_total` (see [`crate::audit`] for
//! what an event may carry: never a result or an error's message).
//!
//! Fail closed: a store failure is an `internal_error` answer (retryable
//! with the same key, since nothing was written), never an ACQUIRED.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use serde_json::Value;

use crate::audit::Audit;
use crate::clock::Clock;
use crate::decode::{self, Limits};
use crate::envelope::{Checked, Envelope, ErrorCode, ExecutorError, RequestError, unknown_tool};
use crate::identity::{Caller, Principals};
use crate::ledger::{
    Begin, BeginAnswer, Collect, Complete, Completion, ExecutionId, ExecutionRecord, LedgerConfig,
    OutputSchemas, Reconcile, Settled, TicketClaims, TicketKeys, Verdict,
};
use crate::metrics::Metrics;
use crate::policy::PolicyEngine;
use crate::store::{Store, StoreError};
use crate::tools::Violation;

mod observe;
mod requests;
mod tickets;

use observe::Seen;
pub use requests::MAX_ERROR_BYTES;
pub use requests::{
    AllowedCall, BeginRequest, CompleteRequest, CompletionStatus, ExecutorAuth, LedgerError,
    ReconcileRequest,
};
use requests::{check_error, check_key, no_result};

/// The tracing target of ledger transitions.
pub const LEDGER_TARGET: &str = "toolgate::ledger";

/// How many batches one collection sweep deletes at most; the next sweep
/// goes on where it stopped.
const MAX_BATCHES_PER_SWEEP: usize = 100;

/// Runs `batch` (one short transaction: how many records it handled, and
/// the most it may) until one handles fewer than its most, at most
/// [`MAX_BATCHES_PER_SWEEP`] times, letting waiting requests in between
/// two batches; the total.
async fn in_batches<F, Fut>(mut batch: F) -> Result<usize, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(usize, usize), StoreError>>,
{
    let mut total = 0;
    for _ in 0..MAX_BATCHES_PER_SWEEP {
        let (n, most) = batch().await?;
        total += n;
        if n < most {
            break;
        }
        tokio::task::yield_now().await;
    }
    Ok(total)
}

/// Everything a [`LedgerDesk`] needs; none of it has a default.
#[derive(Debug)]
pub(crate) struct LedgerParts {
    /// The live policy engine, for tool contracts.
    pub engine: Arc<ArcSwap<PolicyEngine>>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: LedgerConfig,
    /// Results are decoded under these limits.
    pub limits: Limits,
    /// How many output violations one answer lists.
    pub violation_cap: usize,
    /// Who each call runs as, as for decisions.
    pub principals: Principals,
    /// Records every begin, completion and reconciliation.
    pub audit: Arc<Audit>,
    /// Counts them, and store errors.
    pub metrics: Arc<Metrics>,
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
    principals: Principals,
    audit: Arc<Audit>,
    metrics: Arc<Metrics>,
    /// The ticket keys, loaded from the store on first use (and again when
    /// a ticket names a version not loaded yet).
    ticket_keys: arc_swap::ArcSwapOption<TicketKeys>,
}

impl LedgerDesk {
    /// A desk wired as production wires it (see [`crate::server`], its
    /// one caller outside unit tests).
    #[must_use]
    pub(crate) fn new(parts: LedgerParts) -> Self {
        let LedgerParts {
            engine,
            store,
            clock,
            config,
            limits,
            violation_cap,
            principals,
            audit,
            metrics,
        } = parts;
        Self {
            engine,
            store,
            clock,
            config,
            limits,
            violation_cap,
            principals,
            audit,
            metrics,
            ticket_keys: arc_swap::ArcSwapOption::empty(),
        }
    }

    /// The principal of a request (see [`Principals`]), once it is known to
    /// be of a tenant the caller may act for: a record of any other tenant
    /// is never read, begun or settled.
    fn principal(&self, auth: &ExecutorAuth) -> Result<Checked<Caller>, RequestError> {
        self.principals.resolve_within(
            auth.caller.as_ref(),
            &auth.identity_token,
            self.clock.now_ms(),
            &auth.tenants,
        )
    }

    /// `BeginExecution`.
    ///
    /// # Errors
    /// [`RequestError::Invalid`] for a malformed request (auth, key, hash,
    /// tool); [`RequestError::TenantNotGranted`] for a principal of a tenant
    /// the caller may not act for (nothing is read or written).
    pub async fn begin(&self, req: BeginRequest) -> Result<BeginAnswer, RequestError> {
        let started = Instant::now();
        let BeginRequest {
            auth,
            idempotency_key,
            arguments_sha256,
            tool,
            lease_ms,
            execution_ticket,
        } = req;
        let principal = self.principal(&auth)?.into_result();
        check_key(&idempotency_key)?;
        let is_sha = arguments_sha256.len() == 64
            && arguments_sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !is_sha {
            return Err(ExecutorError::new(
                "arguments_sha256",
                "must be the 64 lowercase hex digits Authorize returned",
            )
            .into());
        }
        if tool.is_empty() {
            return Err(ExecutorError::new("tool", "must not be empty").into());
        }
        let answer = match &principal {
            Ok(p) => {
                let claims = TicketClaims {
                    tenant_id: &p.tenant_id,
                    subject_id: &p.subject_id,
                    idempotency_key: &idempotency_key,
                    arguments_sha256: &arguments_sha256,
                    tool: &tool,
                };
                match self.check_ticket(&execution_ticket, &claims).await {
                    Ok(()) => {
                        let id = ExecutionId {
                            tenant_id: p.tenant_id.clone(),
                            idempotency_key: idempotency_key.clone(),
                        };
                        self.begin_checked(id, &tool, arguments_sha256.clone(), lease_ms)
                            .await
                    }
                    Err(refusal) => BeginAnswer::refused(&refusal),
                }
            }
            Err(refusal) => BeginAnswer::refused(refusal),
        };
        let seen = Seen::request(
            "begin",
            &auth,
            principal.as_ref().ok(),
            &idempotency_key,
            started,
        );
        self.observe_begin(&seen, &tool, &arguments_sha256, &answer)
            .await;
        Ok(answer)
    }

    /// `Authorize` with `begin_execution`: begins the allowed call under the
    /// decision's own principal, key and hash; `None` when the decision is
    /// not ALLOW.
    pub async fn begin_allowed(
        &self,
        allowed: Option<&AllowedCall<'_>>,
        lease_ms: u32,
        peer: &str,
    ) -> Option<BeginAnswer> {
        let started = Instant::now();
        let allowed = allowed?;
        let principal = allowed.principal;
        let id = ExecutionId {
            tenant_id: principal.tenant_id.clone(),
            idempotency_key: allowed.idempotency_key.to_owned(),
        };
        let answer = self
            .begin_checked(
                id,
                allowed.tool,
                allowed.arguments_sha256.to_owned(),
                lease_ms,
            )
            .await;
        let seen = Seen {
            operation: "begin",
            peer,
            principal: Some(principal),
            decision_id: allowed.decision_id,
            idempotency_key: allowed.idempotency_key,
            started,
        };
        self.observe_begin(&seen, allowed.tool, allowed.arguments_sha256, &answer)
            .await;
        Some(answer)
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
        match self.store.begin_execution(step).await {
            Ok(answer) => answer,
            Err(e) => BeginAnswer::refused(&self.store_failure(&e)),
        }
    }

    /// `CompleteExecution`.
    ///
    /// # Errors
    /// [`RequestError::TenantNotGranted`] as for [`Self::begin`];
    /// [`RequestError::Invalid`] for a malformed request: auth, key, a zero token, no
    /// status, a success without a strictly valid JSON result, a result or
    /// error with a status that takes none, an oversized error.
    pub async fn complete(&self, req: CompleteRequest) -> Result<Settled, RequestError> {
        let started = Instant::now();
        let CompleteRequest {
            auth,
            idempotency_key,
            fencing_token,
            status,
            result_json,
            error,
        } = req;
        let principal = self.principal(&auth)?.into_result();
        check_key(&idempotency_key)?;
        if fencing_token == 0 {
            return Err(ExecutorError::new(
                "fencing_token",
                "is required: the token BeginExecution returned with ACQUIRED",
            )
            .into());
        }
        let status = status.ok_or_else(|| {
            ExecutorError::new("status", "must be one of the COMPLETION_STATUS_ values")
        })?;
        let error = check_error(error, &self.limits)?;
        if status == CompletionStatus::Succeeded && error.is_some() {
            return Err(ExecutorError::new("error", "not with COMPLETION_STATUS_SUCCEEDED").into());
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
        let settled = match &principal {
            Ok(p) => {
                let step = Complete {
                    id: ExecutionId {
                        tenant_id: p.tenant_id.clone(),
                        idempotency_key: idempotency_key.clone(),
                    },
                    fencing_token,
                    completion,
                    now: self.clock.now_ms(),
                    outputs: self.outputs(),
                };
                match self.store.complete_execution(step).await {
                    Ok(settled) => settled,
                    Err(e) => unsettled(&self.store_failure(&e)),
                }
            }
            Err(refusal) => unsettled(refusal),
        };
        let seen = Seen::request(
            "complete",
            &auth,
            principal.as_ref().ok(),
            &idempotency_key,
            started,
        );
        self.observe_settled(&seen, status.as_str(), Some(&settled))
            .await;
        Ok(settled)
    }

    /// `ReconcileExecution`; `Ok(None)` when the caller's tenant has no such record.
    ///
    /// # Errors
    /// [`RequestError::TenantNotGranted`] as for [`Self::begin`];
    /// [`RequestError::Invalid`] for a malformed request: auth, key, applied without
    /// a strictly valid JSON result, not applied with one.
    pub async fn reconcile(&self, req: ReconcileRequest) -> Result<Option<Settled>, RequestError> {
        let started = Instant::now();
        let ReconcileRequest {
            auth,
            idempotency_key,
            applied,
            result_json,
            fencing_token,
        } = req;
        let principal = self.principal(&auth)?.into_result();
        check_key(&idempotency_key)?;
        // Without the holder's token, only a caller granted `reconcile` for
        // this tenant may settle another executor's attempt.
        let principal = principal.and_then(|p| {
            if fencing_token == 0 && !auth.reconcile_tenants.allows(&p.tenant_id) {
                Err(Envelope::new(
                    ErrorCode::Forbidden,
                    "reconciling without the attempt's fencing token needs a `reconcile` grant \
                     for this tenant; nothing was changed",
                )
                .with("reason", "reconcile_not_granted"))
            } else {
                Ok(p)
            }
        });
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
        let settled = match &principal {
            Ok(p) => {
                let step = Reconcile {
                    id: ExecutionId {
                        tenant_id: p.tenant_id.clone(),
                        idempotency_key: idempotency_key.clone(),
                    },
                    holder_token: (fencing_token != 0).then_some(fencing_token),
                    verdict,
                    now: self.clock.now_ms(),
                    outputs: self.outputs(),
                };
                match self.store.reconcile_execution(step).await {
                    Ok(settled) => settled,
                    Err(e) => Some(unsettled(&self.store_failure(&e))),
                }
            }
            Err(refusal) => Some(unsettled(refusal)),
        };
        let seen = Seen::request(
            "reconcile",
            &auth,
            principal.as_ref().ok(),
            &idempotency_key,
            started,
        );
        let reported = if applied { "applied" } else { "not_applied" };
        self.observe_settled(&seen, reported, settled.as_ref())
            .await;
        Ok(settled)
    }

    /// `GetExecution`: the caller's tenant's record of this key, if any.
    ///
    /// # Errors
    /// [`LedgerError::Executor`] for a malformed request,
    /// [`LedgerError::TenantNotGranted`] as for [`Self::begin`],
    /// [`LedgerError::Unauthorized`] when the principal cannot be
    /// established, [`LedgerError::Unavailable`] when the store fails.
    pub async fn get(
        &self,
        auth: &ExecutorAuth,
        idempotency_key: &str,
    ) -> Result<Option<ExecutionRecord>, LedgerError> {
        let principal = self
            .principal(auth)?
            .into_result()
            .map_err(LedgerError::Unauthorized)?;
        check_key(idempotency_key)?;
        self.store
            .get_execution(&principal.tenant_id, idempotency_key)
            .await
            .map_err(|e| {
                self.store_failure(&e);
                LedgerError::Unavailable
            })
    }

    /// Deletes the settled records past retention (`Collect::covers`:
    /// never one whose call may have run), in batches of the configured
    /// size, each its own short transaction; returns how many.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    pub async fn collect_due(&self) -> Result<usize, StoreError> {
        let total = in_batches(|| async move {
            let collect = Collect::new(
                self.clock.now_ms(),
                self.config.retention,
                self.config.collect_batch,
            );
            Ok((self.store.collect_executions(collect).await?, collect.limit))
        })
        .await?;
        if total > 0 {
            tracing::info!(target: LEDGER_TARGET, collected = total, "execution records past retention collected");
        }
        Ok(total)
    }

    /// Makes final the FAILED_RETRYABLE operations nobody retried while a
    /// ticket could ([`crate::ledger::Lapse`]), their budget charges
    /// released in the same transaction; in batches like retention, each
    /// one audited. Returns how many.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    pub async fn lapse_due(&self) -> Result<usize, StoreError> {
        let total = in_batches(|| async move {
            let lapse = crate::ledger::Lapse::new(
                self.clock.now_ms(),
                self.config.ticket_ttl,
                self.config.collect_batch,
            );
            let lapsed = self.store.lapse_executions(lapse).await?;
            for one in &lapsed {
                self.observe_lapse(one).await;
            }
            Ok((lapsed.len(), lapse.limit))
        })
        .await?;
        if total > 0 {
            tracing::info!(target: LEDGER_TARGET, lapsed = total, "operations not retried before their tickets expired made final");
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

    fn store_failure(&self, e: &StoreError) -> Envelope {
        self.metrics.store_error();
        tracing::error!(target: LEDGER_TARGET, error = %e, "ledger store failure (fail closed)");
        Envelope::new(
            ErrorCode::InternalError,
            "the execution ledger could not be reached; nothing was changed, retry with the same key",
        )
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

/// The answer to a completion or reconciliation that changed nothing
/// because of `e` (the store failed, or the principal was refused).
fn unsettled(e: &Envelope) -> Settled {
    Settled {
        state: None,
        error: Some(e.into()),
        record: None,
    }
}
