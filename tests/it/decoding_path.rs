//! The property twin of the fuzz target (`fuzz/fuzz_targets/decode_arguments.rs`):
//! the whole argument-decoding path — strict parse, RFC 8785 canonical
//! form, hashes and idempotency key, JSON Schema validation against every
//! example tool — on arbitrary bytes and arbitrary JSON values. Nothing
//! panics; whatever is accepted round-trips:
//! `canonical(parse(canonical(x))) == canonical(x)`.

use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::{Map, Value};
use toolgate::decode::{Limits, canonical_json, idempotency_key, parse_strict, sha256_hex};
use toolgate::policy::PolicyEngine;

use crate::support::example_policies;

fn engine() -> &'static PolicyEngine {
    static ENGINE: OnceLock<PolicyEngine> = OnceLock::new();
    ENGINE.get_or_init(|| PolicyEngine::load(&example_policies()).unwrap())
}

/// The path, as the fuzz target runs it. Returns the canonical text of
/// accepted input.
fn decoding_path(bytes: &[u8]) -> Option<String> {
    let limits = Limits::default();
    let value = parse_strict(bytes, &limits).ok()?;
    let canonical = canonical_json(&value).expect("an accepted value has a canonical form");
    assert_eq!(sha256_hex(canonical.as_bytes()).len(), 64);
    let key = idempotency_key("tool", "req", "sub", "ten", &canonical);
    assert!(key.starts_with("tool:"));
    let again = parse_strict(canonical.as_bytes(), &limits).expect("canonical text is accepted");
    assert_eq!(canonical_json(&again).unwrap(), canonical);
    if value.is_object() {
        for tool in engine().tools().iter() {
            let _ = tool.validate_input(&value, 20);
        }
    }
    Some(canonical)
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        // The example contracts' own field names and values, so schema
        // validation sees near-valid arguments too.
        prop::sample::select(vec![
            "ord_1001",
            "USD",
            "late",
            "2026-01-01T00:00:00Z",
            "a@b.example"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        any::<String>(),
                        prop::sample::select(vec![
                            "order_id",
                            "amount_cents",
                            "currency",
                            "reason",
                            "note",
                            "to",
                            "query",
                        ])
                        .prop_map(str::to_owned),
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decoding_path(&bytes);
    }

    /// Bytes near JSON: tokens glued at random.
    #[test]
    fn json_like_bytes_never_panic_and_round_trip(
        tokens in prop::collection::vec(prop::sample::select(vec![
            "{", "}", "[", "]", ",", ":", " ", "\"order_id\"", "\"a\"", "\"\\u0000\"", "\"\\ud800\"",
            "\"\\ud83d\\ude00\"", "0", "-0", "1e308", "1e309", "9007199254740993", "0.1", "true",
            "null", "\u{feff}", "\"\u{2028}\"",
        ]), 0..24),
    ) {
        let _ = decoding_path(tokens.concat().as_bytes());
    }

    #[test]
    fn accepted_values_round_trip(value in json_value()) {
        let canonical = canonical_json(&value).unwrap();
        if let Some(again) = decoding_path(canonical.as_bytes()) {
            prop_assert_eq!(&again, &canonical);
        }
        // The pretty spelling of the same value has the same canonical form.
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        if let Some(from_pretty) = decoding_path(pretty.as_bytes()) {
            prop_assert_eq!(from_pretty, canonical);
        }
    }
}
