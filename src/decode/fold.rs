//! The form in which case-insensitive JSON readers see an object key
//! (DESIGN §2.1): two keys with the same folded form are duplicates.
//!
//! Go's `encoding/json` (and so the Go MCP SDKs), .NET's `System.Text.Json`
//! with case-insensitive properties and Jackson's
//! `ACCEPT_CASE_INSENSITIVE_PROPERTIES` match a key to a field ignoring case
//! and take the last match. An object that holds `"name"` and `"Name"` then
//! means one thing to toolgate and another to the server behind it, which
//! is how a policy proxy is bypassed (GHSA-wvj2-96wp-fq3f). The MCP Go
//! SDK also dropped trailing U+0000 from keys (GHSA-q382-vc8q-7jhj).
//!
//! The fold must be at least as coarse as every such reader's: keys that any
//! of them reads as one must fold alike. Folding a little more (full
//! mappings fold `"ß"` onto `"ss"`) only refuses a rare object that no
//! schema of ours names both ways; folding less would let a smuggled key
//! through. So each character is mapped to its lowercase, then uppercase,
//! then lowercase form with Rust's (full) Unicode mappings: that joins every
//! simple case-folding orbit (`s`, `S`, `ſ`; `k`, `K`, `K`; `µ`, `Μ`, `μ`),
//! the simple per-character upper- and lowercase equalities of Go, .NET and
//! Java, and the full mappings' expansions. U+0130 (`İ`) is the one
//! character whose simple lowercase (`i`, what Go's fold uses) is not a
//! prefix of its full one (`i̇`), so it is mapped to `i` first. This module
//! holds rules, no IO; the integration tests check it against Go's own
//! `unicode` tables and `encoding/json`.

/// The folded form of `key`: trailing U+0000 removed, then every character
/// case-folded as the module says. ASCII keys take a fast path with the
/// same result.
#[must_use]
pub fn folded_key(key: &str) -> String {
    let key = key.trim_end_matches('\0');
    if key.is_ascii() {
        return key.to_ascii_lowercase();
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        let c = if c == '\u{130}' { 'i' } else { c };
        for lower in c.to_lowercase() {
            for upper in lower.to_uppercase() {
                out.extend(upper.to_lowercase());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::folded_key;

    #[test]
    fn ascii_keys_fold_to_lowercase() {
        assert_eq!(folded_key("Name"), "name");
        assert_eq!(folded_key("TOOL_name-1"), "tool_name-1");
        assert_eq!(folded_key(""), "");
    }

    #[test]
    fn trailing_nul_characters_are_dropped_and_no_others() {
        assert_eq!(folded_key("name\0"), "name");
        assert_eq!(folded_key("name\0\0"), "name");
        assert_eq!(folded_key("\0name"), "\0name");
        assert_eq!(folded_key("na\0me"), "na\0me");
        assert_eq!(folded_key("\0"), "");
    }

    #[test]
    fn case_folding_orbits_meet() {
        // Each group is one simple case-folding orbit (CaseFolding.txt) or
        // a simple upper/lowercase equality a case-insensitive reader uses.
        let groups: &[&[&str]] = &[
            &["params", "PARAMS", "param\u{17f}"],
            &["kind", "\u{212a}ind"],
            &["\u{e5}", "\u{c5}", "\u{212b}"],
            &["\u{b5}", "\u{39c}", "\u{3bc}"],
            &["\u{3b8}", "\u{398}", "\u{3d1}", "\u{3f4}"],
            &["\u{3b9}", "\u{399}", "\u{345}", "\u{1fbe}"],
            &["\u{3c3}", "\u{3a3}", "\u{3c2}"],
            &["\u{1c4}", "\u{1c5}", "\u{1c6}"],
            &["\u{df}", "\u{1e9e}"],
            &["\u{390}", "\u{1fd3}"],
            &["\u{fb05}", "\u{fb06}"],
            &["\u{13a0}", "\u{ab70}"],
            &["id", "\u{130}d", "\u{131}d", "ID"],
            &["\u{10400}", "\u{10428}"],
        ];
        for group in groups {
            let first = folded_key(group[0]);
            for key in *group {
                assert_eq!(folded_key(key), first, "{key:?} against {:?}", group[0]);
            }
        }
    }

    #[test]
    fn different_letters_stay_apart() {
        assert_ne!(folded_key("name"), folded_key("nome"));
        // Normalization is not folding: no reader composes characters.
        assert_ne!(folded_key("\u{e9}"), folded_key("e\u{301}"));
        assert_ne!(folded_key("a"), folded_key("\u{430}"));
    }
}
