//! The parser differential of issue 29 on arbitrary bytes: whatever
//! toolgate's strict decoder accepts (the first step of every door, the
//! JSON-RPC envelope and the tool arguments alike), a reader that matches
//! keys ignoring case and takes the last one — Go's `encoding/json` (the Go
//! MCP SDKs), .NET's, Jackson's — decides the same method, tool and
//! arguments, and the same value everywhere in the document.
//!
//! The other reader is modelled here, on serde_json's tokenizer (so every
//! member is seen, duplicates included, in order): a struct field is the
//! value of the *last* member whose key folds to the field's name, where
//! folding is Go's `appendFoldedName` (ASCII upper case; any other
//! character `ToUpper(ToLower(c))`), after dropping trailing U+0000 (the key
//! a NUL-terminated reader sees, GHSA-q382-vc8q-7jhj). Nothing may panic.

#![no_main]

use std::fmt;

use libfuzzer_sys::fuzz_target;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use toolgate::decode::{Limits, canonical_json, parse_strict};
use toolgate::ext_authz::{ExtAuthzConfig, HttpRequest, Read, read};

/// A JSON document as a last-wins, case-insensitive reader holds it: every
/// member, in order.
#[derive(Debug)]
enum Loose {
    Scalar(Value),
    Array(Vec<Loose>),
    Object(Vec<(String, Loose)>),
}

impl<'de> Deserialize<'de> for Loose {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LooseVisitor)
    }
}

struct LooseVisitor;

impl<'de> Visitor<'de> for LooseVisitor {
    type Value = Loose;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Loose, E> {
        Ok(Loose::Scalar(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Loose, E> {
        Ok(Loose::Scalar(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Loose, E> {
        Ok(Loose::Scalar(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Loose, E> {
        Ok(Loose::Scalar(Value::from(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Loose, E> {
        Ok(Loose::Scalar(Value::String(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Loose, E> {
        Ok(Loose::Scalar(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Loose, E> {
        Ok(Loose::Scalar(Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Loose, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Loose::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Loose, A::Error> {
        let mut members = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Loose>()? {
            members.push((k, v));
        }
        Ok(Loose::Object(members))
    }
}

/// Go's `encoding/json` key folding (`appendFoldedName`, Go 1.21 and
/// later), after the trailing NULs a C-string reader never sees.
fn go_fold(key: &str) -> String {
    key.trim_end_matches('\0')
        .chars()
        .map(|c| {
            if c.is_ascii() {
                c.to_ascii_uppercase()
            } else {
                // Go's unicode.ToLower / ToUpper map one rune to one rune;
                // Rust's may give several (ß → SS): Go keeps such a rune.
                let lower = single(c.to_lowercase()).unwrap_or(c);
                single(lower.to_uppercase()).unwrap_or(lower)
            }
        })
        .collect()
}

fn single(mut it: impl Iterator<Item = char>) -> Option<char> {
    match (it.next(), it.next()) {
        (Some(c), None) => Some(c),
        _ => None,
    }
}

/// The value a case-insensitive, last-wins reader gives field `name`.
fn field<'a>(members: &'a [(String, Loose)], name: &str) -> Option<&'a Loose> {
    let want = go_fold(name);
    members
        .iter()
        .rev()
        .find(|(k, _)| go_fold(k) == want)
        .map(|(_, v)| v)
}

/// Whether the other reader reads `loose` as `strict`, everywhere: each of
/// strict's members is the value the other reader gives its name, and the
/// other reader sees no member that is not one of them.
fn agrees(strict: &Value, loose: &Loose) -> bool {
    match (strict, loose) {
        (Value::Object(map), Loose::Object(members)) => {
            let mut names: Vec<String> = members.iter().map(|(k, _)| go_fold(k)).collect();
            names.sort();
            names.dedup();
            names.len() == map.len()
                && map
                    .iter()
                    .all(|(k, v)| field(members, k).is_some_and(|l| agrees(v, l)))
        }
        (Value::Array(items), Loose::Array(loose)) => {
            items.len() == loose.len() && items.iter().zip(loose).all(|(v, l)| agrees(v, l))
        }
        // Numbers by their canonical text: `-0` and `0`, `1E2` and `100`
        // are one value to toolgate's hash and to every reader.
        (Value::Number(_), Loose::Scalar(l @ Value::Number(_))) => {
            canonical_json(strict).ok() == canonical_json(l).ok()
        }
        (v, Loose::Scalar(l)) => v == l,
        _ => false,
    }
}

/// Member `name` of an object, as the other reader finds it.
fn member<'a>(doc: Option<&'a Loose>, name: &str) -> Option<&'a Loose> {
    match doc {
        Some(Loose::Object(members)) => field(members, name),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let Ok(strict) = parse_strict(data, &limits) else {
        return;
    };
    // serde_json reads all that the strict decoder accepts (which is
    // stricter: lone surrogates, duplicates, number range, and 64 levels
    // deep at most, inside serde_json's 128).
    let mut de = serde_json::Deserializer::from_slice(data);
    let loose = Loose::deserialize(&mut de).expect("serde_json reads what toolgate accepted");
    de.end().expect("one document");
    // What the ext_authz door makes of the body: refused, passed (not a
    // tools/call), or one tools/call of a tool with arguments.
    let request = HttpRequest {
        method: "POST".into(),
        path: "/mcp".into(),
        headers: Vec::new(),
        body: data.to_vec(),
        partial: false,
    };
    let method = member(Some(&loose), "method");
    let params = member(Some(&loose), "params");
    match read(&request, &ExtAuthzConfig::default(), &limits) {
        Err(_) => return,
        // What passes unchecked is no tools/call to the other reader.
        Ok(Read::Pass) => assert!(
            !matches!(method, Some(Loose::Scalar(Value::String(m))) if m == "tools/call"),
            "a tools/call passed unchecked"
        ),
        // What is decided is the call the other reader runs.
        Ok(Read::ToolCall(call)) => {
            assert!(
                matches!(method, Some(Loose::Scalar(Value::String(m))) if m == "tools/call"),
                "the method differs"
            );
            assert!(
                matches!(member(params, "name"), Some(Loose::Scalar(Value::String(n))) if *n == call.tool),
                "the tool differs"
            );
            let decided = parse_strict(&call.arguments, &limits).expect("the decided arguments");
            // `null` arguments are none, to toolgate and to Go (a nil map).
            let run =
                member(params, "arguments").filter(|a| !matches!(a, Loose::Scalar(Value::Null)));
            let empty = Loose::Object(Vec::new());
            assert!(
                agrees(&decided, run.unwrap_or(&empty)),
                "the arguments differ"
            );
        }
    }
    // ...and so is every other value of the document.
    assert!(agrees(&strict, &loose), "the documents differ");
});
