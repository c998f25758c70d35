//! The strict decoder's unit tests: grammar, strings, numbers, duplicate
//! keys, limits and messages, by exact error and position.

use serde_json::Value;

use super::{DecodeError, Limits, parse_strict};
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
