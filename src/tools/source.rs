//! Positions in a contract file: where a JSON pointer's member starts, and duplicate keys.
//!
//! serde_json reports positions only for the errors it raises itself; the semantic checks of a
//! contract (a bad name, an unknown field, a problem deep inside `inputSchema`) are located
//! here by walking the text. The walker runs only on text serde_json has already accepted; on
//! anything it does not understand it gives up (`None`) rather than guess.
//!
//! Duplicate keys are found here too: `serde_json::Value` keeps the last of two equal keys
//! silently, so a reviewer could read one schema while another one is enforced.

use std::collections::HashSet;

use super::pointer;

/// A position in a text: byte offset, and 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) offset: usize,
    pub(crate) line: usize,
    pub(crate) column: usize,
}

impl Position {
    /// The position of byte `offset` of `text` (clamped to the text).
    pub(crate) fn at(text: &str, offset: usize) -> Self {
        let before = text.get(..offset).unwrap_or(text);
        let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
        Position {
            offset: before.len(),
            line: before.matches('\n').count() + 1,
            column: before.get(line_start..).unwrap_or("").chars().count() + 1,
        }
    }

    /// The position of serde_json's 1-based (`line`, `column`), whose column counts bytes.
    pub(crate) fn from_line_column(text: &str, line: usize, column: usize) -> Self {
        let line_start: usize = text
            .split_inclusive('\n')
            .take(line.saturating_sub(1))
            .map(str::len)
            .sum();
        Position::at(text, line_start + column.saturating_sub(1))
    }
}

/// Where the member or element named by `pointer` starts: the opening quote of an object
/// member's key, the first byte of an array element, or the root value for `""`.
pub(crate) fn locate(text: &str, pointer: &str) -> Option<Position> {
    let target: Vec<String> = pointer::segments(pointer).collect();
    let mut walker = Walker::new(text, Goal::Locate(&target));
    walker
        .walk_document()
        .map(|offset| Position::at(text, offset))
}

/// The first key that appears twice in one object, in document order: its JSON pointer and
/// the position of its second occurrence.
pub(crate) fn first_duplicate_key(text: &str) -> Option<(String, Position)> {
    let mut walker = Walker::new(text, Goal::Duplicate);
    let offset = walker.walk_document()?;
    let mut pointer = String::new();
    for segment in &walker.path {
        pointer::push(&mut pointer, segment);
    }
    Some((pointer, Position::at(text, offset)))
}

enum Goal<'a> {
    Locate(&'a [String]),
    Duplicate,
}

/// Why the walk ended early.
enum Halt {
    /// The goal was reached at this byte offset; `Walker::path` is where.
    Found(usize),
    /// The text is not JSON as this walker understands it.
    Lost,
}

struct Walker<'t, 'g> {
    text: &'t str,
    pos: usize,
    path: Vec<String>,
    goal: Goal<'g>,
}

impl<'t, 'g> Walker<'t, 'g> {
    fn new(text: &'t str, goal: Goal<'g>) -> Self {
        Walker {
            text,
            pos: 0,
            path: Vec::new(),
            goal,
        }
    }

    fn walk_document(&mut self) -> Option<usize> {
        self.skip_whitespace();
        match self.node(self.pos).and_then(|()| self.value()) {
            Err(Halt::Found(offset)) => Some(offset),
            Ok(()) | Err(Halt::Lost) => None,
        }
    }

    /// Called at the start of every member and element (and the root).
    fn node(&self, offset: usize) -> Result<(), Halt> {
        match self.goal {
            Goal::Locate(target) if self.path == target => Err(Halt::Found(offset)),
            Goal::Locate(_) | Goal::Duplicate => Ok(()),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), Halt> {
        self.skip_whitespace();
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Halt::Lost)
        }
    }

    fn value(&mut self) -> Result<(), Halt> {
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => self.string().map(drop),
            Some(_) => {
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.pos += 1;
                }
                Ok(())
            }
            None => Err(Halt::Lost),
        }
    }

    /// Consumes a string literal and returns its decoded value.
    fn string(&mut self) -> Result<String, Halt> {
        let start = self.pos;
        self.expect(b'"')?;
        loop {
            match self.peek() {
                Some(b'"') => break,
                Some(b'\\') => self.pos += 2,
                Some(_) => self.pos += 1,
                None => return Err(Halt::Lost),
            }
        }
        self.pos += 1;
        let literal = self.text.get(start..self.pos).ok_or(Halt::Lost)?;
        serde_json::from_str(literal).map_err(|_| Halt::Lost)
    }

    fn object(&mut self) -> Result<(), Halt> {
        self.expect(b'{')?;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        let mut keys = HashSet::new();
        loop {
            self.skip_whitespace();
            let key_start = self.pos;
            let key = self.string()?;
            let duplicate = !keys.insert(key.clone());
            self.path.push(key);
            if duplicate && matches!(self.goal, Goal::Duplicate) {
                return Err(Halt::Found(key_start));
            }
            self.node(key_start)?;
            self.expect(b':')?;
            self.value()?;
            self.path.pop();
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(Halt::Lost),
            }
        }
    }

    fn array(&mut self) -> Result<(), Halt> {
        self.expect(b'[')?;
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        let mut index = 0_usize;
        loop {
            self.skip_whitespace();
            self.path.push(index.to_string());
            self.node(self.pos)?;
            self.value()?;
            self.path.pop();
            index += 1;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(Halt::Lost),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str =
        "{\n  \"a\": 1,\n  \"b\": [true, {\"c/d\": null}],\n  \"é\": {\"x\": \"\\\"}\"}\n}";

    fn line_column(pointer: &str) -> Option<(usize, usize)> {
        locate(TEXT, pointer).map(|position| (position.line, position.column))
    }

    #[test]
    fn locates_members_elements_and_root() {
        assert_eq!(line_column(""), Some((1, 1)));
        assert_eq!(line_column("/a"), Some((2, 3)));
        assert_eq!(line_column("/b"), Some((3, 3)));
        assert_eq!(line_column("/b/0"), Some((3, 9)));
        assert_eq!(line_column("/b/1"), Some((3, 15)));
        assert_eq!(line_column("/b/1/c~1d"), Some((3, 16)));
        assert_eq!(line_column("/é/x"), Some((4, 9)));
        assert_eq!(line_column("/missing"), None);
        assert_eq!(line_column("/b/2"), None);
    }

    #[test]
    fn finds_the_first_duplicate_key() {
        assert_eq!(first_duplicate_key(TEXT), None);
        let text = "{\"a\": {\"k\": 1, \"\\u006b\": 2}, \"a\": 3}";
        let (pointer, position) = first_duplicate_key(text).unwrap();
        assert_eq!(pointer, "/a/k");
        assert_eq!((position.line, position.column), (1, 16));
    }

    #[test]
    fn converts_serde_positions() {
        let position = Position::from_line_column(TEXT, 3, 3);
        assert_eq!(position, Position::at(TEXT, 14));
        assert_eq!((position.line, position.column), (3, 3));
    }
}
