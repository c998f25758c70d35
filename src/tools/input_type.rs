//! The type of a tool's arguments as Cedar sees them (`context.input`), and the arguments
//! projected into Cedar's JSON value format.
//!
//! Owns the mapping from JSON Schema to a Cedar-neutral type tree (table in the module docs
//! of [`crate::tools`]) and the projection of schema-valid arguments onto it. Must not import
//! `cedar_policy`: the policy layer renders [`InputType`] as Cedar schema text and feeds the
//! projected JSON to Cedar. Must not round: a value Cedar cannot represent exactly is a
//! [`ProjectionError`], never an approximation a policy could be fooled by.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

use super::{decimal, pointer};

/// A Cedar-neutral type: what a policy may assume about a value in `context.input`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputType {
    /// A record of the fields whose schemas map, sorted by name.
    Record(Vec<InputField>),
    /// Cedar `String`.
    String,
    /// Cedar `Long`.
    Long,
    /// Cedar `Bool`.
    Bool,
    /// Cedar `decimal` (four fraction digits).
    Decimal,
    /// Cedar `datetime`.
    Datetime,
    /// Cedar `ipaddr`.
    IpAddr,
    /// Cedar `Set` of the element type.
    Set(Box<InputType>),
}

/// One attribute of a [`InputType::Record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputField {
    /// The property name, exactly as in the schema.
    pub name: String,
    /// Whether every valid value has this field: listed in `required` and not nullable.
    pub required: bool,
    /// The field's type.
    pub ty: InputType,
}

/// Property names Cedar's JSON format reserves for escapes (`{"__extn": …}` is an extension
/// value, not a record); a record field of that name would be misread, so it is not mapped.
const CEDAR_RESERVED_KEYS: [&str; 3] = ["__entity", "__extn", "__expr"];

impl InputType {
    /// The type of every value valid against `schema` (assumed to compile), or `None` when
    /// the schema does not map; the parent record then omits the property, so a policy
    /// cannot mention it. See the table in [`crate::tools`].
    #[must_use]
    pub fn from_schema(schema: &Value) -> Option<InputType> {
        derive(schema).map(|(ty, _nullable)| ty)
    }

    /// `value` (valid against the schema this type came from) in Cedar's JSON value format:
    /// strings, longs and booleans as they are; decimals, datetimes and IP addresses as
    /// `{"__extn": {"fn": …, "arg": …}}`; sets as arrays; records as objects holding only
    /// the fields of the type (unmapped properties dropped, absent optional fields and `null`
    /// values omitted).
    ///
    /// Normalizations: a JSON number becomes the decimal literal denoting it exactly
    /// (`12.5` → `"12.5"`, `12` → `"12.0"`); a date-time becomes UTC with milliseconds
    /// (`2024-01-01T10:00:00+02:00` → `2024-01-01T08:00:00.000Z`, extra digits truncated);
    /// an IPv6 address is written without an embedded IPv4 part.
    ///
    /// # Errors
    /// [`ProjectionError`] with the JSON pointer of the value: a number with more than four
    /// fraction digits or outside the decimal or long range, a date-time Cedar cannot hold
    /// (a leap second, a year outside 0000–9999 after conversion to UTC), an address Cedar
    /// cannot hold, or a value that does not have this type at all (it was not validated).
    pub fn project(&self, value: &Value) -> Result<Value, ProjectionError> {
        project(self, value, &mut String::new())
    }
}

/// Why a value could not be given to Cedar. Each variant has a stable
/// [`reason`](ProjectionError::reason) for the envelope's `details`; messages name the
/// pointer, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
pub enum ProjectionError {
    /// A number is not exactly a Cedar `decimal` or `Long`.
    #[error(
        "the number at {pointer:?} is not representable in Cedar (at most 4 fraction digits, within the decimal or long range)"
    )]
    #[diagnostic(code(toolgate::tools::number_not_representable))]
    NumberNotRepresentable {
        /// Where in the arguments.
        pointer: String,
    },
    /// A date-time is not representable as a Cedar `datetime`.
    #[error("the date-time at {pointer:?} is not representable in Cedar")]
    #[diagnostic(code(toolgate::tools::datetime_not_representable))]
    DatetimeNotRepresentable {
        /// Where in the arguments.
        pointer: String,
    },
    /// An address is not representable as a Cedar `ipaddr`.
    #[error("the IP address at {pointer:?} is not representable in Cedar")]
    #[diagnostic(code(toolgate::tools::ip_not_representable))]
    IpNotRepresentable {
        /// Where in the arguments.
        pointer: String,
    },
    /// The value does not have the type derived from its schema: it was not validated first.
    #[error("the value at {pointer:?} does not match the type derived from the input schema")]
    #[diagnostic(code(toolgate::tools::value_not_schema_valid))]
    NotSchemaValid {
        /// Where in the arguments.
        pointer: String,
    },
}

impl ProjectionError {
    /// The stable reason string for the envelope's `details.reason`.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            ProjectionError::NumberNotRepresentable { .. } => "number_not_representable",
            ProjectionError::DatetimeNotRepresentable { .. } => "datetime_not_representable",
            ProjectionError::IpNotRepresentable { .. } => "ip_not_representable",
            ProjectionError::NotSchemaValid { .. } => "value_not_schema_valid",
        }
    }

    /// The JSON pointer of the offending value in the arguments.
    #[must_use]
    pub fn pointer(&self) -> &str {
        match self {
            ProjectionError::NumberNotRepresentable { pointer }
            | ProjectionError::DatetimeNotRepresentable { pointer }
            | ProjectionError::IpNotRepresentable { pointer }
            | ProjectionError::NotSchemaValid { pointer } => pointer,
        }
    }
}

/// The type of `schema` and whether `null` is also valid (`"type": [T, "null"]`).
fn derive(schema: &Value) -> Option<(InputType, bool)> {
    let schema = schema.as_object()?;
    let (name, nullable) = match schema.get("type") {
        Some(Value::String(name)) => (name.as_str(), false),
        Some(Value::Array(names)) => match names.as_slice() {
            [Value::String(name)] => (name.as_str(), false),
            [Value::String(a), Value::String(b)] if b == "null" => (a.as_str(), true),
            [Value::String(a), Value::String(b)] if a == "null" => (b.as_str(), true),
            _ => return None,
        },
        Some(_) => return None,
        // Without `type`, only a closed set of strings says what the value is.
        None => return only_strings(schema).then_some((InputType::String, false)),
    };
    let ty = match name {
        "string" => match schema.get("format").and_then(Value::as_str) {
            Some("date-time") => InputType::Datetime,
            Some("ipv4" | "ipv6") => InputType::IpAddr,
            Some("decimal") => InputType::Decimal,
            _ => InputType::String,
        },
        "integer" => InputType::Long,
        "number" => InputType::Decimal,
        "boolean" => InputType::Bool,
        "array" => {
            // With `prefixItems`, `items` covers only the tail: no one type holds every item.
            if schema.contains_key("prefixItems") {
                return None;
            }
            match derive(schema.get("items")?)? {
                // A Cedar set cannot hold null.
                (_, true) => return None,
                (item, false) => InputType::Set(Box::new(item)),
            }
        }
        "object" => record(schema)?,
        // "null" (Cedar has no null) and anything unknown.
        _ => return None,
    };
    Some((ty, nullable))
}

/// Whether `enum` / `const` (at least one present) admit only strings.
fn only_strings(schema: &Map<String, Value>) -> bool {
    let enumerated = schema.get("enum").map(|values| {
        values
            .as_array()
            .is_some_and(|values| values.iter().all(Value::is_string))
    });
    let constant = schema.get("const").map(Value::is_string);
    match (enumerated, constant) {
        (None, None) => false,
        (enumerated, constant) => enumerated.unwrap_or(true) && constant.unwrap_or(true),
    }
}

fn record(schema: &Map<String, Value>) -> Option<InputType> {
    let Some(properties) = schema.get("properties") else {
        // A map (`additionalProperties` / `patternProperties` only) has no fixed attributes.
        let open = schema.contains_key("patternProperties")
            || schema
                .get("additionalProperties")
                .is_some_and(|additional| additional != &Value::Bool(false));
        return (!open).then(|| InputType::Record(Vec::new()));
    };
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields: Vec<InputField> = properties
        .as_object()?
        .iter()
        .filter(|(name, _)| !CEDAR_RESERVED_KEYS.contains(&name.as_str()))
        .filter_map(|(name, property)| {
            let (ty, nullable) = derive(property)?;
            Some(InputField {
                name: name.clone(),
                required: required.contains(name.as_str()) && !nullable,
                ty,
            })
        })
        .collect();
    fields.sort_by(|a, b| a.name.cmp(&b.name));
    Some(InputType::Record(fields))
}

fn project(ty: &InputType, value: &Value, at: &mut String) -> Result<Value, ProjectionError> {
    let not_valid = |at: &String| ProjectionError::NotSchemaValid {
        pointer: at.clone(),
    };
    match (ty, value) {
        (InputType::String, Value::String(_)) | (InputType::Bool, Value::Bool(_)) => {
            Ok(value.clone())
        }
        (InputType::Long, Value::Number(number)) => {
            long(number)
                .map(Value::from)
                .ok_or_else(|| ProjectionError::NumberNotRepresentable {
                    pointer: at.clone(),
                })
        }
        (InputType::Decimal, Value::Number(number)) => decimal::from_number(number)
            .map(|literal| extension("decimal", literal))
            .ok_or_else(|| ProjectionError::NumberNotRepresentable {
                pointer: at.clone(),
            }),
        (InputType::Decimal, Value::String(text)) => decimal::is_literal(text)
            .then(|| extension("decimal", text.clone()))
            .ok_or_else(|| ProjectionError::NumberNotRepresentable {
                pointer: at.clone(),
            }),
        (InputType::Datetime, Value::String(text)) => datetime(text)
            .map(|utc| extension("datetime", utc))
            .ok_or_else(|| ProjectionError::DatetimeNotRepresentable {
                pointer: at.clone(),
            }),
        (InputType::IpAddr, Value::String(text)) => ip(text)
            .map(|address| extension("ip", address))
            .ok_or_else(|| ProjectionError::IpNotRepresentable {
                pointer: at.clone(),
            }),
        (InputType::Set(item), Value::Array(items)) => {
            let mut projected = Vec::with_capacity(items.len());
            for (index, element) in items.iter().enumerate() {
                let len = at.len();
                pointer::push(at, &index.to_string());
                projected.push(project(item, element, at)?);
                at.truncate(len);
            }
            Ok(Value::Array(projected))
        }
        (InputType::Record(fields), Value::Object(object)) => {
            let mut projected = Map::new();
            for field in fields {
                let len = at.len();
                pointer::push(at, &field.name);
                match object.get(&field.name) {
                    None | Some(Value::Null) if !field.required => {}
                    None | Some(Value::Null) => return Err(not_valid(at)),
                    Some(element) => {
                        projected.insert(field.name.clone(), project(&field.ty, element, at)?);
                    }
                }
                at.truncate(len);
            }
            Ok(Value::Object(projected))
        }
        _ => Err(not_valid(at)),
    }
}

fn extension(function: &str, arg: String) -> Value {
    json!({"__extn": {"fn": function, "arg": arg}})
}

/// An integer-valued number as a Cedar `Long` (`1.0` is an integer in JSON Schema).
fn long(number: &serde_json::Number) -> Option<i64> {
    if let Some(int) = number.as_i64() {
        return Some(int);
    }
    let float = number.as_f64().filter(|_| !number.is_u64())?;
    // 2^63 is exactly representable; every integral f64 in [-2^63, 2^63) is an i64.
    const BOUND: f64 = 9_223_372_036_854_775_808.0;
    (float.fract() == 0.0 && (-BOUND..BOUND).contains(&float)).then(|| {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "integral and within i64 range, checked above"
        )]
        let int = float as i64;
        int
    })
}

/// An RFC 3339 date-time as Cedar's `YYYY-MM-DDThh:mm:ss.SSSZ` in UTC.
fn datetime(text: &str) -> Option<String> {
    // RFC 3339 fixes the layout up to the seconds: `YYYY-MM-DDThh:mm:ss`.
    if !matches!(text.as_bytes().get(10), Some(b'T' | b't')) {
        return None;
    }
    // The `time` crate reads a leap second as 59.999999999; Cedar has no leap seconds, and
    // a policy must not see a moment other than the one the model wrote.
    if text.get(17..19) == Some("60") {
        return None;
    }
    let utc = OffsetDateTime::parse(text, &Rfc3339)
        .ok()?
        .checked_to_offset(UtcOffset::UTC)?;
    if !(0..=9999).contains(&utc.year()) {
        return None;
    }
    utc.format(format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    ))
    .ok()
}

/// An IPv4 or IPv6 address in a form Cedar's `ip()` reads.
fn ip(text: &str) -> Option<String> {
    Some(match text.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(address) => address.to_string(),
        std::net::IpAddr::V6(address) => {
            let shown = address.to_string();
            if shown.contains('.') {
                // `::ffff:1.2.3.4`: Cedar refuses a dotted IPv4 part inside IPv6.
                address
                    .segments()
                    .iter()
                    .map(|segment| format!("{segment:x}"))
                    .collect::<Vec<_>>()
                    .join(":")
            } else {
                shown
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refund_schema() -> Value {
        json!({
            "type": "object",
            "required": ["order_id", "amount_cents", "reason", "note"],
            "properties": {
                "order_id": {"type": "string", "minLength": 1},
                "amount_cents": {"type": "integer", "minimum": 1},
                "reason": {"enum": ["damaged", "late", "other"]},
                "notify": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "requested_at": {"type": "string", "format": "date-time"},
                "note": {"type": ["string", "null"]},
                "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                "choice": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
            },
            "additionalProperties": false
        })
    }

    fn field(name: &str, required: bool, ty: InputType) -> InputField {
        InputField {
            name: name.to_owned(),
            required,
            ty,
        }
    }

    #[test]
    fn refund_schema_maps_to_a_record() {
        assert_eq!(
            InputType::from_schema(&refund_schema()),
            Some(InputType::Record(vec![
                field("amount_cents", true, InputType::Long),
                field("note", false, InputType::String),
                field("notify", false, InputType::Bool),
                field("order_id", true, InputType::String),
                field("reason", true, InputType::String),
                field("requested_at", false, InputType::Datetime),
                field("tags", false, InputType::Set(Box::new(InputType::String))),
            ]))
        );
    }

    #[test]
    fn refund_arguments_project_to_cedar_json() {
        let ty = InputType::from_schema(&refund_schema()).unwrap();
        let args = json!({
            "order_id": "o-1",
            "amount_cents": 12_500,
            "reason": "late",
            "notify": true,
            "tags": ["vip", "eu"],
            "requested_at": "2024-01-01T10:00:00+02:00",
            "note": null,
            "metadata": {"a": "b"},
            "choice": 3
        });
        assert_eq!(
            ty.project(&args).unwrap(),
            json!({
                "order_id": "o-1",
                "amount_cents": 12_500,
                "reason": "late",
                "notify": true,
                "tags": ["vip", "eu"],
                "requested_at": {"__extn": {"fn": "datetime", "arg": "2024-01-01T08:00:00.000Z"}}
            })
        );
        let minimal = json!({"order_id": "o", "amount_cents": 1, "reason": "other", "note": "n"});
        assert_eq!(
            ty.project(&minimal).unwrap(),
            json!({"order_id": "o", "amount_cents": 1, "reason": "other", "note": "n"})
        );
    }

    #[test]
    fn mapping_table() {
        let cases = [
            (json!({"type": "string"}), Some(InputType::String)),
            (
                json!({"type": "string", "format": "date"}),
                Some(InputType::String),
            ),
            (
                json!({"type": "string", "format": "ipv6"}),
                Some(InputType::IpAddr),
            ),
            (
                json!({"type": "string", "format": "decimal"}),
                Some(InputType::Decimal),
            ),
            (json!({"type": "number"}), Some(InputType::Decimal)),
            (json!({"type": ["integer"]}), Some(InputType::Long)),
            (json!({"type": ["null", "boolean"]}), Some(InputType::Bool)),
            (json!({"const": "x"}), Some(InputType::String)),
            (json!({"enum": ["a", 1]}), None),
            (json!({"enum": ["a"], "const": 1}), None),
            (
                json!({"type": "string", "allOf": [{"minLength": 1}]}),
                Some(InputType::String),
            ),
            (json!({"type": ["string", "integer"]}), None),
            (json!({"type": "null"}), None),
            (json!({"$ref": "#/$defs/x"}), None),
            (json!({"oneOf": [{"type": "string"}]}), None),
            (json!(true), None),
            (json!({}), None),
            (json!({"type": "array"}), None),
            (
                json!({"type": "array", "items": {"type": ["string", "null"]}}),
                None,
            ),
            (
                json!({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}}),
                None,
            ),
            (
                json!({"type": "array", "items": {"type": "array", "items": {"type": "number"}}}),
                Some(InputType::Set(Box::new(InputType::Set(Box::new(
                    InputType::Decimal,
                ))))),
            ),
            (json!({"type": "object"}), Some(InputType::Record(vec![]))),
            (
                json!({"type": "object", "additionalProperties": false}),
                Some(InputType::Record(vec![])),
            ),
            (
                json!({"type": "object", "additionalProperties": true}),
                None,
            ),
            (
                json!({"type": "object", "patternProperties": {"^a": {}}}),
                None,
            ),
            (
                json!({"type": "object", "properties": {"__extn": {"type": "string"}, "b": {"type": "integer"}}, "required": ["__extn", "b"]}),
                Some(InputType::Record(vec![field("b", true, InputType::Long)])),
            ),
        ];
        for (schema, expected) in cases {
            assert_eq!(InputType::from_schema(&schema), expected, "{schema}");
        }
    }

    #[test]
    fn numbers() {
        let ty = InputType::Record(vec![
            field("price", false, InputType::Decimal),
            field("count", false, InputType::Long),
        ]);
        let decimal = |arg: &str| json!({"__extn": {"fn": "decimal", "arg": arg}});
        assert_eq!(
            ty.project(&json!({"price": 12.5, "count": 3.0})).unwrap(),
            json!({"price": decimal("12.5"), "count": 3})
        );
        assert_eq!(
            ty.project(&json!({"price": 7, "count": -9_007_199_254_740_991_i64}))
                .unwrap(),
            json!({"price": decimal("7.0"), "count": -9_007_199_254_740_991_i64})
        );
        for (args, pointer) in [
            (json!({"price": 0.12345}), "/price"),
            (json!({"price": 1e15}), "/price"),
            (json!({"count": 1.5}), "/count"),
            (json!({"count": u64::MAX}), "/count"),
        ] {
            let error = ty.project(&args).unwrap_err();
            assert_eq!(
                error,
                ProjectionError::NumberNotRepresentable {
                    pointer: pointer.to_owned()
                },
                "{args}"
            );
            assert_eq!(error.reason(), "number_not_representable");
        }
        let text = InputType::Decimal;
        assert_eq!(text.project(&json!("-3.1400")).unwrap(), decimal("-3.1400"));
        assert_eq!(
            text.project(&json!("3.14159")).unwrap_err().reason(),
            "number_not_representable"
        );
    }

    #[test]
    fn datetimes() {
        let cases = [
            (
                "2024-01-01T10:00:00+02:00",
                Some("2024-01-01T08:00:00.000Z"),
            ),
            ("2024-01-01t10:00:00z", Some("2024-01-01T10:00:00.000Z")),
            (
                "2024-02-29T23:30:00.123456789-01:30",
                Some("2024-03-01T01:00:00.123Z"),
            ),
            (
                "2024-01-01T10:00:00.9999Z",
                Some("2024-01-01T10:00:00.999Z"),
            ),
            (
                "2024-01-01T10:00:00.5-00:00",
                Some("2024-01-01T10:00:00.500Z"),
            ),
            ("0000-01-01T00:30:00+01:00", None),
            ("9999-12-31T23:30:00-01:00", None),
            ("1998-12-31T23:59:60Z", None),
            ("2024-01-01 10:00:00Z", None),
            ("2024-01-01T10:00:00", None),
        ];
        for (input, expected) in cases {
            let projected = InputType::Datetime.project(&json!(input));
            match expected {
                Some(utc) => assert_eq!(
                    projected.unwrap(),
                    json!({"__extn": {"fn": "datetime", "arg": utc}}),
                    "{input}"
                ),
                None => assert_eq!(
                    projected.unwrap_err(),
                    ProjectionError::DatetimeNotRepresentable {
                        pointer: String::new()
                    },
                    "{input}"
                ),
            }
        }
    }

    #[test]
    fn ip_addresses() {
        let ip = |arg: &str| json!({"__extn": {"fn": "ip", "arg": arg}});
        assert_eq!(
            InputType::IpAddr.project(&json!("10.0.0.1")).unwrap(),
            ip("10.0.0.1")
        );
        assert_eq!(InputType::IpAddr.project(&json!("::1")).unwrap(), ip("::1"));
        assert_eq!(
            InputType::IpAddr.project(&json!("::ffff:1.2.3.4")).unwrap(),
            ip("0:0:0:0:0:ffff:102:304")
        );
        assert_eq!(
            InputType::IpAddr
                .project(&json!("fe80::1%eth0"))
                .unwrap_err()
                .reason(),
            "ip_not_representable"
        );
    }

    #[test]
    fn unvalidated_values_are_refused_with_their_pointer() {
        let ty = InputType::Record(vec![
            field("id", true, InputType::String),
            field("tags", false, InputType::Set(Box::new(InputType::Long))),
        ]);
        for (args, pointer) in [
            (json!("x"), ""),
            (json!({}), "/id"),
            (json!({"id": null}), "/id"),
            (json!({"id": 5}), "/id"),
            (json!({"id": "a", "tags": [1, "2"]}), "/tags/1"),
        ] {
            assert_eq!(
                ty.project(&args),
                Err(ProjectionError::NotSchemaValid {
                    pointer: pointer.to_owned()
                }),
                "{args}"
            );
        }
    }
}
