//! Properties of decoding plus canonicalization: every spelling of one JSON
//! document has one canonical text and hash, and the canonical text is a fixed
//! point. Documents are generated as a tree, then written out with random key
//! order, string escapes, number spellings and whitespace.

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::{Limits, canonical_json, folded_key, idempotency_key, parse_strict, sha256_hex};

const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

#[derive(Debug, Clone)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Array(Vec<Node>),
    /// Keys unique under case folding; the writer chooses the order.
    Object(Vec<(String, Node)>),
}

impl Node {
    /// The value the tree stands for, built without any parser.
    fn to_value(&self) -> Value {
        match self {
            Self::Null => Value::Null,
            Self::Bool(b) => Value::Bool(*b),
            Self::Int(i) => Value::from(*i),
            Self::Float(f) => Value::from(*f),
            Self::Str(s) => Value::from(s.as_str()),
            Self::Array(items) => Value::Array(items.iter().map(Self::to_value).collect()),
            Self::Object(members) => Value::Object(
                members
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value()))
                    .collect::<Map<_, _>>(),
            ),
        }
    }
}

/// Strings biased towards what needs escaping or sorts differently in UTF-16.
fn text() -> impl Strategy<Value = String> {
    let tricky = prop::sample::select(vec![
        '"',
        '\\',
        '/',
        '\u{0}',
        '\u{8}',
        '\u{1f}',
        '\u{7f}',
        '\u{e9}',
        '\u{2028}',
        '\u{fb01}',
        '\u{fffe}',
        '\u{1f600}',
        '\u{10ffff}',
    ]);
    prop::collection::vec(prop_oneof![any::<char>(), tricky], 0..8)
        .prop_map(|chars| chars.into_iter().collect())
}

/// Finite doubles the decoder accepts: the magnitudes in `[2^53, 1e21)` are out
/// of range by rule (their canonical text is an unsafe integer), tested apart.
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("in range", |f| {
            f.is_finite() && !(9_007_199_254_740_992.0..1e21).contains(&f.abs())
        }),
        // Short decimals, where shortest-digit formatting matters most.
        (-100_000_i32..100_000, 0_i32..8).prop_map(|(m, e)| f64::from(m) / 10_f64.powi(e)),
    ]
}

fn node() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![
        Just(Node::Null),
        any::<bool>().prop_map(Node::Bool),
        (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).prop_map(Node::Int),
        float().prop_map(Node::Float),
        text().prop_map(Node::Str),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Node::Array),
            object_of(inner),
        ]
    })
}

fn object_of(inner: impl Strategy<Value = Node>) -> impl Strategy<Value = Node> {
    prop::collection::btree_map(text(), inner, 0..6).prop_map(|members| {
        // Keys equal under case folding are duplicates (DESIGN §2.1): an
        // object of valid JSON keeps the first of each.
        let mut seen = std::collections::HashSet::new();
        Node::Object(
            members
                .into_iter()
                .filter(|(key, _)| seen.insert(folded_key(key)))
                .collect(),
        )
    })
}

/// Deterministic choices for the writer (SplitMix64), so one seed is one spelling.
struct Choices(u64);

impl Choices {
    fn pick(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        usize::try_from((z ^ (z >> 31)) % n as u64).unwrap()
    }

    fn whitespace(&mut self, out: &mut String) {
        out.push_str(["", "", " ", "\n", "\t", "\r\n  "][self.pick(6)]);
    }

    fn unicode_escape(&mut self, out: &mut String, unit: u16) {
        if self.pick(2) == 0 {
            out.push_str(&format!("\\u{unit:04x}"));
        } else {
            out.push_str(&format!("\\u{unit:04X}"));
        }
    }

    fn string(&mut self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '/' => Some("\\/"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                _ => None,
            };
            let must_escape = matches!(c, '"' | '\\' | '\u{0}'..='\u{1f}');
            match self.pick(3) {
                0 if !must_escape => out.push(c),
                1 if short.is_some() => out.push_str(short.unwrap()),
                _ => {
                    let mut units = [0; 2];
                    for unit in c.encode_utf16(&mut units) {
                        self.unicode_escape(out, *unit);
                    }
                }
            }
        }
        out.push('"');
    }

    fn write(&mut self, out: &mut String, node: &Node) {
        match node {
            Node::Null => out.push_str("null"),
            Node::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Node::Int(i) => {
                let spelling = ["", ".0", "e0", "E+0", ".000e-0"][self.pick(5)];
                out.push_str(&format!("{i}{spelling}"));
            }
            Node::Float(f) => {
                let spelling = match self.pick(4) {
                    0 => format!("{f:e}"),
                    1 => format!("{f:E}"),
                    2 => format!("{f:?}"),
                    // Display never uses an exponent; a fraction keeps it a
                    // double literal rather than an (over-large) integer one.
                    _ => {
                        let plain = format!("{f}");
                        if plain.contains('.') {
                            plain
                        } else {
                            plain + ".0"
                        }
                    }
                };
                out.push_str(&spelling);
            }
            Node::Str(s) => self.string(out, s),
            Node::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.whitespace(out);
                    self.write(out, item);
                    self.whitespace(out);
                }
                out.push(']');
            }
            Node::Object(members) => {
                let mut order: Vec<&(String, Node)> = members.iter().collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, self.pick(i + 1));
                }
                out.push('{');
                for (i, (key, value)) in order.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.whitespace(out);
                    self.string(out, key);
                    self.whitespace(out);
                    out.push(':');
                    self.whitespace(out);
                    self.write(out, value);
                    self.whitespace(out);
                }
                out.push('}');
            }
        }
    }
}

fn spell(node: &Node, seed: u64) -> String {
    let mut out = String::new();
    let mut choices = Choices(seed);
    choices.whitespace(&mut out);
    choices.write(&mut out, node);
    choices.whitespace(&mut out);
    out
}

/// JSON equality, with numbers compared as the doubles JCS sees them.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn canonical_of(text: &str) -> String {
    let value = parse_strict(text.as_bytes(), &Limits::default())
        .unwrap_or_else(|e| panic!("{e} in {text:?}"));
    canonical_json(&value).unwrap()
}

proptest! {
    #[test]
    fn every_spelling_has_one_canonical_form(
        document in object_of(node()),
        seeds in prop::array::uniform3(any::<u64>()),
    ) {
        let expected = canonical_json(&document.to_value()).unwrap();
        for seed in seeds {
            let text = spell(&document, seed);
            let canonical = canonical_of(&text);
            prop_assert_eq!(&canonical, &expected, "spelling {:?}", text);
            prop_assert_eq!(sha256_hex(canonical.as_bytes()), sha256_hex(expected.as_bytes()));
        }
    }

    #[test]
    fn canonical_form_is_a_fixed_point(document in object_of(node()), seed in any::<u64>()) {
        let canonical = canonical_of(&spell(&document, seed));
        let reparsed = parse_strict(canonical.as_bytes(), &Limits::default()).unwrap();
        prop_assert!(same_json(&reparsed, &document.to_value()), "{}", canonical);
        prop_assert_eq!(canonical_json(&reparsed).unwrap(), canonical);
    }

    /// The number rules and ECMAScript formatting agree: a double is either out
    /// of range, or its canonical text decodes back to exactly that double.
    #[test]
    fn accepted_doubles_survive_their_canonical_form(
        f in any::<f64>().prop_filter("finite", |f| f.is_finite()),
        exponent in any::<bool>(),
    ) {
        let text = if exponent { format!("{f:e}") } else { format!("{f:?}") };
        match parse_strict(text.as_bytes(), &Limits::default()) {
            Ok(value) => {
                let canonical = canonical_json(&value).unwrap();
                let again = parse_strict(canonical.as_bytes(), &Limits::default()).unwrap();
                prop_assert_eq!(again.as_f64(), Some(f), "{} -> {}", text, canonical);
                prop_assert_eq!(canonical_json(&again).unwrap(), canonical);
            }
            Err(e) => {
                let unsafe_integer = (9_007_199_254_740_992.0..1e21).contains(&f.abs());
                prop_assert_eq!((e.reason(), unsafe_integer), ("number_out_of_range", true), "{}", text);
            }
        }
    }

    /// Our RFC 8785 writer and the reference implementation
    /// (`serde_json_canonicalizer`) agree byte for byte.
    #[test]
    fn canonical_form_is_the_reference_implementations(
        document in node(),
        top in object_of(node()),
    ) {
        for value in [document.to_value(), top.to_value()] {
            let reference = serde_json_canonicalizer::to_string(&value).unwrap();
            prop_assert_eq!(canonical_json(&value).unwrap(), reference);
        }
    }

    /// The idempotency key's envelope, built from the canonical arguments,
    /// is the canonical form of the whole envelope object.
    #[test]
    fn the_idempotency_key_hashes_the_canonical_envelope(
        arguments in object_of(node()),
        fields in prop::array::uniform4(text()),
    ) {
        let [tool, request, subject, tenant] = fields;
        let arguments = arguments.to_value();
        let envelope = serde_json::json!({
            "arguments": arguments, "request_id": request, "subject_id": subject,
            "tenant_id": tenant, "tool_name": tool,
        });
        let reference = serde_json_canonicalizer::to_string(&envelope).unwrap();
        let key = idempotency_key(
            &tool, &request, &subject, &tenant, &canonical_json(&arguments).unwrap(),
        );
        prop_assert_eq!(key, format!("{tool}:{}", sha256_hex(reference.as_bytes())));
    }

    /// Strictness only ever removes: what we accept, serde_json accepts with
    /// the same meaning.
    #[test]
    fn accepted_input_means_what_serde_json_says(
        tokens in prop::collection::vec(prop::sample::select(vec![
            "{", "}", "[", "]", ",", ":", " ", "\"a\"", "\"\\u0061\"", "\"\\ud83d\\ude00\"",
            "\"\\ud800\"", "1", "-0", "0.5e-3", "1e400", "9007199254740993", "true", "nul",
        ]), 0..14),
    ) {
        let text = tokens.concat();
        let ours = parse_strict(text.as_bytes(), &Limits::default());
        let theirs = serde_json::from_str::<Value>(&text);
        if let Ok(value) = &ours {
            let reference = theirs.as_ref().map_err(ToString::to_string);
            prop_assert!(
                reference.is_ok_and(|r| same_json(value, r)),
                "{:?}: {:?} vs {:?}", text, value, theirs
            );
        }
        if theirs.is_err() {
            prop_assert!(ours.is_err(), "{:?} accepted", text);
        }
    }
}
