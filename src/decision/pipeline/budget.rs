//! The budget stage (DESIGN §13.1): Cedar's question asked on what each
//! budget counting the call has used, and an ALLOW charged in the same
//! serialisable step as the decision that relied on it.
//!
//! The step is optimistic: the store answers each key's usage with its
//! version, Cedar decides on it, and the charge is made only if no key
//! moved since; if one did (another call was charged to it in between, on
//! this replica or another), the decision is taken again on the new usage,
//! at most [`MAX_ROUNDS`] times. A call no budget counts makes no store
//! access here.

use super::refusal::{Stop, budget_invalid, evaluation_refused, store_unavailable};
use super::{Hashed, ToolCallAuthorizer};
use crate::budgets::{self, Meter, Seen};
use crate::clock::UnixMillis;
use crate::identity::Caller;
use crate::policy::{PolicyDecision, PolicyEngine, ToolCall};

/// The most times one decision is taken again because its keys moved
/// before the charge: each round lost means another call was charged, so
/// this bounds only a pathological contention, answered as retryable.
pub(super) const MAX_ROUNDS: usize = 64;

/// A decision on budgets, and whether it charged them.
pub(super) struct Budgeted {
    pub(super) decision: PolicyDecision,
    pub(super) seen: Vec<Seen>,
    pub(super) charged: bool,
}

impl ToolCallAuthorizer {
    /// The budgets counting the call as it meets them: none for a call no
    /// budget counts.
    pub(super) fn meters(
        engine: &PolicyEngine,
        hashed: &Hashed<'_>,
        caller: &Caller,
    ) -> Result<Vec<Meter>, Stop> {
        let counting = engine.budgets().of_tool(&hashed.tool.name);
        if counting.is_empty() {
            return Ok(Vec::new());
        }
        budgets::meters(counting, caller, hashed.tool, &hashed.args)
            .map_err(|refusal| Stop::Deny(budget_invalid(&refusal)))
    }

    /// Cedar's answer for `call` (its `budgets` filled here), the ALLOW
    /// charged to every meter, the whole step taken again while a key
    /// moved under it. `from_store`: the entities are the entity store's
    /// (the caller gave none), so entities that do not fit are no caller's
    /// mistake.
    pub(super) async fn decide_budgeted(
        &self,
        engine: &PolicyEngine,
        call: ToolCall<'_>,
        meters: &[Meter],
        hashed: &Hashed<'_>,
        now: UnixMillis,
        from_store: bool,
    ) -> Result<Budgeted, Stop> {
        let refused = |e| evaluation_refused(e, from_store, hashed.tool);
        if meters.is_empty() {
            let decision = engine.decide_tool_call(&call).map_err(refused)?;
            return Ok(Budgeted {
                decision,
                seen: Vec::new(),
                charged: false,
            });
        }
        let tenant = &call.caller.tenant_id;
        let keys: Vec<budgets::BudgetKey> = meters.iter().map(|m| m.key.clone()).collect();
        for _ in 0..MAX_ROUNDS {
            let usage = match self
                .store
                .budget_usage(tenant, &hashed.key, &keys, now)
                .await
            {
                Ok(usage) => usage,
                Err(e) => return Err(Stop::Deny(self.budget_store_failed(&e))),
            };
            let seen = budgets::seen(meters, &usage)
                .map_err(|refusal| Stop::Deny(budget_invalid(&refusal)))?;
            let decision = engine
                .decide_tool_call(&ToolCall {
                    budgets: &seen,
                    ..call
                })
                .map_err(refused)?;
            if !matches!(decision, PolicyDecision::Allow { .. }) {
                for over in seen
                    .iter()
                    .filter(|b| b.used.saturating_add(b.this_call) > b.limit)
                {
                    self.metrics.budget_over_limit(&over.name);
                }
                return Ok(Budgeted {
                    decision,
                    seen,
                    charged: false,
                });
            }
            let charges = budgets::charges(meters, &usage);
            if charges.is_empty() {
                // A retry of an operation already charged: not again.
                return Ok(Budgeted {
                    decision,
                    seen,
                    charged: false,
                });
            }
            match self
                .store
                .charge_budgets(tenant, &hashed.key, &charges, now)
                .await
            {
                Ok(true) => {
                    for charge in &charges {
                        self.metrics.budget_charged(&charge.key.budget);
                    }
                    return Ok(Budgeted {
                        decision,
                        seen,
                        charged: true,
                    });
                }
                Ok(false) => {}
                Err(e) => return Err(Stop::Deny(self.budget_store_failed(&e))),
            }
        }
        tracing::warn!(tool = %hashed.tool.name, rounds = MAX_ROUNDS, "a budget key kept moving under its decision: refused as retryable");
        Err(Stop::Deny(store_unavailable().with("reason", "contended")))
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
