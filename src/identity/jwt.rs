//! Identity tokens: JWTs verified against a JSON Web Key Set (DESIGN §4, §8).
//!
//! Each key's type fixes the one algorithm it verifies (RSA → RS256, EC
//! P-256 → ES256, Ed25519 → EdDSA, oct → HS256), so a token cannot choose a
//! weaker or confused algorithm (`none`, or HS256 keyed with an RSA public
//! key). Expiry and not-before are checked against an injected clock with a
//! leeway. Messages never contain the token or key material.

use std::collections::HashMap;
use std::path::Path;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use super::Caller;

/// Names of the claims that carry identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimNames {
    pub subject: String,
    pub tenant: String,
    /// A JSON array of strings.
    pub roles: String,
    /// A space-separated string.
    pub scope: String,
}

impl Default for ClaimNames {
    fn default() -> Self {
        Self {
            subject: "sub".into(),
            tenant: "tenant".into(),
            roles: "roles".into(),
            scope: "scope".into(),
        }
    }
}

/// What a token must satisfy besides its signature.
#[derive(Debug, Clone, Default)]
pub struct VerifierConfig {
    pub issuer: Option<String>,
    pub audience: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway_seconds: u64,
    pub claims: ClaimNames,
}

/// Why a token or key set is not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the key set `{path}`: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the key set is not a valid JWKS: {0}")]
    Jwks(String),
    #[error("the token is malformed")]
    Malformed,
    #[error("the token names no known key")]
    UnknownKey,
    #[error("the token's algorithm does not match its key")]
    WrongAlgorithm,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token has the wrong issuer")]
    WrongIssuer,
    #[error("the token has the wrong audience")]
    WrongAudience,
    #[error("the token lacks the claim `{0}`")]
    MissingClaim(String),
    #[error("the token's claim `{0}` has the wrong type")]
    InvalidClaim(String),
}

impl TokenError {
    /// A stable snake_case reason for envelope details.
    #[must_use]
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::Io { .. } | Self::Jwks(_) => "key_set_invalid",
            Self::Malformed => "malformed",
            Self::UnknownKey => "unknown_key",
            Self::WrongAlgorithm => "wrong_algorithm",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongIssuer => "wrong_issuer",
            Self::WrongAudience => "wrong_audience",
            Self::MissingClaim(_) => "missing_claim",
            Self::InvalidClaim(_) => "invalid_claim",
        }
    }
}

struct Key {
    algorithm: Algorithm,
    key: DecodingKey,
}

/// Verifies identity tokens against a fixed key set.
pub struct TokenVerifier {
    keys: HashMap<String, Key>,
    /// The key of a set with exactly one key and no `kid`.
    sole: Option<Key>,
    config: VerifierConfig,
}

impl std::fmt::Debug for TokenVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenVerifier")
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl TokenVerifier {
    /// Reads a JWKS file.
    ///
    /// # Errors
    /// [`TokenError::Io`] or [`TokenError::Jwks`].
    pub fn from_jwks_file(path: &Path, config: VerifierConfig) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_jwks_json(&text, config)
    }

    /// Parses a JWKS text. Keys marked for encryption (`"use": "enc"`) are
    /// skipped; a key without `kid` is allowed only as the set's sole key.
    ///
    /// # Errors
    /// [`TokenError::Jwks`] for a malformed set or an unsupported key type.
    pub fn from_jwks_json(text: &str, config: VerifierConfig) -> Result<Self, TokenError> {
        let set: JwkSet =
            serde_json::from_str(text).map_err(|e| TokenError::Jwks(e.to_string()))?;
        let mut keys = HashMap::new();
        let mut sole = None;
        let usable: Vec<_> = set
            .keys
            .iter()
            .filter(|k| !matches!(k.common.public_key_use, Some(PublicKeyUse::Encryption)))
            .collect();
        for jwk in &usable {
            let algorithm = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                    Algorithm::ES256
                }
                AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                    Algorithm::EdDSA
                }
                AlgorithmParameters::OctetKey(_) => Algorithm::HS256,
                _ => {
                    return Err(TokenError::Jwks(
                        "unsupported key type (use RSA, EC P-256, Ed25519 or oct)".into(),
                    ));
                }
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| TokenError::Jwks(e.to_string()))?;
            match &jwk.common.key_id {
                Some(kid) => {
                    keys.insert(kid.clone(), Key { algorithm, key });
                }
                None if usable.len() == 1 => sole = Some(Key { algorithm, key }),
                None => {
                    return Err(TokenError::Jwks(
                        "every key of a set with several keys needs a `kid`".into(),
                    ));
                }
            }
        }
        if keys.is_empty() && sole.is_none() {
            return Err(TokenError::Jwks("the key set has no signing key".into()));
        }
        Ok(Self { keys, sole, config })
    }

    /// Verifies a token at `now_unix` (seconds) and returns its caller.
    ///
    /// # Errors
    /// A [`TokenError`] naming the first check that failed.
    pub fn verify(&self, token: &str, now_unix: i64) -> Result<Caller, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let key = match &header.kid {
            Some(kid) => self.keys.get(kid).ok_or(TokenError::UnknownKey)?,
            None => self.sole.as_ref().ok_or(TokenError::UnknownKey)?,
        };
        if header.alg != key.algorithm {
            return Err(TokenError::WrongAlgorithm);
        }
        let mut validation = Validation::new(key.algorithm);
        // Time is checked below against the injected clock.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.required_spec_claims.clear();
        match &self.config.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        if let Some(iss) = &self.config.issuer {
            validation.set_issuer(&[iss]);
        }
        let data = jsonwebtoken::decode::<Value>(token, &key.key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::InvalidSignature => TokenError::BadSignature,
                ErrorKind::InvalidIssuer => TokenError::WrongIssuer,
                ErrorKind::InvalidAudience => TokenError::WrongAudience,
                ErrorKind::InvalidAlgorithm => TokenError::WrongAlgorithm,
                ErrorKind::MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
                _ => TokenError::Malformed,
            }
        })?;
        let claims = data.claims;
        // A configured issuer or audience must be present, not merely unequal.
        if self.config.issuer.is_some() && claims.get("iss").is_none() {
            return Err(TokenError::WrongIssuer);
        }
        if self.config.audience.is_some() && claims.get("aud").is_none() {
            return Err(TokenError::WrongAudience);
        }
        let leeway = i64::try_from(self.config.leeway_seconds).unwrap_or(i64::MAX);
        let exp = claims
            .get("exp")
            .ok_or_else(|| TokenError::MissingClaim("exp".into()))?;
        let exp = exp
            .as_i64()
            .ok_or_else(|| TokenError::InvalidClaim("exp".into()))?;
        if now_unix > exp.saturating_add(leeway) {
            return Err(TokenError::Expired);
        }
        if let Some(nbf) = claims.get("nbf") {
            let nbf = nbf
                .as_i64()
                .ok_or_else(|| TokenError::InvalidClaim("nbf".into()))?;
            if now_unix.saturating_add(leeway) < nbf {
                return Err(TokenError::NotYetValid);
            }
        }
        let names = &self.config.claims;
        let string = |name: &str| -> Result<String, TokenError> {
            match claims.get(name) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(_) => Err(TokenError::InvalidClaim(name.to_owned())),
                None => Err(TokenError::MissingClaim(name.to_owned())),
            }
        };
        let subject_id = string(&names.subject)?;
        let tenant_id = string(&names.tenant)?;
        let roles = match claims.get(&names.roles) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(ToOwned::to_owned)
                        .ok_or_else(|| TokenError::InvalidClaim(names.roles.clone()))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(TokenError::InvalidClaim(names.roles.clone())),
        };
        let scopes = match claims.get(&names.scope) {
            None => Vec::new(),
            Some(Value::String(s)) => s.split_whitespace().map(ToOwned::to_owned).collect(),
            Some(_) => return Err(TokenError::InvalidClaim(names.scope.clone())),
        };
        Ok(Caller {
            subject_id,
            tenant_id,
            scopes,
            roles,
            agent_id: String::new(),
            session_id: String::new(),
        })
    }
}

impl crate::approval_desk::IdentityVerifier for TokenVerifier {
    fn verify(&self, token: &str, now_unix_seconds: i64) -> Result<Caller, &'static str> {
        Self::verify(self, token, now_unix_seconds).map_err(|e| e.reason())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/it/fixtures/keys")
                .join(name),
        )
        .unwrap()
    }

    fn verifier(config: VerifierConfig) -> TokenVerifier {
        TokenVerifier::from_jwks_json(&String::from_utf8(fixture("jwks.json")).unwrap(), config)
            .unwrap()
    }

    fn sign(alg: Algorithm, kid: &str, claims: &Value) -> String {
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&fixture("rsa.pem")).unwrap(),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&fixture("ec.pem")).unwrap(),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(&fixture("ed25519.pem")).unwrap(),
            _ => EncodingKey::from_secret(&fixture("hs256.secret")).unwrap(),
        };
        let mut header = Header::new(alg);
        header.kid = Some(kid.into());
        encode(&header, claims, &key).unwrap()
    }

    fn claims() -> Value {
        json!({"sub": "dana", "tenant": "acme", "roles": ["support_admin"], "scope": "approvals:decide approvals:read",
               "iss": "https://idp.test", "aud": "toolgate", "exp": NOW + 300, "nbf": NOW - 10})
    }

    fn strict() -> VerifierConfig {
        VerifierConfig {
            issuer: Some("https://idp.test".into()),
            audience: Some("toolgate".into()),
            leeway_seconds: 30,
            claims: ClaimNames::default(),
        }
    }

    fn reason(v: &TokenVerifier, token: &str) -> &'static str {
        v.verify(token, NOW).unwrap_err().reason()
    }

    #[test]
    fn every_algorithm_verifies_and_yields_the_caller() {
        let v = verifier(strict());
        for (alg, kid) in [
            (Algorithm::RS256, "rsa-1"),
            (Algorithm::ES256, "ec-1"),
            (Algorithm::EdDSA, "ed-1"),
            (Algorithm::HS256, "hs-1"),
        ] {
            let caller = v.verify(&sign(alg, kid, &claims()), NOW).unwrap();
            assert_eq!(caller.subject_id, "dana", "{alg:?}");
            assert_eq!(caller.tenant_id, "acme");
            assert_eq!(caller.roles, vec!["support_admin"]);
            assert_eq!(caller.scopes, vec!["approvals:decide", "approvals:read"]);
        }
    }

    #[test]
    fn time_claims_use_the_injected_clock_with_leeway() {
        let v = verifier(strict());
        let mut c = claims();
        c["exp"] = json!(NOW - 20);
        assert!(
            v.verify(&sign(Algorithm::ES256, "ec-1", &c), NOW).is_ok(),
            "within leeway"
        );
        c["exp"] = json!(NOW - 31);
        assert_eq!(reason(&v, &sign(Algorithm::ES256, "ec-1", &c)), "expired");
        let mut c = claims();
        c["nbf"] = json!(NOW + 60);
        assert_eq!(
            reason(&v, &sign(Algorithm::ES256, "ec-1", &c)),
            "not_yet_valid"
        );
        let mut c = claims();
        c.as_object_mut().unwrap().remove("exp");
        assert_eq!(
            reason(&v, &sign(Algorithm::ES256, "ec-1", &c)),
            "missing_claim"
        );
    }

    #[test]
    fn issuer_audience_and_identity_claims_are_enforced() {
        let v = verifier(strict());
        let with = |k: &str, val: Value| {
            let mut c = claims();
            c[k] = val;
            sign(Algorithm::RS256, "rsa-1", &c)
        };
        assert_eq!(
            reason(&v, &with("iss", json!("https://evil.test"))),
            "wrong_issuer"
        );
        assert_eq!(
            reason(&v, &with("aud", json!("someone-else"))),
            "wrong_audience"
        );
        assert_eq!(
            reason(&v, &with("roles", json!("support_admin"))),
            "invalid_claim"
        );
        assert_eq!(reason(&v, &with("tenant", json!(""))), "invalid_claim");
        let mut c = claims();
        c.as_object_mut().unwrap().remove("sub");
        assert_eq!(
            reason(&v, &sign(Algorithm::RS256, "rsa-1", &c)),
            "missing_claim"
        );
        let mut c = claims();
        c.as_object_mut().unwrap().remove("aud");
        assert_eq!(
            reason(&v, &sign(Algorithm::RS256, "rsa-1", &c)),
            "wrong_audience"
        );
    }

    #[test]
    fn forged_and_confused_tokens_are_refused() {
        let v = verifier(strict());
        let good = sign(Algorithm::RS256, "rsa-1", &claims());
        // Tampered payload: the tenant swapped for another.
        let mut parts: Vec<String> = good.split('.').map(ToOwned::to_owned).collect();
        let mut c = claims();
        c["tenant"] = json!("globex");
        parts[1] = base64_url(&serde_json::to_vec(&c).unwrap());
        assert_eq!(reason(&v, &parts.join(".")), "bad_signature");
        // alg none.
        let none = format!(
            "{}.{}.",
            base64_url(br#"{"alg":"none","kid":"rsa-1"}"#),
            parts[1]
        );
        assert_eq!(reason(&v, &none), "malformed");
        // HS256 keyed with the RSA public key, presented under the RSA kid.
        let confused = {
            let mut header = Header::new(Algorithm::HS256);
            header.kid = Some("rsa-1".into());
            encode(
                &header,
                &claims(),
                &EncodingKey::from_secret(b"the rsa public key").unwrap(),
            )
            .unwrap()
        };
        assert_eq!(reason(&v, &confused), "wrong_algorithm");
        // Signed by a key under another key's id.
        assert_eq!(
            reason(&v, &sign(Algorithm::HS256, "rsa-1", &claims())),
            "wrong_algorithm"
        );
        let wrong_key = {
            let mut header = Header::new(Algorithm::HS256);
            header.kid = Some("hs-1".into());
            encode(
                &header,
                &claims(),
                &EncodingKey::from_secret(b"not the secret").unwrap(),
            )
            .unwrap()
        };
        assert_eq!(reason(&v, &wrong_key), "bad_signature");
        assert_eq!(
            reason(&v, &sign(Algorithm::HS256, "nobody", &claims())),
            "unknown_key"
        );
        assert_eq!(reason(&v, "not a token"), "malformed");
    }

    #[test]
    fn claim_names_are_configurable_and_messages_hold_no_token() {
        let config = VerifierConfig {
            claims: ClaimNames {
                subject: "uid".into(),
                tenant: "org".into(),
                roles: "groups".into(),
                scope: "scp".into(),
            },
            ..VerifierConfig::default()
        };
        let v = verifier(config);
        let token = sign(
            Algorithm::HS256,
            "hs-1",
            &json!({"uid": "u1", "org": "o1", "groups": ["g"], "scp": "a b", "exp": NOW + 5}),
        );
        let caller = v.verify(&token, NOW).unwrap();
        assert_eq!(
            (
                caller.subject_id.as_str(),
                caller.tenant_id.as_str(),
                caller.scopes.len()
            ),
            ("u1", "o1", 2)
        );
        let err = v.verify(&token, NOW + 100).unwrap_err();
        assert!(!err.to_string().contains(&token));
        assert!(!format!("{v:?}").contains("toolgate-test"));
    }

    fn base64_url(bytes: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..=chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }
}
