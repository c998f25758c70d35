//! JSON pointers (RFC 6901): the syntax check and the unescaped segments.
//!
//! Owns the one reading of a pointer used by contract checks, the document order of violations
//! and the locating of errors in contract files. Must not resolve pointers against anything but
//! the value it is handed.

/// Whether `text` is a JSON pointer: empty, or `/`-separated segments in which every `~` is
/// followed by `0` or `1`.
pub(crate) fn is_valid(text: &str) -> bool {
    if !(text.is_empty() || text.starts_with('/')) {
        return false;
    }
    let mut bytes = text.bytes();
    while let Some(byte) = bytes.next() {
        if byte == b'~' && !matches!(bytes.next(), Some(b'0' | b'1')) {
            return false;
        }
    }
    true
}

/// The unescaped segments of a pointer that [`is_valid`] accepts; the root pointer `""` has none.
pub(crate) fn segments(pointer: &str) -> impl Iterator<Item = String> + '_ {
    pointer
        .split('/')
        .skip(1)
        // `~1` first: `~01` is the segment `~1`, not `/`.
        .map(|segment| segment.replace("~1", "/").replace("~0", "~"))
}

/// The pointer `pointer` followed by the segment `segment`, escaped.
pub(crate) fn push(pointer: &mut String, segment: &str) {
    pointer.push('/');
    pointer.push_str(&segment.replace('~', "~0").replace('/', "~1"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax() {
        for ok in ["", "/", "/a", "/a/0", "/~0/~1", "/a~1b", "//"] {
            assert!(is_valid(ok), "{ok:?}");
        }
        for bad in ["a", "#/a", "/~", "/~2", "/a~", "0"] {
            assert!(!is_valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn segments_are_unescaped_in_order() {
        assert_eq!(segments("").count(), 0);
        assert_eq!(segments("/").collect::<Vec<_>>(), [""]);
        assert_eq!(
            segments("/a~1b/~01/c~0").collect::<Vec<_>>(),
            ["a/b", "~1", "c~"]
        );
        let mut built = String::new();
        push(&mut built, "a/b");
        push(&mut built, "~1");
        assert_eq!(built, "/a~1b/~01");
    }
}
