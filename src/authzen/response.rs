//! Pipeline outcomes → AuthZEN Decision objects, and the PDP metadata.

use serde_json::{Map, Value, json};

use super::{AuthzenConfig, Entry};
use crate::clock::UnixMillis;
use crate::decision::{AuthorizeOutcome, Decision};
use crate::envelope::ErrorCode;

/// The capability URN of the Access Request and Approval profile.
pub const ACCESS_REQUEST_CAPABILITY: &str = "urn:openid:authzen:capability:access-request";

/// The Decision object of one outcome: `decision` is `true` only for
/// ALLOW, and `context` carries what the PEP needs ([`decision_context`]).
#[must_use]
pub fn decision_json(outcome: &AuthorizeOutcome, call: &Entry, config: &AuthzenConfig) -> Value {
    json!({
        "decision": outcome.decision == Decision::Allow,
        "context": decision_context(outcome, call, config),
    })
}

/// The decision context (DESIGN §11.1): `evaluation_id`, `reason` (the
/// error code, absent on allow), `reason_user` (the `model_output` text),
/// `idempotency_key`, `arguments_sha256` and `timeout_ms` once the call was
/// hashed, `approval_id` when an approval is involved (opened, named in the
/// answer, or presented by the call), and for
/// APPROVAL_REQUIRED the `access_request` object when the deployment has an
/// Access Request endpoint.
#[must_use]
pub fn decision_context(
    outcome: &AuthorizeOutcome,
    call: &Entry,
    config: &AuthzenConfig,
) -> Map<String, Value> {
    let arguments_sent = call.arguments_sent;
    let mut c = Map::new();
    c.insert("evaluation_id".into(), outcome.decision_id.clone().into());
    if let Some(envelope) = &outcome.error {
        let mut envelope = envelope.clone();
        if !arguments_sent && envelope.code == ErrorCode::SchemaViolation {
            // `{}` stood in for arguments the PEP never sent: say so.
            envelope = envelope.with("arguments", "not_sent");
        }
        c.insert("reason".into(), envelope.code.as_str().into());
        c.insert("reason_user".into(), envelope.model_output().into());
    }
    if !outcome.idempotency_key.is_empty() {
        c.insert(
            "idempotency_key".into(),
            outcome.idempotency_key.clone().into(),
        );
        c.insert(
            "arguments_sha256".into(),
            outcome.arguments_sha256.clone().into(),
        );
        c.insert("timeout_ms".into(), outcome.timeout_ms.into());
    }
    let named = outcome
        .error
        .as_ref()
        .and_then(|e| e.details.get("approval_id"))
        .and_then(Value::as_str);
    let presented = Some(call.input.approval_id.as_str()).filter(|a| !a.is_empty());
    let approval_id = outcome
        .approval
        .as_ref()
        .map(|a| a.0.as_str())
        .or(named)
        .or(presented);
    if let Some(id) = approval_id {
        c.insert("approval_id".into(), id.into());
    }
    if outcome.decision == Decision::ApprovalRequired
        && let (Some(endpoint), Some((id, expires_at))) =
            (&config.access_request_endpoint, &outcome.approval)
    {
        c.insert(
            "access_request".into(),
            access_request(endpoint, id, *expires_at, outcome),
        );
    }
    c
}

/// The requestable-denial object of the Access Request and Approval
/// profile. toolgate has already opened the approval (PENDING), so the
/// `display` names it; the binding material is `context.evaluation_id`.
fn access_request(
    endpoint: &str,
    approval_id: &str,
    expires_at: UnixMillis,
    outcome: &AuthorizeOutcome,
) -> Value {
    let risk = outcome.risk.map_or("unknown", |r| r.as_str());
    json!({
        "endpoint": endpoint,
        "template": format!("toolgate:{risk}"),
        "expires_at": rfc3339(expires_at),
        "display": {
            "title": "Approval required",
            "description": format!(
                "This call waits for a human approval: approval {approval_id} is pending. \
                 Once an approver approves it, the same call is allowed."
            ),
        },
    })
}

/// RFC 3339 text of a Unix time in milliseconds (UTC, seconds precision).
fn rfc3339(ms: UnixMillis) -> String {
    time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000))
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// The PDP metadata (AuthZEN §9) for a PDP at `base` (no trailing `/`).
#[must_use]
pub fn metadata(base: &str, config: &AuthzenConfig, action_search: bool) -> Value {
    let mut m = Map::new();
    m.insert("policy_decision_point".into(), base.into());
    m.insert(
        "access_evaluation_endpoint".into(),
        format!("{base}/access/v1/evaluation").into(),
    );
    m.insert(
        "access_evaluations_endpoint".into(),
        format!("{base}/access/v1/evaluations").into(),
    );
    if action_search {
        m.insert(
            "search_action_endpoint".into(),
            format!("{base}/access/v1/search/action").into(),
        );
    }
    if let Some(endpoint) = &config.access_request_endpoint {
        m.insert("access_request_endpoint".into(), endpoint.clone().into());
        m.insert("capabilities".into(), json!([ACCESS_REQUEST_CAPABILITY]));
    }
    Value::Object(m)
}

/// The Action Search answer (AuthZEN §8): the tools as actions
/// `{name: <tool>}`, in name order, from `offset`, at most `limit` of them.
/// A page object says where the next page starts (an empty `next_token`
/// at the end) whenever the PEP asked for a page.
#[must_use]
pub fn action_results(tools: &[String], offset: usize, limit: Option<usize>) -> Value {
    let rest = tools.get(offset..).unwrap_or_default();
    let take = limit.map_or(rest.len(), |l| l.min(rest.len()));
    let results: Vec<Value> = rest
        .iter()
        .take(take)
        .map(|t| json!({ "name": t }))
        .collect();
    if limit.is_none() && offset == 0 {
        return json!({ "results": results });
    }
    let next = offset.saturating_add(take);
    let next_token = if next < tools.len() {
        super::request::page_token(next)
    } else {
        String::new()
    };
    json!({
        "page": {"next_token": next_token, "count": take, "total": tools.len()},
        "results": results,
    })
}
