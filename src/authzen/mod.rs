//! The OpenID AuthZEN 1.0 door (DESIGN §11.1): AuthZEN requests in, the
//! one pipeline's inputs out, its outcomes back as AuthZEN decisions.
//!
//! This core is pure: a strictly decoded request body becomes
//! [`crate::decision::AuthorizeInput`]s (`door: Door::Gateway`) through
//! the mapping of §11.1, each pointer of which `[authzen]` may move
//! ([`AuthzenConfig`]); an [`crate::decision::AuthorizeOutcome`] becomes
//! the Decision object with its `context` (and, for APPROVAL_REQUIRED, the
//! `access_request` object of the Access Request and Approval profile); an
//! Action Search request becomes the principal whose callable tools
//! (DESIGN §11.4) are the answer; then the PDP metadata, and the COAZ-MCP
//! declared mapping (`x-authzen-mapping`) each tool publishes. `http.rs`
//! serves it over HTTP on the gRPC listener.
//!
//! It must not decide anything itself: a decision is `true` only when the
//! pipeline allowed the call. With `require_identity_token` the principal
//! is the verified token's; what the body says of the subject is only
//! compared with it, never taken.

pub mod http;
mod mapping;
mod request;
mod response;

pub use mapping::{declared_mapping, mcp_input_schema};
pub use request::{
    ActionSearch, Batch, Entry, Refusal, Semantic, Transport, page_token, parse_action_search,
    parse_evaluation, parse_evaluations,
};
pub use response::{action_results, decision_context, decision_json, metadata};

/// Where §11.1's mapping reads each field of an AuthZEN request, and how
/// the door answers. Every pointer is an RFC 6901 JSON pointer into one
/// evaluation (after the defaults of `/access/v1/evaluations` are applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzenConfig {
    /// The tenant of a request that names none. Unset by default: a
    /// request without a tenant is refused (`400`), never defaulted.
    pub default_tenant: Option<String>,
    /// `resource.type` values that name a tool (`tool`, `mcp_tool`).
    pub tool_types: Vec<String>,
    /// The arguments: the first pointer present wins; none present is `{}`.
    pub arguments: Vec<String>,
    pub subject: String,
    pub tenant: String,
    pub roles: String,
    pub scopes: String,
    pub agent: String,
    pub session: String,
    /// The business operation id: the first pointer present wins; none
    /// present makes the call its own operation.
    pub request_id: Vec<String>,
    pub approval_id: String,
    /// The header carrying the user's identity token (a JWT), read when
    /// `require_identity_token` is set; `authorization` takes a `Bearer`
    /// credential.
    pub identity_token_header: String,
    /// The `policy_decision_point` of the metadata (an `https` URL without
    /// query or fragment); unset, it is the URL the request was sent to.
    pub policy_decision_point: Option<String>,
    /// The Access Request endpoint of the deployment (the Access Request
    /// and Approval profile): when set, it is published in the metadata
    /// and an APPROVAL_REQUIRED answer carries `context.access_request`;
    /// the profile forbids that object without such an endpoint.
    pub access_request_endpoint: Option<String>,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The most entries one `/access/v1/evaluations` request may carry.
    pub max_evaluations: usize,
}

/// Default body cap: the arguments' default cap (1 MiB) and room for the
/// AuthZEN envelope around them and for a few entries.
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 * 1_048_576;

/// Default cap on evaluations per request, as `BatchAuthorize`'s.
pub const DEFAULT_MAX_EVALUATIONS: usize = 128;

/// How many levels the AuthZEN envelope adds above the arguments
/// (`{evaluations: [{resource: {properties: {arguments: …}}}]}`), so the
/// body's depth limit is the arguments' plus this.
pub const ENVELOPE_DEPTH: usize = 5;

impl Default for AuthzenConfig {
    fn default() -> Self {
        let s = |v: &str| v.to_owned();
        Self {
            default_tenant: None,
            tool_types: vec![s("tool"), s("mcp_tool")],
            arguments: vec![s("/resource/properties/arguments"), s("/context/arguments")],
            subject: s("/subject/id"),
            tenant: s("/subject/properties/tenant"),
            roles: s("/subject/properties/roles"),
            scopes: s("/subject/properties/scopes"),
            agent: s("/context/agent"),
            session: s("/context/session"),
            request_id: vec![s("/context/request_id"), s("/context/correlation_id")],
            approval_id: s("/context/approval_id"),
            identity_token_header: s("authorization"),
            policy_decision_point: None,
            access_request_endpoint: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_evaluations: DEFAULT_MAX_EVALUATIONS,
        }
    }
}

impl AuthzenConfig {
    /// Every pointer with the key it is configured under.
    #[must_use]
    pub fn pointers(&self) -> Vec<(&'static str, &str)> {
        let mut all: Vec<(&'static str, &str)> = vec![
            ("subject", &self.subject),
            ("tenant", &self.tenant),
            ("roles", &self.roles),
            ("scopes", &self.scopes),
            ("agent", &self.agent),
            ("session", &self.session),
            ("approval_id", &self.approval_id),
        ];
        all.extend(self.arguments.iter().map(|p| ("arguments", p.as_str())));
        all.extend(self.request_id.iter().map(|p| ("request_id", p.as_str())));
        all
    }
}

/// Whether `pointer` is an RFC 6901 pointer into a part of an evaluation
/// that a PEP sends (`/subject`, `/resource`, `/action`, `/context`), below
/// the part itself, with valid `~` escapes.
#[must_use]
pub fn is_evaluation_pointer(pointer: &str) -> bool {
    let Some(rest) = pointer.strip_prefix('/') else {
        return false;
    };
    let mut tokens = rest.split('/');
    let part_ok = matches!(
        tokens.next(),
        Some("subject" | "resource" | "action" | "context")
    );
    let mut below = false;
    for t in tokens {
        below = true;
        let mut chars = t.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return false;
            }
        }
    }
    part_ok && below
}

/// The tokens of a pointer, unescaped (`~1` is `/`, `~0` is `~`).
fn pointer_tokens(pointer: &str) -> Vec<String> {
    pointer
        .strip_prefix('/')
        .unwrap_or(pointer)
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect()
}

#[cfg(test)]
mod tests;
