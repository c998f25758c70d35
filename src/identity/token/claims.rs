//! The claims of a token whose signature verified: `exp`/`nbf` against the
//! caller's clock, issuer, audience, and the identity claims.

use serde_json::{Map, Value};

use super::*;

impl TokenVerifier {
    pub(super) fn check_time(
        &self,
        claims: &Map<String, Value>,
        now: i64,
    ) -> Result<i64, TokenError> {
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

    pub(super) fn check_issuer(&self, claims: &Map<String, Value>) -> Result<(), TokenError> {
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

    pub(super) fn check_audience(&self, claims: &Map<String, Value>) -> Result<(), TokenError> {
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

    pub(super) fn identity(
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

/// A NumericDate claim (RFC 7519 §2): seconds, possibly fractional (floored).
pub(super) fn numeric_date(
    claims: &Map<String, Value>,
    name: &str,
) -> Result<Option<i64>, TokenError> {
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

pub(super) fn string_items(items: &[Value]) -> Option<Vec<String>> {
    items
        .iter()
        .map(|v| match v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            _ => None,
        })
        .collect()
}
