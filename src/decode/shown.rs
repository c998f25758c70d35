//! Request text as a message may show it: every character that could act on
//! the reader's terminal, log viewer or page instead of being read (C0 and
//! C1 controls, DEL, the bidirectional controls, the line and paragraph
//! separators) is written as a Rust-style escape, `\u{1b}`. A message that
//! quotes a tool name, a method or a JSON pointer from the request then
//! shows what was sent without doing what it asks (an ANSI sequence that
//! recolours a log line, a CR that rewrites it, an U+202E that reverses a
//! name on screen).

use std::borrow::Cow;

/// Whether `c` is written as an escape ([`shown`]).
const fn is_active(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        // Bidirectional marks, embeddings, overrides and isolates.
        | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        | '\u{61c}'
        // Line and paragraph separators: a new line to many readers.
        | '\u{2028}' | '\u{2029}')
}

/// `text` with every active character ([`is_active`]) escaped as `\u{…}`
/// (lowercase hex, no leading zeros); borrowed when there is none.
///
/// ```
/// use toolgate::decode::shown;
///
/// assert_eq!(shown("refund_order"), "refund_order");
/// assert_eq!(shown("x\u{1b}[31m\r\n"), r"x\u{1b}[31m\u{d}\u{a}");
/// assert_eq!(shown("abc\u{202e}fed"), r"abc\u{202e}fed");
/// ```
#[must_use]
pub fn shown(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_active) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_active(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_is_escaped_and_nothing_else() {
        for c in [
            '\u{0}', '\t', '\n', '\r', '\u{1b}', '\u{7f}', '\u{85}', '\u{9f}',
        ] {
            assert_eq!(shown(&c.to_string()), format!("\\u{{{:x}}}", u32::from(c)));
        }
        for c in [
            '\u{200e}', '\u{202e}', '\u{2066}', '\u{2069}', '\u{61c}', '\u{2028}',
        ] {
            assert_eq!(shown(&c.to_string()), format!("\\u{{{:x}}}", u32::from(c)));
        }
        // Printable text, any script, stays as it is, and is not copied.
        for s in [
            "refund_order",
            "ſ",
            "Straße",
            "名前",
            "a\\u{1b}",
            " ~",
            "\u{a0}",
        ] {
            assert!(matches!(shown(s), Cow::Borrowed(b) if b == s), "{s:?}");
        }
    }
}
