//! Turning untrusted argument bytes into a JSON value, and that value into the
//! one canonical text that is hashed, authorized and executed (DESIGN §2.1, §2.3).
//!
//! This module owns the strict decoding rules (RFC 8259 grammar, no duplicate
//! keys, no lone surrogates, I-JSON number range, size and depth limits) and the
//! RFC 8785 canonical form with its SHA-256 hashes and the idempotency key.
//!
//! It holds rules only: no IO, no logging, no clock. It knows nothing of gRPC,
//! Cedar, tool contracts or JSON Schema; callers map [`DecodeError`] to an
//! envelope code with [`DecodeError::is_limit`] and check for a top-level object
//! themselves.

mod canonical;
mod strict;

#[cfg(test)]
mod conformance_tests;
#[cfg(test)]
mod property_tests;

pub use canonical::{CanonicalError, canonical_json, idempotency_key, sha256_hex};
pub use strict::{DecodeError, Limits, parse_strict};
