//! The audit events (DESIGN §9): what one decision, approval decision or
//! ledger transition leaves in the log. The builders take input types of
//! their own, filled in by the desks, and copy only ids, hashes, outcomes
//! and codes — never raw or display arguments, results, executors' error
//! messages or tokens.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::budgets::{Seen, SessionSeen};
use crate::identity::Caller;

/// What the audit log keeps of one decision: ids, hashes, the verdict and
/// its code, the determining policies — the pipeline fills it in, and
/// nothing else of the call (arguments, tokens) can reach the event.
#[derive(Debug, Clone, Copy)]
pub struct DecisionAudit<'a> {
    pub decision_id: &'a str,
    pub request_id: &'a str,
    pub call_id: &'a str,
    /// The tool name as the executor sent it (cut when echoed).
    pub tool: &'a str,
    pub tool_version: &'a str,
    pub policy_version: &'a str,
    /// The principal the call ran as, `None` when it was not established.
    pub principal: Option<&'a Caller>,
    pub peer: &'a str,
    pub idempotency_key: &'a str,
    pub arguments_sha256: &'a str,
    /// `allow`, `deny` or `approval_required`.
    pub decision: &'a str,
    /// The envelope's code, empty for an allow.
    pub code: &'a str,
    pub policies: &'a [String],
    /// The approval the answer names (created or pending for
    /// APPROVAL_REQUIRED; for a gateway call also the one it used, waits
    /// on or was refused by), if any.
    pub approval_created: Option<&'a str>,
    /// The approval id the executor presented (empty for none).
    pub approval_presented: &'a str,
    /// The door the call came through (`executor` or `gateway`).
    pub door: &'a str,
    /// The gateway's action name (cut when echoed); empty for an executor.
    pub action: &'a str,
    /// What the decision saw of each budget counting the call (DESIGN
    /// §13.3): written, with whether it charged them, only when non-empty.
    pub budgets: &'a [Seen],
    pub charged: bool,
    /// What the decision saw of its session (DESIGN §13.2: labels, tools,
    /// calls), written as `session_state` only when a policy read it.
    pub session: Option<&'a SessionSeen>,
}

/// What a refused gateway request's event says (see
/// [`AuditEvent::refused_request`]): where it came and why it was refused,
/// never what it carried.
#[derive(Debug, Clone, Copy)]
pub struct RefusalAudit<'a> {
    /// The door (`authzen`).
    pub door: &'a str,
    /// The endpoint path.
    pub endpoint: &'a str,
    pub peer: &'a str,
    /// The PEP's request id (`X-Request-ID`, cut when echoed).
    pub request_id: &'a str,
    /// The HTTP status answered.
    pub status: u16,
    /// A stable reason (`duplicate_key`, `not_a_tool`, `no_tenant`, …).
    pub reason: &'a str,
}

/// One audit event: an object of ids, hashes and outcomes, written as its
/// JSON line while it is built (one buffer, no map of owned keys and values
/// per event). Its fields are in the order the builder adds them; every
/// builder adds each key once.
#[derive(Clone, PartialEq, Eq)]
pub struct AuditEvent(Vec<u8>);

impl std::fmt::Debug for AuditEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AuditEvent")
            .field(&String::from_utf8_lossy(&self.0))
            .finish()
    }
}

/// Longest model-supplied text (a tool name, an approval id) copied in.
const MAX_ECHO: usize = 128;

/// An event's line is about this long; one allocation holds it.
const LINE_CAPACITY: usize = 768;

/// At most the first [`MAX_ECHO`] characters of `s`.
fn echo(s: &str) -> &str {
    s.char_indices()
        .nth(MAX_ECHO)
        .map_or(s, |(end, _)| s.get(..end).unwrap_or(s))
}

/// Tenant, subject, agent and session of a principal, empty when unknown.
fn principal(c: Option<&Caller>) -> (&str, &str, &str, &str) {
    c.map_or(("", "", "", ""), |c| {
        (
            c.tenant_id.as_str(),
            c.subject_id.as_str(),
            c.agent_id.as_str(),
            c.session_id.as_str(),
        )
    })
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl AuditEvent {
    fn new(event: &str) -> Self {
        let now = time::OffsetDateTime::now_utc();
        let ts = now
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let mut line = Vec::with_capacity(LINE_CAPACITY);
        line.push(b'{');
        let first = Self(line);
        first.field("time", ts).with("event", event)
    }

    /// Appends `"key":value` (the caller adds the separator).
    fn field(mut self, key: &str, value: impl Serialize) -> Self {
        // INVARIANT: strings, numbers, arrays of strings and JSON values
        // always serialize, and a `Vec` never fails to write.
        let key_written = serde_json::to_writer(&mut self.0, key);
        self.0.push(b':');
        let value_written = serde_json::to_writer(&mut self.0, &value);
        debug_assert!(key_written.is_ok() && value_written.is_ok());
        self
    }

    fn with(mut self, key: &str, value: impl Serialize) -> Self {
        self.0.push(b',');
        self.field(key, value)
    }

    /// The event of one Authorize decision, for the principal it ran as
    /// (from the auth context, or from the verified identity token when one
    /// is required); `peer` is the transport identity.
    #[must_use]
    pub fn decision(d: &DecisionAudit<'_>, latency: Duration) -> Self {
        let (tenant, subject, agent, session) = principal(d.principal);
        // The approval the answer names, else the one it presented.
        let approval_id = d
            .approval_created
            .unwrap_or_else(|| echo(d.approval_presented));
        let event = Self::new("decision")
            .with("decision_id", d.decision_id)
            .with("request_id", echo(d.request_id))
            .with("call_id", echo(d.call_id))
            .with("tool", echo(d.tool))
            .with("tool_version", d.tool_version)
            .with("policy_version", d.policy_version)
            .with("tenant", tenant)
            .with("subject", subject)
            .with("agent", agent)
            .with("session", session)
            .with("peer", d.peer)
            .with("idempotency_key", d.idempotency_key)
            .with("arguments_sha256", d.arguments_sha256)
            .with("decision", d.decision)
            .with("code", d.code)
            .with("policies", d.policies)
            .with("approval_id", approval_id)
            .with("door", d.door)
            .with("action", echo(d.action));
        let event = if d.budgets.is_empty() {
            event
        } else {
            event.with("budgets", d.budgets).with("charged", d.charged)
        };
        let event = match d.session {
            Some(seen) => event.with("session_state", seen),
            None => event,
        };
        event.with("latency_us", micros(latency))
    }

    /// The event of a gateway request refused before any decision: one per
    /// refusal (a malformed body, a request that names no tenant, …).
    #[must_use]
    pub fn refused_request(r: &RefusalAudit<'_>) -> Self {
        Self::new("request_refused")
            .with("door", r.door)
            .with("endpoint", r.endpoint)
            .with("peer", r.peer)
            .with("request_id", echo(r.request_id))
            .with("status", r.status)
            .with("reason", r.reason)
    }

    /// The event of one DecideApproval call: `outcome` is `approved`,
    /// `rejected`, or the code it was refused with. `approver` is `None`
    /// when the token did not verify.
    #[must_use]
    pub fn approval_decision(
        approval: ApprovalAudit<'_>,
        approver: Option<&Caller>,
        outcome: &str,
        latency: Duration,
    ) -> Self {
        let (tenant, subject) =
            approver.map_or(("", ""), |c| (c.tenant_id.as_str(), c.subject_id.as_str()));
        Self::new("approval_decision")
            .with("approval_id", echo(approval.approval_id))
            .with("tenant", tenant)
            .with("subject", subject)
            .with("peer", approval.peer)
            .with("verdict", approval.verdict)
            .with("outcome", outcome)
            .with(
                "requester",
                approval.record.map_or("", |r| r.requester_subject_id),
            )
            .with("agent", approval.record.map_or("", |r| r.agent_id))
            .with("tool", approval.record.map_or("", |r| r.tool))
            .with(
                "tool_version",
                approval.record.map_or("", |r| r.tool_version),
            )
            .with("request_id", approval.record.map_or("", |r| r.request_id))
            .with(
                "arguments_sha256",
                approval.record.map_or("", |r| r.arguments_sha256),
            )
            .with("policy_version", approval.policy_version)
            .with("latency_us", micros(latency))
    }

    /// The event of one ledger call (`event: "ledger"`): who, which
    /// operation of which tool and arguments, the outcome, the state after,
    /// the code, the fencing token and the attempt. Never a result, nor an
    /// error's message or details (an executor may write anything there);
    /// an executor's own error code is kept only when it looks like one.
    #[must_use]
    pub fn ledger(l: &LedgerAudit<'_>, latency: Duration) -> Self {
        let (tenant, subject, agent, session) = principal(l.principal);
        Self::new("ledger")
            .with("operation", l.operation)
            .with("decision_id", l.decision_id)
            .with("tenant", tenant)
            .with("subject", subject)
            .with("agent", agent)
            .with("session", session)
            .with("peer", l.peer)
            .with("idempotency_key", echo(l.idempotency_key))
            .with("arguments_sha256", echo(l.arguments_sha256))
            .with("tool", echo(l.tool))
            .with("tool_version", l.tool_version)
            .with("policy_version", l.policy_version)
            .with("reported", l.reported)
            .with("outcome", l.outcome)
            .with("state", l.state)
            .with("code", safe_code(l.code))
            .with("attempt", l.attempt)
            .with("latency_us", micros(latency))
    }

    /// The event of one entity-store write (`event: "entities"`, DESIGN
    /// §11.6): the operation, the tenant, the caller's transport identity,
    /// how many uids the request named and how many rows it changed, the
    /// outcome (`ok` or the refusal code). Never a uid, an attribute or any
    /// other part of the entities: they are the deployment's data.
    #[must_use]
    pub fn entities(e: &EntityAudit<'_>, latency: Duration) -> Self {
        Self::new("entities")
            .with("operation", e.operation)
            .with("tenant", echo(e.tenant))
            .with("peer", e.peer)
            .with("uids", e.uids)
            .with("changed", e.changed)
            .with("outcome", e.outcome)
            .with("policy_version", e.policy_version)
            .with("latency_us", micros(latency))
    }

    /// A bare event of the given fields, for the queue's own tests.
    #[cfg(test)]
    #[must_use]
    pub fn fields(event: &str, fields: &[(&str, Value)]) -> Self {
        fields
            .iter()
            .fold(Self::new(event), |e, (k, v)| e.with(k, v.clone()))
    }

    /// The JSON line (without the newline).
    #[must_use]
    pub fn into_line(mut self) -> String {
        self.0.push(b'}');
        // INVARIANT: serde_json writes UTF-8; the fallback is unreachable.
        String::from_utf8(self.0).unwrap_or_default()
    }
}

/// What a ledger event says (see [`AuditEvent::ledger`]).
#[derive(Debug, Clone, Copy)]
pub struct LedgerAudit<'a> {
    /// `begin`, `complete`, `reconcile`, or `lapse` (the sweep that makes
    /// final an operation not retried before its tickets expired).
    pub operation: &'static str,
    /// The principal the call ran as, when it could be established.
    pub principal: Option<&'a Caller>,
    pub peer: &'a str,
    /// The decision that began the execution (`Authorize` with
    /// `begin_execution`), else empty.
    pub decision_id: &'a str,
    pub idempotency_key: &'a str,
    pub arguments_sha256: &'a str,
    pub tool: &'a str,
    /// The loaded contract's version of the tool, if it is loaded.
    pub tool_version: &'a str,
    pub policy_version: &'a str,
    /// What the executor reported: a completion's status (`succeeded`,
    /// `failed_retryable`, `failed_final`, `unknown`) or a reconciliation's
    /// verdict (`applied`, `not_applied`); empty for a begin.
    pub reported: &'static str,
    /// Begin: `acquired`, `in_progress`, `completed`, `reconcile_required`,
    /// `refused`; complete and reconcile: `ok`, `not_found` or the code.
    pub outcome: &'a str,
    /// The record's state after the call, lowercase; empty without a record.
    pub state: &'static str,
    /// The answer's error code, empty without one.
    pub code: &'a str,
    /// The attempt the call is about. Never the fencing token: it is the
    /// holder's secret, and whoever reads it could complete the attempt.
    pub attempt: u32,
}

/// A code fit for the audit log: one of toolgate's, or an executor's own
/// code when it is a short identifier; anything else is withheld, since an
/// executor may put data in it.
fn safe_code(code: &str) -> Value {
    let identifier = code.len() <= 64
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if crate::envelope::ErrorCode::parse(code).is_some() || identifier {
        Value::from(code)
    } else {
        Value::from("withheld")
    }
}

/// What an entity-store event says (see [`AuditEvent::entities`]).
#[derive(Debug, Clone, Copy)]
pub struct EntityAudit<'a> {
    /// `upsert` or `delete`.
    pub operation: &'static str,
    pub tenant: &'a str,
    pub peer: &'a str,
    /// How many entities (upsert) or uids (delete) the request named.
    pub uids: usize,
    /// How many were written or deleted.
    pub changed: usize,
    /// `ok`, or the code the request was refused with.
    pub outcome: &'static str,
    pub policy_version: &'a str,
}

/// The call an approval is bound to, as its event tells it (the approvals'
/// records give it: `ApprovalRecord::audited`): ids and hashes, never the
/// arguments.
#[derive(Debug, Clone, Copy)]
pub struct ApprovedCall<'a> {
    pub requester_subject_id: &'a str,
    pub agent_id: &'a str,
    pub tool: &'a str,
    pub tool_version: &'a str,
    pub request_id: &'a str,
    pub arguments_sha256: &'a str,
}

/// What an approval-decision event says about the approval.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalAudit<'a> {
    pub approval_id: &'a str,
    /// The call the approval is bound to, as stored, when it was found.
    pub record: Option<ApprovedCall<'a>>,
    pub verdict: &'a str,
    pub policy_version: &'a str,
    pub peer: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decision's line, byte for byte: the fields in the builder's order,
    /// model-supplied text cut at 128 characters and escaped, no raw data.
    #[test]
    fn a_decision_line_is_exact() {
        let caller = Caller {
            subject_id: "bob".into(),
            tenant_id: "acme".into(),
            scopes: vec!["orders:refund".into()],
            roles: vec!["support_agent".into()],
            agent_id: "support-bot".into(),
            session_id: "s-42".into(),
        };
        let policies = vec!["refund-by-support".to_owned(), "tenancy#0".to_owned()];
        let long_tool = format!("{}\"éxyz", "t".repeat(126));
        let d = DecisionAudit {
            decision_id: "0190-d",
            request_id: "refund-1",
            call_id: "call_7",
            tool: &long_tool,
            tool_version: "1.0.0",
            policy_version: "v1",
            principal: Some(&caller),
            peer: "spiffe://acme/executor",
            idempotency_key: "refund_order:ab12",
            arguments_sha256: "cd34",
            decision: "allow",
            code: "",
            policies: &policies,
            approval_created: None,
            approval_presented: "",
            door: "executor",
            action: "",
            budgets: &[],
            charged: false,
            session: None,
        };
        let line = AuditEvent::decision(&d, Duration::from_micros(42)).into_line();
        let (time, rest) = line
            .strip_prefix("{\"time\":\"")
            .and_then(|l| l.split_once('"'))
            .unwrap();
        time::OffsetDateTime::parse(time, &time::format_description::well_known::Rfc3339).unwrap();
        let tool = format!("{}\\\"é", "t".repeat(126));
        assert_eq!(
            rest,
            format!(
                ",\"event\":\"decision\",\"decision_id\":\"0190-d\",\"request_id\":\"refund-1\",\
                 \"call_id\":\"call_7\",\"tool\":\"{tool}\",\"tool_version\":\"1.0.0\",\
                 \"policy_version\":\"v1\",\"tenant\":\"acme\",\"subject\":\"bob\",\
                 \"agent\":\"support-bot\",\"session\":\"s-42\",\"peer\":\"spiffe://acme/executor\",\
                 \"idempotency_key\":\"refund_order:ab12\",\"arguments_sha256\":\"cd34\",\
                 \"decision\":\"allow\",\"code\":\"\",\"policies\":[\"refund-by-support\",\"tenancy#0\"],\
                 \"approval_id\":\"\",\"door\":\"executor\",\"action\":\"\",\"latency_us\":42}}"
            )
        );
        // serde_json reads it back and writes the same bytes.
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value.to_string(), line);
    }

    /// Codes reach the audit log only as identifiers: ours, or an
    /// executor's that looks like one.
    #[test]
    fn executor_codes_are_kept_only_when_they_are_identifiers() {
        for (code, shown) in [
            ("lease_lost", "lease_lost"),
            ("", ""),
            ("card_declined", "card_declined"),
            ("payments.v2:DECLINED-51", "payments.v2:DECLINED-51"),
            ("card 4111 1111 declined", "withheld"),
            ("{\"pan\":\"4111\"}", "withheld"),
        ] {
            assert_eq!(safe_code(code), Value::from(shown), "{code}");
        }
        assert_eq!(safe_code(&"x".repeat(65)), Value::from("withheld"));
    }
}
