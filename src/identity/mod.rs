//! Who is calling: the authenticated caller of a decision, the rule of who
//! a request runs as ([`Principals`]), identity tokens verified against a
//! JWKS (`token`) that may be fetched from the identity provider and
//! rotate (`remote`), and development keys (`dev`).
//!
//! The caller comes from the executor's authentication middleware (trusted,
//! DESIGN §1) or a verified token, never from the model's arguments. A leaf:
//! it imports only the clock, the tenant scope and the error table; it must
//! not read anything the model wrote, nor log tokens or keys.

/// How long a call waits for the key-set fetch a token's unknown key asked
/// for before it is refused as `unknown_key`.
pub const UNKNOWN_KEY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Turns an identity token into the caller it names, or the reason it
/// cannot (a stable snake_case word).
#[async_trait::async_trait]
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

    /// [`IdentityVerifier::verify_with_expiry`] that, for a token naming a
    /// key the set lacks, first waits (bounded by [`UNKNOWN_KEY_WAIT`]) for
    /// the fetch of the key set that the unknown key asked for, when the
    /// rate limit let one start. `now_unix_seconds` is read after the wait.
    ///
    /// # Errors
    /// The reason the token is not acceptable.
    async fn verify_fresh(
        &self,
        token: &str,
        now_unix_seconds: &(dyn Fn() -> i64 + Send + Sync),
    ) -> Result<(Caller, i64), &'static str> {
        self.verify_with_expiry(token, now_unix_seconds())
    }
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

/// The credential of an `Authorization: Bearer <token>` value (RFC 6750;
/// the scheme is case-insensitive): how the gateway doors read the user's
/// identity token.
#[must_use]
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, credential) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credential.trim())
}

mod dev;
mod principals;
mod remote;
mod token;

pub use remote::{JwksLocation, RemoteJwksConfig, RemoteKeySet, RemoteKeysError};

pub use principals::{Principals, require_caller};

pub use dev::{DEV_KID, DevSigner, generate_dev_keyset};
pub use token::{
    ClaimNames, FixedKeys, JwksError, KeySet, KeySource, MAX_JWKS_BYTES, MAX_TOKEN_BYTES,
    TokenError, TokenVerifier, VerifiedIdentity, VerifierConfig,
};

/// The one value of header `name` as text: `None` when it is absent, sent
/// twice (a request that says two things is taken at neither) or not text.
/// The plain HTTP doors read identity tokens (and their other headers) with it.
#[must_use]
pub fn single_header<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => v.to_str().ok(),
        _ => None,
    }
}

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

#[async_trait::async_trait]
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

    async fn verify_fresh(
        &self,
        token: &str,
        now_unix_seconds: &(dyn Fn() -> i64 + Send + Sync),
    ) -> Result<(Caller, i64), &'static str> {
        Self::verify_fresh(self, token, now_unix_seconds, UNKNOWN_KEY_WAIT)
            .await
            .map(|identity| {
                let exp = identity.expires_at;
                (Caller::from(identity), exp)
            })
            .map_err(|e| e.reason())
    }
}
