//! Cedar: schema generation, policy loading and validation, slicing,
//! evaluation and reload (DESIGN §3.2, §3.3, §9).
//!
//! This is the only module that imports `cedar_policy`. It turns a
//! `policies/` folder into a [`PolicyEngine`] — a validated, immutable unit
//! of schema, policies (sliced per action), tool contracts and static
//! entities — answers Cedar questions about one tool call, and replaces the
//! live engine when the folder changes ([`PolicyReloader`],
//! [`start_reloads`]). `plain` (a test helper) evaluates bare Cedar requests through the
//! same evaluation function, for Cedar's own integration tests. It knows
//! nothing of gRPC, storage or approvals beyond the boolean "a valid
//! approval was presented".
//!
//! Invariants:
//! - An engine exists only if every policy validated in strict mode against
//!   the combined schema; a broken set never goes live, and a failed reload
//!   keeps the last good one.
//! - Evaluation fails closed: any policy evaluation error is
//!   [`PolicyDecision::Errored`], never an allow.
//! - A decision evaluates its action's slice, which holds every policy whose
//!   action scope can match (see the `INVARIANT` in `slice.rs`): slicing
//!   never changes a decision, its determining policies or its errors.

mod callable;
mod decide;
mod diagnostic;
mod load;
mod parts;
#[cfg(any(test, feature = "test-support"))]
pub mod plain;
mod principals;
mod reach;
mod reload;
pub mod schema;
mod sessions;
mod slice;
mod stored;
mod values;
mod watch;

#[cfg(test)]
mod callable_tests;
#[cfg(test)]
mod cedar_conformance_tests;

pub use callable::{HiddenReason, ToolReach};
pub use decide::{ApprovalSubject, PolicyDecision, ToolCall};
pub use diagnostic::{Severity, SourceDiagnostic, codes, line_column};
pub use load::{LoadErrors, PolicyLoadError};
pub use parts::{BuildError, DecideError, InvalidEntities};
pub use reload::{PolicyReloader, PolicyStatus, ReloadFailure, ReloadMetrics, ReloadOutcome};
pub use watch::{ReloadTriggers, start_reloads};

use cedar_policy::Schema;

use self::callable::CallableIndex;
use self::principals::PrincipalBases;
use self::reach::RequestBases;
use self::slice::PolicySlices;

use std::collections::HashMap;

use crate::budgets::{Budgets, SessionUse};
use crate::tools::ToolRegistry;

/// A loaded, validated policy deployment. Immutable: a reload builds a new one.
pub struct PolicyEngine {
    tools: ToolRegistry,
    /// The budgets of DESIGN §13.1, and per tool the ones that count it.
    budgets: Budgets,
    /// Per tool, how its calls use their session (DESIGN §13.2); a tool
    /// absent uses none.
    sessions: HashMap<String, SessionUse>,
    schema: Schema,
    /// Every policy, and per action the slice a decision evaluates.
    policies: PolicySlices,
    /// The static entities, and per action the part a request can reach.
    static_entities: RequestBases,
    /// Per tool and caller, the base with the principal (see `principals`).
    principal_bases: PrincipalBases,
    /// Per tool, what "which tools may this principal call" needs (§11.4).
    callable: CallableIndex,
    schema_text: String,
    version: String,
    warnings: Vec<SourceDiagnostic>,
}

impl std::fmt::Debug for PolicyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("version", &self.version)
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}

impl PolicyEngine {
    /// The tool contracts of this deployment.
    #[must_use]
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The budgets of this deployment.
    #[must_use]
    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    /// How calls of `tool` use their session (DESIGN §13.2): neither read
    /// nor added to for a tool no policy or label concerns.
    #[must_use]
    pub fn session_use(&self, tool: &str) -> SessionUse {
        self.sessions.get(tool).copied().unwrap_or_default()
    }

    /// `context.budgets` of a call of `tool` when nothing was charged yet
    /// (used 0, this call 0): for tests that ask Cedar without a store.
    #[cfg(test)]
    pub(crate) fn unspent_budgets(&self, tool: &str) -> Vec<crate::budgets::Seen> {
        self.budgets
            .of_tool(tool)
            .iter()
            .map(|b| crate::budgets::Seen {
                name: b.name.clone(),
                used: 0,
                this_call: 0,
                limit: b.limit,
            })
            .collect()
    }

    /// A hash of every loaded file: changes exactly when their content does.
    #[must_use]
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The combined Cedar schema (generated part and the team's), as text
    /// Cedar's own CLI accepts.
    #[must_use]
    pub fn schema_text(&self) -> &str {
        &self.schema_text
    }

    /// Validator warnings found at load (the set is live despite them).
    #[must_use]
    pub fn warnings(&self) -> &[SourceDiagnostic] {
        &self.warnings
    }

    /// How many policies are loaded.
    #[must_use]
    pub fn policy_count(&self) -> usize {
        self.policies.full().policies().count()
    }

    /// Every policy id (its `@id`, else `<file>#<index>`), sorted.
    #[must_use]
    pub fn policy_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .policies
            .full()
            .policies()
            .map(|p| p.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// The most policies any one action evaluates (its slice).
    #[must_use]
    pub fn largest_slice(&self) -> usize {
        self.policies.largest_slice()
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};

    fn copy_dir(src: &Path, dst: &Path) {
        std::fs::create_dir_all(dst).unwrap();
        for entry in std::fs::read_dir(src).unwrap() {
            let entry = entry.unwrap();
            let to = dst.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &to);
            } else {
                std::fs::copy(entry.path(), to).unwrap();
            }
        }
    }

    /// A copy of the example `policies/` in a temporary folder, to edit.
    pub(crate) fn examples() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("policies");
        copy_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("policies"),
            &dir,
        );
        (tmp, dir)
    }
}
