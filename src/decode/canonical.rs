//! The canonical form of decoded arguments and the hashes built on it
//! (DESIGN §2.3).
//!
//! Serialization is RFC 8785 (JCS): members sorted by their UTF-16 code
//! units, no whitespace, the minimal string escapes of RFC 8785 §3.2.2.2,
//! and numbers in ECMAScript form through `ryu-js`, the ES6 formatter every
//! Rust JCS implementation uses. It is written here, not taken from
//! `serde_json_canonicalizer`, because that crate re-parses every member
//! name to sort it and cost more than the rest of a decision; a property
//! test holds the two byte-for-byte equal on generated documents, next to
//! the RFC 8785 vectors. It assumes values from [`super::parse_strict`],
//! where every number is already an exact double.

use std::fmt::Write as _;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// A value that has no RFC 8785 form.
#[derive(Debug, thiserror::Error)]
pub enum CanonicalError {
    /// JCS has no form for NaN or infinity. `serde_json::Value` cannot hold
    /// those, so this is a fail-closed path.
    #[error("value has no canonical json form (a number is not finite)")]
    NotFinite,
}

/// The RFC 8785 text of `value`: members sorted by UTF-16 code units, no
/// whitespace, minimal string escapes, numbers in ECMAScript form.
///
/// # Errors
/// [`CanonicalError::NotFinite`] for a number with no finite double value.
pub fn canonical_json(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::with_capacity(128);
    write_value(&mut out, value)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            // Integers too are written as the double they denote (RFC 8785 §3.2.2.3).
            let f = n
                .as_f64()
                .filter(|f| f.is_finite())
                .ok_or(CanonicalError::NotFinite)?;
            out.push_str(ryu_js::Buffer::new().format_finite(f));
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(map) => write_object(out, map)?,
    }
    Ok(())
}

fn write_object(out: &mut String, map: &Map<String, Value>) -> Result<(), CanonicalError> {
    let mut members: Vec<(&String, &Value)> = map.iter().collect();
    // RFC 8785 §3.2.3: by the UTF-16 code units of the names, not by bytes.
    members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    out.push('{');
    for (i, (name, value)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, name);
        out.push(':');
        write_value(out, value)?;
    }
    out.push('}');
    Ok(())
}

/// A JSON string with only the escapes RFC 8785 §3.2.2.2 requires.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let mut plain = 0;
    for (i, c) in s.char_indices() {
        let escape = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\u{8}' => "\\b",
            '\u{c}' => "\\f",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if c < ' ' => "",
            _ => continue,
        };
        out.push_str(s.get(plain..i).unwrap_or_default());
        if escape.is_empty() {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push_str(escape);
        }
        plain = i + c.len_utf8();
    }
    out.push_str(s.get(plain..).unwrap_or_default());
    out.push('"');
}

/// Lowercase hex SHA-256 of `bytes` (64 characters).
#[must_use]
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `<tool>:` followed by the lowercase hex SHA-256 of the JCS text of
/// `{"arguments", "request_id", "subject_id", "tenant_id", "tool_name"}`,
/// given the JCS text of the arguments.
///
/// Equal inputs give equal keys, and a change to any of the five changes the
/// key; it can be recomputed by any executor with a JCS library.
#[must_use]
pub fn idempotency_key(
    tool: &str,
    request_id: &str,
    subject_id: &str,
    tenant_id: &str,
    canonical_arguments: &str,
) -> String {
    // The five names are ASCII and already in UTF-16 order, so the
    // envelope's JCS text is this concatenation (a test holds it equal to
    // canonicalizing the whole envelope).
    let mut envelope = String::with_capacity(canonical_arguments.len() + 128);
    envelope.push_str("{\"arguments\":");
    envelope.push_str(canonical_arguments);
    for (name, value) in [
        ("request_id", request_id),
        ("subject_id", subject_id),
        ("tenant_id", tenant_id),
        ("tool_name", tool),
    ] {
        envelope.push_str(",\"");
        envelope.push_str(name);
        envelope.push_str("\":");
        write_string(&mut envelope, value);
    }
    envelope.push('}');
    format!("{tool}:{}", sha256_hex(envelope.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Limits, parse_strict};

    fn canonical_of(input: &str) -> String {
        let value = parse_strict(input.as_bytes(), &Limits::default())
            .unwrap_or_else(|e| panic!("{input}: {e}"));
        canonical_json(&value).unwrap()
    }

    #[test]
    fn sorts_members_by_utf16_code_units_and_drops_whitespace() {
        // U+1F600 (surrogates D83D..) sorts before U+FB01 in UTF-16, after it in UTF-8.
        assert_eq!(
            canonical_of(
                "{ \"\u{fb01}\": 1, \"\u{1f600}\": 2, \"b\": [ 1 , {\"z\":0,\"a\":0} ], \"a\": null }"
            ),
            "{\"a\":null,\"b\":[1,{\"a\":0,\"z\":0}],\"\u{1f600}\":2,\"\u{fb01}\":1}"
        );
    }

    #[test]
    fn escapes_strings_minimally() {
        assert_eq!(
            canonical_of(r#""\u0041\/\u00e9\u001f\u007f\b\f\n\r\t\"\\\u2028""#),
            "\"A/\u{e9}\\u001f\u{7f}\\b\\f\\n\\r\\t\\\"\\\\\u{2028}\""
        );
    }

    /// ES6 `Number.prototype.toString` vectors in the `hex-ieee,expected` shape
    /// of upstream's `es6testfile100m.txt`: every finite row of RFC 8785
    /// Appendix B, plus the first example of upstream's README.
    #[test]
    fn formats_doubles_like_ecmascript() {
        let vectors: [(u64, &str); 25] = [
            (0x0000_0000_0000_0000, "0"),
            (0x8000_0000_0000_0000, "0"),
            (0x0000_0000_0000_0001, "5e-324"),
            (0x8000_0000_0000_0001, "-5e-324"),
            (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
            (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
            (0x4340_0000_0000_0000, "9007199254740992"),
            (0xc340_0000_0000_0000, "-9007199254740992"),
            (0x4340_0000_0000_0001, "9007199254740994"),
            (0x4430_0000_0000_0000, "295147905179352830000"),
            (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
            (0x44b5_2d02_c7e1_4af6, "1e+23"),
            (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
            (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
            (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
            (0x444b_1ae4_d6e2_ef50, "1e+21"),
            (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
            (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
            (0x41b3_de43_5555_5553, "333333333.3333332"),
            (0x41b3_de43_5555_5554, "333333333.33333325"),
            (0x41b3_de43_5555_5555, "333333333.3333333"),
            (0x41b3_de43_5555_5556, "333333333.3333334"),
            (0x41b3_de43_5555_5557, "333333333.33333343"),
            (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
            (0x4314_3ff3_c1cb_0959, "1424953923781206.2"),
        ];
        for (bits, expected) in vectors {
            let value = Value::from(f64::from_bits(bits));
            assert_eq!(
                canonical_json(&value).unwrap(),
                expected,
                "bits {bits:016x}"
            );
        }
    }

    #[test]
    fn number_literals_canonicalize_through_the_strict_parser() {
        let cases = [
            ("-0", "0"),
            ("-0.0", "0"),
            ("0e-400", "0"),
            ("1.0", "1"),
            ("1E2", "100"),
            ("1e21", "1e+21"),
            ("1e-6", "0.000001"),
            ("123e21", "1.23e+23"),
            ("9.999999999999997e-7", "9.999999999999997e-7"),
            ("0.0000010", "0.000001"),
            ("1e-7", "1e-7"),
            ("9007199254740991", "9007199254740991"),
            ("-9007199254740991", "-9007199254740991"),
            ("9007199254740991.0", "9007199254740991"),
            ("0.1", "0.1"),
            ("-0.000001e-300", "-1e-306"),
            ("1424953923781206.25", "1424953923781206.2"),
        ];
        for (input, expected) in cases {
            assert_eq!(canonical_of(input), expected, "input {input}");
        }
    }

    #[test]
    fn sha256_hex_is_lowercase_hex() {
        // FIPS 180-2 test vector for "abc".
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    const REFUND_RAW: &str = r#"{ "reason": "box \"crushed\" \u2013 dam\u0061ged",
        "order_id": "ord_123", "amount_cents": 1.5e3, "notify": [true, null] }"#;

    /// Assembled by hand from DESIGN §2.3, not by the code under test.
    const REFUND_CANONICAL: &str = concat!(
        r#"{"arguments":{"amount_cents":1500,"notify":[true,null],"order_id":"ord_123","#,
        r#""reason":"box \"crushed\" "#,
        "\u{2013}",
        r#" damaged"},"request_id":"req-42","subject_id":"user:alice","#,
        r#""tenant_id":"acme","tool_name":"refund_order"}"#
    );

    /// `printf '%s' '<REFUND_CANONICAL>' | sha256sum` (GNU coreutils), run once.
    const REFUND_DIGEST: &str = "9c07e8b3233e10aee503f541b33b40f63af7ce29616a7f28dd9d9d90faa03e14";

    #[test]
    fn idempotency_key_matches_an_independent_hash() {
        let arguments = parse_strict(REFUND_RAW.as_bytes(), &Limits::default()).unwrap();
        let arguments = canonical_json(&arguments).unwrap();
        let key = idempotency_key("refund_order", "req-42", "user:alice", "acme", &arguments);
        assert_eq!(
            key,
            format!("refund_order:{}", sha256_hex(REFUND_CANONICAL.as_bytes()))
        );
        assert_eq!(key, format!("refund_order:{REFUND_DIGEST}"));
    }

    #[test]
    fn idempotency_key_changes_with_every_field() {
        let args = canonical_json(&serde_json::json!({"order_id": "ord_123"})).unwrap();
        let other = canonical_json(&serde_json::json!({"order_id": "ord_124"})).unwrap();
        let base = idempotency_key("t", "r", "s", "n", &args);
        let variants = [
            idempotency_key("u", "r", "s", "n", &args),
            idempotency_key("t", "q", "s", "n", &args),
            idempotency_key("t", "r", "x", "n", &args),
            idempotency_key("t", "r", "s", "m", &args),
            idempotency_key("t", "r", "s", "n", &other),
            // Swapping values between fields must not collide either.
            idempotency_key("t", "s", "r", "n", &args),
        ];
        for variant in &variants {
            assert_ne!(variant, &base);
        }
        assert!(base.starts_with("t:") && base.len() == 2 + 64, "{base}");
    }
}
