//! The whole argument-decoding path on arbitrary bytes: strict parse →
//! RFC 8785 canonical form → SHA-256 and idempotency key → the canonical
//! text parses again to the same canonical text → JSON Schema validation
//! against every example tool contract. Nothing may panic; whatever is
//! accepted must round-trip. The same path is a proptest in
//! `tests/it/decoding_path.rs`.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use toolgate::decode::{Limits, canonical_json, idempotency_key, parse_strict, sha256_hex};
use toolgate::policy::PolicyEngine;

fn engine() -> &'static PolicyEngine {
    static ENGINE: OnceLock<PolicyEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        PolicyEngine::load(&dir).unwrap_or_else(|e| panic!("example policies: {e:?}"))
    })
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let Ok(value) = parse_strict(data, &limits) else {
        return;
    };
    let canonical = canonical_json(&value).expect("an accepted value has a canonical form");
    assert_eq!(sha256_hex(canonical.as_bytes()).len(), 64);
    let key = idempotency_key("tool", "req", "sub", "ten", &canonical);
    assert!(key.starts_with("tool:"));
    let again = parse_strict(canonical.as_bytes(), &limits).expect("canonical text is accepted");
    assert_eq!(canonical_json(&again).expect("canonical again"), canonical);
    if value.is_object() {
        for tool in engine().tools().iter() {
            let _ = tool.validate_input(&value, 20);
        }
    }
});
