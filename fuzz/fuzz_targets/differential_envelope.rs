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
        (v, Loose::Scalar(l)) => v == l,
        _ => false,
    }
}

/// The decision's inputs as the other reader finds them: the method, the
/// tool and the arguments.
fn reading(doc: &Loose) -> (Option<&Value>, Option<&Value>, Option<&Loose>) {
    let Loose::Object(top) = doc else {
        return (None, None, None);
    };
    let method = match field(top, "method") {
        Some(Loose::Scalar(v)) => Some(v),
        _ => None,
    };
    let Some(Loose::Object(params)) = field(top, "params") else {
        return (method, None, None);
    };
    let name = match field(params, "name") {
        Some(Loose::Scalar(v)) => Some(v),
        _ => None,
    };
    (method, name, field(params, "arguments"))
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
    // The method, the tool and the arguments toolgate decides on are the
    // ones the other reader runs...
    let (method, name, arguments) = reading(&loose);
    assert_eq!(method, strict.get("method"), "the method differs");
    let params = strict.get("params");
    assert_eq!(name, params.and_then(|p| p.get("name")), "the tool differs");
    if let Some(args) = params.and_then(|p| p.get("arguments")) {
        let l = arguments.expect("the other reader finds the arguments");
        assert!(agrees(args, l), "the arguments differ");
        canonical_json(args).expect("accepted arguments have a canonical form");
    }
    // ...and so is every other value of the document.
    assert!(agrees(&strict, &loose), "the documents differ");
});
