//! The approval console (DESIGN §12): a web page for approvers, served by
//! the sidecar at `/console/`, and the small JSON API it calls under
//! `/console/api/`. This core is pure: the configuration, the embedded
//! assets and the headers every response carries, and the JSON the page
//! reads (an approval, a refusal, a watch event). `http.rs` serves it over
//! HTTP on the listener, in front of the one [`ApprovalDesk`]
//! (`crate::approvals::desk::ApprovalDesk`).
//!
//! The page is plain HTML, CSS and one ES module, compiled into the binary
//! (`include_bytes!`): no build step, no Node.js, no CDN. It talks JSON and
//! Server-Sent Events rather than gRPC-Web, so that no generated protobuf
//! bundle has to be committed; every call is still the desk's, authorized
//! by Cedar on the approver's verified token (`view_approval`,
//! `decide_approval`), and the live queue reads the same watch as
//! `WatchApprovals`.
//!
//! It must not decide anything: who may see or decide an approval is the
//! desk's answer, shown in words.

pub mod http;

use serde_json::{Value, json};

use crate::approvals::{ApprovalEvent, ApprovalEventKind, ApprovalRecord, WatchEnd};
use crate::envelope::Envelope;

/// `[console]`: whether the console is served, and where the approver's
/// token comes from behind an authenticating proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// Off by default: the console is one more door, opened on purpose.
    pub enabled: bool,
    /// The request header (lowercase) that carries the approver's identity
    /// token, set by the deployment's authenticating proxy (oauth2-proxy's
    /// `X-Forwarded-Access-Token` with `--pass-access-token`, or
    /// `authorization` with `--pass-authorization-header`, whose `Bearer`
    /// credential is taken). Without it, the page's own `Authorization:
    /// Bearer` (the development sign-in form) is read.
    pub token_header: String,
}

/// oauth2-proxy's header for the access token it passes upstream.
pub const DEFAULT_TOKEN_HEADER: &str = "x-forwarded-access-token";

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            token_header: DEFAULT_TOKEN_HEADER.to_owned(),
        }
    }
}

/// The Content-Security-Policy of every console response: only the
/// console's own origin, no inline script or style, no framing, no form
/// posted anywhere (the sign-in form is handled by the page's script).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The headers every console response carries, errors included.
pub const SECURITY_HEADERS: [(&str, &str); 6] = [
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// One embedded file of the page.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its name under `/console/` (`""` is the page itself).
    pub name: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

/// The page's files, compiled in.
pub const ASSETS: [Asset; 4] = [
    Asset {
        name: "",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("assets/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/app.js"),
    },
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("assets/console.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        bytes: include_bytes!("assets/favicon.svg"),
    },
];

/// The embedded file named `name` (the part of the path after `/console/`).
#[must_use]
pub fn asset(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

/// An approval as the page reads it. The display arguments (already
/// redacted by the contract's `sensitive` pointers, canonical JSON) are
/// sent as JSON, for the page to pretty-print; the hash is the one the
/// decision must send back.
#[must_use]
pub fn approval_json(r: &ApprovalRecord) -> Value {
    let arguments = serde_json::from_str::<Value>(&r.display_arguments)
        .unwrap_or_else(|_| Value::String(r.display_arguments.clone()));
    json!({
        "approval_id": r.approval_id,
        "tenant_id": r.tenant_id,
        "requester": r.requester_subject_id,
        "agent": r.agent_id,
        "tool": r.tool,
        "tool_version": r.tool_version,
        "risk": r.risk.as_str(),
        "arguments_sha256": r.arguments_sha256,
        "display_arguments": arguments,
        "redacted_marker": crate::approvals::REDACTED,
        "request_id": r.request_id,
        "status": r.status.as_str(),
        "created_at": r.created_at,
        "expires_at": r.expires_at,
        "decided_by": r.decided_by,
        "decided_at": r.decided_at,
        "reason": r.reason,
        "consumed": r.consumed_by_idempotency_key.is_some(),
        "why": why_json(&r.why),
    })
}

/// Why the call needs a human, as the page shows it: the policy's reason,
/// and each budget's figures with their decimals already placed (a page's
/// numbers are doubles, a budget's integers may not fit one).
fn why_json(why: &crate::approvals::ApprovalWhy) -> Value {
    let budgets: Vec<Value> = why
        .budgets
        .iter()
        .map(|b| {
            let shown = |v: i128| decimal(v, b.decimals);
            json!({
                "name": b.name,
                "window_seconds": b.window_seconds,
                "used": shown(b.used.into()),
                "this_call": shown(b.this_call.into()),
                "total": shown(i128::from(b.used) + i128::from(b.this_call)),
                "limit": shown(b.limit.into()),
            })
        })
        .collect();
    json!({ "reason": why.reason, "budgets": budgets })
}

/// `v` with `decimals` digits after the point: 62000 with 2 is `620.00`.
fn decimal(v: i128, decimals: u8) -> String {
    let digits = v.unsigned_abs().to_string();
    let sign = if v < 0 { "-" } else { "" };
    let places = usize::from(decimals);
    if places == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = places + 1);
    let (whole, frac) = padded.split_at(padded.len() - places);
    format!("{sign}{whole}.{frac}")
}

/// A refusal as the page reads it: the envelope's code, message and details.
#[must_use]
pub fn error_json(e: &Envelope) -> Value {
    json!({
        "error": {
            "code": e.code.as_str(),
            "message": e.message,
            "details": e.details,
        }
    })
}

/// A watch event, as the `approval` event of the live stream.
#[must_use]
pub fn event_json(e: &ApprovalEvent) -> Value {
    let kind = match e.kind {
        ApprovalEventKind::Created => "created",
        ApprovalEventKind::Decided => "decided",
        ApprovalEventKind::Expired => "expired",
        ApprovalEventKind::Consumed => "consumed",
    };
    json!({ "kind": kind, "approval": approval_json(&e.approval) })
}

/// Why the live stream ended, as its last (`end`) event: `unauthorized`
/// sends the approver back to sign-in; the others re-list and watch anew.
#[must_use]
pub fn end_json(end: WatchEnd) -> Value {
    let (code, message) = match end {
        WatchEnd::TokenExpired => ("unauthorized", "the identity token expired".to_owned()),
        WatchEnd::Lagged(n) => (
            "data_loss",
            format!("the watch fell {n} events behind; list again and watch anew"),
        ),
        WatchEnd::Gap => (
            "data_loss",
            "approval events from other replicas may have been missed; list again and watch anew"
                .to_owned(),
        ),
        WatchEnd::Closed => ("unavailable", "the server is shutting down".to_owned()),
    };
    json!({ "code": code, "message": message })
}

/// One Server-Sent Events frame (`event:` and one `data:` line: the JSON
/// has no newline).
#[must_use]
pub fn sse_frame(event: &str, data: &Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// A decision as the page sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRequest {
    pub approve: bool,
    /// The hash the approver was shown.
    pub arguments_sha256: String,
    pub reason: String,
}

/// The most bytes a decision body may have (a reason is cut to 1000
/// characters by the desk).
pub const MAX_DECISION_BYTES: usize = 16 * 1024;

/// Reads a decision body: `{"verdict": "approve"|"reject",
/// "arguments_sha256": "…", "reason": "…"}`, strictly (no other key, no
/// duplicate). A rejection needs a reason.
///
/// # Errors
/// An `invalid_arguments` envelope naming what is wrong.
pub fn parse_decision(body: &[u8]) -> Result<DecisionRequest, Envelope> {
    use crate::envelope::ErrorCode;
    let bad = |m: &str| Envelope::new(ErrorCode::InvalidArguments, m.to_owned());
    let limits = crate::decode::Limits {
        max_bytes: MAX_DECISION_BYTES,
        max_depth: 2,
    };
    let value = crate::decode::parse_strict(body, &limits)
        .map_err(|e| bad(&format!("the decision is not valid JSON: {e}")))?;
    let Value::Object(mut fields) = value else {
        return Err(bad("the decision is not a JSON object"));
    };
    let mut text = |key: &str| match fields.remove(key) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(bad(&format!("`{key}` is not a string"))),
    };
    let verdict = text("verdict")?;
    let arguments_sha256 = text("arguments_sha256")?;
    let reason = text("reason")?;
    if let Some(key) = fields.keys().next() {
        return Err(bad(&format!("unknown field `{key}`")));
    }
    let approve = match verdict.as_str() {
        "approve" => true,
        "reject" => false,
        _ => return Err(bad("`verdict` must be `approve` or `reject`")),
    };
    if !approve && reason.trim().is_empty() {
        return Err(bad("a rejection needs a reason").with("field", "reason"));
    }
    Ok(DecisionRequest {
        approve,
        arguments_sha256,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budgets_integers_are_shown_with_its_decimals() {
        for (v, d, shown) in [
            (62_000, 2, "620.00"),
            (5, 2, "0.05"),
            (0, 2, "0.00"),
            (-150, 2, "-1.50"),
            (200, 0, "200"),
            (i128::from(i64::MAX) * 2, 18, "18.446744073709551614"),
        ] {
            assert_eq!(decimal(v, d), shown, "{v} {d}");
        }
        let why = crate::approvals::ApprovalWhy::example();
        assert_eq!(
            why_json(&why),
            json!({
                "reason": "the agent's refunds today would exceed 500.00",
                "budgets": [{"name": "refunds_daily", "window_seconds": 86_400, "used": "600.00",
                             "this_call": "20.00", "total": "620.00", "limit": "500.00"}],
            })
        );
        assert_eq!(
            why_json(&crate::approvals::ApprovalWhy::default()),
            json!({"reason": null, "budgets": []})
        );
    }

    #[test]
    fn decisions_are_read_strictly() {
        let ok = parse_decision(br#"{"verdict":"reject","arguments_sha256":"ab","reason":"no"}"#)
            .unwrap();
        assert_eq!(
            ok,
            DecisionRequest {
                approve: false,
                arguments_sha256: "ab".into(),
                reason: "no".into()
            }
        );
        let message = |body: &[u8]| parse_decision(body).unwrap_err().message;
        assert_eq!(
            message(br#"{"verdict":"reject","arguments_sha256":"ab","reason":"  "}"#),
            "a rejection needs a reason"
        );
        assert_eq!(
            message(br#"{"verdict":"maybe","arguments_sha256":"ab"}"#),
            "`verdict` must be `approve` or `reject`"
        );
        assert_eq!(
            message(br#"{"verdict":"approve","arguments_sha256":"ab","admin":true}"#),
            "unknown field `admin`"
        );
        assert_eq!(
            message(br#"{"verdict":"approve","verdict":"reject"}"#),
            "the decision is not valid JSON: duplicate object key `/verdict` at byte 21"
        );
        assert_eq!(message(b"[]"), "the decision is not a JSON object");
    }

    #[test]
    fn every_asset_is_served_with_its_type() {
        assert_eq!(
            asset("").map(|a| a.content_type),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(
            asset("app.js").map(|a| a.content_type),
            Some("text/javascript; charset=utf-8")
        );
        assert_eq!(
            asset("favicon.svg").map(|a| a.content_type),
            Some("image/svg+xml")
        );
        assert!(asset("../Cargo.toml").is_none());
        // The page loads only what is embedded, from its own origin.
        let page = std::str::from_utf8(asset("").unwrap().bytes).unwrap();
        for name in ["app.js", "console.css", "favicon.svg"] {
            assert!(page.contains(&format!("\"{name}\"")), "{name}");
        }
        assert!(!page.contains("<script>") && !page.contains("style="));
    }
}
