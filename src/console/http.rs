//! The console over HTTP (axum), on the listener behind the admission layer
//! (grant `console`): the embedded page, and its JSON API under
//! `/console/api/`, each call one call of the [`ApprovalDesk`] with the
//! approver's token.
//!
//! The token is read from the header `[console] token_header` names (the
//! authenticating proxy's), else from `Authorization: Bearer` (the page's
//! development sign-in, which keeps it in session storage). It is never
//! read from a URL or a cookie, never logged, never echoed.
//!
//! A desk answer, refusal included, is `200` with `{"approval": …}` or
//! `{"error": envelope}`: decisions are data, and the page shows a refusal
//! in words rather than as a failed request. Non-2xx answers are for
//! requests the page never makes: a wrong method or content type, a body
//! too large, a path that is not there, a cross-site request
//! (`Sec-Fetch-Site` other than `same-origin` or `none`: the API is for
//! the console's own page only, whatever cookie a proxy relies on).
//!
//! The live queue (`/console/api/events`) is Server-Sent Events read by
//! `fetch` (so the token goes in a header, never in the URL): `ready` once
//! the watch is subscribed (the page lists then, so nothing falls between
//! the list and the watch), an `approval` event per watch event, and one
//! `end` event with the reason the watch ended (its token's `exp`, a lag, a
//! gap, the server stopping).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::{
    ConsoleConfig, DecisionRequest, approval_json, asset, end_json, error_json, event_json,
    parse_decision, sse_frame,
};
use crate::access::PeerIdentity;
use crate::approvals::ApprovalStatus;
use crate::approvals::desk::{ApprovalDesk, DeskError};
use crate::envelope::{Envelope, ErrorCode};
use crate::identity::{bearer, single_header as single};

/// How many pages of [`ApprovalDesk::list`] one listing reads at most.
const MAX_PAGES: usize = 8;
/// The size of each of those pages.
const PAGE: usize = 500;
/// How many decided or expired approvals the history shows.
const HISTORY: usize = 200;
/// How often an idle live stream sends a comment, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The console over HTTP: the approval desk it is a door onto, and its
/// configuration.
#[derive(Debug)]
pub struct ConsoleHttp {
    approvals: Arc<ApprovalDesk>,
    config: ConsoleConfig,
}

impl ConsoleHttp {
    #[must_use]
    pub(crate) fn new(approvals: Arc<ApprovalDesk>, config: ConsoleConfig) -> Self {
        Self { approvals, config }
    }
}

#[derive(Debug, Clone)]
struct State {
    console: Arc<ConsoleHttp>,
    /// Becomes `true` when the server starts shutting down: live streams end.
    stopping: watch::Receiver<bool>,
}

/// The console's routes, to merge beside the gRPC services. When the
/// console is not enabled they answer `404`, saying how to enable it.
pub(crate) fn router(console: Arc<ConsoleHttp>, stopping: watch::Receiver<bool>) -> axum::Router {
    use axum::routing::any;
    axum::Router::new()
        .route("/console", any(handle))
        .route("/console/", any(handle))
        .route("/console/{*rest}", any(handle))
        .with_state(State { console, stopping })
}

/// The answer of the admission layer to a console request it refuses (no
/// grant, or the DNS-rebinding guard): `403` with a message.
#[must_use]
pub(crate) fn forbidden(message: &str) -> Response {
    text(StatusCode::FORBIDDEN, message)
}

fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in super::SECURITY_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// An answer of `status` with `body` of `content_type`, never cached.
fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    secured(response)
}

fn text(status: StatusCode, message: &str) -> Response {
    respond(status, "text/plain; charset=utf-8", message.to_owned())
}

fn json_response(value: &Value) -> Response {
    respond(StatusCode::OK, "application/json", value.to_string())
}

fn method_not_allowed(allow: &'static str) -> Response {
    let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

impl ConsoleHttp {
    /// The approver's token: the proxy's header first, else the page's
    /// `Authorization: Bearer`; empty when neither is there (the desk
    /// refuses it as `unauthorized`).
    fn token(&self, headers: &HeaderMap) -> String {
        let header = self.config.token_header.as_str();
        if header != "authorization"
            && let Some(value) = single(headers, header)
        {
            return bearer(value).unwrap_or(value).trim().to_owned();
        }
        single(headers, "authorization")
            .and_then(bearer)
            .unwrap_or_default()
            .to_owned()
    }

    /// A token header sent more than once, if any: the proxy's, or
    /// `Authorization`. Such a request says two things about who is asking
    /// and is refused, rather than taken at one of them (or at the
    /// client's own `Authorization` behind the proxy's back).
    fn repeated_token_header(&self, headers: &HeaderMap) -> Option<String> {
        [self.config.token_header.as_str(), "authorization"]
            .into_iter()
            .find(|name| headers.get_all(*name).iter().nth(1).is_some())
            .map(str::to_owned)
    }

    /// Whether the token came from the proxy's header.
    fn via_proxy(&self, headers: &HeaderMap) -> bool {
        self.config.token_header != "authorization"
            && single(headers, &self.config.token_header).is_some()
    }
}

async fn handle(
    axum::extract::State(state): axum::extract::State<State>,
    req: http::Request<Body>,
) -> Response {
    let console = Arc::clone(&state.console);
    if !console.config.enabled {
        return text(
            StatusCode::NOT_FOUND,
            "the approval console is not enabled (set `[console] enabled = true`)",
        );
    }
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    if path == "/console" {
        // Relative, so that it also holds behind a proxy's path prefix.
        let mut response = text(StatusCode::MOVED_PERMANENTLY, "the console is at /console/");
        response
            .headers_mut()
            .insert(header::LOCATION, HeaderValue::from_static("console/"));
        return response;
    }
    let rest = path.strip_prefix("/console/").unwrap_or_default();
    let Some(api) = rest.strip_prefix("api/") else {
        return page(&parts, rest);
    };
    // The API is for the console's own page: a browser says where a
    // request comes from, and a page of another site gets nothing here.
    if let Some(site) = single(&parts.headers, "sec-fetch-site")
        && site != "same-origin"
        && site != "none"
    {
        return text(
            StatusCode::FORBIDDEN,
            "the console API answers only the console's own page",
        );
    }
    if let Some(name) = console.repeated_token_header(&parts.headers) {
        return text(
            StatusCode::BAD_REQUEST,
            &format!("the header `{name}` is sent more than once: send the token once"),
        );
    }
    let api = api.to_owned();
    match api.as_str() {
        "session" => get_only(&parts).unwrap_or_else(|| session(&console, &parts.headers)),
        "approvals" => match get_only(&parts) {
            Some(refused) => refused,
            None => list(&console, &parts).await,
        },
        "events" => match get_only(&parts) {
            Some(refused) => refused,
            None => events(&console, &parts.headers, state.stopping.clone()).await,
        },
        _ => {
            let mut segments = api.splitn(3, '/');
            match (segments.next(), segments.next(), segments.next()) {
                (Some("approvals"), Some(id), None) if !id.is_empty() => match get_only(&parts) {
                    Some(refused) => refused,
                    None => get(&console, &parts.headers, id).await,
                },
                (Some("approvals"), Some(id), Some("decision")) if !id.is_empty() => {
                    decide(&console, &parts, body, id).await
                }
                _ => text(StatusCode::NOT_FOUND, "no such console path"),
            }
        }
    }
}

/// `None` for a GET (or HEAD); else the `405`.
fn get_only(req: &http::request::Parts) -> Option<Response> {
    (req.method != Method::GET && req.method != Method::HEAD)
        .then(|| method_not_allowed("GET, HEAD"))
}

/// One of the page's embedded files.
fn page(req: &http::request::Parts, name: &str) -> Response {
    if let Some(refused) = get_only(req) {
        return refused;
    }
    let Some(asset) = asset(name) else {
        return text(StatusCode::NOT_FOUND, "no such console file");
    };
    let mut response = Response::new(Body::from(asset.bytes));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    // Small and compiled in: always revalidated, never stale after an upgrade.
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    secured(response)
}

/// Who the token says the approver is: `signed_in` and the identity, or
/// `signed_in: false` with why (the page then shows the sign-in form).
fn session(console: &ConsoleHttp, headers: &HeaderMap) -> Response {
    let token = console.token(headers);
    let verified = if token.is_empty() {
        Err(DeskError(missing_token()))
    } else {
        console.approvals.authenticate_until(&token)
    };
    match verified {
        Ok((caller, left)) => json_response(&json!({
            "signed_in": true,
            "subject": caller.subject_id,
            "tenant": caller.tenant_id,
            "roles": caller.roles,
            "expires_in_ms": u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            "from_proxy": console.via_proxy(headers),
        })),
        Err(DeskError(e)) => {
            let mut answer = error_json(&e);
            if let Value::Object(fields) = &mut answer {
                fields.insert("signed_in".to_owned(), Value::Bool(false));
            }
            json_response(&answer)
        }
    }
}

/// The pending queue (`?view=pending`, the default) or the history
/// (`?view=history`: decided and expired approvals, latest first), each
/// holding only what the approver may view.
async fn list(console: &ConsoleHttp, req: &http::request::Parts) -> Response {
    let history = match req.uri.query().unwrap_or("") {
        "" | "view=pending" => false,
        "view=history" => true,
        _ => return text(StatusCode::BAD_REQUEST, "`view` is `pending` or `history`"),
    };
    let token = console.token(&req.headers);
    let status = (!history).then_some(ApprovalStatus::Pending);
    let mut approvals = Vec::new();
    let mut page_token = String::new();
    let mut complete = false;
    for _ in 0..MAX_PAGES {
        match console
            .approvals
            .list(&token, status, PAGE, &page_token)
            .await
        {
            Ok(page) => {
                approvals.extend(page.approvals);
                page_token = page.next_page_token;
                if page_token.is_empty() {
                    complete = true;
                    break;
                }
            }
            Err(DeskError(e)) => return json_response(&error_json(&e)),
        }
    }
    if history {
        approvals.retain(|a| a.status != ApprovalStatus::Pending);
        approvals.sort_by_key(|a| std::cmp::Reverse(a.decided_at.unwrap_or(a.expires_at)));
        if approvals.len() > HISTORY {
            approvals.truncate(HISTORY);
            complete = false;
        }
    } else {
        approvals.sort_by_key(|a| std::cmp::Reverse(a.created_at));
    }
    json_response(&json!({
        "approvals": approvals.iter().map(approval_json).collect::<Vec<_>>(),
        "complete": complete,
    }))
}

async fn get(console: &ConsoleHttp, headers: &HeaderMap, id: &str) -> Response {
    match console.approvals.get(&console.token(headers), id).await {
        Ok(r) => json_response(&json!({ "approval": approval_json(&r) })),
        Err(DeskError(e)) => json_response(&error_json(&e)),
    }
}

async fn decide(
    console: &ConsoleHttp,
    req: &http::request::Parts,
    body: Body,
    id: &str,
) -> Response {
    if req.method != Method::POST {
        return method_not_allowed("POST");
    }
    // JSON only: a page of another site cannot send it without a CORS
    // preflight, which the console never grants.
    let json = single(&req.headers, "content-type")
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a decision is `application/json`",
        );
    }
    let token = console.token(&req.headers);
    let peer = req
        .extensions
        .get::<PeerIdentity>()
        .map(ToString::to_string)
        .unwrap_or_default();
    let Ok(body) = axum::body::to_bytes(body, super::MAX_DECISION_BYTES).await else {
        return text(StatusCode::PAYLOAD_TOO_LARGE, "the decision is too large");
    };
    let DecisionRequest {
        approve,
        arguments_sha256,
        reason,
    } = match parse_decision(&body) {
        Ok(d) => d,
        Err(e) => return json_response(&error_json(&e)),
    };
    match console
        .approvals
        .decide(&token, id, approve, &arguments_sha256, &reason, &peer)
        .await
    {
        Ok(r) => json_response(&json!({ "approval": approval_json(&r) })),
        Err(DeskError(e)) => json_response(&error_json(&e)),
    }
}

/// The live stream: the desk's watch as Server-Sent Events.
async fn events(
    console: &ConsoleHttp,
    headers: &HeaderMap,
    mut stopping: watch::Receiver<bool>,
) -> Response {
    let (tx, rx) = mpsc::channel::<String>(64);
    let token = console.token(headers);
    let watching = if token.is_empty() {
        Err(DeskError(missing_token()))
    } else {
        console.approvals.watch(&token).await
    };
    match watching {
        Err(DeskError(e)) => {
            // Not a failed request: the page reads why, and signs in again.
            let end = json!({"code": e.code.as_str(), "message": e.message});
            let _ = tx.try_send(sse_frame("end", &end));
        }
        Ok(mut watch) => {
            tokio::spawn(async move {
                let ready = json!({"subject": watch.caller().subject_id});
                if tx.send(sse_frame("ready", &ready)).await.is_err() {
                    return;
                }
                let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
                keep_alive.tick().await;
                loop {
                    let frame = tokio::select! {
                        next = watch.next() => match next {
                            Ok(event) => sse_frame("approval", &event_json(&event)),
                            Err(end) => {
                                let _ = tx.send(sse_frame("end", &end_json(end))).await;
                                return;
                            }
                        },
                        _ = keep_alive.tick() => ": keep-alive\n\n".to_owned(),
                        // The page went away: the watch ends with it.
                        () = tx.closed() => return,
                        () = async { let _ = stopping.wait_for(|s| *s).await; } => {
                            let end = json!({"code": "unavailable", "message": "the server is shutting down; watch again"});
                            let _ = tx.send(sse_frame("end", &end)).await;
                            return;
                        }
                    };
                    if tx.send(frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    }
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let stream = tokio_stream::StreamExt::map(stream, Ok::<_, std::convert::Infallible>);
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Proxies (nginx) must not buffer a live stream.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    secured(response)
}

/// The refusal of a request with no token at all.
fn missing_token() -> Envelope {
    Envelope::new(ErrorCode::Unauthorized, "no identity token").with("reason", "missing")
}
