//! The identity tokens' tests.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use serde_json::Value;

use super::errors::*;
use super::keys::*;
use super::memo::*;
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
    let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &key, Algorithm::HS256).unwrap();
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
    let v = TokenVerifier::from_jwks_json(&json!({"keys": [no_kid.clone()]}).to_string(), strict())
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
        jwks_error(&json!({"keys": [set["keys"][3].clone(), set["keys"][3].clone()]}).to_string()),
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
