//! Who is calling: the authenticated caller of a decision.
//!
//! The caller comes from the executor's authentication middleware (trusted,
//! DESIGN §1), never from the model's arguments. This module holds the domain
//! type; it must not read anything the model wrote.

/// The authenticated principal of one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub subject_id: String,
    pub tenant_id: String,
    pub scopes: Vec<String>,
    pub roles: Vec<String>,
    pub agent_id: String,
    pub session_id: String,
}

mod jwt;

pub use jwt::{ClaimNames, TokenError, TokenVerifier, VerifierConfig};
