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

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{Map, Value};

/// The longest token accepted, in bytes. Real identity tokens stay well under
/// this; anything longer is refused before any decoding work.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The largest key set file read, in bytes.
pub const MAX_JWKS_BYTES: u64 = 1024 * 1024;

/// RFC 7518 §3.2: an HS256 key must be at least as long as the hash output.
const MIN_HMAC_KEY_BYTES: usize = 32;

/// RSA moduli below this are refused (NIST SP 800-131A); above the upper
/// bound the RustCrypto backend would fail every verification.
const MIN_RSA_BITS: usize = 2048;
const MAX_RSA_BITS: usize = 8192;

/// The four algorithms toolgate accepts (DESIGN §8).
const ACCEPTED: [(&str, Algorithm); 4] = [
    ("RS256", Algorithm::RS256),
    ("ES256", Algorithm::ES256),
    ("EdDSA", Algorithm::EdDSA),
    ("HS256", Algorithm::HS256),
];

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

/// Why a key set cannot be loaded. `index` is the key's position in `keys`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
pub enum JwksError {
    #[error("the key set is not valid JSON (line {line}, column {column})")]
    Syntax { line: usize, column: usize },
    #[error(
        "the key set is not a JWKS: expected an object with a `keys` array of objects (line {line}, column {column})"
    )]
    Shape { line: usize, column: usize },
    #[error(
        "the key set holds no signature key ({skipped} key(s) not meant for signatures skipped)"
    )]
    #[diagnostic(help("add an RSA, EC P-256, Ed25519 or oct key with `\"use\": \"sig\"`"))]
    NoUsableKeys { skipped: usize },
    #[error("`keys[{index}]` has no `kid`; when a set holds several signature keys each needs one")]
    KeyWithoutKid { index: usize },
    #[error("`keys[{index}]` repeats the kid `{kid}`")]
    DuplicateKid { index: usize, kid: String },
    #[error("`keys[{index}]` ({}) is not supported: {detail}", kid_label(.kid.as_deref()))]
    #[diagnostic(help(
        "toolgate verifies RS256 (RSA), ES256 (EC P-256), EdDSA (OKP Ed25519) and HS256 (oct)"
    ))]
    UnsupportedKey {
        index: usize,
        kid: Option<String>,
        detail: String,
    },
    #[error("`keys[{index}]` ({}) is invalid: {detail}", kid_label(.kid.as_deref()))]
    InvalidKey {
        index: usize,
        kid: Option<String>,
        detail: &'static str,
    },
    #[error("`keys[{index}]` ({}) holds private key material", kid_label(.kid.as_deref()))]
    #[diagnostic(help(
        "publish only the public members of asymmetric keys (drop `d`, `p`, `q`, …)"
    ))]
    PrivateKeyMaterial { index: usize, kid: Option<String> },
    #[error("the key set has no oct key with kid `{kid}` of at least 32 bytes")]
    MissingDevKey { kid: &'static str },
}

/// Why a token (or the key set that verifies tokens) is not acceptable.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TokenError {
    #[error("cannot read the key set `{}`", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Jwks(#[from] JwksError),
    #[error("the token is malformed: {detail}")]
    Malformed { detail: &'static str },
    #[error("the token names no key of the key set ({})", kid_label(.kid.as_deref()))]
    UnknownKey { kid: Option<String> },
    #[error("the token's algorithm `{alg}` is not accepted (RS256, ES256, EdDSA, HS256 are)")]
    UnsupportedAlgorithm { alg: String },
    #[error("the token's algorithm `{alg}` does not match its key ({}), which verifies only `{expected}`", kid_label(.kid.as_deref()))]
    WrongAlgorithm {
        alg: &'static str,
        expected: &'static str,
        kid: Option<String>,
    },
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token expired at {expired_at} (unix seconds)")]
    Expired { expired_at: i64 },
    #[error("the token is not valid before {not_before} (unix seconds)")]
    NotYetValid { not_before: i64 },
    #[error("the token's issuer is not `{expected}`")]
    WrongIssuer { expected: String },
    #[error("the token is not meant for the audience `{expected}`")]
    WrongAudience { expected: String },
    #[error("the token names an audience, and no audience is configured")]
    #[diagnostic(help("configure the audience toolgate's tokens carry (`--audience`)"))]
    AudienceNotConfigured,
    #[error("the token lacks the claim `{claim}`")]
    MissingClaim { claim: String },
    #[error("the token's claim `{claim}` is not {expected}")]
    InvalidClaim {
        claim: String,
        expected: &'static str,
    },
    #[error("no operating-system randomness for a development key")]
    RandomUnavailable,
    #[error("cannot sign a development token")]
    Signing,
}

impl TokenError {
    /// A stable snake_case reason for envelope details and metrics. It names
    /// the check that failed and nothing the token said.
    #[must_use]
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::Io { .. } => "key_set_unreadable",
            Self::Jwks(_) => "key_set_invalid",
            Self::Malformed { .. } => "malformed",
            Self::UnknownKey { .. } => "unknown_key",
            Self::UnsupportedAlgorithm { .. } => "unsupported_algorithm",
            Self::WrongAlgorithm { .. } => "wrong_algorithm",
            Self::BadSignature => "bad_signature",
            Self::Expired { .. } => "expired",
            Self::NotYetValid { .. } => "not_yet_valid",
            Self::WrongIssuer { .. } => "wrong_issuer",
            Self::WrongAudience { .. } | Self::AudienceNotConfigured => "wrong_audience",
            Self::MissingClaim { .. } => "missing_claim",
            Self::InvalidClaim { .. } => "invalid_claim",
            Self::RandomUnavailable => "random_unavailable",
            Self::Signing => "signing_failed",
        }
    }
}

/// One verification key: its id, the one algorithm it verifies, the key.
struct VerificationKey {
    index: usize,
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// A parsed key set: the verification keys of one JWKS, in order, and the
/// signatures they have verified.
pub struct KeySet {
    keys: Vec<VerificationKey>,
    verified: VerifiedSignatures,
}

/// The most signatures a key set remembers; past it, it forgets them all
/// and starts again (a burst of distinct tokens costs one verification
/// each, as it would with no memory at all).
const MAX_VERIFIED_SIGNATURES: usize = 4096;

/// Signatures a key set has verified, so that the same token presented
/// again (an executor's or a gateway's every call carries its user's token)
/// is not verified again: an ES256 verification costs about 280 µs here.
///
/// What is remembered is the SHA-256 of (the key's position in the set,
/// the signing input, the signature): "this key of this set verified this
/// signature over these bytes", nothing more. Every other check (shape,
/// algorithm, key binding, `exp`/`nbf`, issuer, audience, claims) still
/// runs on every use. Only a signature that verified is ever remembered,
/// so a flood of forged tokens cannot fill it; and the memory belongs to
/// the set: when the key source rotates the set, a new set starts empty,
/// so a key removed from it verifies nothing remembered.
#[derive(Default)]
struct VerifiedSignatures(std::sync::Mutex<std::collections::HashSet<[u8; 32]>>);

impl VerifiedSignatures {
    fn fingerprint(key_index: usize, signing_input: &str, signature: &[u8]) -> [u8; 32] {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        hash.update((key_index as u64).to_le_bytes());
        // The signing input is base64url and dots: it never holds a NUL.
        hash.update(signing_input.as_bytes());
        hash.update([0]);
        hash.update(signature);
        hash.finalize().into()
    }

    fn contains(&self, fingerprint: &[u8; 32]) -> bool {
        self.0.lock().is_ok_and(|set| set.contains(fingerprint))
    }

    fn remember(&self, fingerprint: [u8; 32]) {
        // A poisoned lock only means no memory: every token is verified.
        if let Ok(mut set) = self.0.lock() {
            if set.len() >= MAX_VERIFIED_SIGNATURES {
                set.clear();
            }
            set.insert(fingerprint);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map_or(0, |set| set.len())
    }
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.labels()).finish()
    }
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

impl KeySet {
    /// Parses a JWKS text (RFC 7517) as [`TokenVerifier::from_jwks_json`]
    /// describes.
    ///
    /// # Errors
    /// [`TokenError::Jwks`] naming the first offending key.
    pub fn from_jwks_json(jwks: &str) -> Result<Self, TokenError> {
        let raw = parse_key_set(jwks)?;
        let mut keys = Vec::new();
        let mut skipped = 0;
        for (index, member) in raw.keys.into_iter().enumerate() {
            match verification_key(index, member)? {
                Some(key) => keys.push(key),
                None => skipped += 1,
            }
        }
        if keys.is_empty() {
            return Err(JwksError::NoUsableKeys { skipped }.into());
        }
        if keys.len() > 1 {
            for (n, key) in keys.iter().enumerate() {
                let Some(kid) = &key.kid else {
                    return Err(JwksError::KeyWithoutKid { index: key.index }.into());
                };
                if keys.iter().take(n).any(|k| k.kid.as_ref() == Some(kid)) {
                    return Err(JwksError::DuplicateKid {
                        index: key.index,
                        kid: printable(kid),
                    }
                    .into());
                }
            }
        }
        Ok(Self {
            keys,
            verified: VerifiedSignatures::default(),
        })
    }

    /// The key ids of the set, in order (`None` for a sole key without one).
    pub fn key_ids(&self) -> impl Iterator<Item = Option<&str>> {
        self.keys.iter().map(|k| k.kid.as_deref())
    }

    /// `kid … ALG` per key: what logs and `Debug` may show of a set.
    fn labels(&self) -> impl Iterator<Item = String> + '_ {
        self.keys
            .iter()
            .map(|k| format!("{} {}", kid_label(k.kid.as_deref()), alg_name(k.algorithm)))
    }

    fn key_for(&self, kid: Option<&str>) -> Result<&VerificationKey, TokenError> {
        let found = match kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            // A token without `kid` can only mean the sole key of the set.
            None => match self.keys.as_slice() {
                [only] => Some(only),
                _ => None,
            },
        };
        found.ok_or_else(|| TokenError::UnknownKey {
            kid: kid.map(printable),
        })
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

    fn check_time(&self, claims: &Map<String, Value>, now: i64) -> Result<i64, TokenError> {
        let leeway = i64::try_from(self.config.leeway_seconds).unwrap_or(i64::MAX);
        let exp = numeric_date(claims, "exp")?.ok_or_else(|| missing("exp"))?;
        // RFC 7519 §4.1.4: valid only *before* `exp`.
        if now >= exp.saturating_add(leeway) {
            return Err(TokenError::Expired { expired_at: exp });
        }
        if let Some(nbf) = numeric_date(claims, "nbf")? {
            // RFC 7519 §4.1.5: valid *on or after* `nbf`.
            if now.saturating_add(leeway) < nbf {
                return Err(TokenError::NotYetValid { not_before: nbf });
            }
        }
        Ok(exp)
    }

    fn check_issuer(&self, claims: &Map<String, Value>) -> Result<(), TokenError> {
        let Some(expected) = &self.config.issuer else {
            return Ok(());
        };
        match claims.get("iss") {
            None | Some(Value::Null) => Err(missing("iss")),
            Some(Value::String(iss)) if iss == expected => Ok(()),
            Some(Value::String(_)) => Err(TokenError::WrongIssuer {
                expected: expected.clone(),
            }),
            Some(_) => Err(invalid("iss", "a string")),
        }
    }

    fn check_audience(&self, claims: &Map<String, Value>) -> Result<(), TokenError> {
        let audiences: Vec<&str> = match claims.get("aud") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(aud)) => vec![aud.as_str()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| invalid("aud", "a string or an array of strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid("aud", "a string or an array of strings")),
        };
        match &self.config.audience {
            Some(_) if audiences.is_empty() => Err(missing("aud")),
            Some(expected) if audiences.contains(&expected.as_str()) => Ok(()),
            Some(expected) => Err(TokenError::WrongAudience {
                expected: expected.clone(),
            }),
            None if audiences.is_empty() => Ok(()),
            None => Err(TokenError::AudienceNotConfigured),
        }
    }

    fn identity(
        &self,
        claims: &Map<String, Value>,
        expires_at: i64,
    ) -> Result<VerifiedIdentity, TokenError> {
        let names = &self.config.claims;
        let required = |name: &str| match claims.get(name) {
            None | Some(Value::Null) => Err(missing(name)),
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(_) => Err(invalid(name, "a non-empty string")),
        };
        let subject = required(&names.subject)?;
        let tenant = required(&names.tenant)?;
        let roles = match claims.get(&names.roles) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => string_items(items)
                .ok_or_else(|| invalid(&names.roles, "an array of non-empty strings"))?,
            Some(_) => return Err(invalid(&names.roles, "an array of non-empty strings")),
        };
        let scopes = match claims.get(&names.scope) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => s.split_ascii_whitespace().map(str::to_owned).collect(),
            // Some identity providers send scopes as an array (`scp`).
            Some(Value::Array(items)) => string_items(items).ok_or_else(|| {
                invalid(
                    &names.scope,
                    "a space-separated string or an array of strings",
                )
            })?,
            Some(_) => {
                return Err(invalid(
                    &names.scope,
                    "a space-separated string or an array of strings",
                ));
            }
        };
        Ok(VerifiedIdentity {
            subject,
            tenant,
            roles,
            scopes,
            expires_at,
        })
    }
}

/// The one crypto backend toolgate uses. Named explicitly rather than taken
/// from jsonwebtoken's process default, which panics when a dependency graph
/// enables both or neither backend feature.
pub(crate) fn provider() -> &'static CryptoProvider {
    &jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER
}

/// The `keys` of a JWKS, each kept as raw members so that private members
/// and per-key errors can be reported before typed parsing.
#[derive(serde::Deserialize)]
pub(crate) struct RawKeySet {
    pub(crate) keys: Vec<Map<String, Value>>,
}

pub(crate) fn parse_key_set(jwks: &str) -> Result<RawKeySet, JwksError> {
    // serde_json's messages can quote the offending value (a key's `k`, say),
    // so only the position and the category are kept.
    serde_json::from_str(jwks).map_err(|e| {
        let (line, column) = (e.line(), e.column());
        if e.is_data() {
            JwksError::Shape { line, column }
        } else {
            JwksError::Syntax { line, column }
        }
    })
}

pub(crate) fn read_key_set(path: &Path) -> Result<String, TokenError> {
    let io = |source| TokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    file.take(MAX_JWKS_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if u64::try_from(text.len()).unwrap_or(u64::MAX) > MAX_JWKS_BYTES {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the key set is larger than 1 MiB",
        )));
    }
    Ok(text)
}

/// Turns one raw JWK into a verification key, `None` when it is not meant for
/// verifying signatures.
fn verification_key(
    index: usize,
    member: Map<String, Value>,
) -> Result<Option<VerificationKey>, JwksError> {
    let kid = match member.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => {
            return Err(JwksError::InvalidKey {
                index,
                kid: None,
                detail: "`kid` is not a string",
            });
        }
    };
    let label = kid.as_deref().map(printable);
    let invalid_key = |detail| JwksError::InvalidKey {
        index,
        kid: label.clone(),
        detail,
    };
    let unsupported = |detail: String| JwksError::UnsupportedKey {
        index,
        kid: label.clone(),
        detail,
    };
    if !for_signatures(&member).map_err(invalid_key)? {
        return Ok(None);
    }
    let kty = match member.get("kty") {
        Some(Value::String(kty)) => kty.clone(),
        _ => return Err(invalid_key("`kty` is missing or not a string")),
    };
    let private: &[&str] = match kty.as_str() {
        "RSA" => &["d", "p", "q", "dp", "dq", "qi", "oth"],
        "EC" | "OKP" => &["d"],
        _ => &[],
    };
    if private.iter().any(|m| member.contains_key(*m)) {
        return Err(JwksError::PrivateKeyMaterial { index, kid: label });
    }
    let declared = match member.get("alg") {
        None => None,
        Some(Value::String(alg)) => Some(alg.clone()),
        Some(_) => return Err(invalid_key("`alg` is not a string")),
    };
    let curve = member.get("crv").and_then(Value::as_str).map(printable);
    let jwk: Jwk = serde_json::from_value(Value::Object(member))
        .map_err(|_| invalid_key("a member has the wrong type"))?;
    let (algorithm, detail) = match &jwk.algorithm {
        AlgorithmParameters::RSA(p) => {
            check_rsa(&p.n, &p.e).map_err(invalid_key)?;
            (Algorithm::RS256, "RSA keys verify only RS256 here")
        }
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
            check_len(&p.x, 32).map_err(|()| invalid_key("`x` is not 32 base64url bytes"))?;
            check_len(&p.y, 32).map_err(|()| invalid_key("`y` is not 32 base64url bytes"))?;
            (Algorithm::ES256, "EC P-256 keys verify only ES256")
        }
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            check_len(&p.x, 32).map_err(|()| invalid_key("`x` is not 32 base64url bytes"))?;
            (Algorithm::EdDSA, "Ed25519 keys verify only EdDSA")
        }
        AlgorithmParameters::OctetKey(p) => {
            let secret = URL_SAFE_NO_PAD
                .decode(&p.value)
                .map_err(|_| invalid_key("`k` is not base64url"))?;
            if secret.len() < MIN_HMAC_KEY_BYTES {
                return Err(invalid_key("an HS256 secret must be at least 32 bytes"));
            }
            (Algorithm::HS256, "oct keys verify only HS256")
        }
        AlgorithmParameters::EllipticCurve(_) | AlgorithmParameters::OctetKeyPair(_) => {
            return Err(unsupported(format!(
                "curve `{}` (only P-256 and Ed25519 are)",
                curve.unwrap_or_default()
            )));
        }
        // `Other`, and whatever a later jsonwebtoken adds (non-exhaustive).
        _ => {
            return Err(match kty.as_str() {
                "RSA" | "oct" => invalid_key("a required member is missing or malformed"),
                "EC" | "OKP" => match curve {
                    Some(curve) => {
                        unsupported(format!("curve `{curve}`, or a required member is missing"))
                    }
                    None => invalid_key("`crv` is missing"),
                },
                other => unsupported(format!("key type `{}`", printable(other))),
            });
        }
    };
    if let Some(declared) = declared
        && declared != alg_name(algorithm)
    {
        return Err(unsupported(format!(
            "`alg` is `{}`; {detail}",
            printable(&declared)
        )));
    }
    let key = DecodingKey::from_jwk(&jwk).map_err(|_| invalid_key("the key does not decode"))?;
    // Building a verifier parses the public key (EC point on the curve,
    // Ed25519 point decompression), so a bad key fails here, not per token.
    if (provider().verifier_factory)(&algorithm, &key).is_err() {
        return Err(invalid_key("not a valid public key for its algorithm"));
    }
    Ok(Some(VerificationKey {
        index,
        kid,
        algorithm,
        key,
    }))
}

/// Whether a JWK is meant for verifying signatures (`use`, `key_ops`, `alg`).
fn for_signatures(member: &Map<String, Value>) -> Result<bool, &'static str> {
    match member.get("use") {
        None => {}
        Some(Value::String(u)) if u == "sig" => {}
        Some(Value::String(_)) => return Ok(false),
        Some(_) => return Err("`use` is not a string"),
    }
    match member.get("key_ops") {
        None => {}
        Some(Value::Array(ops)) if ops.iter().any(|op| op.as_str() == Some("verify")) => {}
        Some(Value::Array(_)) => return Ok(false),
        Some(_) => return Err("`key_ops` is not an array"),
    }
    if let Some(Value::String(alg)) = member.get("alg") {
        // RFC 7518 §4.1: the key-management algorithms of JWE.
        let encryption = alg == "RSA1_5"
            || alg == "dir"
            || alg.starts_with("RSA-OAEP")
            || alg.starts_with("ECDH-ES")
            || alg.starts_with("PBES2-")
            || (alg.starts_with('A') && alg.ends_with("KW"));
        if encryption {
            return Ok(false);
        }
    }
    Ok(true)
}

fn check_rsa(n: &str, e: &str) -> Result<(), &'static str> {
    let n = URL_SAFE_NO_PAD
        .decode(n)
        .map_err(|_| "`n` is not base64url")?;
    let e = URL_SAFE_NO_PAD
        .decode(e)
        .map_err(|_| "`e` is not base64url")?;
    let n = strip_leading_zeros(&n);
    let e = strip_leading_zeros(&e);
    let bits = match n.first() {
        Some(&top) => (n.len() - 1) * 8 + (8 - top.leading_zeros() as usize),
        None => 0,
    };
    if bits < MIN_RSA_BITS {
        return Err("the RSA modulus is shorter than 2048 bits");
    }
    if bits > MAX_RSA_BITS {
        return Err("the RSA modulus is longer than 8192 bits");
    }
    if n.last().is_none_or(|b| b % 2 == 0) {
        return Err("the RSA modulus is even");
    }
    // The backend accepts exponents up to 2^33 - 1; 65537 is the norm.
    let small =
        e.len() <= 5 && e.iter().fold(0_u64, |acc, b| (acc << 8) | u64::from(*b)) < (1 << 33);
    if !small || e.last().is_none_or(|b| b % 2 == 0) || e == [1] {
        return Err("the RSA exponent is not an odd number between 3 and 2^33");
    }
    Ok(())
}

fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    bytes.get(start..).unwrap_or_default()
}

fn check_len(b64: &str, len: usize) -> Result<(), ()> {
    match URL_SAFE_NO_PAD.decode(b64) {
        Ok(bytes) if bytes.len() == len => Ok(()),
        _ => Err(()),
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

/// A NumericDate claim (RFC 7519 §2): seconds, possibly fractional (floored).
fn numeric_date(claims: &Map<String, Value>, name: &str) -> Result<Option<i64>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                return Ok(Some(i));
            }
            match n.as_f64() {
                // `as` saturates: a date past i64 is "never", before it "always".
                Some(f) if f.is_finite() => Ok(Some(f.floor() as i64)),
                _ => Err(invalid(name, "a number of seconds")),
            }
        }
        Some(_) => Err(invalid(name, "a number of seconds")),
    }
}

fn string_items(items: &[Value]) -> Option<Vec<String>> {
    items
        .iter()
        .map(|v| match v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            _ => None,
        })
        .collect()
}

fn malformed(detail: &'static str) -> TokenError {
    TokenError::Malformed { detail }
}

fn missing(claim: &str) -> TokenError {
    TokenError::MissingClaim {
        claim: claim.to_owned(),
    }
}

fn invalid(claim: &str, expected: &'static str) -> TokenError {
    TokenError::InvalidClaim {
        claim: claim.to_owned(),
        expected,
    }
}

fn alg_name(algorithm: Algorithm) -> &'static str {
    ACCEPTED
        .iter()
        .find(|(_, a)| *a == algorithm)
        .map_or("unsupported", |(name, _)| name)
}

/// A value from a token or key set made safe for a message: escaped (no
/// control characters reach a log line) and cut at 64 characters.
fn printable(text: &str) -> String {
    const LIMIT: usize = 64;
    let mut out: String = text
        .chars()
        .take(LIMIT)
        .flat_map(char::escape_debug)
        .collect();
    if text.chars().nth(LIMIT).is_some() {
        out.push('…');
    }
    out
}

fn kid_label(kid: Option<&str>) -> String {
    match kid {
        Some(kid) => format!("kid `{kid}`"),
        None => "no kid".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;
    const ISSUER: &str = "https://idp.test";

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(fixture_path(name)).unwrap()
    }

    fn fixture_path(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/it/fixtures/keys")
            .join(name)
    }

    fn jwks() -> String {
        String::from_utf8(fixture("jwks.json")).unwrap()
    }

    fn strict() -> VerifierConfig {
        VerifierConfig {
            issuer: Some(ISSUER.into()),
            audience: Some("toolgate".into()),
            leeway_seconds: 30,
            claims: ClaimNames::default(),
        }
    }

    fn verifier() -> TokenVerifier {
        TokenVerifier::from_jwks_json(&jwks(), strict()).unwrap()
    }

    fn claims() -> Value {
        json!({
            "sub": "dana", "tenant": "acme", "roles": ["support_admin", "auditor"],
            "scope": "approvals:decide  approvals:read", "iss": ISSUER, "aud": "toolgate",
            "iat": NOW - 10, "nbf": NOW - 10, "exp": NOW + 300,
        })
    }

    fn with(key: &str, value: Value) -> Value {
        let mut c = claims();
        c[key] = value;
        c
    }

    fn without(key: &str) -> Value {
        let mut c = claims();
        c.as_object_mut().unwrap().remove(key);
        c
    }

    fn encoding_key(alg: Algorithm) -> EncodingKey {
        match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&fixture("rsa.pem")).unwrap(),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&fixture("ec.pem")).unwrap(),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(&fixture("ed25519.pem")).unwrap(),
            Algorithm::HS256 => EncodingKey::from_secret(&fixture("hs256.secret")).unwrap(),
            other => panic!("no fixture key for {other:?}"),
        }
    }

    fn kid_of(alg: Algorithm) -> &'static str {
        match alg {
            Algorithm::RS256 => "rsa-1",
            Algorithm::ES256 => "ec-1",
            Algorithm::EdDSA => "ed-1",
            _ => "hs-1",
        }
    }

    /// A token signed by jsonwebtoken itself with the fixture key of `alg`.
    fn sign(alg: Algorithm, claims: &Value) -> String {
        let mut header = Header::new(alg);
        header.kid = Some(kid_of(alg).into());
        jsonwebtoken::encode(&header, claims, &encoding_key(alg)).unwrap()
    }

    /// A token with any header, signed with `key` under `alg`.
    fn forge(header: &Value, claims: &Value, alg: Algorithm, key: &EncodingKey) -> String {
        let input = format!("{}.{}", b64(&header.to_string()), b64(&claims.to_string()));
        let signature = jsonwebtoken::crypto::sign(input.as_bytes(), key, alg).unwrap();
        format!("{input}.{signature}")
    }

    fn b64(text: &str) -> String {
        URL_SAFE_NO_PAD.encode(text)
    }

    fn error(v: &TokenVerifier, token: &str) -> TokenError {
        v.verify(token, NOW).unwrap_err()
    }

    fn reason(v: &TokenVerifier, token: &str) -> &'static str {
        error(v, token).reason()
    }

    fn jwks_error(text: &str) -> String {
        TokenVerifier::from_jwks_json(text, strict())
            .unwrap_err()
            .to_string()
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    fn remembered(v: &TokenVerifier) -> usize {
        v.keys.current().verified.len()
    }

    #[test]
    fn a_verified_signature_is_remembered_and_every_other_check_still_runs() {
        let v = verifier();
        let token = sign(Algorithm::ES256, &claims());
        assert_eq!(remembered(&v), 0);
        assert_eq!(v.verify(&token, NOW).unwrap().subject, "dana");
        assert_eq!(remembered(&v), 1);
        assert_eq!(v.verify(&token, NOW).unwrap().subject, "dana");
        assert_eq!(remembered(&v), 1);
        // Remembered, yet expired is expired and too early is too early.
        assert!(matches!(
            v.verify(&token, NOW + 400),
            Err(TokenError::Expired { .. })
        ));
        assert!(matches!(
            v.verify(&token, NOW - 100),
            Err(TokenError::NotYetValid { .. })
        ));
        // The same bytes with another key's kid: that key is checked afresh.
        let (input, signature) = token.rsplit_once('.').unwrap();
        let (_, payload) = input.split_once('.').unwrap();
        let other_kid = format!(
            "{}.{payload}.{signature}",
            b64(&json!({"alg": "ES256", "kid": "rsa-1"}).to_string())
        );
        assert_eq!(reason(&v, &other_kid), "wrong_algorithm");
    }

    #[test]
    fn a_changed_signature_or_payload_is_verified_afresh_and_refused() {
        let v = verifier();
        let token = sign(Algorithm::ES256, &claims());
        v.verify(&token, NOW).unwrap();
        let (input, signature) = token.rsplit_once('.').unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(signature).unwrap();
        raw[10] ^= 1;
        let tampered = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&raw));
        assert_eq!(reason(&v, &tampered), "bad_signature");
        let (header, _) = input.split_once('.').unwrap();
        let other_payload = format!(
            "{header}.{}.{signature}",
            b64(&with("sub", json!("mallory")).to_string())
        );
        assert_eq!(reason(&v, &other_payload), "bad_signature");
        assert_eq!(remembered(&v), 1);
    }

    /// A key source whose set the test replaces, as a rotation does.
    #[derive(Debug)]
    struct Swapped(std::sync::Mutex<std::sync::Arc<KeySet>>);

    impl KeySource for Swapped {
        fn current(&self) -> std::sync::Arc<KeySet> {
            std::sync::Arc::clone(&self.0.lock().unwrap())
        }
    }

    #[test]
    fn a_key_removed_by_a_rotation_verifies_nothing_it_verified_before() {
        let all = KeySet::from_jwks_json(&jwks()).unwrap();
        let mut without_ec: Value = serde_json::from_str(&jwks()).unwrap();
        without_ec["keys"]
            .as_array_mut()
            .unwrap()
            .retain(|k| k["kid"] != "ec-1");
        let rotated = KeySet::from_jwks_json(&without_ec.to_string()).unwrap();
        let source = std::sync::Arc::new(Swapped(std::sync::Mutex::new(std::sync::Arc::new(all))));
        let v = TokenVerifier::with_keys(source.clone(), strict());
        let token = sign(Algorithm::ES256, &claims());
        v.verify(&token, NOW).unwrap();
        assert_eq!(remembered(&v), 1);
        *source.0.lock().unwrap() = std::sync::Arc::new(rotated);
        assert_eq!(reason(&v, &token), "unknown_key");
        assert_eq!(remembered(&v), 0);
    }

    #[test]
    fn the_memory_is_bounded_and_forgets_all_at_once() {
        let memory = VerifiedSignatures::default();
        for i in 0..MAX_VERIFIED_SIGNATURES {
            memory.remember(VerifiedSignatures::fingerprint(0, &i.to_string(), b"s"));
        }
        assert_eq!(memory.len(), MAX_VERIFIED_SIGNATURES);
        let first = VerifiedSignatures::fingerprint(0, "0", b"s");
        assert!(memory.contains(&first));
        memory.remember(VerifiedSignatures::fingerprint(1, "0", b"s"));
        assert_eq!(memory.len(), 1);
        assert!(!memory.contains(&first));
    }

    #[test]
    fn every_algorithm_verifies_and_yields_the_identity() {
        let v = verifier();
        for alg in [
            Algorithm::RS256,
            Algorithm::ES256,
            Algorithm::EdDSA,
            Algorithm::HS256,
        ] {
            assert_eq!(
                v.verify(&sign(alg, &claims()), NOW).unwrap(),
                VerifiedIdentity {
                    subject: "dana".into(),
                    tenant: "acme".into(),
                    roles: strings(&["support_admin", "auditor"]),
                    scopes: strings(&["approvals:decide", "approvals:read"]),
                    expires_at: NOW + 300,
                },
                "{alg:?}"
            );
        }
    }

    #[test]
    fn expiry_is_checked_on_the_injected_clock_with_leeway() {
        let v = verifier();
        let at = |exp: i64| v.verify(&sign(Algorithm::ES256, &with("exp", json!(exp))), NOW);
        assert_eq!(
            at(NOW - 29).unwrap().expires_at,
            NOW - 29,
            "within the leeway"
        );
        assert_eq!(
            at(NOW - 30).unwrap_err().reason(),
            "expired",
            "leeway spent"
        );
        assert_eq!(
            at(NOW - 31).unwrap_err().to_string(),
            format!("the token expired at {} (unix seconds)", NOW - 31)
        );
        let no_leeway = TokenVerifier::from_jwks_json(
            &jwks(),
            VerifierConfig {
                leeway_seconds: 0,
                ..strict()
            },
        )
        .unwrap();
        let token = sign(Algorithm::ES256, &with("exp", json!(NOW)));
        assert_eq!(
            reason(&no_leeway, &token),
            "expired",
            "valid only before exp"
        );
        assert!(no_leeway.verify(&token, NOW - 1).is_ok());
        assert_eq!(at(0).unwrap_err().reason(), "expired", "an ancient token");
        // A fractional NumericDate is floored.
        let fractional = sign(Algorithm::ES256, &with("exp", json!(NOW as f64 + 100.75)));
        assert_eq!(v.verify(&fractional, NOW).unwrap().expires_at, NOW + 100);
    }

    #[test]
    fn exp_is_required_and_must_be_a_number() {
        let v = verifier();
        let e = error(&v, &sign(Algorithm::RS256, &without("exp")));
        assert_eq!(
            (e.reason(), e.to_string().as_str()),
            ("missing_claim", "the token lacks the claim `exp`")
        );
        let e = error(&v, &sign(Algorithm::RS256, &with("exp", json!("tomorrow"))));
        assert_eq!(
            (e.reason(), e.to_string().as_str()),
            (
                "invalid_claim",
                "the token's claim `exp` is not a number of seconds"
            )
        );
    }

    #[test]
    fn a_future_nbf_is_refused_beyond_the_leeway() {
        let v = verifier();
        let at = |nbf: i64| v.verify(&sign(Algorithm::EdDSA, &with("nbf", json!(nbf))), NOW);
        assert!(at(NOW + 30).is_ok(), "within the leeway");
        let e = at(NOW + 31).unwrap_err();
        assert_eq!(e.reason(), "not_yet_valid");
        assert_eq!(
            e.to_string(),
            format!("the token is not valid before {} (unix seconds)", NOW + 31)
        );
        let e = error(&v, &sign(Algorithm::EdDSA, &with("nbf", json!(null))));
        assert_eq!(e.reason(), "invalid_claim");
    }

    #[test]
    fn the_issuer_must_match_when_configured() {
        let v = verifier();
        let e = error(
            &v,
            &sign(Algorithm::RS256, &with("iss", json!("https://evil.test"))),
        );
        assert_eq!(e.reason(), "wrong_issuer");
        assert_eq!(
            e.to_string(),
            "the token's issuer is not `https://idp.test`"
        );
        assert_eq!(
            reason(&v, &sign(Algorithm::RS256, &without("iss"))),
            "missing_claim"
        );
        assert_eq!(
            reason(&v, &sign(Algorithm::RS256, &with("iss", json!([ISSUER])))),
            "invalid_claim"
        );
        let any_issuer = TokenVerifier::from_jwks_json(
            &jwks(),
            VerifierConfig {
                issuer: None,
                ..strict()
            },
        )
        .unwrap();
        let token = sign(Algorithm::RS256, &with("iss", json!("https://other.test")));
        assert!(any_issuer.verify(&token, NOW).is_ok());
    }

    #[test]
    fn the_audience_must_be_named_when_configured() {
        let v = verifier();
        let e = error(
            &v,
            &sign(Algorithm::HS256, &with("aud", json!("someone-else"))),
        );
        assert_eq!(e.reason(), "wrong_audience");
        assert_eq!(
            e.to_string(),
            "the token is not meant for the audience `toolgate`"
        );
        assert_eq!(
            reason(&v, &sign(Algorithm::HS256, &with("aud", json!(["a", "b"])))),
            "wrong_audience"
        );
        let listed = sign(
            Algorithm::HS256,
            &with("aud", json!(["billing", "toolgate"])),
        );
        assert!(v.verify(&listed, NOW).is_ok(), "one of several audiences");
        assert_eq!(
            reason(&v, &sign(Algorithm::HS256, &without("aud"))),
            "missing_claim"
        );
        assert_eq!(
            reason(
                &v,
                &sign(Algorithm::HS256, &with("aud", json!(["toolgate", 7])))
            ),
            "invalid_claim"
        );
    }

    #[test]
    fn without_a_configured_audience_a_token_for_someone_is_refused() {
        let v = TokenVerifier::from_jwks_json(
            &jwks(),
            VerifierConfig {
                audience: None,
                ..strict()
            },
        )
        .unwrap();
        let e = error(&v, &sign(Algorithm::HS256, &claims()));
        assert_eq!(e.reason(), "wrong_audience");
        assert_eq!(
            e.to_string(),
            "the token names an audience, and no audience is configured"
        );
        assert!(
            v.verify(&sign(Algorithm::HS256, &without("aud")), NOW)
                .is_ok()
        );
    }

    #[test]
    fn an_unknown_or_absent_kid_finds_no_key() {
        let v = verifier();
        let mut header = json!({"alg": "HS256", "kid": "hs-2"});
        let key = encoding_key(Algorithm::HS256);
        let e = error(&v, &forge(&header, &claims(), Algorithm::HS256, &key));
        assert_eq!(e.reason(), "unknown_key");
        assert_eq!(
            e.to_string(),
            "the token names no key of the key set (kid `hs-2`)"
        );
        header.as_object_mut().unwrap().remove("kid");
        let e = error(&v, &forge(&header, &claims(), Algorithm::HS256, &key));
        assert_eq!(
            e.to_string(),
            "the token names no key of the key set (no kid)"
        );
        // A kid from the token is escaped and cut in messages.
        let header = json!({"alg": "HS256", "kid": format!("x\n{}", "k".repeat(100))});
        let e = error(&v, &forge(&header, &claims(), Algorithm::HS256, &key));
        let text = e.to_string();
        assert!(
            text.contains("x\\nkkk") && text.ends_with("…`)") && !text.contains('\n'),
            "{text}"
        );
    }

    #[test]
    fn a_tampered_payload_fails_the_signature() {
        let v = verifier();
        for alg in [
            Algorithm::RS256,
            Algorithm::ES256,
            Algorithm::EdDSA,
            Algorithm::HS256,
        ] {
            let token = sign(alg, &claims());
            let parts: Vec<&str> = token.split('.').collect();
            let forged = b64(&with("tenant", json!("globex")).to_string());
            let tampered = format!("{}.{forged}.{}", parts[0], parts[2]);
            let e = error(&v, &tampered);
            assert_eq!(e.reason(), "bad_signature", "{alg:?}");
            assert_eq!(e.to_string(), "the token's signature does not verify");
        }
    }

    #[test]
    fn alg_none_is_refused_in_every_spelling() {
        let v = verifier();
        let payload = b64(&claims().to_string());
        for alg in ["none", "None", "NONE", "nOnE"] {
            for kid in [json!("rsa-1"), json!("hs-1")] {
                let header = b64(&json!({"alg": alg, "kid": kid}).to_string());
                for signature in ["", "AAAA"] {
                    let e = error(&v, &format!("{header}.{payload}.{signature}"));
                    assert_eq!(e.reason(), "unsupported_algorithm", "{alg} {signature:?}");
                    assert_eq!(
                        e.to_string(),
                        format!(
                            "the token's algorithm `{alg}` is not accepted (RS256, ES256, EdDSA, HS256 are)"
                        )
                    );
                }
            }
        }
    }

    #[test]
    fn other_algorithms_are_refused_even_for_a_matching_key_type() {
        let v = verifier();
        let rsa = encoding_key(Algorithm::RS256);
        let header = json!({"alg": "PS256", "kid": "rsa-1"});
        assert_eq!(
            reason(&v, &forge(&header, &claims(), Algorithm::PS256, &rsa)),
            "unsupported_algorithm"
        );
        let header = json!({"alg": "HS512", "kid": "hs-1"});
        let hs = encoding_key(Algorithm::HS256);
        assert_eq!(
            reason(&v, &forge(&header, &claims(), Algorithm::HS512, &hs)),
            "unsupported_algorithm"
        );
    }

    #[test]
    fn hs256_keyed_with_the_rsa_public_key_is_refused() {
        // The classic algorithm-confusion forgery: sign HS256 with the
        // verifier's RSA public key (its PEM text, its JWKS entry, its
        // modulus) as the HMAC secret, and name the RSA key.
        let public_pem = fixture("rsa.pub.pem");
        let set: Value = serde_json::from_str(&jwks()).unwrap();
        let jwk_text = set["keys"][0].to_string();
        let n = set["keys"][0]["n"].as_str().unwrap().to_owned();
        let secrets = [public_pem.clone(), jwk_text.into_bytes(), n.into_bytes()];
        let v = verifier();
        for secret in &secrets {
            let key = EncodingKey::from_secret(secret).unwrap();
            let header = json!({"alg": "HS256", "kid": "rsa-1", "typ": "JWT"});
            let e = error(&v, &forge(&header, &claims(), Algorithm::HS256, &key));
            assert_eq!(e.reason(), "wrong_algorithm");
            assert_eq!(
                e.to_string(),
                "the token's algorithm `HS256` does not match its key (kid `rsa-1`), which verifies only `RS256`"
            );
        }
        // Also when the RSA key is the sole key and the token names none.
        let rsa_only = json!({"keys": [{"kty": "RSA", "n": set["keys"][0]["n"], "e": "AQAB"}]});
        let v = TokenVerifier::from_jwks_json(&rsa_only.to_string(), strict()).unwrap();
        let key = EncodingKey::from_secret(&public_pem).unwrap();
        let token = forge(&json!({"alg": "HS256"}), &claims(), Algorithm::HS256, &key);
        assert_eq!(reason(&v, &token), "wrong_algorithm");
        let genuine = forge(
            &json!({"alg": "RS256"}),
            &claims(),
            Algorithm::RS256,
            &encoding_key(Algorithm::RS256),
        );
        assert_eq!(v.verify(&genuine, NOW).unwrap().subject, "dana");
    }

    #[test]
    fn a_token_naming_another_keys_kid_is_refused() {
        let v = verifier();
        let header = json!({"alg": "RS256", "kid": "hs-1"});
        let token = forge(
            &header,
            &claims(),
            Algorithm::RS256,
            &encoding_key(Algorithm::RS256),
        );
        assert_eq!(reason(&v, &token), "wrong_algorithm");
        let header = json!({"alg": "ES256", "kid": "ed-1"});
        let token = forge(
            &header,
            &claims(),
            Algorithm::ES256,
            &encoding_key(Algorithm::ES256),
        );
        assert_eq!(reason(&v, &token), "wrong_algorithm");
    }

    #[test]
    fn a_signature_by_another_key_is_refused() {
        let v = verifier();
        let unlisted = EncodingKey::from_rsa_pem(&fixture("rsa-unlisted.pem")).unwrap();
        let header = json!({"alg": "RS256", "kid": "rsa-1"});
        assert_eq!(
            reason(&v, &forge(&header, &claims(), Algorithm::RS256, &unlisted)),
            "bad_signature"
        );
        let other_secret = EncodingKey::from_secret(b"another 32-byte secret, not ours").unwrap();
        let header = json!({"alg": "HS256", "kid": "hs-1"});
        assert_eq!(
            reason(
                &v,
                &forge(&header, &claims(), Algorithm::HS256, &other_secret)
            ),
            "bad_signature"
        );
        // One flipped bit in the middle of a genuine signature.
        let token = sign(Algorithm::ES256, &claims());
        let (input, signature) = token.rsplit_once('.').unwrap();
        let mut bytes = URL_SAFE_NO_PAD.decode(signature).unwrap();
        bytes[20] ^= 1;
        let flipped = format!("{input}.{}", URL_SAFE_NO_PAD.encode(bytes));
        assert_eq!(reason(&v, &flipped), "bad_signature");
    }

    #[test]
    fn subject_and_tenant_are_required_non_empty_strings() {
        let v = verifier();
        for claim in ["sub", "tenant"] {
            let e = error(&v, &sign(Algorithm::ES256, &without(claim)));
            assert_eq!(e.reason(), "missing_claim");
            assert_eq!(
                e.to_string(),
                format!("the token lacks the claim `{claim}`")
            );
            let e = error(&v, &sign(Algorithm::ES256, &with(claim, json!(""))));
            assert_eq!(e.reason(), "invalid_claim");
            assert_eq!(
                e.to_string(),
                format!("the token's claim `{claim}` is not a non-empty string")
            );
            let e = error(&v, &sign(Algorithm::ES256, &with(claim, json!(42))));
            assert_eq!(e.reason(), "invalid_claim");
            let e = error(&v, &sign(Algorithm::ES256, &with(claim, json!(null))));
            assert_eq!(e.reason(), "missing_claim");
        }
    }

    #[test]
    fn roles_must_be_an_array_of_strings_and_may_be_absent() {
        let v = verifier();
        for bad in [
            json!("support_admin"),
            json!({"a": 1}),
            json!([1]),
            json!(["ok", ""]),
        ] {
            let e = error(&v, &sign(Algorithm::HS256, &with("roles", bad.clone())));
            assert_eq!(e.reason(), "invalid_claim", "{bad}");
            assert_eq!(
                e.to_string(),
                "the token's claim `roles` is not an array of non-empty strings"
            );
        }
        let identity = v
            .verify(&sign(Algorithm::HS256, &without("roles")), NOW)
            .unwrap();
        assert!(identity.roles.is_empty());
        let identity = v
            .verify(&sign(Algorithm::HS256, &with("roles", json!([]))), NOW)
            .unwrap();
        assert!(identity.roles.is_empty());
    }

    #[test]
    fn scope_is_space_separated_and_may_be_absent() {
        let v = verifier();
        let identity = v
            .verify(&sign(Algorithm::HS256, &without("scope")), NOW)
            .unwrap();
        assert!(identity.scopes.is_empty());
        let identity = v
            .verify(
                &sign(Algorithm::HS256, &with("scope", json!(" a  b\tc "))),
                NOW,
            )
            .unwrap();
        assert_eq!(identity.scopes, strings(&["a", "b", "c"]));
        let identity = v
            .verify(
                &sign(Algorithm::HS256, &with("scope", json!(["a", "b"]))),
                NOW,
            )
            .unwrap();
        assert_eq!(identity.scopes, strings(&["a", "b"]));
        assert_eq!(
            reason(&v, &sign(Algorithm::HS256, &with("scope", json!(3)))),
            "invalid_claim"
        );
    }

    #[test]
    fn malformed_tokens_are_refused_before_any_key_is_used() {
        let v = verifier();
        let good = sign(Algorithm::HS256, &claims());
        let parts: Vec<&str> = good.split('.').collect();
        let cases = [
            ("", "not three dot-separated parts"),
            ("not a token", "not three dot-separated parts"),
            ("a.b", "not three dot-separated parts"),
            ("a.b.c.d", "not three dot-separated parts"),
            ("!!!.e30.AAAA", "the header is not a JSON object"),
            ("W10.e30.AAAA", "the header is not a JSON object"),
            ("e30.e30.AAAA", "the header has no string `alg`"),
        ];
        for (token, detail) in cases {
            let e = error(&v, token);
            assert_eq!(e.reason(), "malformed", "{token:?}");
            assert_eq!(e.to_string(), format!("the token is malformed: {detail}"));
        }
        let padded = format!("{}.{}.{}==", parts[0], parts[1], parts[2]);
        assert_eq!(
            error(&v, &padded).to_string(),
            "the token is malformed: the signature is not base64url"
        );
        let header = b64(&json!({"alg": "HS256", "kid": 7}).to_string());
        assert_eq!(
            error(&v, &format!("{header}.{}.{}", parts[1], parts[2])).to_string(),
            "the token is malformed: the header's `kid` is not a string"
        );
        let long = format!("{}.{}.{}", parts[0], "A".repeat(MAX_TOKEN_BYTES), parts[2]);
        assert_eq!(
            error(&v, &long).to_string(),
            "the token is malformed: longer than 16384 bytes"
        );
        // A payload that is signed but not a JSON object.
        let key = encoding_key(Algorithm::HS256);
        let input = format!("{}.{}", b64(r#"{"alg":"HS256","kid":"hs-1"}"#), b64("[1]"));
        let signature =
            jsonwebtoken::crypto::sign(input.as_bytes(), &key, Algorithm::HS256).unwrap();
        assert_eq!(
            error(&v, &format!("{input}.{signature}")).to_string(),
            "the token is malformed: the payload is not a JSON object"
        );
    }

    #[test]
    fn critical_header_extensions_are_refused() {
        let v = verifier();
        let header = json!({"alg": "HS256", "kid": "hs-1", "crit": ["b64"], "b64": false});
        let token = forge(
            &header,
            &claims(),
            Algorithm::HS256,
            &encoding_key(Algorithm::HS256),
        );
        assert_eq!(
            error(&v, &token).to_string(),
            "the token is malformed: the header names critical extensions (`crit`)"
        );
    }

    #[test]
    fn keys_embedded_in_the_header_are_ignored() {
        // A token carrying its own key (`jwk`) is verified against the set.
        let v = verifier();
        let attacker = EncodingKey::from_rsa_pem(&fixture("rsa-unlisted.pem")).unwrap();
        let header = json!({"alg": "RS256", "kid": "rsa-1", "jku": "https://evil.test/jwks",
                            "jwk": {"kty": "RSA", "n": "AQAB", "e": "AQAB"}});
        assert_eq!(
            reason(&v, &forge(&header, &claims(), Algorithm::RS256, &attacker)),
            "bad_signature"
        );
    }

    #[test]
    fn claim_names_are_configurable() {
        let v = TokenVerifier::from_jwks_json(
            &jwks(),
            VerifierConfig {
                claims: ClaimNames {
                    subject: "uid".into(),
                    tenant: "org".into(),
                    roles: "groups".into(),
                    scope: "scp".into(),
                },
                ..strict()
            },
        )
        .unwrap();
        let custom = json!({"uid": "u1", "org": "o1", "groups": ["g"], "scp": "a b",
                            "sub": "ignored", "tenant": "ignored", "roles": ["ignored"],
                            "iss": ISSUER, "aud": "toolgate", "exp": NOW + 5});
        assert_eq!(
            v.verify(&sign(Algorithm::EdDSA, &custom), NOW).unwrap(),
            VerifiedIdentity {
                subject: "u1".into(),
                tenant: "o1".into(),
                roles: strings(&["g"]),
                scopes: strings(&["a", "b"]),
                expires_at: NOW + 5,
            }
        );
        let e = error(&v, &sign(Algorithm::EdDSA, &claims()));
        assert_eq!(e.to_string(), "the token lacks the claim `uid`");
        let mut c = custom.clone();
        c["groups"] = json!("g");
        assert_eq!(
            error(&v, &sign(Algorithm::EdDSA, &c)).to_string(),
            "the token's claim `groups` is not an array of non-empty strings"
        );
    }

    #[test]
    fn no_message_or_debug_output_holds_the_token_or_a_key() {
        let v = verifier();
        let set: Value = serde_json::from_str(&jwks()).unwrap();
        let secrets: Vec<String> = ["n", "x", "y", "k"]
            .iter()
            .flat_map(|m| {
                set["keys"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(move |k| k[m].as_str())
            })
            .map(|s| s[..16].to_owned())
            .collect();
        let debug = format!("{v:?}");
        assert_eq!(
            debug,
            "TokenVerifier { keys: [\"kid `rsa-1` RS256\", \"kid `ec-1` ES256\", \"kid `ed-1` EdDSA\", \
             \"kid `hs-1` HS256\"], config: VerifierConfig { issuer: Some(\"https://idp.test\"), \
             audience: Some(\"toolgate\"), leeway_seconds: 30, claims: ClaimNames { subject: \"sub\", \
             tenant: \"tenant\", roles: \"roles\", scope: \"scope\" } } }"
        );
        let tokens = [
            sign(Algorithm::RS256, &with("exp", json!(NOW - 100))),
            sign(Algorithm::HS256, &with("aud", json!("x"))),
            sign(Algorithm::ES256, &without("sub")),
        ];
        for token in &tokens {
            let e = error(&v, token);
            for part in token.split('.') {
                assert!(!e.to_string().contains(part), "{e}");
                assert!(!format!("{e:?}").contains(part), "{e:?}");
            }
        }
        for secret in &secrets {
            assert!(!debug.contains(secret.as_str()));
        }
    }

    #[test]
    fn the_fixture_key_set_loads_from_its_file() {
        let v = TokenVerifier::from_jwks_file(&fixture_path("jwks.json"), strict()).unwrap();
        assert_eq!(
            v.key_ids(),
            [Some("rsa-1"), Some("ec-1"), Some("ed-1"), Some("hs-1")].map(|k| k.map(String::from))
        );
        let e = TokenVerifier::from_jwks_file(&fixture_path("absent.json"), strict()).unwrap_err();
        assert_eq!(e.reason(), "key_set_unreadable");
        assert!(
            e.to_string().starts_with("cannot read the key set `"),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn keys_not_for_signatures_are_skipped() {
        let set: Value = serde_json::from_str(&jwks()).unwrap();
        let rsa = set["keys"][0].clone();
        let mut enc = rsa.clone();
        enc["kid"] = json!("enc-1");
        enc["use"] = json!("enc");
        enc["alg"] = json!("RSA-OAEP");
        let mut wrap = set["keys"][3].clone();
        wrap["kid"] = json!("kw-1");
        wrap.as_object_mut().unwrap().remove("use");
        wrap["alg"] = json!("A256KW");
        let mut ops = set["keys"][1].clone();
        ops["kid"] = json!("ops-1");
        ops["key_ops"] = json!(["deriveBits"]);
        // An unsupported key type for encryption is skipped, not refused.
        let ecdh = json!({"kty": "OKP", "crv": "X25519", "kid": "x-1", "use": "enc", "x": "AAAA"});
        let text = json!({"keys": [enc, rsa, wrap, ops, ecdh]}).to_string();
        let v = TokenVerifier::from_jwks_json(&text, strict()).unwrap();
        assert_eq!(v.key_ids(), [Some("rsa-1".to_owned())]);
        assert_eq!(
            jwks_error(
                &json!({"keys": [set["keys"][0].clone()]})
                    .to_string()
                    .replace("\"sig\"", "\"enc\"")
            ),
            "the key set holds no signature key (1 key(s) not meant for signatures skipped)"
        );
    }

    #[test]
    fn kids_are_required_with_several_keys_and_must_be_unique() {
        let set: Value = serde_json::from_str(&jwks()).unwrap();
        let mut no_kid = set["keys"][3].clone();
        no_kid.as_object_mut().unwrap().remove("kid");
        // The sole key may lack a kid; a token without kid then uses it.
        let v =
            TokenVerifier::from_jwks_json(&json!({"keys": [no_kid.clone()]}).to_string(), strict())
                .unwrap();
        let token = forge(
            &json!({"alg": "HS256"}),
            &claims(),
            Algorithm::HS256,
            &encoding_key(Algorithm::HS256),
        );
        assert_eq!(v.verify(&token, NOW).unwrap().subject, "dana");
        assert_eq!(
            jwks_error(&json!({"keys": [set["keys"][0].clone(), no_kid]}).to_string()),
            "`keys[1]` has no `kid`; when a set holds several signature keys each needs one"
        );
        assert_eq!(
            jwks_error(
                &json!({"keys": [set["keys"][3].clone(), set["keys"][3].clone()]}).to_string()
            ),
            "`keys[1]` repeats the kid `hs-1`"
        );
    }

    #[test]
    fn unusable_key_sets_are_refused_with_the_key_named() {
        let set: Value = serde_json::from_str(&jwks()).unwrap();
        let key = |i: usize, patch: Value| {
            let mut k = set["keys"][i].clone();
            for (name, value) in patch.as_object().unwrap() {
                if value.is_null() {
                    k.as_object_mut().unwrap().remove(name);
                } else {
                    k[name] = value.clone();
                }
            }
            jwks_error(&json!({"keys": [k]}).to_string())
        };
        assert_eq!(
            key(0, json!({"d": "AQAB"})),
            "`keys[0]` (kid `rsa-1`) holds private key material"
        );
        assert_eq!(
            key(1, json!({"d": "AQAB"})),
            "`keys[0]` (kid `ec-1`) holds private key material"
        );
        assert_eq!(
            key(0, json!({"alg": "RS512"})),
            "`keys[0]` (kid `rsa-1`) is not supported: `alg` is `RS512`; RSA keys verify only RS256 here"
        );
        assert_eq!(
            key(3, json!({"alg": "HS512"})),
            "`keys[0]` (kid `hs-1`) is not supported: `alg` is `HS512`; oct keys verify only HS256"
        );
        assert_eq!(
            key(3, json!({"k": "c2hvcnQ"})),
            "`keys[0]` (kid `hs-1`) is invalid: an HS256 secret must be at least 32 bytes"
        );
        assert_eq!(
            key(0, json!({"n": URL_SAFE_NO_PAD.encode([0xff_u8; 128])})),
            "`keys[0]` (kid `rsa-1`) is invalid: the RSA modulus is shorter than 2048 bits"
        );
        assert_eq!(
            key(0, json!({"e": "Ag"})),
            "`keys[0]` (kid `rsa-1`) is invalid: the RSA exponent is not an odd number between 3 and 2^33"
        );
        assert_eq!(
            key(0, json!({"e": null})),
            "`keys[0]` (kid `rsa-1`) is invalid: a required member is missing or malformed"
        );
        assert_eq!(
            key(1, json!({"crv": "P-384"})),
            "`keys[0]` (kid `ec-1`) is not supported: curve `P-384` (only P-256 and Ed25519 are)"
        );
        assert_eq!(
            key(1, json!({"crv": "secp256k1"})),
            "`keys[0]` (kid `ec-1`) is not supported: curve `secp256k1`, or a required member is missing"
        );
        // x of a point not on the curve (y changed).
        assert_eq!(
            key(1, json!({"y": URL_SAFE_NO_PAD.encode([7_u8; 32])})),
            "`keys[0]` (kid `ec-1`) is invalid: not a valid public key for its algorithm"
        );
        assert_eq!(
            key(2, json!({"x": "AAAA"})),
            "`keys[0]` (kid `ed-1`) is invalid: `x` is not 32 base64url bytes"
        );
        assert_eq!(
            key(2, json!({"kty": "AKP", "alg": "ML-DSA-44"})),
            "`keys[0]` (kid `ed-1`) is not supported: key type `AKP`"
        );
        assert_eq!(
            key(2, json!({"kid": 5})),
            "`keys[0]` (no kid) is invalid: `kid` is not a string"
        );
        assert_eq!(
            jwks_error("{\"keys\": ["),
            "the key set is not valid JSON (line 1, column 10)"
        );
        assert_eq!(
            jwks_error("{\"keys\": {}}"),
            "the key set is not a JWKS: expected an object with a `keys` array of objects (line 1, column 9)"
        );
        assert_eq!(
            jwks_error("{\"keys\": []}"),
            "the key set holds no signature key (0 key(s) not meant for signatures skipped)"
        );
        let e = TokenVerifier::from_jwks_json("[]", strict()).unwrap_err();
        assert_eq!(e.reason(), "key_set_invalid");
    }

    #[test]
    fn a_jwks_error_never_quotes_key_material() {
        // `k` of the wrong type: serde would quote the value; we don't.
        let text = r#"{"keys": [{"kty": "oct", "kid": "a", "k": "c2VjcmV0LXZhbHVlLXRoYXQtbXVzdC1ub3QtbGVhayEh", "use": 5}]}"#;
        let message = jwks_error(text);
        assert!(!message.contains("c2VjcmV0"), "{message}");
        let text = r#"{"keys": [{"kty": "oct", "kid": "a", "k": ["c2VjcmV0LXZhbHVl"]}]}"#;
        let message = jwks_error(text);
        assert!(!message.contains("c2VjcmV0"), "{message}");
        assert_eq!(
            message,
            "`keys[0]` (kid `a`) is invalid: a required member is missing or malformed"
        );
    }

    #[test]
    fn every_reason_is_stable() {
        let reasons = [
            (malformed("x"), "malformed"),
            (TokenError::UnknownKey { kid: None }, "unknown_key"),
            (
                TokenError::UnsupportedAlgorithm { alg: "none".into() },
                "unsupported_algorithm",
            ),
            (
                TokenError::WrongAlgorithm {
                    alg: "HS256",
                    expected: "RS256",
                    kid: None,
                },
                "wrong_algorithm",
            ),
            (TokenError::BadSignature, "bad_signature"),
            (TokenError::Expired { expired_at: 0 }, "expired"),
            (TokenError::NotYetValid { not_before: 0 }, "not_yet_valid"),
            (
                TokenError::WrongIssuer {
                    expected: "i".into(),
                },
                "wrong_issuer",
            ),
            (
                TokenError::WrongAudience {
                    expected: "a".into(),
                },
                "wrong_audience",
            ),
            (TokenError::AudienceNotConfigured, "wrong_audience"),
            (missing("sub"), "missing_claim"),
            (invalid("roles", "x"), "invalid_claim"),
            (
                JwksError::NoUsableKeys { skipped: 0 }.into(),
                "key_set_invalid",
            ),
            (
                TokenError::Io {
                    path: "x".into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                },
                "key_set_unreadable",
            ),
            (TokenError::RandomUnavailable, "random_unavailable"),
            (TokenError::Signing, "signing_failed"),
        ];
        for (error, expected) in reasons {
            assert_eq!(error.reason(), expected, "{error}");
            let message = error.to_string();
            assert!(
                message.starts_with(|c: char| c.is_lowercase() || c == '`'),
                "{message}"
            );
        }
    }
}
