//! Why a key set or a token is refused. Nothing here holds a token, a
//! signature or key material; values taken from a token (a `kid`, an
//! `alg`) appear only escaped and truncated.

use std::path::PathBuf;

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

pub(super) fn malformed(detail: &'static str) -> TokenError {
    TokenError::Malformed { detail }
}

pub(super) fn missing(claim: &str) -> TokenError {
    TokenError::MissingClaim {
        claim: claim.to_owned(),
    }
}

pub(super) fn invalid(claim: &str, expected: &'static str) -> TokenError {
    TokenError::InvalidClaim {
        claim: claim.to_owned(),
        expected,
    }
}

/// A value from a token or key set made safe for a message: escaped (no
/// control characters reach a log line) and cut at 64 characters.
pub(super) fn printable(text: &str) -> String {
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

pub(super) fn kid_label(kid: Option<&str>) -> String {
    match kid {
        Some(kid) => format!("kid `{kid}`"),
        None => "no kid".to_owned(),
    }
}
