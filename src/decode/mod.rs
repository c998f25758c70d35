//! Turning untrusted argument bytes into a JSON value, and that value into the
//! one canonical text that is hashed, authorized and executed (DESIGN §2.1, §2.3).
//!
//! This module owns the strict decoding rules (RFC 8259 grammar, no duplicate
//! keys, under case folding too, no lone surrogates, I-JSON number range, size and depth limits) and the
//! RFC 8785 canonical form with its SHA-256 hashes and the idempotency key.
//!
//! It holds rules only: no IO, no logging, no clock. It knows nothing of gRPC,
//! Cedar, tool contracts or JSON Schema; callers map [`DecodeError`] to an
//! envelope code with [`DecodeError::is_limit`] and check for a top-level object
//! themselves.
//!
//! The model's bytes, their canonical text, its hash and the key any
//! executor with a JCS library can recompute:
//!
//! ```
//! use toolgate::decode::{Limits, canonical_json, idempotency_key, parse_strict, sha256_hex};
//!
//! let raw = br#"{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}"#;
//! let value = parse_strict(raw, &Limits::default())?;
//! let canonical = canonical_json(&value)?;
//! assert_eq!(
//!     canonical,
//!     r#"{"amount_cents":2500,"currency":"USD","order_id":"ord_1001","reason":"late"}"#
//! );
//! assert_eq!(sha256_hex(canonical.as_bytes()).len(), 64);
//!
//! // The key is the tool's name and the hash of the canonical envelope of
//! // the five fields that make one operation.
//! let key = idempotency_key("refund_order", "refund-ord_1001-1", "bob", "acme", &canonical);
//! let envelope = serde_json::json!({
//!     "arguments": value, "request_id": "refund-ord_1001-1",
//!     "subject_id": "bob", "tenant_id": "acme", "tool_name": "refund_order",
//! });
//! assert_eq!(key, format!("refund_order:{}", sha256_hex(canonical_json(&envelope)?.as_bytes())));
//!
//! // A duplicate key is refused, never resolved to one of the values.
//! let twice = parse_strict(br#"{"amount_cents": 1, "amount_cents": 100000}"#, &Limits::default());
//! assert_eq!(twice.unwrap_err().reason(), "duplicate_key");
//!
//! // So is a key that a case-insensitive reader (Go, .NET) takes for another.
//! let folded = parse_strict(br#"{"name": "search_docs", "Name": "delete_account"}"#, &Limits::default());
//! assert_eq!(folded.unwrap_err().reason(), "duplicate_key");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod canonical;
mod error;
mod fold;
mod lexer;
mod shown;
mod strict;

#[cfg(test)]
mod conformance_tests;
#[cfg(test)]
mod property_tests;
#[cfg(test)]
mod strict_tests;

pub use canonical::{CanonicalError, canonical_json, idempotency_key, sha256_hex};
pub use error::DecodeError;
pub use fold::folded_key;
pub use shown::shown;
pub use strict::{Limits, parse_strict};
