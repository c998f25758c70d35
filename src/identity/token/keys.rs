//! The verification keys: a JWKS read and parsed, each key checked for the
//! one algorithm its type fixes (RSA → RS256, EC P-256 → ES256, Ed25519 →
//! EdDSA, oct → HS256) and the sizes that algorithm needs.

use std::fmt;
use std::io::Read as _;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{Map, Value};

use super::*;

/// RFC 7518 §3.2: an HS256 key must be at least as long as the hash output.
pub(super) const MIN_HMAC_KEY_BYTES: usize = 32;

/// RSA moduli below this are refused (NIST SP 800-131A); above the upper
/// bound the RustCrypto backend would fail every verification.
pub(super) const MIN_RSA_BITS: usize = 2048;

pub(super) const MAX_RSA_BITS: usize = 8192;

/// The four algorithms toolgate accepts (DESIGN §8).
pub(super) const ACCEPTED: [(&str, Algorithm); 4] = [
    ("RS256", Algorithm::RS256),
    ("ES256", Algorithm::ES256),
    ("EdDSA", Algorithm::EdDSA),
    ("HS256", Algorithm::HS256),
];

/// One verification key: its id, the one algorithm it verifies, the key.
pub(super) struct VerificationKey {
    pub(super) index: usize,
    pub(super) kid: Option<String>,
    pub(super) algorithm: Algorithm,
    pub(super) key: DecodingKey,
}

/// A parsed key set: the verification keys of one JWKS, in order, and the
/// signatures they have verified.
pub struct KeySet {
    pub(super) keys: Vec<VerificationKey>,
    pub(super) verified: VerifiedSignatures,
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.labels()).finish()
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
    pub(super) fn labels(&self) -> impl Iterator<Item = String> + '_ {
        self.keys
            .iter()
            .map(|k| format!("{} {}", kid_label(k.kid.as_deref()), alg_name(k.algorithm)))
    }

    pub(super) fn key_for(&self, kid: Option<&str>) -> Result<&VerificationKey, TokenError> {
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
pub(super) fn verification_key(
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
pub(super) fn for_signatures(member: &Map<String, Value>) -> Result<bool, &'static str> {
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

pub(super) fn check_rsa(n: &str, e: &str) -> Result<(), &'static str> {
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

pub(super) fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    bytes.get(start..).unwrap_or_default()
}

pub(super) fn check_len(b64: &str, len: usize) -> Result<(), ()> {
    match URL_SAFE_NO_PAD.decode(b64) {
        Ok(bytes) if bytes.len() == len => Ok(()),
        _ => Err(()),
    }
}

pub(super) fn alg_name(algorithm: Algorithm) -> &'static str {
    ACCEPTED
        .iter()
        .find(|(_, a)| *a == algorithm)
        .map_or("unsupported", |(name, _)| name)
}
