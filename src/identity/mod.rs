//! Who is calling: the authenticated caller of a decision, the rule of who
//! a request runs as ([`Principals`]), identity tokens verified against a
//! JWKS (`token`), and development keys (`dev`).
//!
//! The caller comes from the executor's authentication middleware (trusted,
//! DESIGN §1) or a verified token, never from the model's arguments. A leaf:
//! it imports only the clock, the tenant scope and the error table; it must
//! not read anything the model wrote, nor log tokens or keys.

/// Turns an identity token into the caller it names, or the reason it
/// cannot (a stable snake_case word).
pub trait IdentityVerifier: Send + Sync + std::fmt::Debug {
    /// # Errors
    /// The reason the token is not acceptable.
    fn verify(&self, token: &str, now_unix_seconds: i64) -> Result<Caller, &'static str>;

    /// [`IdentityVerifier::verify`], with the token's `exp` (unix seconds):
    /// for what outlives one call, such as a watch.
    ///
    /// # Errors
    /// The reason the token is not acceptable.
    fn verify_with_expiry(
        &self,
        token: &str,
        now_unix_seconds: i64,
    ) -> Result<(Caller, i64), &'static str>;
}

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

mod dev;
mod principals;
mod token;

pub use principals::{Principals, require_caller};

pub use dev::{DEV_KID, DevSigner, generate_dev_keyset};
pub use token::{
    ClaimNames, JwksError, MAX_JWKS_BYTES, MAX_TOKEN_BYTES, TokenError, TokenVerifier,
    VerifiedIdentity, VerifierConfig,
};

impl From<VerifiedIdentity> for Caller {
    /// A caller proven by an identity token; agent and session are not
    /// token claims and stay empty.
    fn from(identity: VerifiedIdentity) -> Self {
        Self {
            subject_id: identity.subject,
            tenant_id: identity.tenant,
            scopes: identity.scopes,
            roles: identity.roles,
            agent_id: String::new(),
            session_id: String::new(),
        }
    }
}

impl IdentityVerifier for TokenVerifier {
    fn verify(&self, token: &str, now_unix_seconds: i64) -> Result<Caller, &'static str> {
        Self::verify(self, token, now_unix_seconds)
            .map(Caller::from)
            .map_err(|e| e.reason())
    }

    fn verify_with_expiry(
        &self,
        token: &str,
        now_unix_seconds: i64,
    ) -> Result<(Caller, i64), &'static str> {
        Self::verify(self, token, now_unix_seconds)
            .map(|identity| {
                let exp = identity.expires_at;
                (Caller::from(identity), exp)
            })
            .map_err(|e| e.reason())
    }
}
