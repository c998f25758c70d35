//! Identity tokens: JWTs (RFC 7519, compact JWS) verified against a JSON Web
//! Key Set (RFC 7517), and the identity they carry (DESIGN §1, §4, §8).
//!
//! Each key's type fixes the one algorithm it verifies — RSA → RS256,
//! EC P-256 → ES256, OKP Ed25519 → EdDSA, oct → HS256 — and a token whose
//! header names any other algorithm is refused before its signature is looked
//! at. So a token cannot pick `none`, nor HS256 keyed with an RSA public key
//! (algorithm confusion). Keys embedded in or pointed to by the token header
//! (`jwk`, `jku`, `x5u`, `x5c`) are never used: trust comes from the key set
//! alone. `exp` is required; `exp` and `nbf` are checked against the caller's
//! clock (`now_unix`), never the system's, so tests do not sleep.
//!
//! This module must not log, must not read anything the model wrote, and never
//! puts the token, a signature or key material into an error message or a
//! `Debug` output. Values taken from a token (a `kid`, an `alg`) appear only
//! escaped and truncated.

mod claims;
mod errors;
mod keys;
mod memo;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value};

pub use errors::{JwksError, TokenError};
use errors::{invalid, kid_label, malformed, missing, printable};
pub use keys::KeySet;
use keys::{ACCEPTED, alg_name};
pub(crate) use keys::{parse_key_set, provider, read_key_set};
use memo::VerifiedSignatures;

/// The longest token accepted, in bytes. Real identity tokens stay well under
/// this; anything longer is refused before any decoding work.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The largest key set file read, in bytes.
pub const MAX_JWKS_BYTES: u64 = 1024 * 1024;

/// Names of the claims that carry identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimNames {
    /// A non-empty string; default `sub`.
    pub subject: String,
    /// A non-empty string; default `tenant`.
    pub tenant: String,
    /// A JSON array of strings; default `roles`.
    pub roles: String,
    /// A space-separated string (or an array of strings); default `scope`.
    pub scope: String,
}

impl Default for ClaimNames {
    fn default() -> Self {
        Self {
            subject: "sub".to_owned(),
            tenant: "tenant".to_owned(),
            roles: "roles".to_owned(),
            scope: "scope".to_owned(),
        }
    }
}

/// What a token must satisfy besides its signature.
#[derive(Debug, Clone)]
pub struct VerifierConfig {
    /// When set, `iss` must be present and equal to it.
    pub issuer: Option<String>,
    /// When set, `aud` must be present and name it. When unset, a token that
    /// names any audience is refused (RFC 7519 §4.1.3): it was minted for
    /// someone, and toolgate cannot tell that it is toolgate.
    pub audience: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds; default 30.
    pub leeway_seconds: u64,
    pub claims: ClaimNames,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        Self {
            issuer: None,
            audience: None,
            leeway_seconds: 30,
            claims: ClaimNames::default(),
        }
    }
}

/// The identity a verified token carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedIdentity {
    pub subject: String,
    pub tenant: String,
    pub roles: Vec<String>,
    pub scopes: Vec<String>,
    /// The token's `exp`, in unix seconds.
    pub expires_at: i64,
}

/// Where a verifier's keys come from: a fixed set (a file), or a set that
/// is fetched again and may rotate ([`super::RemoteKeySet`]).
pub trait KeySource: Send + Sync + fmt::Debug {
    /// The set in force now.
    fn current(&self) -> std::sync::Arc<KeySet>;

    /// A token named a key the current set lacks: ask for a fresh fetch.
    /// `None` when none was started (a fixed set, or the rate limit that
    /// keeps a flood of unknown kids from hammering the identity
    /// provider); else a receiver that changes when the next fetch has
    /// ended, successful or not.
    fn refresh_for_unknown_key(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// A key set read once (a file, or a text in tests): it never changes.
#[derive(Debug)]
pub struct FixedKeys(std::sync::Arc<KeySet>);

impl KeySource for FixedKeys {
    fn current(&self) -> std::sync::Arc<KeySet> {
        std::sync::Arc::clone(&self.0)
    }
}

/// Verifies identity tokens against a key source. Build one per key source
/// and audience, and share it; verification takes `&self`.
pub struct TokenVerifier {
    keys: std::sync::Arc<dyn KeySource>,
    config: VerifierConfig,
}

impl fmt::Debug for TokenVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Key ids and algorithms only: never the key bytes.
        let keys: Vec<String> = self.keys.current().labels().collect();
        f.debug_struct("TokenVerifier")
            .field("keys", &keys)
            .field("config", &self.config)
            .finish()
    }
}

impl TokenVerifier {
    /// Reads a JWKS file (at most [`MAX_JWKS_BYTES`]) and parses it as
    /// [`TokenVerifier::from_jwks_json`] does.
    ///
    /// # Errors
    /// [`TokenError::Io`] when the file cannot be read, is not UTF-8 or is too
    /// large; [`TokenError::Jwks`] as for [`TokenVerifier::from_jwks_json`].
    pub fn from_jwks_file(path: &Path, config: VerifierConfig) -> Result<Self, TokenError> {
        Self::from_jwks_json(&read_key_set(path)?, config)
    }

    /// A verifier of `config` over the keys of `keys` (a fixed set, or one
    /// that rotates).
    #[must_use]
    pub fn with_keys(keys: std::sync::Arc<dyn KeySource>, config: VerifierConfig) -> Self {
        Self { keys, config }
    }

    /// A verifier over the same keys with another `config` (another
    /// audience, say): a rotation reaches both.
    #[must_use]
    pub fn sharing_keys(&self, config: VerifierConfig) -> Self {
        Self {
            keys: std::sync::Arc::clone(&self.keys),
            config,
        }
    }

    /// Parses a JWKS text (RFC 7517).
    ///
    /// Keys that are not for verifying signatures are **skipped**, as any
    /// consumer of a published key set must: a `use` other than `sig`, a
    /// `key_ops` without `verify`, or an `alg` naming a key-encryption
    /// algorithm (`RSA-OAEP`, `ECDH-ES`, `A128KW`, …). Every other key must be
    /// usable, or the whole set is **refused**: RSA of 2048–8192 bits
    /// (`alg` absent or `RS256`), EC P-256 (`ES256`), OKP Ed25519 (`EdDSA`),
    /// oct of at least 32 bytes (`HS256`). An asymmetric key carrying private
    /// members is refused. A key without `kid` is allowed only as the set's
    /// sole signature key; kids must be unique.
    ///
    /// # Errors
    /// [`TokenError::Jwks`] naming the first offending key.
    pub fn from_jwks_json(jwks: &str, config: VerifierConfig) -> Result<Self, TokenError> {
        let keys = KeySet::from_jwks_json(jwks)?;
        Ok(Self::with_keys(
            std::sync::Arc::new(FixedKeys(std::sync::Arc::new(keys))),
            config,
        ))
    }

    /// The key ids of the set in force, in order (`None` for a sole key
    /// without one).
    #[must_use]
    pub fn key_ids(&self) -> Vec<Option<String>> {
        self.keys
            .current()
            .key_ids()
            .map(|k| k.map(str::to_owned))
            .collect()
    }

    /// Verifies `token` at `now_unix` (seconds) and returns the identity it
    /// carries. The checks run in this order, and the first failure is the
    /// error: shape, algorithm, key, algorithm-to-key binding, signature,
    /// `exp`/`nbf`, issuer, audience, identity claims. No claim is read
    /// before the signature has verified.
    ///
    /// # Errors
    /// The [`TokenError`] of the first failed check.
    pub fn verify(&self, token: &str, now_unix: i64) -> Result<VerifiedIdentity, TokenError> {
        let result = self.verify_with(&self.keys.current(), token, now_unix);
        if matches!(result, Err(TokenError::UnknownKey { .. })) {
            // Not awaited here: the next token naming that key finds it.
            let _ = self.keys.refresh_for_unknown_key();
        }
        result
    }

    /// [`Self::verify`] that, when the token names a key the set lacks and
    /// a fetch of the set may start, waits for that fetch (at most
    /// `wait`) and verifies again: a key published just now verifies on
    /// its first token. `now_unix` is read after the wait.
    ///
    /// # Errors
    /// As [`Self::verify`].
    pub async fn verify_fresh(
        &self,
        token: &str,
        now_unix: impl Fn() -> i64 + Send,
        wait: std::time::Duration,
    ) -> Result<VerifiedIdentity, TokenError> {
        let result = self.verify_with(&self.keys.current(), token, now_unix());
        if !matches!(result, Err(TokenError::UnknownKey { .. })) {
            return result;
        }
        let Some(mut fetched) = self.keys.refresh_for_unknown_key() else {
            return result;
        };
        if tokio::time::timeout(wait, fetched.changed()).await.is_err() {
            return result;
        }
        self.verify_with(&self.keys.current(), token, now_unix())
    }

    fn verify_with(
        &self,
        keys: &KeySet,
        token: &str,
        now_unix: i64,
    ) -> Result<VerifiedIdentity, TokenError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(malformed("longer than 16384 bytes"));
        }
        let (signing_input, signature) = token
            .rsplit_once('.')
            .ok_or_else(|| malformed("not three dot-separated parts"))?;
        let (header, payload) = signing_input
            .split_once('.')
            .ok_or_else(|| malformed("not three dot-separated parts"))?;
        if payload.contains('.') {
            return Err(malformed("not three dot-separated parts"));
        }
        let header =
            json_object(header).ok_or_else(|| malformed("the header is not a JSON object"))?;
        let algorithm = match header.get("alg") {
            Some(Value::String(alg)) => ACCEPTED
                .iter()
                .find(|(name, _)| name == alg)
                .map(|&(_, a)| a)
                .ok_or_else(|| TokenError::UnsupportedAlgorithm {
                    alg: printable(alg),
                })?,
            _ => return Err(malformed("the header has no string `alg`")),
        };
        if header.contains_key("crit") {
            // RFC 7515 §4.1.11: a recipient must refuse critical extensions it
            // does not implement; toolgate implements none (this also refuses
            // unencoded payloads, RFC 7797).
            return Err(malformed("the header names critical extensions (`crit`)"));
        }
        let kid = match header.get("kid") {
            None => None,
            Some(Value::String(kid)) => Some(kid.as_str()),
            Some(_) => return Err(malformed("the header's `kid` is not a string")),
        };
        let key = keys.key_for(kid)?;
        if key.algorithm != algorithm {
            return Err(TokenError::WrongAlgorithm {
                alg: alg_name(algorithm),
                expected: alg_name(key.algorithm),
                kid: key.kid.as_deref().map(printable),
            });
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| malformed("the signature is not base64url"))?;
        let fingerprint = VerifiedSignatures::fingerprint(key.index, signing_input, &signature);
        if !keys.verified.contains(&fingerprint) {
            // INVARIANT: every key was built by this provider's verifier factory
            // at load, so this only fails if the backend changed its mind; fail
            // closed.
            let verifier = (provider().verifier_factory)(&key.algorithm, &key.key)
                .map_err(|_| TokenError::BadSignature)?;
            verifier
                .verify(signing_input.as_bytes(), &signature)
                .map_err(|_| TokenError::BadSignature)?;
            keys.verified.remember(fingerprint);
        }

        let claims =
            json_object(payload).ok_or_else(|| malformed("the payload is not a JSON object"))?;
        let expires_at = self.check_time(&claims, now_unix)?;
        self.check_issuer(&claims)?;
        self.check_audience(&claims)?;
        self.identity(&claims, expires_at)
    }
}

/// A base64url (unpadded, canonical) JSON object, or `None`.
fn json_object(part: &str) -> Option<Map<String, Value>> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}
