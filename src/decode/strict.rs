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

use serde_json::{Map, Value};

use super::error::{
    BYTE_ORDER_MARK, DecodeError, EXPECTED_COMMA_OR_CLOSE, EXPECTED_VALUE, INVALID_UTF8,
    TRAILING_CHARACTERS, UNEXPECTED_END, syntax,
};
use super::fold::folded_key;
use super::lexer::{Cursor, NumberError};

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

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
