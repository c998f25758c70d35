//! Which tools' calls need their session from the store (DESIGN §13.2):
//! read when a policy that may apply to the tool's action reads
//! `context.session`'s `labels`, `tools` or `calls`; added to when allowed
//! if the tool has labels or any policy reads `tools` or `calls`. Every
//! other call's `context.session` is its id and nothing else is asked of
//! the store, so stateless calls cost what they cost.

use std::collections::HashMap;

use cedar_policy::{Policy, PolicySet};
use serde_json::Value;

use super::slice::PolicySlices;
use crate::budgets::SessionUse;
use crate::tools::ToolRegistry;

/// What one policy reads of `context.session`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reads {
    /// `labels`, `tools` or `calls` (or the session, or the context, whole).
    state: bool,
    /// `tools` or `calls`: every allowed call of a session counts.
    history: bool,
}

impl Reads {
    const ALL: Self = Self {
        state: true,
        history: true,
    };

    fn with(self, other: Self) -> Self {
        Self {
            state: self.state || other.state,
            history: self.history || other.history,
        }
    }
}

/// Per tool, how the set uses its calls' sessions; a tool absent uses none.
pub(super) fn build(tools: &ToolRegistry, policies: &PolicySlices) -> HashMap<String, SessionUse> {
    let history = reads_of(policies.full()).history;
    let mut uses = HashMap::new();
    for tool in tools.iter() {
        let Ok(action) = super::parts::uid("Action", &tool.name) else {
            continue;
        };
        let use_ = SessionUse {
            reads: reads_of(policies.for_action(&action)).state,
            records: history || !tool.labels.is_empty(),
        };
        if use_.any() {
            uses.insert(tool.name.clone(), use_);
        }
    }
    uses
}

fn reads_of(set: &PolicySet) -> Reads {
    set.policies()
        .map(policy_reads)
        .fold(Reads::default(), Reads::with)
}

/// What `policy`'s conditions read of the session. A policy that cannot be
/// written out reads everything.
fn policy_reads(policy: &Policy) -> Reads {
    let Ok(est) = policy.to_json() else {
        return Reads::ALL;
    };
    let mut reads = Reads::default();
    if let Some(conditions) = est.get("conditions") {
        walk(conditions, &mut reads);
    }
    reads
}

fn is_var_context(v: &Value) -> bool {
    v.get("Var").and_then(Value::as_str) == Some("context")
}

/// `context.session` (or `context["session"]`, the same in the JSON form).
fn is_session(v: &Value) -> bool {
    v.get(".").is_some_and(|access| {
        access.get("left").is_some_and(is_var_context)
            && access.get("attr").and_then(Value::as_str) == Some("session")
    })
}

fn walk(v: &Value, reads: &mut Reads) {
    match v {
        Value::Object(map) => {
            if let Some(access) = map.get(".") {
                let left = access.get("left").unwrap_or(&Value::Null);
                let attr = access.get("attr").and_then(Value::as_str);
                if is_session(left) {
                    match attr {
                        Some("id") => {}
                        Some("labels") => reads.state = true,
                        _ => *reads = reads.with(Reads::ALL),
                    }
                    return;
                }
                if is_var_context(left) && attr == Some("session") {
                    // The session record itself, compared or passed whole.
                    *reads = reads.with(Reads::ALL);
                    return;
                }
                if is_var_context(left) {
                    return;
                }
                walk(left, reads);
                return;
            }
            if let Some(has) = map.get("has") {
                let left = has.get("left").unwrap_or(&Value::Null);
                if is_var_context(left) || is_session(left) {
                    // `context has session`, `context.session has labels`:
                    // the schema answers these, the state does not.
                    return;
                }
                walk(left, reads);
                return;
            }
            if is_var_context(v) {
                // The whole context, e.g. `context == {…}`.
                *reads = reads.with(Reads::ALL);
                return;
            }
            for value in map.values() {
                walk(value, reads);
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(item, reads);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(text: &str) -> Reads {
        let policy: Policy = text.parse().expect("the policy parses");
        policy_reads(&policy)
    }

    #[test]
    fn reads_follow_what_the_conditions_name() {
        let none = Reads::default();
        let state = Reads {
            state: true,
            history: false,
        };
        assert_eq!(reads("permit (principal, action, resource);"), none);
        assert_eq!(
            reads(r#"permit (principal, action, resource) when { context.session.id == "s" };"#),
            none
        );
        assert_eq!(
            reads(
                r#"permit (principal, action, resource) when { context has session && context.agent == "a" };"#
            ),
            none
        );
        assert_eq!(
            reads(
                r#"forbid (principal, action, resource) when { context.session.labels.contains("read_secret") };"#
            ),
            state
        );
        assert_eq!(
            reads(
                r#"forbid (principal, action, resource) when { context["session"]["labels"].isEmpty() };"#
            ),
            state
        );
        assert_eq!(
            reads("forbid (principal, action, resource) when { context.session.calls > 10 };"),
            Reads::ALL
        );
        assert_eq!(
            reads(
                r#"forbid (principal, action, resource) unless { context.session.tools.contains("x") };"#
            ),
            Reads::ALL
        );
        // Whole: the session or the context compared or passed as a value.
        assert_eq!(
            reads(
                r#"forbid (principal, action, resource) when { context.session == context.session };"#
            ),
            Reads::ALL
        );
        assert_eq!(
            reads(r#"forbid (principal, action, resource) when { context == {} };"#),
            Reads::ALL
        );
    }
}
