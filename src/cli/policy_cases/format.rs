//! The case file format (`policies/tests/*.json`), parsed strictly: unknown
//! fields, duplicate keys and contradictory cases are errors located by
//! file, line and column. The raw serde structs stay in this file; the
//! runner sees only the validated [`CaseFile`].

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::decision::Decision;
use crate::identity::Caller;
use crate::policy::SourceDiagnostic;
use crate::tools::source::{Position, first_duplicate_key, locate};

/// The stable kind of every case file problem.
pub const CODE: &str = "toolgate::policy_test";

/// The `request_id` of a call case that names none: every tool whose risk
/// is not `read` needs one, and a test is one operation.
pub const DEFAULT_REQUEST_ID: &str = "policy-test";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    description: Option<String>,
    /// Defaults for the cases of this file.
    #[serde(default)]
    auth: Option<RawAuth>,
    #[serde(default)]
    entities: Option<Value>,
    cases: Vec<RawCase>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    subject_id: String,
    tenant_id: String,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    scopes: Vec<String>,
    #[serde(default)]
    agent_id: String,
    #[serde(default)]
    session_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
    #[serde(default)]
    auth: Option<RawAuth>,
    #[serde(default)]
    entities: Option<Value>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    approved: bool,
    /// Earlier calls of the same caller (and session), decided first on
    /// the same store: what budgets they were charged, the case's call sees.
    #[serde(default)]
    history: Vec<RawHistory>,
    #[serde(default)]
    decide_approval: Option<RawDecideApproval>,
    #[serde(default)]
    view_approval: Option<RawViewApproval>,
    expect: RawExpect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHistory {
    tool: String,
    arguments: String,
    /// How many such calls, each its own operation (default 1).
    #[serde(default)]
    repeat: Option<u32>,
}

/// The most calls one case's `history` makes.
pub const MAX_HISTORY: u32 = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawViewApproval {
    viewer: RawAuth,
    requester: String,
    #[serde(default)]
    tenant: Option<String>,
    tool: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDecideApproval {
    approver: RawAuth,
    requester: String,
    #[serde(default)]
    tenant: Option<String>,
    tool: String,
    verdict: RawVerdict,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawVerdict {
    Approve,
    Reject,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    /// `allow`, `deny` or `approval_required`.
    decision: String,
    #[serde(default)]
    code: Option<String>,
    policies: Vec<String>,
    #[serde(default)]
    message: Option<String>,
}

/// One validated case file.
#[derive(Debug, Clone)]
pub struct CaseFile {
    pub description: Option<String>,
    pub cases: Vec<Case>,
}

/// One case: what to ask, and the answer expected.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    /// The 1-based line where the case starts.
    pub line: usize,
    pub question: Question,
    pub expect: Expectation,
}

/// What a case asks.
#[derive(Debug, Clone)]
pub enum Question {
    /// A tool call through the whole decision pipeline.
    Call(CallCase),
    /// May `approver` decide an approval of this call (Cedar's
    /// `decide_approval`, the question the approval desk asks)?
    DecideApproval(DecideApprovalCase),
    /// May `viewer` read an approval of this call (Cedar's `view_approval`,
    /// the question `ListApprovals`, `GetApproval` and `WatchApprovals` ask)?
    ViewApproval(ViewApprovalCase),
}

#[derive(Debug, Clone)]
pub struct CallCase {
    pub tool: String,
    /// The argument text exactly as a model would send it.
    pub arguments: String,
    pub caller: Caller,
    /// Cedar entity JSON (an array), as `entities_json` carries it; empty for none.
    pub entities_json: String,
    pub request_id: String,
    /// Whether a granted approval bound to exactly this call is presented.
    pub approved: bool,
    /// The calls decided before this one, in order, by the same caller.
    pub history: Vec<HistoryCall>,
}

/// One call of a case's `history`, made `repeat` times (each time its own
/// operation: request id `history-<entry>-<n>`).
#[derive(Debug, Clone)]
pub struct HistoryCall {
    pub tool: String,
    pub arguments: String,
    pub repeat: u32,
}

#[derive(Debug, Clone)]
pub struct DecideApprovalCase {
    pub approver: Caller,
    pub requester: String,
    pub tenant: String,
    pub tool: String,
    /// `"approve"` or `"reject"`.
    pub verdict: &'static str,
}

#[derive(Debug, Clone)]
pub struct ViewApprovalCase {
    pub viewer: Caller,
    pub requester: String,
    pub tenant: String,
    pub tool: String,
}

/// The answer a case expects. `code` is always compared (`None`: no
/// envelope); `message` only when the case gives one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    pub decision: Decision,
    pub code: Option<String>,
    pub policies: Vec<String>,
    pub message: Option<String>,
}

/// Parses and validates one case file.
///
/// # Errors
/// A diagnostic at the offending place: invalid JSON, a duplicate key, an
/// unknown field, or a case that is neither one call nor one approval
/// decision, or expects an impossible answer.
pub fn parse(path: &Path, text: &str) -> Result<CaseFile, Box<SourceDiagnostic>> {
    // Before serde, which would keep the last of two keys inside `entities`.
    if let Some((pointer, at)) = first_duplicate_key(text) {
        return Err(Box::new(
            SourceDiagnostic::at_line_column(
                path,
                at.line,
                at.column,
                format!("duplicate key `{pointer}`"),
            )
            .with_code(CODE),
        ));
    }
    let raw: RawFile = serde_json::from_str(text).map_err(|e| {
        let at = Position::from_line_column(text, e.line(), e.column());
        Box::new(
            SourceDiagnostic::at_line_column(path, at.line, at.column, e.to_string())
                .with_code(CODE),
        )
    })?;
    let RawFile {
        description,
        auth,
        entities,
        cases,
    } = raw;
    let mut out = Vec::with_capacity(cases.len());
    for (i, raw) in cases.into_iter().enumerate() {
        let at = locate(text, &format!("/cases/{i}"));
        let fail = |message: String| {
            let (line, column) = at.map_or((1, 1), |p| (p.line, p.column));
            Box::new(SourceDiagnostic::at_line_column(path, line, column, message).with_code(CODE))
        };
        let name = raw.name.clone();
        let case = validate(raw, auth.as_ref(), entities.as_ref())
            .map_err(|m| fail(format!("case `{name}`: {m}")))?;
        out.push(Case {
            line: at.map_or(1, |p| p.line),
            ..case
        });
    }
    Ok(CaseFile {
        description,
        cases: out,
    })
}

fn caller(a: RawAuth) -> Result<Caller, String> {
    if a.subject_id.is_empty() || a.tenant_id.is_empty() {
        return Err("`subject_id` and `tenant_id` must not be empty".into());
    }
    Ok(Caller {
        subject_id: a.subject_id,
        tenant_id: a.tenant_id,
        scopes: a.scopes,
        roles: a.roles,
        agent_id: a.agent_id,
        session_id: a.session_id,
    })
}

/// A case's `history`, each entry repeated 1 or more times, at most
/// [`MAX_HISTORY`] calls in all.
fn history_calls(history: Vec<RawHistory>) -> Result<Vec<HistoryCall>, String> {
    let mut calls = 0_u32;
    let mut earlier = Vec::with_capacity(history.len());
    for h in history {
        let repeat = h.repeat.unwrap_or(1);
        calls = calls.saturating_add(repeat);
        if repeat == 0 || calls > MAX_HISTORY {
            return Err(format!(
                "`history` repeats each call 1 or more times, at most {MAX_HISTORY} calls in all"
            ));
        }
        earlier.push(HistoryCall {
            tool: h.tool,
            arguments: h.arguments,
            repeat,
        });
    }
    Ok(earlier)
}

fn validate(
    raw: RawCase,
    default_auth: Option<&RawAuth>,
    default_entities: Option<&Value>,
) -> Result<Case, String> {
    let RawCase {
        name,
        tool,
        arguments,
        auth,
        entities,
        request_id,
        approved,
        history,
        decide_approval,
        view_approval,
        expect,
    } = raw;
    let approval_case = decide_approval.is_some() || view_approval.is_some();
    if approval_case
        && (auth.is_some()
            || entities.is_some()
            || request_id.is_some()
            || approved
            || !history.is_empty())
    {
        return Err(
            "a `decide_approval` or `view_approval` case takes no `auth`, `entities`, `request_id`, `approved` or `history`"
                .into(),
        );
    }
    let earlier = history_calls(history)?;
    let question = match (decide_approval, view_approval, tool, arguments) {
        (None, Some(v), None, None) => {
            let viewer = caller(v.viewer)?;
            Question::ViewApproval(ViewApprovalCase {
                tenant: v.tenant.unwrap_or_else(|| viewer.tenant_id.clone()),
                viewer,
                requester: v.requester,
                tool: v.tool,
            })
        }
        (Some(d), None, None, None) => {
            let approver = caller(d.approver)?;
            Question::DecideApproval(DecideApprovalCase {
                tenant: d.tenant.unwrap_or_else(|| approver.tenant_id.clone()),
                approver,
                requester: d.requester,
                tool: d.tool,
                verdict: match d.verdict {
                    RawVerdict::Approve => "approve",
                    RawVerdict::Reject => "reject",
                },
            })
        }
        (None, None, Some(tool), Some(arguments)) => {
            let auth = auth
                .or_else(|| default_auth.cloned())
                .ok_or("no `auth`, and the file gives no default")?;
            let entities_json = match entities.as_ref().or(default_entities) {
                None | Some(Value::Null) => String::new(),
                Some(v @ Value::Array(_)) => v.to_string(),
                Some(_) => return Err("`entities` must be an array of Cedar entities".into()),
            };
            Question::Call(CallCase {
                tool,
                arguments,
                caller: caller(auth)?,
                entities_json,
                request_id: request_id.unwrap_or_else(|| DEFAULT_REQUEST_ID.to_owned()),
                approved,
                history: earlier,
            })
        }
        (Some(_), _, _, _) | (_, Some(_), _, _) => {
            return Err(
                "give one of `tool` and `arguments`, `decide_approval` or `view_approval`".into(),
            );
        }
        (None, None, _, _) => {
            return Err("a call case needs `tool` and `arguments` (the raw argument text)".into());
        }
    };
    Ok(Case {
        name,
        line: 1,
        question,
        expect: expectation(expect)?,
    })
}

/// What a case expects, checked: a known decision, a code exactly where one belongs.
fn expectation(expect: RawExpect) -> Result<Expectation, String> {
    let RawExpect {
        decision,
        code,
        mut policies,
        message,
    } = expect;
    let decision = match decision.as_str() {
        "allow" => Decision::Allow,
        "deny" => Decision::Deny,
        "approval_required" => Decision::ApprovalRequired,
        other => {
            return Err(format!(
                "unknown decision `{other}`, expected `allow`, `deny` or `approval_required`"
            ));
        }
    };
    let code = match (decision, code) {
        (Decision::Allow, None) => None,
        (Decision::Allow, Some(_)) => {
            return Err("an `allow` has no `code`".into());
        }
        (Decision::ApprovalRequired, None) => Some("approval_required".to_owned()),
        (Decision::Deny, None) => {
            return Err("a `deny` must name its `code` (e.g. `forbidden`)".into());
        }
        (_, Some(code)) => Some(code),
    };
    policies.sort();
    Ok(Expectation {
        decision,
        code,
        policies,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        parse(Path::new("t.json"), text).unwrap_err().to_string()
    }

    const CALL: &str = r#""tool": "search_docs", "arguments": "{}", "auth": {"subject_id": "u", "tenant_id": "t"}"#;

    #[test]
    fn a_case_file_is_strict_and_its_errors_are_located() {
        assert_eq!(
            error(&format!(
                "{{\"cases\": [\n  {{\"name\": \"a\", {CALL},\n   \"expect\": {{\"decision\": \"allow\", \"policies\": [], \"colour\": 1}}}}]}}"
            )),
            "t.json:3:59: unknown field `colour`, expected one of `decision`, `code`, `policies`, `message` at line 3 column 59"
        );
        assert_eq!(
            error(&format!(
                "{{\"cases\": [\n  {{\"name\": \"a\", {CALL},\n   \"expect\": {{\"decision\": \"deny\", \"policies\": []}}}}]}}"
            )),
            "t.json:2:3: case `a`: a `deny` must name its `code` (e.g. `forbidden`)"
        );
        assert_eq!(
            error(&format!(
                "{{\"cases\": [{{\"name\": \"a\", \"name\": \"b\", {CALL}, \"expect\": {{\"decision\": \"allow\", \"policies\": []}}}}]}}"
            )),
            "t.json:1:26: duplicate key `/cases/0/name`"
        );
        assert_eq!(
            error(
                "{\"cases\": [{\"name\": \"a\", \"tool\": \"x\", \"expect\": {\"decision\": \"allow\", \"policies\": []}}]}"
            ),
            "t.json:1:12: case `a`: a call case needs `tool` and `arguments` (the raw argument text)"
        );
        assert_eq!(
            error(
                "{\"cases\": [{\"name\": \"a\", \"tool\": \"x\", \"arguments\": \"{}\", \"expect\": {\"decision\": \"allow\", \"policies\": []}}]}"
            ),
            "t.json:1:12: case `a`: no `auth`, and the file gives no default"
        );
    }

    #[test]
    fn defaults_fill_what_a_case_leaves_out() {
        let file = parse(
            Path::new("t.json"),
            r#"{"auth": {"subject_id": "u", "tenant_id": "t", "roles": ["r"]},
                "entities": [],
                "cases": [
                  {"name": "a", "tool": "get_order", "arguments": "{\"order_id\": \"o\"}",
                   "expect": {"decision": "approval_required", "policies": ["z", "a"]}}]}"#,
        )
        .unwrap();
        let case = &file.cases[0];
        assert_eq!(case.line, 4);
        let Question::Call(call) = &case.question else {
            panic!("a call case");
        };
        assert_eq!(call.caller.roles, ["r"]);
        assert_eq!(call.entities_json, "[]");
        assert_eq!(call.request_id, DEFAULT_REQUEST_ID);
        assert_eq!(
            case.expect,
            Expectation {
                decision: Decision::ApprovalRequired,
                code: Some("approval_required".into()),
                policies: vec!["a".into(), "z".into()],
                message: None,
            }
        );
    }
}
