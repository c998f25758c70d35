//! What one call is charged (DESIGN §13.1): each counting budget's key and
//! amount, and what Cedar is shown of it once the store said what was
//! used. Rules only: the store reads the usage and makes the charge.
//!
//! The step a decision takes is optimistic and serialisable per key: the
//! store answers each key's `used` with its `version` (bumped by every
//! charge to it); Cedar decides on those values; the charge is made only
//! if no key's version moved since ([`Charge::seen_version`]), else the
//! decision is taken again on the new values. A charge made therefore
//! always lands on exactly the `used` its decision saw, or less (charges
//! left the window or were released in between): the allowed charges of
//! a window never sum above what each decision saw.

use serde_json::Value;

use super::{Budget, KeyPart, Measure};
use crate::identity::Caller;
use crate::tools::ToolContract;

/// One budget's key, as the store keeps it: the budget's name, the key's
/// canonical text (the tenant and each part of `per`), and the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetKey {
    pub budget: String,
    pub key: String,
    pub window_ms: i64,
}

/// What the store knows of one key at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Usage {
    /// What the charges in the window sum to, this call's own left out;
    /// `None` when the sum does not fit a Long.
    pub used: Option<i64>,
    /// Moves with every charge made to the key.
    pub version: i64,
    /// Whether this idempotency key already holds a live charge on it (a
    /// retry of the same operation: not charged again).
    pub charged: bool,
}

/// One key's charge, made only if its version is still `seen_version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub key: BudgetKey,
    pub amount: i64,
    pub seen_version: i64,
}

/// One budget as a call meets it: its key, what this call charges, its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meter {
    pub key: BudgetKey,
    pub this_call: i64,
    pub limit: i64,
}

/// `context.budgets.<name>` of one decision, and what its audit event keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Seen {
    pub name: String,
    pub used: i64,
    pub this_call: i64,
    pub limit: i64,
}

impl Seen {
    /// Whether the call takes the budget past its limit: `used +
    /// this_call > limit` (a sum past a Long is past any limit). What the
    /// over-limit counter counts and what an approval shows its approver.
    #[must_use]
    pub fn exceeded(&self) -> bool {
        self.used
            .checked_add(self.this_call)
            .is_none_or(|total| total > self.limit)
    }
}

/// Why a call's charge cannot be computed: a `budget_invalid` deny.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeterRefusal {
    /// The measure is negative (a schema without `minimum: 0` let it through).
    Negative { budget: String, pointer: String },
    /// The measure is not an integer that fits a Long.
    NotAnInteger { budget: String, pointer: String },
    /// `used + this_call` does not fit a Long.
    Overflow { budget: String },
}

impl MeterRefusal {
    /// The budget concerned.
    #[must_use]
    pub fn budget(&self) -> &str {
        match self {
            Self::Negative { budget, .. }
            | Self::NotAnInteger { budget, .. }
            | Self::Overflow { budget } => budget,
        }
    }

    /// `details.reason` of the deny.
    #[must_use]
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::Negative { .. } => "negative_measure",
            Self::NotAnInteger { .. } => "measure_not_an_integer",
            Self::Overflow { .. } => "overflow",
        }
    }

    /// The pointer of the measure, when the arguments are at fault.
    #[must_use]
    pub fn pointer(&self) -> Option<&str> {
        match self {
            Self::Negative { pointer, .. } | Self::NotAnInteger { pointer, .. } => Some(pointer),
            Self::Overflow { .. } => None,
        }
    }
}

/// The key of `budget` for a call by `caller` of `tool` with the normalized
/// arguments `args`: a JSON array of the tenant and each part of `per`, in
/// file order, each named (`["tenant","acme","agent","bot-1"]`), so no two
/// keys of one budget share a text. The resource is the contract's
/// resource id, or the tool's name for a tool without a resource. A call
/// without a session id is keyed by the empty session: every such call of
/// the subject shares it, so leaving the id out never escapes a budget.
#[must_use]
pub fn key_text(budget: &Budget, caller: &Caller, tool: &ToolContract, args: &Value) -> String {
    let mut parts: Vec<&str> = vec!["tenant", &caller.tenant_id];
    for part in &budget.per {
        let value = match part {
            KeyPart::Subject => caller.subject_id.as_str(),
            KeyPart::Agent => caller.agent_id.as_str(),
            KeyPart::Session => caller.session_id.as_str(),
            KeyPart::Resource => tool.resource_id(args).unwrap_or(tool.name.as_str()),
        };
        parts.push(part.as_str());
        parts.push(value);
    }
    // A list of strings always serialises.
    serde_json::to_string(&parts).unwrap_or_default()
}

/// What a call charges `budget`: 1, or the integer at the measure's
/// pointer of the normalized arguments.
///
/// # Errors
/// [`MeterRefusal::Negative`] or [`MeterRefusal::NotAnInteger`].
pub fn amount(budget: &Budget, args: &Value) -> Result<i64, MeterRefusal> {
    let Measure::Pointer(pointer) = &budget.measure else {
        return Ok(1);
    };
    let refusal = |negative: bool| {
        let (budget, pointer) = (budget.name.clone(), pointer.clone());
        if negative {
            MeterRefusal::Negative { budget, pointer }
        } else {
            MeterRefusal::NotAnInteger { budget, pointer }
        }
    };
    let value = args.pointer(pointer).ok_or_else(|| refusal(false))?;
    let n = match value.as_i64() {
        Some(n) => n,
        // JSON Schema's `integer` admits 10.0: the same integer.
        None => match value.as_f64() {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "the value is integral and within i64's range, checked first"
            )]
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => f as i64,
            Some(f) if f < 0.0 => return Err(refusal(true)),
            _ => return Err(refusal(false)),
        },
    };
    if n < 0 {
        return Err(refusal(true));
    }
    Ok(n)
}

/// Every budget of `budgets` as this call meets it, in their order.
///
/// # Errors
/// The first budget whose measure the arguments do not give.
pub fn meters(
    budgets: &[std::sync::Arc<Budget>],
    caller: &Caller,
    tool: &ToolContract,
    args: &Value,
) -> Result<Vec<Meter>, MeterRefusal> {
    budgets
        .iter()
        .map(|budget| {
            Ok(Meter {
                key: BudgetKey {
                    budget: budget.name.clone(),
                    key: key_text(budget, caller, tool, args),
                    window_ms: i64::try_from(budget.window.as_millis()).unwrap_or(i64::MAX),
                },
                this_call: amount(budget, args)?,
                limit: budget.limit,
            })
        })
        .collect()
}

/// What Cedar is shown of each meter given the store's `usage` (in the
/// same order).
///
/// # Errors
/// [`MeterRefusal::Overflow`] when a sum, or the sum with this call, does
/// not fit a Long: the policy could not compare it.
pub fn seen(meters: &[Meter], usage: &[Usage]) -> Result<Vec<Seen>, MeterRefusal> {
    meters
        .iter()
        .zip(usage)
        .map(|(meter, usage)| {
            let overflow = || MeterRefusal::Overflow {
                budget: meter.key.budget.clone(),
            };
            let used = usage.used.ok_or_else(overflow)?;
            used.checked_add(meter.this_call).ok_or_else(overflow)?;
            Ok(Seen {
                name: meter.key.budget.clone(),
                used,
                this_call: meter.this_call,
                limit: meter.limit,
            })
        })
        .collect()
}

/// The charges an allowed call makes: one per key it does not hold a live
/// charge on already (a retry is charged once).
#[must_use]
pub fn charges(meters: &[Meter], usage: &[Usage]) -> Vec<Charge> {
    meters
        .iter()
        .zip(usage)
        .filter(|(_, usage)| !usage.charged)
        .map(|(meter, usage)| Charge {
            key: meter.key.clone(),
            amount: meter.this_call,
            seen_version: usage.version,
        })
        .collect()
}
