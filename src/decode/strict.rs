//! The strict JSON decoder: RFC 8259 grammar exactly, plus the rules that make a
//! canonical hash sound (DESIGN §2.1).
//!
//! `serde_json` alone is not strict enough: it keeps the last of duplicated keys
//! and silently rounds out-of-range numbers, and two parsers that disagree on
//! such input are how a confused-deputy bypass is built. This parser rejects
//! them instead. It is iterative (an explicit stack of open containers), so
//! hostile nesting cannot overflow the call stack, and it must not grow any
//! leniency (comments, trailing commas, `NaN`): every accepted text has exactly
//! one meaning.

use std::collections::HashSet;

use serde_json::{Map, Number, Value};

use super::fold::folded_key;

/// The largest integer magnitude an IEEE-754 double holds exactly (2^53 − 1);
/// I-JSON (RFC 7493 §2.2) puts integer literals beyond it out of range.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Doubles with a magnitude in `[2^53, 1e21)` are integers that ECMAScript, and
/// so RFC 8785, prints as integer literals (`1e16` becomes `10000000000000000`).
/// Accepting them would emit canonical text this parser rejects and that
/// integer-native peers read as a different number (2^60 prints as
/// `1152921504606847000`), so they are out of range whatever their spelling.
const INTEGER_NOTATION_UNSAFE: std::ops::Range<f64> = 9_007_199_254_740_992.0..1e21;

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

// Stable `Syntax` reasons; callers and clients match on these strings.
const INVALID_UTF8: &str = "invalid_utf8";
const BYTE_ORDER_MARK: &str = "byte_order_mark";
const TRAILING_CHARACTERS: &str = "trailing_characters";
const UNEXPECTED_END: &str = "unexpected_end";
const EXPECTED_VALUE: &str = "expected_value";
const EXPECTED_KEY: &str = "expected_key";
const EXPECTED_COLON: &str = "expected_colon";
const EXPECTED_COMMA_OR_CLOSE: &str = "expected_comma_or_close";
const INVALID_LITERAL: &str = "invalid_literal";
const INVALID_NUMBER: &str = "invalid_number";
const INVALID_ESCAPE: &str = "invalid_escape";
const LONE_SURROGATE: &str = "lone_surrogate";
const CONTROL_CHARACTER: &str = "control_character";

/// Size and depth limits applied before and during decoding.
///
/// `max_depth` also bounds the recursion of everything that later walks the
/// decoded value (`serde_json`'s `Drop` and serializers recurse), so it must
/// stay far below what a thread's stack can hold; the default is 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted input, in bytes.
    pub max_bytes: usize,
    /// Deepest accepted nesting; every array or object opening adds one level.
    pub max_depth: usize,
}

impl Default for Limits {
    /// 1 MiB and 64 levels (DESIGN §2.1).
    fn default() -> Self {
        Self {
            max_bytes: 1_048_576,
            max_depth: 64,
        }
    }
}

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

/// Decodes `bytes` as exactly one JSON value of any type under `limits`.
///
/// Accepted input has one meaning for every conforming parser: valid UTF-8
/// without a byte-order mark, RFC 8259 grammar with whitespace limited to space,
/// tab, line feed and carriage return, unique keys in every object, no lone
/// surrogate escapes, and numbers in the I-JSON range (see
/// [`DecodeError::NumberOutOfRange`]). Integer literals become integer numbers,
/// all other numbers the nearest `f64`, so the canonical text of every accepted
/// value is itself accepted and decodes to the same value.
///
/// # Errors
/// [`DecodeError::TooLarge`] is checked before anything else; otherwise the
/// first problem in input order is reported: [`DecodeError::Syntax`],
/// [`DecodeError::TooDeep`], [`DecodeError::DuplicateKey`] or
/// [`DecodeError::NumberOutOfRange`].
pub fn parse_strict(bytes: &[u8], limits: &Limits) -> Result<Value, DecodeError> {
    if bytes.len() > limits.max_bytes {
        return Err(DecodeError::TooLarge {
            size: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    // A BOM is valid UTF-8, so it is checked first to get its own reason.
    if bytes.starts_with(UTF8_BOM) {
        return Err(syntax(0, BYTE_ORDER_MARK));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| syntax(e.valid_up_to(), INVALID_UTF8))?;
    Parser {
        cursor: Cursor { text, pos: 0 },
        stack: Vec::new(),
        max_depth: limits.max_depth,
    }
    .parse_document()
}

fn syntax(position: usize, reason: &'static str) -> DecodeError {
    DecodeError::Syntax { position, reason }
}

/// An array or object whose closing bracket has not been read yet.
enum Frame {
    Array(Vec<Value>),
    /// `key` is the member whose value is being parsed.
    Object {
        members: Map<String, Value>,
        key: String,
        /// The folded form of every key read so far (DESIGN §2.1).
        folded: HashSet<String>,
    },
}

struct Parser<'a> {
    cursor: Cursor<'a>,
    stack: Vec<Frame>,
    max_depth: usize,
}

impl Parser<'_> {
    fn parse_document(mut self) -> Result<Value, DecodeError> {
        'value: loop {
            self.cursor.skip_whitespace();
            let start = self.cursor.pos;
            let mut value = match self.cursor.peek() {
                Some(b'[') => {
                    self.enter()?;
                    self.cursor.skip_whitespace();
                    if self.cursor.eat(b']') {
                        Value::Array(Vec::new())
                    } else {
                        self.stack.push(Frame::Array(Vec::new()));
                        continue 'value;
                    }
                }
                Some(b'{') => {
                    self.enter()?;
                    self.cursor.skip_whitespace();
                    if self.cursor.eat(b'}') {
                        Value::Object(Map::new())
                    } else {
                        // The first key of an object cannot be a duplicate.
                        let (_, key) = self.cursor.parse_key()?;
                        self.cursor.expect_colon()?;
                        let folded = HashSet::from([folded_key(&key)]);
                        self.stack.push(Frame::Object {
                            members: Map::new(),
                            key,
                            folded,
                        });
                        continue 'value;
                    }
                }
                Some(b'"') => Value::String(self.cursor.parse_string()?),
                Some(b'-' | b'0'..=b'9') => self.cursor.parse_number().map_err(|e| match e {
                    NumberError::Syntax(e) => e,
                    NumberError::OutOfRange => DecodeError::NumberOutOfRange {
                        position: start,
                        pointer: self.pointer(),
                    },
                })?,
                Some(b't') => self.cursor.parse_literal("true", Value::Bool(true))?,
                Some(b'f') => self.cursor.parse_literal("false", Value::Bool(false))?,
                Some(b'n') => self.cursor.parse_literal("null", Value::Null)?,
                Some(_) => return Err(syntax(start, EXPECTED_VALUE)),
                None => return Err(syntax(start, UNEXPECTED_END)),
            };

            // A value is complete: hand it to the innermost open container,
            // closing containers for as long as their closing bracket follows.
            loop {
                let Some(frame) = self.stack.last_mut() else {
                    self.cursor.skip_whitespace();
                    return if self.cursor.at_end() {
                        Ok(value)
                    } else {
                        Err(syntax(self.cursor.pos, TRAILING_CHARACTERS))
                    };
                };
                self.cursor.skip_whitespace();
                let at = self.cursor.pos;
                match frame {
                    Frame::Array(items) => {
                        items.push(value);
                        match self.cursor.next_byte()? {
                            b',' => continue 'value,
                            b']' => value = Value::Array(std::mem::take(items)),
                            _ => return Err(syntax(at, EXPECTED_COMMA_OR_CLOSE)),
                        }
                    }
                    Frame::Object {
                        members,
                        key,
                        folded,
                    } => {
                        members.insert(std::mem::take(key), value);
                        match self.cursor.next_byte()? {
                            b',' => {
                                let (key_start, next) = self.cursor.parse_key()?;
                                // Byte-identical keys fold alike, so this
                                // one check finds both kinds of duplicate.
                                let duplicate = !folded.insert(folded_key(&next));
                                // Stored before reporting so that the stack's
                                // pointer names the duplicated member itself.
                                *key = next;
                                if duplicate {
                                    return Err(DecodeError::DuplicateKey {
                                        position: key_start,
                                        pointer: self.pointer(),
                                    });
                                }
                                self.cursor.expect_colon()?;
                                continue 'value;
                            }
                            b'}' => value = Value::Object(std::mem::take(members)),
                            _ => return Err(syntax(at, EXPECTED_COMMA_OR_CLOSE)),
                        }
                    }
                }
                self.stack.pop();
            }
        }
    }

    /// Consumes an opening bracket if one more level fits within the limit.
    fn enter(&mut self) -> Result<(), DecodeError> {
        if self.stack.len() >= self.max_depth {
            return Err(DecodeError::TooDeep {
                position: self.cursor.pos,
                limit: self.max_depth,
            });
        }
        self.cursor.pos += 1;
        Ok(())
    }

    /// The RFC 6901 pointer of the value being parsed: for each open container
    /// the index the next element will take, or the key of the pending member.
    fn pointer(&self) -> String {
        let mut pointer = String::new();
        for frame in &self.stack {
            pointer.push('/');
            match frame {
                Frame::Array(items) => pointer.push_str(&items.len().to_string()),
                Frame::Object { key, .. } => {
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                }
            }
        }
        pointer
    }
}

/// A number that parsed grammatically but is outside the I-JSON range; the
/// parser adds the position and pointer, which the cursor does not know.
enum NumberError {
    Syntax(DecodeError),
    OutOfRange,
}

impl From<DecodeError> for NumberError {
    fn from(e: DecodeError) -> Self {
        Self::Syntax(e)
    }
}

/// A read position in input already validated as UTF-8.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }

    /// Consumes and returns one byte; running out of input is an error here
    /// because every caller needs one more byte to finish what it started.
    fn next_byte(&mut self) -> Result<u8, DecodeError> {
        let byte = self.peek().ok_or(syntax(self.pos, UNEXPECTED_END))?;
        self.pos += 1;
        Ok(byte)
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn skip_digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }

    /// The text between two positions the cursor has already passed.
    fn slice(&self, start: usize) -> Result<&'a str, DecodeError> {
        // INVARIANT: callers only cut before ASCII bytes, which are always
        // char boundaries; failing closed here costs nothing if that breaks.
        self.text
            .get(start..self.pos)
            .ok_or(syntax(start, INVALID_UTF8))
    }

    fn parse_literal(&mut self, word: &str, value: Value) -> Result<Value, DecodeError> {
        let rest = self.text.get(self.pos..).unwrap_or_default();
        if rest.starts_with(word) {
            self.pos += word.len();
            Ok(value)
        } else if word.starts_with(rest) {
            Err(syntax(self.text.len(), UNEXPECTED_END))
        } else {
            Err(syntax(self.pos, INVALID_LITERAL))
        }
    }

    /// Parses a member's key, returning it with the position of its quote.
    fn parse_key(&mut self) -> Result<(usize, String), DecodeError> {
        self.skip_whitespace();
        let start = self.pos;
        match self.peek() {
            Some(b'"') => Ok((start, self.parse_string()?)),
            Some(_) => Err(syntax(start, EXPECTED_KEY)),
            None => Err(syntax(start, UNEXPECTED_END)),
        }
    }

    fn expect_colon(&mut self) -> Result<(), DecodeError> {
        self.skip_whitespace();
        let at = self.pos;
        if self.next_byte()? == b':' {
            Ok(())
        } else {
            Err(syntax(at, EXPECTED_COLON))
        }
    }

    /// Parses a string starting at its opening quote, unescaping it.
    fn parse_string(&mut self) -> Result<String, DecodeError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let run = self.pos;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.pos += 1;
            }
            out.push_str(self.slice(run)?);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => out.push(self.parse_escape()?),
                Some(_) => return Err(syntax(self.pos, CONTROL_CHARACTER)),
                None => return Err(syntax(self.pos, UNEXPECTED_END)),
            }
        }
    }

    /// Parses one escape sequence starting at its backslash.
    fn parse_escape(&mut self) -> Result<char, DecodeError> {
        let start = self.pos;
        self.pos += 1;
        Ok(match self.next_byte()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.parse_unicode_escape(start),
            _ => return Err(syntax(start, INVALID_ESCAPE)),
        })
    }

    /// Parses the hex digits of a `\u` escape (the cursor is past the `u`),
    /// joining a surrogate pair; either half alone is not a character.
    fn parse_unicode_escape(&mut self, start: usize) -> Result<char, DecodeError> {
        let unit = self.parse_hex4(start)?;
        let code = match unit {
            0xD800..=0xDBFF => {
                let low_start = self.pos;
                if self.peek().is_none() {
                    return Err(syntax(low_start, UNEXPECTED_END));
                }
                if !(self.eat(b'\\') && self.eat(b'u')) {
                    return Err(syntax(start, LONE_SURROGATE));
                }
                let low = self.parse_hex4(low_start)?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(syntax(start, LONE_SURROGATE));
                }
                0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(syntax(start, LONE_SURROGATE)),
            _ => unit,
        };
        // INVARIANT: `code` is a non-surrogate below 0x110000, so this holds.
        char::from_u32(code).ok_or(syntax(start, LONE_SURROGATE))
    }

    fn parse_hex4(&mut self, start: usize) -> Result<u32, DecodeError> {
        let mut unit = 0;
        for _ in 0..4 {
            let digit = char::from(self.next_byte()?)
                .to_digit(16)
                .ok_or(syntax(start, INVALID_ESCAPE))?;
            unit = unit * 16 + digit;
        }
        Ok(unit)
    }

    /// Parses a number per the RFC 8259 grammar, then applies the I-JSON range.
    fn parse_number(&mut self) -> Result<Value, NumberError> {
        let start = self.pos;
        self.eat(b'-');
        match self.next_byte()? {
            b'0' => {
                // `0` may not be followed by more digits: leading zeros are
                // octal in some parsers and decimal in others.
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err(syntax(self.pos, INVALID_NUMBER).into());
                }
            }
            b'1'..=b'9' => {
                self.skip_digits();
            }
            _ => return Err(syntax(self.pos - 1, INVALID_NUMBER).into()),
        }
        let mut integer = true;
        if self.eat(b'.') {
            integer = false;
            self.require_digits()?;
        }
        let mantissa = self.slice(start)?;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            integer = false;
            self.pos += 1;
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            self.require_digits()?;
        }
        let literal = self.slice(start)?;

        if integer {
            // A literal too long for i64 is far beyond 2^53 anyway.
            let n: i64 = literal.parse().map_err(|_| NumberError::OutOfRange)?;
            if n.unsigned_abs() > MAX_SAFE_INTEGER {
                return Err(NumberError::OutOfRange);
            }
            return Ok(Value::from(n));
        }
        let f: f64 = literal.parse().map_err(|_| syntax(start, INVALID_NUMBER))?;
        // A non-zero literal that rounds to zero would hash like `0`.
        let underflow = f == 0.0 && mantissa.bytes().any(|b| matches!(b, b'1'..=b'9'));
        if underflow || INTEGER_NOTATION_UNSAFE.contains(&f.abs()) {
            return Err(NumberError::OutOfRange);
        }
        // `from_f64` rejects exactly the infinities that overflow produces.
        Number::from_f64(f)
            .map(Value::Number)
            .ok_or(NumberError::OutOfRange)
    }

    /// At least one digit must follow a `.` or an exponent marker.
    fn require_digits(&mut self) -> Result<(), DecodeError> {
        if self.skip_digits() > 0 {
            Ok(())
        } else if self.at_end() {
            Err(syntax(self.pos, UNEXPECTED_END))
        } else {
            Err(syntax(self.pos, INVALID_NUMBER))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(input: &str, expected: Result<Value, DecodeError>) {
        assert_eq!(
            parse_strict(input.as_bytes(), &Limits::default()),
            expected,
            "input: {input:?}"
        );
    }

    fn syntax_at(position: usize, reason: &'static str) -> Result<Value, DecodeError> {
        Err(DecodeError::Syntax { position, reason })
    }

    fn duplicate(position: usize, pointer: &str) -> Result<Value, DecodeError> {
        Err(DecodeError::DuplicateKey {
            position,
            pointer: pointer.to_owned(),
        })
    }

    fn out_of_range(position: usize, pointer: &str) -> Result<Value, DecodeError> {
        Err(DecodeError::NumberOutOfRange {
            position,
            pointer: pointer.to_owned(),
        })
    }

    #[test]
    fn accepts_every_value_type_at_top_level() {
        check(
            " \t\r\n{\"a\": [1, -2.5, true, false, null, \"x\"]} \n",
            Ok(json!({"a": [1, -2.5, true, false, null, "x"]})),
        );
        check("\"s\"", Ok(json!("s")));
        check("0", Ok(json!(0)));
        check("null", Ok(Value::Null));
        check("[]", Ok(json!([])));
        check("{}", Ok(json!({})));
    }

    #[test]
    fn unescapes_strings() {
        check(
            r#""\"\\\/\b\f\n\r\t\u0041\u00e9\uD834\uDD1E""#,
            Ok(json!("\"\\/\u{8}\u{c}\n\r\tA\u{e9}\u{1D11E}")),
        );
        check("\"\u{1D11E}é\"", Ok(json!("\u{1D11E}é")));
    }

    #[test]
    fn rejects_bad_encoding_with_its_position() {
        check("\u{FEFF}{}", syntax_at(0, "byte_order_mark"));
        assert_eq!(
            parse_strict(b"[\"a\xff\"]", &Limits::default()),
            syntax_at(3, "invalid_utf8")
        );
    }

    #[test]
    fn rejects_grammar_errors_with_their_position() {
        check("", syntax_at(0, "unexpected_end"));
        check("  ", syntax_at(2, "unexpected_end"));
        check("{} x", syntax_at(3, "trailing_characters"));
        check("1 2", syntax_at(2, "trailing_characters"));
        check("[1,]", syntax_at(3, "expected_value"));
        check("[1 2]", syntax_at(3, "expected_comma_or_close"));
        check("{\"a\":1,}", syntax_at(7, "expected_key"));
        check("{'a':1}", syntax_at(1, "expected_key"));
        check("{\"a\" 1}", syntax_at(5, "expected_colon"));
        check("{\"a\":1 \"b\":2}", syntax_at(7, "expected_comma_or_close"));
        check("[1", syntax_at(2, "unexpected_end"));
        check("{\"a\":", syntax_at(5, "unexpected_end"));
        check("[\"abc", syntax_at(5, "unexpected_end"));
        check("/* c */ 1", syntax_at(0, "expected_value"));
        check("[1] // c", syntax_at(4, "trailing_characters"));
        check("'a'", syntax_at(0, "expected_value"));
        check("[NaN]", syntax_at(1, "expected_value"));
        check("[Infinity]", syntax_at(1, "expected_value"));
        check("[+1]", syntax_at(1, "expected_value"));
        check("[.5]", syntax_at(1, "expected_value"));
        check("[tru]", syntax_at(1, "invalid_literal"));
        check("nul", syntax_at(3, "unexpected_end"));
        check("\u{a0}1", syntax_at(0, "expected_value"));
        check("\u{c}1", syntax_at(0, "expected_value"));
    }

    #[test]
    fn rejects_malformed_numbers() {
        check("[01]", syntax_at(2, "invalid_number"));
        check("[-01]", syntax_at(3, "invalid_number"));
        check("[-]", syntax_at(2, "invalid_number"));
        check("[-a]", syntax_at(2, "invalid_number"));
        check("[1.]", syntax_at(3, "invalid_number"));
        check("[1.e5]", syntax_at(3, "invalid_number"));
        check("[1e]", syntax_at(3, "invalid_number"));
        check("[1e+]", syntax_at(4, "invalid_number"));
        check("1.", syntax_at(2, "unexpected_end"));
        check("-", syntax_at(1, "unexpected_end"));
    }

    #[test]
    fn rejects_bad_strings() {
        check("[\"a\u{1f}\"]", syntax_at(3, "control_character"));
        check("[\"\t\"]", syntax_at(2, "control_character"));
        check(r#"["\x"]"#, syntax_at(2, "invalid_escape"));
        check(r#"["\u12g4"]"#, syntax_at(2, "invalid_escape"));
        check(r#"["\U0041"]"#, syntax_at(2, "invalid_escape"));
        check(r#"["\u004"#, syntax_at(7, "unexpected_end"));
        check(r#"["\ud800"]"#, syntax_at(2, "lone_surrogate"));
        check(r#"["\udc00"]"#, syntax_at(2, "lone_surrogate"));
        check(r#"["x\ud800\u0041"]"#, syntax_at(3, "lone_surrogate"));
        check(r#"["\ud800\ud800"]"#, syntax_at(2, "lone_surrogate"));
        check(r#"["\ud800\n"]"#, syntax_at(2, "lone_surrogate"));
        check(r#"["\ud800\uzzzz"]"#, syntax_at(8, "invalid_escape"));
        check(r#"["\ud800"#, syntax_at(8, "unexpected_end"));
    }

    #[test]
    fn duplicate_keys_are_compared_after_unescaping() {
        check(r#"{"a":1,"a":2}"#, duplicate(7, "/a"));
        check(r#"{"a":1,"\u0061":2}"#, duplicate(7, "/a"));
        check(r#"{"a":{"b":1,"b":2}}"#, duplicate(12, "/a/b"));
        check(
            r#"[0,{"x":1,"a/~b":2,"a/~b":3}]"#,
            duplicate(19, "/1/a~1~0b"),
        );
        check(r#"{"":1,"":2}"#, duplicate(6, "/"));
        // Reported where the repeated key ends, before what follows it.
        check(r#"{"a":1,"a""#, duplicate(7, "/a"));
        // Keys a case-insensitive reader takes for one another are
        // duplicates too (DESIGN §2.1), reported at the later key.
        check(r#"{"a":1,"A":2}"#, duplicate(7, "/A"));
        check(
            r#"{"name":"search_docs","arguments":{},"Name":"delete_account"}"#,
            duplicate(37, "/Name"),
        );
        check(
            r#"{"params":{},"param\u017f":{}}"#,
            duplicate(13, "/param\u{17f}"),
        );
        check(r#"{"kind":1,"\u212aind":2}"#, duplicate(10, "/\u{212a}ind"));
        check(
            r#"{"method":1,"method\u0000":2}"#,
            duplicate(12, "/method\u{0}"),
        );
        check(r#"{"x":{"Id":1,"iD":2}}"#, duplicate(13, "/x/iD"));
        // Normalization is not folded: no such reader composes characters.
        check(
            "{\"\u{e9}\":1,\"e\u{301}\":2}",
            Ok(json!({"\u{e9}": 1, "e\u{301}": 2})),
        );
        // A NUL anywhere but at the end makes a different key.
        check(r#"{"a":1,"\u0000a":2}"#, Ok(json!({"a": 1, "\u{0}a": 2})));
        // Keys in different objects are independent.
        check(
            r#"{"a":{"a":1},"b":{"a":2}}"#,
            Ok(json!({"a": {"a": 1}, "b": {"a": 2}})),
        );
    }

    #[test]
    fn integers_stop_at_two_to_the_53rd() {
        check("[9007199254740991]", Ok(json!([9_007_199_254_740_991_u64])));
        check(
            "[-9007199254740991]",
            Ok(json!([-9_007_199_254_740_991_i64])),
        );
        check("[9007199254740992]", out_of_range(1, "/0"));
        check("[-9007199254740992]", out_of_range(1, "/0"));
        check(
            "[1,{\"n\":[99999999999999999999999]}]",
            out_of_range(9, "/1/n/0"),
        );
        check("18446744073709551616", out_of_range(0, ""));
        // Other spellings are doubles, rounded to nearest like every JCS peer...
        check("9007199254740991.4", Ok(json!(9_007_199_254_740_991.0)));
        check("9.007199254740991e15", Ok(json!(9_007_199_254_740_991.0)));
        check("-1.5e300", Ok(json!(-1.5e300)));
        check("1e21", Ok(json!(1e21)));
        check("-999999999999999999999.5", Ok(json!(-1e21)));
        // ...unless canonical form would print them as unsafe integers.
        check("9007199254740991.5", out_of_range(0, ""));
        check("[9007199254740992.0]", out_of_range(1, "/0"));
        check("{\"n\":1e16}", out_of_range(5, "/n"));
        check("-1E+20", out_of_range(0, ""));
        check("999999999999999900000.0", out_of_range(0, ""));
    }

    #[test]
    fn doubles_must_not_overflow_or_underflow() {
        check("[1e400]", out_of_range(1, "/0"));
        check("[-1e400]", out_of_range(1, "/0"));
        check("[1e-400]", out_of_range(1, "/0"));
        check("{\"a/b\":-0.0000001e-400}", out_of_range(7, "/a~1b"));
        check("[0e-400]", Ok(json!([0.0])));
        check("[0.0]", Ok(json!([0.0])));
        check("[-0]", Ok(json!([0])));
        check("[1.7976931348623157e308]", Ok(json!([f64::MAX])));
        check("[5e-324]", Ok(json!([5e-324])));
        check("[1E+2]", Ok(json!([100.0])));
    }

    fn nested(depth: usize) -> String {
        "[".repeat(depth) + &"]".repeat(depth)
    }

    #[test]
    fn depth_limit_counts_every_opening() {
        assert_eq!(
            parse_strict(nested(64).as_bytes(), &Limits::default()).map(|v| v.is_array()),
            Ok(true)
        );
        check(
            &nested(65),
            Err(DecodeError::TooDeep {
                position: 64,
                limit: 64,
            }),
        );
        let objects = "{\"a\":".repeat(65) + "1" + &"}".repeat(65);
        check(
            &objects,
            Err(DecodeError::TooDeep {
                position: 5 * 64,
                limit: 64,
            }),
        );
        let scalar_only = Limits {
            max_depth: 0,
            ..Limits::default()
        };
        assert_eq!(parse_strict(b"1", &scalar_only), Ok(json!(1)));
        assert_eq!(
            parse_strict(b"[]", &scalar_only),
            Err(DecodeError::TooDeep {
                position: 0,
                limit: 0
            })
        );
    }

    #[test]
    fn deep_hostile_input_does_not_recurse() {
        check(
            &"[".repeat(100_000),
            Err(DecodeError::TooDeep {
                position: 64,
                limit: 64,
            }),
        );
        // Even with the depth check out of the way the parser itself holds up.
        let unbounded = Limits {
            max_depth: usize::MAX,
            ..Limits::default()
        };
        assert_eq!(
            parse_strict("[{\"a\":".repeat(100_000).as_bytes(), &unbounded),
            syntax_at(600_000, "unexpected_end")
        );
    }

    #[test]
    fn size_limit_is_checked_before_parsing() {
        let limits = Limits {
            max_bytes: 4,
            ..Limits::default()
        };
        assert_eq!(parse_strict(b"[1] ", &limits), Ok(json!([1])));
        assert_eq!(
            parse_strict(b"\xff\xff\xff\xff\xff", &limits),
            Err(DecodeError::TooLarge { size: 5, limit: 4 })
        );
        let big = vec![b' '; 1_048_577];
        assert_eq!(
            parse_strict(&big, &Limits::default()),
            Err(DecodeError::TooLarge {
                size: 1_048_577,
                limit: 1_048_576
            })
        );
    }

    #[test]
    fn error_accessors_and_messages() {
        let cases = [
            (
                DecodeError::TooLarge { size: 9, limit: 8 },
                "too_large",
                None,
                true,
                "input is 9 bytes, over the limit of 8 bytes",
            ),
            (
                DecodeError::TooDeep {
                    position: 3,
                    limit: 2,
                },
                "too_deep",
                Some(3),
                true,
                "nesting deeper than 2 levels at byte 3",
            ),
            (
                DecodeError::Syntax {
                    position: 1,
                    reason: "lone_surrogate",
                },
                "lone_surrogate",
                Some(1),
                false,
                "invalid json at byte 1: lone_surrogate",
            ),
            (
                DecodeError::DuplicateKey {
                    position: 7,
                    pointer: "/a".into(),
                },
                "duplicate_key",
                Some(7),
                false,
                "duplicate object key `/a` at byte 7",
            ),
            (
                DecodeError::NumberOutOfRange {
                    position: 1,
                    pointer: "/0".into(),
                },
                "number_out_of_range",
                Some(1),
                true,
                "number `/0` at byte 1 is out of the interoperable range",
            ),
        ];
        for (error, reason, position, is_limit, message) in cases {
            assert_eq!(error.reason(), reason);
            assert_eq!(error.position(), position);
            assert_eq!(error.is_limit(), is_limit, "{error:?}");
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn messages_never_echo_the_input() {
        // Only a pointer may carry input text, and only an object key puts it there.
        let cases = [
            (
                "[\"sk-SECRET\" sk-SECRET]",
                "invalid json at byte 13: expected_comma_or_close",
            ),
            ("sk-SECRET", "invalid json at byte 0: expected_value"),
            (
                "[1e999]",
                "number `/0` at byte 1 is out of the interoperable range",
            ),
        ];
        for (input, message) in cases {
            let error = parse_strict(input.as_bytes(), &Limits::default()).map(|_| ());
            assert_eq!(error.map_err(|e| e.to_string()), Err(message.to_owned()));
        }
    }
}
