//! Cedar's `decimal`: its literal syntax and its range.
//!
//! Owns the one definition used by the `decimal` string format (a load-time check of argument
//! values) and by the projection of JSON numbers into Cedar. Must not round: a value either is
//! exactly a Cedar decimal or it is not one.

/// Cedar decimals have exactly this many fraction digits of precision.
const FRACTION_DIGITS: usize = 4;

/// Whether `text` is a Cedar decimal literal: `-?[0-9]+\.[0-9]{1,4}` whose value, scaled by
/// 10^4, fits an `i64` (−922337203685477.5808 ..= 922337203685477.5807).
pub(crate) fn is_literal(text: &str) -> bool {
    let (negative, body) = split_sign(text);
    let Some((int, frac)) = body.split_once('.') else {
        return false;
    };
    is_digits(int)
        && is_digits(frac)
        && frac.len() <= FRACTION_DIGITS
        && scaled(negative, int, frac).is_some()
}

/// The Cedar decimal literal that denotes exactly `number`, or `None` when there is none
/// (more than four fraction digits once trailing zeros are trimmed, or out of range).
///
/// `12` becomes `"12.0"`, `12.50` becomes `"12.5"`, `-0.0` becomes `"0.0"`.
pub(crate) fn from_number(number: &serde_json::Number) -> Option<String> {
    let text = if let Some(int) = number.as_i64() {
        int.to_string()
    } else if let Some(int) = number.as_u64() {
        int.to_string()
    } else {
        let float = number.as_f64().filter(|float| float.is_finite())?;
        // INVARIANT: `Display` for `f64` prints the shortest digits that round-trip, and never
        // in exponent notation, so `text` is `-?[0-9]+(\.[0-9]+)?`.
        float.to_string()
    };
    let (negative, body) = split_sign(&text);
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let frac = frac.trim_end_matches('0');
    if !is_digits(int) || frac.len() > FRACTION_DIGITS {
        return None;
    }
    let frac = if frac.is_empty() { "0" } else { frac };
    let value = scaled(negative, int, frac)?;
    let sign = if value < 0 { "-" } else { "" };
    Some(format!("{sign}{int}.{frac}"))
}

fn split_sign(text: &str) -> (bool, &str) {
    text.strip_prefix('-')
        .map_or((false, text), |rest| (true, rest))
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit())
}

/// `int.frac` (ASCII digits, at most four of them in `frac`) times 10^4, if it fits an `i64`.
fn scaled(negative: bool, int: &str, frac: &str) -> Option<i64> {
    let padding = std::iter::repeat_n(b'0', FRACTION_DIGITS.saturating_sub(frac.len()));
    let limit = i128::from(i64::MAX) + 1;
    let mut magnitude: i128 = 0;
    for digit in int.bytes().chain(frac.bytes()).chain(padding) {
        magnitude = magnitude * 10 + i128::from(digit - b'0');
        // Checked on every digit so that no input, however long, can overflow the i128.
        if magnitude > limit {
            return None;
        }
    }
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literals() {
        for ok in [
            "0.0",
            "-0.0",
            "12.5",
            "007.1234",
            "922337203685477.5807",
            "-922337203685477.5808",
        ] {
            assert!(is_literal(ok), "{ok:?}");
        }
        for bad in [
            "",
            "1",
            "1.",
            ".5",
            "+1.0",
            "1.23456",
            "1e3",
            " 1.0",
            "1.0 ",
            "922337203685477.5808",
            "-922337203685477.5809",
            "99999999999999999999999999999999999999999999.0",
            "--1.0",
            "1.-0",
        ] {
            assert!(!is_literal(bad), "{bad:?}");
        }
    }

    fn number(value: serde_json::Value) -> serde_json::Number {
        match value {
            serde_json::Value::Number(number) => number,
            other => panic!("not a number: {other}"),
        }
    }

    #[test]
    fn numbers() {
        let cases = [
            (json!(12), Some("12.0")),
            (json!(12.5), Some("12.5")),
            (json!(12.50), Some("12.5")),
            (json!(-0.0), Some("0.0")),
            (json!(-1.25), Some("-1.25")),
            (json!(0.0001), Some("0.0001")),
            (json!(0.00001), None),
            (json!(1.23456), None),
            (json!(1e-7), None),
            (json!(1e14), Some("100000000000000.0")),
            (json!(1e15), None),
            (json!(922_337_203_685_477_i64), Some("922337203685477.0")),
            (json!(922_337_203_685_478_i64), None),
            (json!(-922_337_203_685_477_i64), Some("-922337203685477.0")),
            (json!(u64::MAX), None),
            (json!(1e300), None),
        ];
        for (input, expected) in cases {
            assert_eq!(
                from_number(&number(input.clone())).as_deref(),
                expected,
                "{input}"
            );
        }
    }
}
