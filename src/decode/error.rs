//! Why the strict decoder refuses bytes: [`DecodeError`] and its stable
//! reasons, which callers and clients match on.

// Stable `Syntax` reasons; callers and clients match on these strings.
pub(super) const INVALID_UTF8: &str = "invalid_utf8";
pub(super) const BYTE_ORDER_MARK: &str = "byte_order_mark";
pub(super) const TRAILING_CHARACTERS: &str = "trailing_characters";
pub(super) const UNEXPECTED_END: &str = "unexpected_end";
pub(super) const EXPECTED_VALUE: &str = "expected_value";
pub(super) const EXPECTED_KEY: &str = "expected_key";
pub(super) const EXPECTED_COLON: &str = "expected_colon";
pub(super) const EXPECTED_COMMA_OR_CLOSE: &str = "expected_comma_or_close";
pub(super) const INVALID_LITERAL: &str = "invalid_literal";
pub(super) const INVALID_NUMBER: &str = "invalid_number";
pub(super) const INVALID_ESCAPE: &str = "invalid_escape";
pub(super) const LONE_SURROGATE: &str = "lone_surrogate";
pub(super) const CONTROL_CHARACTER: &str = "control_character";

/// Why bytes were not accepted as JSON. Messages never quote the input; a JSON
/// pointer (in backticks, its control characters escaped by
/// [`super::shown`]) and byte offsets are the only input-derived parts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The input is longer than [`Limits::max_bytes`]; nothing was parsed.
    #[error("input is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// An array or object opening at `position` nests deeper than the limit.
    #[error("nesting deeper than {limit} levels at byte {position}")]
    TooDeep { position: usize, limit: usize },
    /// The input is not RFC 8259 JSON; `reason` is a stable snake_case word.
    #[error("invalid json at byte {position}: {reason}")]
    Syntax {
        position: usize,
        reason: &'static str,
    },
    /// An object repeats a key (compared after unescaping); `pointer` is the
    /// RFC 6901 pointer of the repeated member and `position` its key's quote.
    #[error("duplicate object key `{}` at byte {position}", super::shown(.pointer))]
    DuplicateKey { position: usize, pointer: String },
    /// A number outside what every I-JSON peer reads identically: an integer
    /// literal beyond ±(2^53 − 1), a literal that overflows to infinity or
    /// underflows a non-zero value to zero, or any other literal whose nearest
    /// double would be printed in canonical form as an integer beyond ±(2^53 − 1)
    /// (a magnitude from 2^53 up to, not including, 1e21).
    #[error("number `{}` at byte {position} is out of the interoperable range", super::shown(.pointer))]
    NumberOutOfRange { position: usize, pointer: String },
}

impl DecodeError {
    /// Stable machine-readable reason: `too_large`, `too_deep`, the syntax
    /// reason (e.g. `lone_surrogate`), `duplicate_key` or `number_out_of_range`.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::TooDeep { .. } => "too_deep",
            Self::Syntax { reason, .. } => reason,
            Self::DuplicateKey { .. } => "duplicate_key",
            Self::NumberOutOfRange { .. } => "number_out_of_range",
        }
    }

    /// Byte offset into the input where the problem was found; `None` for
    /// [`DecodeError::TooLarge`], which is decided before reading any byte.
    #[must_use]
    pub fn position(&self) -> Option<usize> {
        match self {
            Self::TooLarge { .. } => None,
            Self::TooDeep { position, .. }
            | Self::Syntax { position, .. }
            | Self::DuplicateKey { position, .. }
            | Self::NumberOutOfRange { position, .. } => Some(*position),
        }
    }

    /// `true` for a breached limit (size, depth, number range), which maps to
    /// `invalid_arguments`; `false` for input that is not acceptable JSON at
    /// all (syntax, duplicate key), which maps to `invalid_json`.
    #[must_use]
    pub fn is_limit(&self) -> bool {
        match self {
            Self::TooLarge { .. } | Self::TooDeep { .. } | Self::NumberOutOfRange { .. } => true,
            Self::Syntax { .. } | Self::DuplicateKey { .. } => false,
        }
    }
}

pub(super) fn syntax(position: usize, reason: &'static str) -> DecodeError {
    DecodeError::Syntax { position, reason }
}
