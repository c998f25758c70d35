//! Data flow labels (DESIGN §13.2): what a session has touched, as Cedar
//! sees it in `context.session`, and what one allowed call adds to it.
//! Rules only: the store keeps the sessions, the pipeline decides.
//!
//! A session is (tenant, subject, `session_id`); a call without a session
//! id is the call alone (empty sets, 0) and never touches the store. Its
//! state is the union of the labels and of the tools of the calls allowed
//! in it, and their count. Like a budget's charge, a call that reads the
//! session and adds to it does so only on the version its decision read
//! (else the decision is taken again): two calls of one session that each
//! check what the other adds cannot both pass on a state neither saw.

use std::collections::BTreeSet;

use crate::identity::Caller;

/// How a policy set uses the session of calls of one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionUse {
    /// A policy that may apply to the tool's action reads `labels`,
    /// `tools` or `calls` of `context.session`.
    pub reads: bool,
    /// An allowed call is added to its session: the tool has labels, or
    /// some policy of the set reads `tools` or `calls`.
    pub records: bool,
}

impl SessionUse {
    /// Whether a call of the tool in a session needs the store at all.
    #[must_use]
    pub const fn any(self) -> bool {
        self.reads || self.records
    }
}

/// What the store knows of one session at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionState {
    /// The union of the labels of the calls allowed in it (the asking
    /// operation's own left out), sorted.
    pub labels: BTreeSet<String>,
    /// The tools of those calls, sorted.
    pub tools: BTreeSet<String>,
    /// How many there were.
    pub calls: i64,
    /// Moves with every call added; 0 for a session not (or no longer) kept.
    pub version: i64,
    /// Whether the asking operation is already one of its calls (a retry:
    /// not added again).
    pub recorded: bool,
}

/// One allowed call added to its session, only if the session's version
/// is still `seen_version` (`None`: its decision did not read the session,
/// so it is added whatever the version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub key: String,
    pub tool: String,
    pub labels: Vec<String>,
    pub seen_version: Option<i64>,
    /// How long the session is kept after this call, in milliseconds.
    pub idle_ms: i64,
}

/// `context.session` of one decision (its `id` aside), and what its audit
/// event keeps.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct SessionSeen {
    pub labels: BTreeSet<String>,
    pub tools: BTreeSet<String>,
    pub calls: i64,
}

impl From<&SessionState> for SessionSeen {
    fn from(state: &SessionState) -> Self {
        Self {
            labels: state.labels.clone(),
            tools: state.tools.clone(),
            calls: state.calls,
        }
    }
}

/// The key of the caller's session: `None` for a call without a session
/// id (the call alone). A JSON array of named parts, like a budget's key,
/// so no two sessions share a text.
#[must_use]
pub fn session_key(caller: &Caller) -> Option<String> {
    if caller.session_id.is_empty() {
        return None;
    }
    let parts = [
        "tenant",
        caller.tenant_id.as_str(),
        "subject",
        caller.subject_id.as_str(),
        "session",
        caller.session_id.as_str(),
    ];
    // A list of strings always serialises.
    Some(serde_json::to_string(&parts).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_without_a_session_id_has_no_session() {
        let mut caller = Caller {
            subject_id: "alice".into(),
            tenant_id: "acme".into(),
            scopes: Vec::new(),
            roles: Vec::new(),
            agent_id: String::new(),
            session_id: String::new(),
        };
        assert_eq!(session_key(&caller), None);
        caller.session_id = "s-1".into();
        assert_eq!(
            session_key(&caller).as_deref(),
            Some(r#"["tenant","acme","subject","alice","session","s-1"]"#)
        );
        // The subject is part of it: another subject's session of the same
        // id is another session.
        caller.subject_id = "bob".into();
        assert_eq!(
            session_key(&caller).as_deref(),
            Some(r#"["tenant","acme","subject","bob","session","s-1"]"#)
        );
    }
}
