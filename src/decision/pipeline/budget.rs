//! The budget stage (DESIGN §13.1): Cedar's question asked on what each
//! budget counting the call has used, and an ALLOW charged in the same
//! serialisable step as the decision that relied on it.
//!
//! The step is optimistic: the store answers each key's usage with its
//! version, Cedar decides on it, and the charge is made only if no key
//! moved since; if one did (another call was charged to it in between, on
//! this replica or another), the decision is taken again on the new usage,
//! at most [`MAX_ROUNDS`] times. The session (DESIGN §13.2) takes the
//! same step: read with its version, the allowed call added only on that
//! version. A call no budget counts and whose session no policy or label
//! concerns makes no store access here.

use super::refusal::{Stop, budget_invalid, evaluation_refused, store_unavailable};
use super::{AcrossCalls, Hashed, SessionNeed, ToolCallAuthorizer};
use crate::budgets::{self, Seen, SessionRecord, SessionSeen};
use crate::clock::UnixMillis;
use crate::identity::Caller;
use crate::policy::{PolicyDecision, PolicyEngine, ToolCall};

/// The most times one decision is taken again because its keys moved
/// before the charge: each round lost means another call was charged, so
/// this bounds only a pathological contention, answered as retryable.
pub(super) const MAX_ROUNDS: usize = 64;

/// A decision on budgets and the session, and whether it charged them.
pub(super) struct Budgeted {
    pub(super) decision: PolicyDecision,
    pub(super) seen: Vec<Seen>,
    /// What the decision saw of the session, when it read it.
    pub(super) session: Option<SessionSeen>,
    pub(super) charged: bool,
}

impl ToolCallAuthorizer {
    /// The budgets counting the call as it meets them, and its session
    /// when the set reads or adds to it: nothing for a stateless call.
    pub(super) fn across(
        engine: &PolicyEngine,
        hashed: &Hashed<'_>,
        caller: &Caller,
    ) -> Result<AcrossCalls, Stop> {
        let uses = engine.session_use(&hashed.tool.name);
        let session = if uses.any() {
            budgets::session_key(caller).map(|key| SessionNeed { key, uses })
        } else {
            None
        };
        let counting = engine.budgets().of_tool(&hashed.tool.name);
        let meters = if counting.is_empty() {
            Vec::new()
        } else {
            budgets::meters(counting, caller, hashed.tool, &hashed.args)
                .map_err(|refusal| Stop::Deny(budget_invalid(&refusal)))?
        };
        Ok(AcrossCalls { meters, session })
    }

    /// Cedar's answer for `call` (its `budgets` and `session` filled here),
    /// the ALLOW charged to every meter and added to the session, the whole
    /// step taken again while a key or the session moved under it.
    /// `from_store`: the entities are the entity store's (the caller gave
    /// none), so entities that do not fit are no caller's mistake.
    pub(super) async fn decide_budgeted(
        &self,
        engine: &PolicyEngine,
        call: ToolCall<'_>,
        across: &AcrossCalls,
        hashed: &Hashed<'_>,
        now: UnixMillis,
        from_store: bool,
    ) -> Result<Budgeted, Stop> {
        let refused = |e| evaluation_refused(e, from_store, hashed.tool);
        if across.is_empty() {
            let decision = engine.decide_tool_call(&call).map_err(refused)?;
            return Ok(Budgeted {
                decision,
                seen: Vec::new(),
                session: None,
                charged: false,
            });
        }
        let tenant = &call.caller.tenant_id;
        let meters = &across.meters;
        let keys: Vec<budgets::BudgetKey> = meters.iter().map(|m| m.key.clone()).collect();
        for _ in 0..MAX_ROUNDS {
            let usage = if keys.is_empty() {
                Vec::new()
            } else {
                self.store
                    .budget_usage(tenant, &hashed.key, &keys, now)
                    .await
                    .map_err(|e| Stop::Deny(self.budget_store_failed(&e)))?
            };
            let seen = budgets::seen(meters, &usage)
                .map_err(|refusal| Stop::Deny(budget_invalid(&refusal)))?;
            let state = match &across.session {
                Some(need) if need.uses.reads => Some(
                    self.store
                        .session_state(tenant, &need.key, &hashed.key, now)
                        .await
                        .map_err(|e| Stop::Deny(self.budget_store_failed(&e)))?,
                ),
                _ => None,
            };
            let session = state.as_ref().map(SessionSeen::from);
            let decision = engine
                .decide_tool_call(&ToolCall {
                    budgets: &seen,
                    session: session.as_ref(),
                    ..call
                })
                .map_err(refused)?;
            if !matches!(decision, PolicyDecision::Allow { .. }) {
                for over in seen.iter().filter(|b| b.exceeded()) {
                    self.metrics.budget_over_limit(&over.name);
                }
                return Ok(Budgeted {
                    decision,
                    seen,
                    session,
                    charged: false,
                });
            }
            // A retry of an operation already charged is not charged again.
            let charges = budgets::charges(meters, &usage);
            if !charges.is_empty() {
                match self
                    .store
                    .charge_budgets(tenant, &hashed.key, &charges, now)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => return Err(Stop::Deny(self.budget_store_failed(&e))),
                }
            }
            let charged = !charges.is_empty();
            if let Some(need) = &across.session
                && need.uses.records
                && !state.as_ref().is_some_and(|s| s.recorded)
            {
                let record = SessionRecord {
                    key: need.key.clone(),
                    tool: hashed.tool.name.clone(),
                    labels: hashed.tool.labels.clone(),
                    seen_version: state.as_ref().map(|s| s.version),
                    idle_ms: i64::try_from(self.config.session_idle.as_millis())
                        .unwrap_or(i64::MAX),
                };
                let added = self
                    .store
                    .record_session(tenant, &hashed.key, &record, now)
                    .await;
                if !matches!(added, Ok(true)) && charged {
                    // The charge stood on a decision that does not: taken
                    // back before deciding again (or refusing).
                    self.take_back(tenant, &hashed.key, now).await;
                }
                match added {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => return Err(Stop::Deny(self.budget_store_failed(&e))),
                }
            }
            for charge in &charges {
                self.metrics.budget_charged(&charge.key.budget);
            }
            return Ok(Budgeted {
                decision,
                seen,
                session,
                charged,
            });
        }
        tracing::warn!(tool = %hashed.tool.name, rounds = MAX_ROUNDS, "a budget key or session kept moving under its decision: refused as retryable");
        Err(Stop::Deny(store_unavailable().with("reason", "contended")))
    }

    /// Releases the charges this round made, before it is taken again: no
    /// metric counts them (they were never reported as charged). A release
    /// that fails leaves the charge: more used than spent, never less.
    async fn take_back(&self, tenant_id: &str, key: &str, now: UnixMillis) {
        if let Err(e) = self.store.release_charges(tenant_id, key, now).await {
            self.metrics.store_error();
            tracing::error!(error = %e, "a charge of a decision taken again could not be released");
        }
    }

    /// The charges of an operation whose ALLOW did not stand (a presented
    /// approval turned out unusable, the audit log refused the decision):
    /// released, so only calls that were allowed hold charges. A release
    /// that fails leaves the charge: more used than spent, never less.
    pub(super) async fn uncharge(&self, caller: &Caller, key: &str, now: UnixMillis) {
        match self
            .store
            .release_charges(&caller.tenant_id, key, now)
            .await
        {
            Ok(names) => {
                for name in &names {
                    self.metrics.budget_released(name);
                }
            }
            Err(e) => {
                self.metrics.store_error();
                tracing::error!(error = %e, "a charge of a call that was not allowed could not be released");
            }
        }
    }

    fn budget_store_failed(&self, e: &crate::store::StoreError) -> crate::envelope::Envelope {
        self.metrics.store_error();
        tracing::error!(error = %e, "store failure during a budgeted decision: refused (fail closed)");
        store_unavailable()
    }
}
