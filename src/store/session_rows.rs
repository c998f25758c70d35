//! What both backends keep of a session (DESIGN §13.2), as rows: the
//! session's labels and tools as sorted JSON arrays of strings, its count,
//! version and expiry; and one row per call added, with its own tool and
//! labels, so a retry of a call is told its session without itself.

use std::collections::BTreeSet;

use super::StoreError;
use crate::budgets::{SessionRecord, SessionState};
use crate::clock::UnixMillis;

/// A set of strings as a row keeps it.
pub(super) fn text_of(set: &BTreeSet<String>) -> String {
    // A set of strings always serialises.
    serde_json::to_string(set).unwrap_or_default()
}

/// A row's set of strings.
pub(super) fn set_of(text: &str) -> Result<BTreeSet<String>, StoreError> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Corrupt(format!(
            "a session's labels or tools are not a list of strings: {e}"
        ))
    })
}

/// The session row as it stands: `(labels, tools, calls, version, expires_at)`.
pub(super) struct SessionRow {
    pub(super) labels: String,
    pub(super) tools: String,
    pub(super) calls: i64,
    pub(super) version: i64,
    pub(super) expires_at: UnixMillis,
}

impl SessionRow {
    /// Whether the session is still kept at `now` (not idle past its time).
    pub(super) const fn live(&self, now: UnixMillis) -> bool {
        self.expires_at > now
    }
}

/// The state a decision is shown: an absent or idle session is empty with
/// its version; a live one as its row says, or (for an operation already
/// in it) as its other calls say.
pub(super) fn state_of(
    row: Option<&SessionRow>,
    now: UnixMillis,
    own: Option<Vec<(String, String)>>,
) -> Result<SessionState, StoreError> {
    let Some(row) = row else {
        return Ok(SessionState::default());
    };
    if !row.live(now) {
        return Ok(SessionState {
            version: row.version,
            ..SessionState::default()
        });
    }
    match own {
        None => Ok(SessionState {
            labels: set_of(&row.labels)?,
            tools: set_of(&row.tools)?,
            calls: row.calls,
            version: row.version,
            recorded: false,
        }),
        Some(others) => {
            let mut state = SessionState {
                version: row.version,
                recorded: true,
                ..SessionState::default()
            };
            for (tool, labels) in others {
                state.tools.insert(tool);
                state.labels.extend(set_of(&labels)?);
                state.calls = state.calls.saturating_add(1);
            }
            Ok(state)
        }
    }
}

/// The row after `record` joins it at `now`: `None` when the session
/// moved since its decision read it.
pub(super) fn joined(
    row: Option<&SessionRow>,
    record: &SessionRecord,
    now: UnixMillis,
) -> Result<Option<SessionRow>, StoreError> {
    let version = row.map_or(0, |r| r.version);
    if record.seen_version.is_some_and(|seen| seen != version) {
        return Ok(None);
    }
    let live = row.filter(|r| r.live(now));
    let (mut labels, mut tools, calls) = match live {
        Some(r) => (set_of(&r.labels)?, set_of(&r.tools)?, r.calls),
        None => (BTreeSet::new(), BTreeSet::new(), 0),
    };
    labels.extend(record.labels.iter().cloned());
    tools.insert(record.tool.clone());
    let expires_at = now.saturating_add(record.idle_ms);
    Ok(Some(SessionRow {
        labels: text_of(&labels),
        tools: text_of(&tools),
        calls: calls.saturating_add(1),
        version: version.saturating_add(1),
        expires_at: live.map_or(expires_at, |r| r.expires_at.max(expires_at)),
    }))
}

/// A call's own labels, as its row keeps them.
pub(super) fn labels_text(record: &SessionRecord) -> String {
    text_of(&record.labels.iter().cloned().collect())
}
