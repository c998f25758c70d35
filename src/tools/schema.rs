//! JSON Schema: the one way a schema becomes a validator, and validation errors as
//! [`Violation`]s that are safe to hand back to a model.
//!
//! Owns the compile settings (Draft 2020-12 unless `$schema` says otherwise, `format`
//! asserted, Cedar's `decimal` format added, unknown formats refused) and the wording,
//! pointers and order of violations.
//!
//! Must not fetch anything: the crate is built without jsonschema's HTTP and file resolvers and
//! the retriever is set offline, so a `$ref` to anything outside the schema itself (or a
//! registry the caller hands in, which only the conformance tests do) is a compile error.
//! Knows nothing of contract files, Cedar or gRPC.

use std::cmp::Ordering;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{Registry, ValidationError, Validator};
use serde_json::Value;

use super::{decimal, pointer};

/// How a compiled schema treats the `format` keyword.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Formats {
    /// What every contract schema gets: each known format is asserted (an invalid `date-time`
    /// is a violation), `decimal` is added, and a format name nobody checks is a compile
    /// error, so that a typo can never silently switch a check off.
    Asserted,
    /// Draft 2020-12's default, `format` as an annotation. Only the conformance suite uses
    /// it, to show that the settings differ from the specification in `format` alone.
    #[cfg(test)]
    Annotated,
    /// Every known format asserted and unknown names ignored: the setting the suite's
    /// `optional/format` folder assumes ("format assertion on"). Only the conformance suite
    /// uses it; it differs from [`Formats::Asserted`] in unknown names alone.
    #[cfg(test)]
    AssertedIgnoringUnknown,
}

/// Compiles `schema` with the project's settings (see [`Formats`]). `registry` supplies
/// schemas that `$ref` may reach by URI; contracts pass `None`, so only references inside the
/// schema itself resolve.
///
/// # Errors
/// The schema is not valid against its meta-schema (Draft 2020-12 when `$schema` is absent),
/// a `$ref` does not resolve, a regular expression does not compile, or (with
/// [`Formats::Asserted`]) a `format` is unknown.
pub(crate) fn compile_schema(
    schema: &Value,
    formats: Formats,
    registry: Option<&Registry<'_>>,
) -> Result<Validator, Box<ValidationError<'static>>> {
    let mut options = jsonschema::options()
        .offline()
        .with_format("decimal", decimal::is_literal);
    options = match formats {
        Formats::Asserted => options
            .should_validate_formats(true)
            .should_ignore_unknown_formats(false),
        #[cfg(test)]
        Formats::Annotated => options,
        #[cfg(test)]
        Formats::AssertedIgnoringUnknown => options
            .should_validate_formats(true)
            .should_ignore_unknown_formats(true),
    };
    if let Some(registry) = registry {
        options = options.with_registry(registry);
    }
    options.build(schema).map_err(Box::new)
}

/// Where in the schema document a compile error is, as a JSON pointer ("" when unknown).
///
/// A meta-schema violation reports the offending part of the schema as its *instance*; an
/// error raised while compiling a keyword (an unknown format, a bad regex) reports it as the
/// *schema path*.
pub(crate) fn error_pointer(error: &ValidationError<'_>) -> String {
    match error.kind() {
        ValidationErrorKind::Custom { .. } => error.schema_path().as_str().to_owned(),
        ValidationErrorKind::Referencing(_) => String::new(),
        _ => error.instance_path().as_str().to_owned(),
    }
}

/// The name of the format a compile error refuses as unknown, if that is what it is.
pub(crate) fn unknown_format(error: &ValidationError<'_>) -> Option<String> {
    // jsonschema has no error kind for this; the message is locked by a test below.
    let ValidationErrorKind::Custom { message, .. } = error.kind() else {
        return None;
    };
    let rest = message.strip_prefix("Unknown format: '")?;
    rest.split_once("'.").map(|(name, _)| name.to_owned())
}

/// One way the arguments (or a result) fail their schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// JSON pointer into the instance (`""` for the root).
    pub pointer: String,
    /// The JSON Schema keyword that failed (`required`, `type`, `format`, …; `falseSchema`
    /// for a `false` subschema; `schema` in the never-expected case that the validator
    /// rejects the instance without saying why).
    pub keyword: String,
    /// Lowercase English. Never quotes the instance's values; property names it quotes are
    /// cut at [`QUOTE_LIMIT`] characters and JSON-escaped.
    pub message: String,
}

/// Longest piece of model-supplied text (a property name) a violation message quotes.
pub const QUOTE_LIMIT: usize = 64;

/// Longest piece of schema text (a pattern, an enum list) a violation message quotes.
const SCHEMA_QUOTE_LIMIT: usize = 128;

/// Every violation of `instance` against `validator`, at most `cap` of them (at least one:
/// a cap of 0 must never make an invalid instance look valid).
///
/// Order is document order of the instance (a parent before its children, object members in
/// key order, array elements by index); violations at the same place keep the validator's
/// order. The cap keeps the first ones in that order and memory bounded by `cap`.
pub(crate) fn violations(validator: &Validator, instance: &Value, cap: usize) -> Vec<Violation> {
    if validator.is_valid(instance) {
        return Vec::new();
    }
    let cap = cap.max(1);
    let mut kept: Vec<Violation> = Vec::with_capacity(cap.min(32));
    for error in validator.iter_errors(instance) {
        let pointer = error.instance_path().as_str();
        let at = kept.partition_point(|violation| {
            document_order(instance, &violation.pointer, pointer) != Ordering::Greater
        });
        if at < cap {
            kept.insert(
                at,
                Violation {
                    pointer: pointer.to_owned(),
                    keyword: error.kind().keyword().to_owned(),
                    message: message(&error),
                },
            );
            kept.truncate(cap);
        }
    }
    if kept.is_empty() {
        // INVARIANT: an instance `is_valid` rejects is never reported as valid, even if the
        // error iterator disagrees (fail closed).
        kept.push(Violation {
            pointer: String::new(),
            keyword: "schema".to_owned(),
            message: "value does not match the schema".to_owned(),
        });
    }
    kept
}

/// Compares two pointers into `instance` by document order.
fn document_order(instance: &Value, left: &str, right: &str) -> Ordering {
    let mut node = Some(instance);
    let mut left = pointer::segments(left);
    let mut right = pointer::segments(right);
    loop {
        match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(l), Some(r)) if l == r => {
                node = node.and_then(|value| match value {
                    Value::Object(map) => map.get(&l),
                    Value::Array(items) => l.parse::<usize>().ok().and_then(|i| items.get(i)),
                    _ => None,
                });
            }
            (Some(l), Some(r)) => {
                if let Some(Value::Array(_)) = node
                    && let (Ok(l), Ok(r)) = (l.parse::<usize>(), r.parse::<usize>())
                {
                    return l.cmp(&r);
                }
                // `serde_json::Map` iterates keys in this (byte) order.
                return l.cmp(&r);
            }
        }
    }
}

fn message(error: &ValidationError<'_>) -> String {
    describe(error.kind(), error.instance())
}

fn describe(kind: &ValidationErrorKind, instance: &Value) -> String {
    use ValidationErrorKind as K;
    match kind {
        K::AdditionalItems { limit } => format!("at most {limit} items are allowed"),
        K::AdditionalProperties { unexpected } => {
            format!("{} not allowed", property_list(unexpected))
        }
        K::AnyOf { .. } => "value does not match any of the `anyOf` schemas".to_owned(),
        K::OneOfNotValid { .. } => "value does not match any of the `oneOf` schemas".to_owned(),
        K::OneOfMultipleValid { .. } => {
            "value matches more than one of the `oneOf` schemas".to_owned()
        }
        K::BacktrackLimitExceeded { .. } => {
            "string could not be checked against `pattern` within its backtracking limit".to_owned()
        }
        K::RegexEngineFailure { .. } => "string could not be checked against `pattern`".to_owned(),
        K::Pattern { pattern } => {
            format!(
                "string does not match the pattern {}",
                schema_quote(pattern)
            )
        }
        K::Constant { expected_value } => format!("value must be {}", schema_json(expected_value)),
        K::Contains => "array has no item matching `contains`".to_owned(),
        K::ContentEncoding { content_encoding } => {
            format!("string is not valid {}", schema_quote(content_encoding))
        }
        K::FromUtf8 { .. } => "decoded string is not valid UTF-8".to_owned(),
        K::ContentMediaType { content_media_type } => {
            format!("string is not valid {}", schema_quote(content_media_type))
        }
        K::Custom { .. } => "value is not valid".to_owned(),
        K::Enum { options } => format!("value must be one of {}", schema_json(options)),
        K::ExclusiveMaximum { limit } => format!("number must be less than {limit}"),
        K::ExclusiveMinimum { limit } => format!("number must be greater than {limit}"),
        K::Maximum { limit } => format!("number must be at most {limit}"),
        K::Minimum { limit } => format!("number must be at least {limit}"),
        K::MultipleOf { multiple_of } => format!("number must be a multiple of {multiple_of}"),
        K::FalseSchema => "no value is allowed here".to_owned(),
        K::Format { format } => format!("string is not a valid {}", schema_quote(format)),
        K::MaxItems { limit } => format!("array must have at most {limit} items"),
        K::MinItems { limit } => format!("array must have at least {limit} items"),
        K::MaxLength { limit } => format!("string must be at most {limit} characters long"),
        K::MinLength { limit } => format!("string must be at least {limit} characters long"),
        K::MaxProperties { limit } => format!("object must have at most {limit} properties"),
        K::MinProperties { limit } => format!("object must have at least {limit} properties"),
        K::Not { .. } => "value must not match the `not` schema".to_owned(),
        K::PropertyNames { error } => {
            format!(
                "property name is invalid: {}",
                describe(error.kind(), error.instance())
            )
        }
        K::Required { property } => match property {
            Value::String(name) => format!("required property {} is missing", quote(name)),
            other => format!("required property {} is missing", schema_json(other)),
        },
        K::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(single) => single.as_str().to_owned(),
                TypeKind::Multiple(set) => set
                    .iter()
                    .map(|single| single.as_str())
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            format!("expected {expected}, found {}", json_type(instance))
        }
        K::UnevaluatedItems { .. } => "unevaluated items are not allowed".to_owned(),
        K::UnevaluatedProperties { unexpected } => {
            format!("{} not allowed (unevaluated)", property_list(unexpected))
        }
        K::UniqueItems => "array items must be unique".to_owned(),
        K::Referencing(_) => "schema reference could not be resolved".to_owned(),
    }
}

/// `property "a" is` / `properties "a", "b" and 3 more are`.
fn property_list(names: &[String]) -> String {
    const SHOWN: usize = 3;
    let quoted: Vec<String> = names.iter().take(SHOWN).map(|name| quote(name)).collect();
    let more = names.len().saturating_sub(SHOWN);
    match (names.len(), more) {
        (1, _) => format!("property {} is", quoted.join(", ")),
        (_, 0) => format!("properties {} are", quoted.join(", ")),
        _ => format!("properties {} and {more} more are", quoted.join(", ")),
    }
}

/// Model-supplied text, cut at [`QUOTE_LIMIT`] characters and JSON-escaped.
fn quote(text: &str) -> String {
    quote_limited(text, QUOTE_LIMIT)
}

/// Schema-supplied text, cut at `SCHEMA_QUOTE_LIMIT` characters and JSON-escaped.
fn schema_quote(text: &str) -> String {
    quote_limited(text, SCHEMA_QUOTE_LIMIT)
}

/// A schema value as JSON text, cut at `SCHEMA_QUOTE_LIMIT` characters.
fn schema_json(value: &Value) -> String {
    let (cut, ellipsis) = cut(&value.to_string(), SCHEMA_QUOTE_LIMIT);
    format!("{cut}{ellipsis}")
}

fn quote_limited(text: &str, limit: usize) -> String {
    let (cut, ellipsis) = cut(text, limit);
    format!("{}{ellipsis}", Value::String(cut))
}

/// The first `limit` characters of `text`, and `"…"` if that is not all of it.
fn cut(text: &str, limit: usize) -> (String, &'static str) {
    let cut: String = text.chars().take(limit).collect();
    let ellipsis = if cut.len() < text.len() { "…" } else { "" };
    (cut, ellipsis)
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(number) if number.is_i64() || number.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile(schema: Value) -> Validator {
        compile_schema(&schema, Formats::Asserted, None).unwrap()
    }

    fn triples(violations: &[Violation]) -> Vec<(&str, &str, &str)> {
        violations
            .iter()
            .map(|v| (v.pointer.as_str(), v.keyword.as_str(), v.message.as_str()))
            .collect()
    }

    #[test]
    fn formats_are_asserted_including_decimal() {
        let validator = compile(json!({
            "type": "object",
            "properties": {
                "at": {"type": "string", "format": "date-time"},
                "amount": {"type": "string", "format": "decimal"},
                "ip": {"type": "string", "format": "ipv4"}
            }
        }));
        let args = json!({"at": "yesterday", "amount": "1.23456", "ip": "10.0.0.1"});
        assert_eq!(
            triples(&violations(&validator, &args, 20)),
            [
                ("/amount", "format", r#"string is not a valid "decimal""#),
                ("/at", "format", r#"string is not a valid "date-time""#),
            ]
        );
        let ok = json!({"at": "2024-01-01T10:00:00Z", "amount": "-12.5", "ip": "10.0.0.1"});
        assert_eq!(violations(&validator, &ok, 20), []);
    }

    #[test]
    fn unknown_formats_do_not_compile() {
        let error = compile_schema(
            &json!({"type": "object", "properties": {"a": {"type": "string", "format": "date-tme"}}}),
            Formats::Asserted,
            None,
        )
        .unwrap_err();
        assert_eq!(unknown_format(&error).as_deref(), Some("date-tme"));
        assert_eq!(error_pointer(&error), "/properties/a/format");
    }

    #[test]
    fn nothing_is_fetched() {
        for schema in [
            json!({"$ref": "https://example.com/schema.json"}),
            json!({"$ref": "file:///etc/passwd"}),
            json!({"$ref": "#/$defs/missing"}),
            json!({"$schema": "https://example.com/custom-meta", "type": "object"}),
        ] {
            let error = compile_schema(&schema, Formats::Asserted, None).unwrap_err();
            assert!(
                matches!(error.kind(), ValidationErrorKind::Referencing(_)),
                "{schema}: {error:?}"
            );
        }
    }

    #[test]
    fn meta_schema_errors_point_into_the_schema() {
        let error = compile_schema(
            &json!({"type": "object", "properties": {"a": {"type": "strin"}}}),
            Formats::Asserted,
            None,
        )
        .unwrap_err();
        assert_eq!(error_pointer(&error), "/properties/a/type");
        assert_eq!(unknown_format(&error), None);
    }

    #[test]
    fn violations_in_document_order_capped() {
        let validator = compile(json!({
            "type": "object",
            "required": ["z", "a"],
            "properties": {
                "list": {"type": "array", "items": {"type": "integer"}},
                "b": {"type": "string"}
            },
            "additionalProperties": false
        }));
        let args = json!({"list": ["x", 1, "y", 2, 3, 4, 5, 6, 7, 8, 9, "z"], "b": 5, "extra": 1});
        let all = violations(&validator, &args, 100);
        assert_eq!(
            triples(&all),
            [
                ("", "required", r#"required property "z" is missing"#),
                ("", "required", r#"required property "a" is missing"#),
                (
                    "",
                    "additionalProperties",
                    r#"property "extra" is not allowed"#
                ),
                ("/b", "type", "expected string, found integer"),
                ("/list/0", "type", "expected integer, found string"),
                ("/list/2", "type", "expected integer, found string"),
                ("/list/11", "type", "expected integer, found string"),
            ]
        );
        assert_eq!(violations(&validator, &args, 4), all[..4]);
        assert_eq!(violations(&validator, &args, 0), all[..1]);
    }

    #[test]
    fn messages_do_not_echo_values() {
        let validator = compile(json!({
            "type": "object",
            "properties": {"s": {"type": "string", "maxLength": 3, "pattern": "^a"}},
            "additionalProperties": false
        }));
        let secret = "s3cr3t-".repeat(20);
        let long_key = "k".repeat(100);
        let args = json!({"s": secret.clone(), long_key.clone(): 1, "x\n": 2, "y": 3, "z": 4});
        let found = violations(&validator, &args, 20);
        let expected_key = format!("\"{}\"…", "k".repeat(64));
        assert_eq!(
            triples(&found),
            [
                (
                    "",
                    "additionalProperties",
                    format!(r#"properties {expected_key}, "x\n", "y" and 1 more are not allowed"#)
                        .as_str()
                ),
                (
                    "/s",
                    "maxLength",
                    "string must be at most 3 characters long"
                ),
                ("/s", "pattern", r#"string does not match the pattern "^a""#),
            ]
        );
        assert!(found.iter().all(|v| !v.message.contains("s3cr3t")));
    }
}
