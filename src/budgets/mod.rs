//! Budget files (`policies/budgets/<name>.json`, DESIGN §13.1): what a
//! budget counts, keyed by what, over which window, measured how, and the
//! limit policies are shown.
//!
//! Owns the file format and every load-time rule about a budget: its name,
//! the tools and risks it counts (each tool a loaded contract), its key, its
//! window, and a measure's pointer, which every counted tool's input schema
//! must make a required integer (`context.input` types it `Long`, so the
//! charge is the exact integer Cedar sees). Rules, not IO: reading the files
//! is [`load_dir`]'s only IO; nothing here charges, stores or decides.
//!
//! | field | required | meaning |
//! |---|---|---|
//! | `name` | yes | `^[a-z][a-z0-9_]{0,63}$`, the file's stem; the attribute under `context.budgets` |
//! | `tools` | one of the two | tool names (each a loaded contract) |
//! | `risks` | one of the two | risk levels |
//! | `per` | no (`[]`) | the key besides the tenant: `subject`, `agent`, `session`, `resource`, each at most once |
//! | `windowSeconds` | yes | 1 to 31,622,400 (366 days): a sliding window |
//! | `measure` | no | absent: each call counts 1; `{"pointer": "/amount_cents"}`: the integer there; `"decimals": 2` shows approvers 62000 as 620.00 |
//! | `limit` | yes | an integer from 0, shown to policies; toolgate never compares |

mod charge;
mod session;

pub use charge::{
    BudgetKey, Charge, Meter, MeterRefusal, Seen, Usage, amount, charges, key_text, meters, seen,
};
pub use session::{SessionRecord, SessionSeen, SessionState, SessionUse, session_key};

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::decode::{self, Limits};
use crate::tools::source::{self, Position};
use crate::tools::{InputType, Risk, ToolContract, ToolRegistry, pointer};

/// The longest window: a year, leap day included.
pub const MAX_WINDOW_SECONDS: u64 = 366 * 86_400;

/// One loaded budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub name: String,
    /// The tools it counts, by name.
    pub tools: BTreeSet<String>,
    /// The risks it counts: a call of any tool of one of them.
    pub risks: BTreeSet<Risk>,
    /// The key besides the tenant, in file order.
    pub per: Vec<KeyPart>,
    pub window: Duration,
    pub measure: Measure,
    pub limit: i64,
    /// How its integers are shown to approvers (`measure.decimals`): 2
    /// shows 62000 as 620.00. Never part of a decision.
    pub decimals: u8,
    /// The file it was read from, and its text (part of the policy version).
    pub source_path: PathBuf,
    pub source_text: String,
}

/// A part of a budget's key (the tenant is always one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyPart {
    Subject,
    Agent,
    Session,
    Resource,
}

impl KeyPart {
    /// The name used in budget files.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Subject => "subject",
            Self::Agent => "agent",
            Self::Session => "session",
            Self::Resource => "resource",
        }
    }
}

/// What one counted call charges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    /// 1 per call: a rate.
    Count,
    /// The integer at this pointer of the normalized arguments.
    Pointer(String),
}

impl Budget {
    /// Whether a call of `tool` is counted: its name is listed, or its risk.
    #[must_use]
    pub fn counts(&self, tool: &ToolContract) -> bool {
        self.tools.contains(&tool.name) || self.risks.contains(&tool.risk)
    }
}

/// The budgets of one policy set, and per tool the ones that count it.
#[derive(Debug, Clone, Default)]
pub struct Budgets {
    all: Vec<Arc<Budget>>,
    by_tool: HashMap<String, Vec<Arc<Budget>>>,
}

impl Budgets {
    /// `all` (in name order) indexed by the tools of `tools` each counts.
    #[must_use]
    pub fn new(all: Vec<Budget>, tools: &ToolRegistry) -> Self {
        let all: Vec<Arc<Budget>> = all.into_iter().map(Arc::new).collect();
        let mut by_tool: HashMap<String, Vec<Arc<Budget>>> = HashMap::new();
        for tool in tools.iter() {
            let counting: Vec<Arc<Budget>> =
                all.iter().filter(|b| b.counts(tool)).cloned().collect();
            if !counting.is_empty() {
                by_tool.insert(tool.name.clone(), counting);
            }
        }
        Self { all, by_tool }
    }

    /// Every budget, in name order.
    #[must_use]
    pub fn all(&self) -> &[Arc<Budget>] {
        &self.all
    }

    /// The budgets that count calls of `tool`, in name order (none: the
    /// call is stateless).
    #[must_use]
    pub fn of_tool(&self, tool: &str) -> &[Arc<Budget>] {
        self.by_tool.get(tool).map_or(&[], Vec::as_slice)
    }
}

/// Why a budget file cannot be loaded; `path` is the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct BudgetError {
    pub path: PathBuf,
    pub message: String,
    /// The 1-based line and column the problem is at, when known.
    pub at: Option<(usize, usize)>,
}

impl BudgetError {
    fn new(path: &Path, message: impl Into<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            message: message.into(),
            at: None,
        }
    }

    /// Located at the member `pointer` names in `text`.
    fn at_member(mut self, text: &str, pointer: &str) -> Self {
        self.at = source::locate(text, pointer).map(|p| (p.line, p.column));
        self
    }
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBudget {
    name: String,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    risks: Vec<String>,
    #[serde(default)]
    per: Vec<KeyPart>,
    window_seconds: u64,
    measure: Option<RawMeasure>,
    limit: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeasure {
    pointer: String,
    #[serde(default)]
    decimals: u8,
}

/// The most decimals a measure is shown with (an `i64` has 19 digits).
pub const MAX_DECIMALS: u8 = 18;

/// Whether `name` is a budget name: `^[a-z][a-z0-9_]{0,63}$`, the rule of
/// a session label ([`crate::tools::is_valid_label`]).
#[must_use]
pub fn is_name(name: &str) -> bool {
    crate::tools::is_valid_label(name)
}

/// Reads the budget in `text` (the file at `path`) against the loaded
/// contracts `tools`.
///
/// # Errors
/// A [`BudgetError`] naming the first broken rule.
pub fn parse(path: &Path, text: &str, tools: &ToolRegistry) -> Result<Budget, BudgetError> {
    decode::parse_strict(text.as_bytes(), &Limits::default()).map_err(|e| {
        let mut error = BudgetError::new(path, format!("not a valid JSON document: {e}"));
        error.at = e
            .position()
            .map(|offset| Position::at(text, offset))
            .map(|p| (p.line, p.column));
        error
    })?;
    // The strict parse refused duplicates; serde_json locates the rest.
    let raw: RawBudget = serde_json::from_str(text).map_err(|e| {
        let mut error = BudgetError::new(path, format!("not a budget: {e}"));
        let p = Position::from_line_column(text, e.line(), e.column());
        error.at = Some((p.line, p.column));
        error
    })?;
    let error =
        |message: String, member: &str| BudgetError::new(path, message).at_member(text, member);
    if !is_name(&raw.name) {
        return Err(error(
            format!("name `{}` must match ^[a-z][a-z0-9_]{{0,63}}$", raw.name),
            "/name",
        ));
    }
    if path.file_stem().and_then(|s| s.to_str()) != Some(raw.name.as_str()) {
        return Err(error(
            format!("a budget named `{}` belongs in {}.json", raw.name, raw.name),
            "/name",
        ));
    }
    if raw.tools.is_empty() && raw.risks.is_empty() {
        return Err(error(
            "counts nothing: give `tools`, `risks` or both".into(),
            "",
        ));
    }
    let mut names = BTreeSet::new();
    for tool in raw.tools {
        if tools.get(&tool).is_none() {
            return Err(error(
                format!("`tools` names `{tool}`, which no contract defines"),
                "/tools",
            ));
        }
        if !names.insert(tool.clone()) {
            return Err(error(format!("`tools` names `{tool}` twice"), "/tools"));
        }
    }
    let mut risks = BTreeSet::new();
    for name in raw.risks {
        let risk = Risk::parse(&name).ok_or_else(|| {
            error(
                format!("`risks` names `{name}`: read, write, external, financial or destructive"),
                "/risks",
            )
        })?;
        if !risks.insert(risk) {
            return Err(error(format!("`risks` names `{name}` twice"), "/risks"));
        }
    }
    let mut seen = BTreeSet::new();
    if let Some(again) = raw.per.iter().find(|p| !seen.insert(**p)) {
        return Err(error(
            format!("`per` names {} twice", again.as_str()),
            "/per",
        ));
    }
    if !(1..=MAX_WINDOW_SECONDS).contains(&raw.window_seconds) {
        return Err(error(
            format!("`windowSeconds` must be from 1 to {MAX_WINDOW_SECONDS}"),
            "/windowSeconds",
        ));
    }
    if raw.limit < 0 {
        return Err(error("`limit` must not be negative".into(), "/limit"));
    }
    let decimals = raw.measure.as_ref().map_or(0, |m| m.decimals);
    if decimals > MAX_DECIMALS {
        return Err(error(
            format!("`measure.decimals` must be from 0 to {MAX_DECIMALS}"),
            "/measure/decimals",
        ));
    }
    let budget = Budget {
        name: raw.name,
        tools: names,
        risks,
        per: raw.per,
        window: Duration::from_secs(raw.window_seconds),
        measure: raw
            .measure
            .map_or(Measure::Count, |m| Measure::Pointer(m.pointer)),
        limit: raw.limit,
        decimals,
        source_path: path.to_path_buf(),
        source_text: text.to_owned(),
    };
    if let Measure::Pointer(pointer) = &budget.measure {
        for tool in tools.iter().filter(|t| budget.counts(t)) {
            if !is_required_long(&tool.input_type, pointer) {
                return Err(error(
                    format!(
                        "`measure.pointer` `{pointer}` must name a required integer of every tool \
                         the budget counts; `{}`'s input schema does not make it one",
                        tool.name
                    ),
                    "/measure/pointer",
                ));
            }
        }
    }
    Ok(budget)
}

/// Whether every valid value of `ty` has a `Long` at `pointer`: each
/// segment a required field of a record.
fn is_required_long(ty: &InputType, pointer: &str) -> bool {
    if !pointer::is_valid(pointer) || pointer.is_empty() {
        return false;
    }
    let mut at = ty;
    for segment in pointer::segments(pointer) {
        let InputType::Record(fields) = at else {
            return false;
        };
        let Some(field) = fields.iter().find(|f| f.name == segment && f.required) else {
            return false;
        };
        at = &field.ty;
    }
    *at == InputType::Long
}

/// Every budget in `dir` (`*.json`, in name order) against `tools`; none
/// when the folder does not exist.
///
/// # Errors
/// The first file that cannot be read or loaded.
pub fn load_dir(dir: &Path, tools: &ToolRegistry) -> Result<Vec<Budget>, BudgetError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(BudgetError::new(dir, format!("cannot read: {e}"))),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| BudgetError::new(dir, format!("cannot read: {e}")))?
            .path();
        let visible = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !n.starts_with('.'));
        if visible && path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
    files.sort();
    let mut budgets = Vec::with_capacity(files.len());
    for path in files {
        let text = fs::read_to_string(&path)
            .map_err(|e| BudgetError::new(&path, format!("cannot read: {e}")))?;
        budgets.push(parse(&path, &text, tools)?);
    }
    Ok(budgets)
}

#[cfg(test)]
mod model_check;
#[cfg(test)]
mod tests;
