//! The strict decoder's tokens: a cursor over input already validated as
//! UTF-8 that reads literals, keys, strings with their escapes, and numbers
//! in the I-JSON range (DESIGN §2.1). The parser (`strict.rs`) holds the
//! containers; this file never sees more than one token.

use serde_json::{Number, Value};

use super::error::{
    CONTROL_CHARACTER, DecodeError, EXPECTED_COLON, EXPECTED_KEY, INVALID_ESCAPE, INVALID_LITERAL,
    INVALID_NUMBER, INVALID_UTF8, LONE_SURROGATE, UNEXPECTED_END, syntax,
};

/// The largest integer magnitude an IEEE-754 double holds exactly (2^53 − 1);
/// I-JSON (RFC 7493 §2.2) puts integer literals beyond it out of range.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Doubles with a magnitude in `[2^53, 1e21)` are integers that ECMAScript, and
/// so RFC 8785, prints as integer literals (`1e16` becomes `10000000000000000`).
/// Accepting them would emit canonical text this parser rejects and that
/// integer-native peers read as a different number (2^60 prints as
/// `1152921504606847000`), so they are out of range whatever their spelling.
const INTEGER_NOTATION_UNSAFE: std::ops::Range<f64> = 9_007_199_254_740_992.0..1e21;

/// A number that parsed grammatically but is outside the I-JSON range; the
/// parser adds the position and pointer, which the cursor does not know.
pub(super) enum NumberError {
    Syntax(DecodeError),
    OutOfRange,
}

impl From<DecodeError> for NumberError {
    fn from(e: DecodeError) -> Self {
        Self::Syntax(e)
    }
}

/// A read position in input already validated as UTF-8.
pub(super) struct Cursor<'a> {
    pub(super) text: &'a str,
    pub(super) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    pub(super) fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }

    /// Consumes and returns one byte; running out of input is an error here
    /// because every caller needs one more byte to finish what it started.
    pub(super) fn next_byte(&mut self) -> Result<u8, DecodeError> {
        let byte = self.peek().ok_or(syntax(self.pos, UNEXPECTED_END))?;
        self.pos += 1;
        Ok(byte)
    }

    pub(super) fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    pub(super) fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    pub(super) fn skip_digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }

    /// The text between two positions the cursor has already passed.
    pub(super) fn slice(&self, start: usize) -> Result<&'a str, DecodeError> {
        // INVARIANT: callers only cut before ASCII bytes, which are always
        // char boundaries; failing closed here costs nothing if that breaks.
        self.text
            .get(start..self.pos)
            .ok_or(syntax(start, INVALID_UTF8))
    }

    pub(super) fn parse_literal(&mut self, word: &str, value: Value) -> Result<Value, DecodeError> {
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
    pub(super) fn parse_key(&mut self) -> Result<(usize, String), DecodeError> {
        self.skip_whitespace();
        let start = self.pos;
        match self.peek() {
            Some(b'"') => Ok((start, self.parse_string()?)),
            Some(_) => Err(syntax(start, EXPECTED_KEY)),
            None => Err(syntax(start, UNEXPECTED_END)),
        }
    }

    pub(super) fn expect_colon(&mut self) -> Result<(), DecodeError> {
        self.skip_whitespace();
        let at = self.pos;
        if self.next_byte()? == b':' {
            Ok(())
        } else {
            Err(syntax(at, EXPECTED_COLON))
        }
    }

    /// Parses a string starting at its opening quote, unescaping it.
    pub(super) fn parse_string(&mut self) -> Result<String, DecodeError> {
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
    pub(super) fn parse_escape(&mut self) -> Result<char, DecodeError> {
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
    pub(super) fn parse_unicode_escape(&mut self, start: usize) -> Result<char, DecodeError> {
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

    pub(super) fn parse_hex4(&mut self, start: usize) -> Result<u32, DecodeError> {
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
    pub(super) fn parse_number(&mut self) -> Result<Value, NumberError> {
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
    pub(super) fn require_digits(&mut self) -> Result<(), DecodeError> {
        if self.skip_digits() > 0 {
            Ok(())
        } else if self.at_end() {
            Err(syntax(self.pos, UNEXPECTED_END))
        } else {
            Err(syntax(self.pos, INVALID_NUMBER))
        }
    }
}
