//! Tool contracts: what each tool is, what arguments it accepts, and what a Cedar policy may
//! assume about them.
//!
//! Owns the contract file format (`policies/tools/*.json`, DESIGN §3.1), every load-time rule
//! about contracts, JSON Schema validation of arguments and results (Draft 2020-12, `format`
//! asserted, DESIGN §2.2), and the mapping of an input schema to the type of Cedar's
//! `context.input` together with the projection of arguments into it (DESIGN §3.2).
//!
//! Must not: fetch anything (a schema's `$ref` resolves inside the schema or not at all), read
//! anything but the contracts directory it is given, import `cedar_policy` (the policy layer
//! renders [`InputType`] as Cedar schema text), or know about gRPC, envelopes or the store.
//! These are rules, not IO: nothing here logs, and no message quotes argument values.
//!
//! # Contract files
//!
//! | field | required | meaning |
//! |---|---|---|
//! | `name` | yes | `^[A-Za-z0-9_-]{1,64}$`, unique across files; the Cedar action id |
//! | `version` | yes | any string; echoed in decisions and audit |
//! | `description` | no (`""`) | text |
//! | `risk` | yes | `read`, `write`, `external`, `financial` or `destructive` |
//! | `idempotent` | no (`false`) | re-running the same operation is harmless |
//! | `parallel` | no (`false`) | may run concurrently with other calls |
//! | `timeoutMs` | yes | at least 1 |
//! | `resource` | no | `{"type": "Order", "idPointer": "/order_id"}`; `idPointer` must name a property that every property along the pointer lists in `required` of a `"type": "object"` schema, ending at `"type": "string"` |
//! | `sensitive` | no (`[]`) | JSON pointers redacted from audit logs and approval display |
//! | `approvalTtlSeconds` | no (`900`) | at least 1 |
//! | `maxAttempts` | no (`[ledger] default_max_attempts`, 3) | at least 1: how many attempts the execution ledger grants one operation, the first included; a retryable failure of the last one is final |
//! | `inputSchema` | yes | JSON Schema 2020-12 with `"type": "object"` at the top |
//! | `outputSchema` | no | JSON Schema 2020-12 |
//!
//! Anything else, in the contract or in `resource`, is an error, as is a duplicate key anywhere
//! in the file. Schemas: `$schema`, if present, must be Draft 2020-12; a `$ref` must resolve
//! within the schema; `format` is asserted and an unknown format name is an error. Besides the
//! standard formats there is `decimal`: Cedar's decimal literal, `-?[0-9]+\.[0-9]{1,4}`,
//! between −922337203685477.5808 and 922337203685477.5807.
//!
//! # `context.input`: JSON Schema to Cedar
//!
//! Scalars follow the Cedar project's own generator (`cedar-policy-mcp-schema-generator`, with
//! `encode_numbers_as_decimal`). Unlike it, objects are always records (never entity types),
//! string enums are plain `String`, and what it would model as opaque entity types (null,
//! unions, untyped values) is left out: a property whose schema does not map is omitted from
//! its record, so a policy cannot mention it (strict validation of the policy says so), but
//! the property is still validated by the schema.
//!
//! | JSON Schema | Cedar type | value given to Cedar |
//! |---|---|---|
//! | `"type": "object"` with `properties` | record of the properties that map; a property is required only if listed in `required` and not nullable | object of those fields; unmapped properties dropped, absent or `null` optional fields omitted |
//! | `"type": "object"` without `properties` | `{}` (empty record) | `{}` |
//! | … with only `additionalProperties` (not `false`) or `patternProperties` | *not mapped* (a map, not a record) | — |
//! | `"type": "string"` | `String` | the string |
//! | … `"format": "date-time"` | `datetime` | `datetime("…")`, in UTC with milliseconds: `2024-01-01T10:00:00+02:00` → `2024-01-01T08:00:00.000Z`; digits after the milliseconds are truncated |
//! | … `"format": "ipv4"` / `"ipv6"` | `ipaddr` | `ip("…")`; IPv6 with a dotted IPv4 tail is rewritten in hex groups |
//! | … `"format": "decimal"` | `decimal` | `decimal("…")` as written |
//! | … any other format (`date`, `email`, `uuid`, …) | `String` | the string |
//! | `enum` / `const` of strings only, without `type` | `String` | the string |
//! | `"type": "integer"` | `Long` | the number (`3.0` is the integer 3) |
//! | `"type": "number"` | `decimal` | `decimal("…")` of the exact value: `12.5` → `"12.5"`, `12` → `"12.0"`; more than 4 fraction digits (after trimming zeros) or out of range is refused (`number_not_representable`), never rounded |
//! | `"type": "boolean"` | `Bool` | the boolean |
//! | `"type": "array"` with `items` | `Set<T>` of the item type | array (Cedar sets ignore order and duplicates) |
//! | `"type": [T, "null"]` (either order) | T, and the field is optional | `null` is omitted |
//! | `"type": "null"`, other unions (`["string", "integer"]`), no `type` (except string enums), `true`/`{}` | *not mapped* (Cedar has no null and no unions) | — |
//! | `"type": "array"` without `items`, with `prefixItems`, or with nullable items | *not mapped* | — |
//! | a property named `__entity`, `__extn` or `__expr` | *not mapped* (Cedar's JSON format reserves them) | — |
//!
//! Cedar compares `Long`s with `<` and `>`, but a `decimal` only with its methods:
//! `context.input.amount_cents > 10000` for an integer, `context.input.price.greaterThan(decimal("99.99"))`
//! for a number; so prefer `"type": "integer"` (cents) for amounts policies compare.
//!
//! `type` decides: `anyOf`, `oneOf`, `allOf`, `not`, `if` and `$ref` next to a `type` only
//! narrow what is valid, so they are ignored for the type; without a `type` they do not map.
//! Projection refuses a value Cedar cannot hold exactly (`number_not_representable`,
//! `datetime_not_representable` for leap seconds or years outside 0000–9999 after conversion
//! to UTC, `ip_not_representable`) rather than approximate it: the call is then
//! `invalid_arguments`, never authorized on a different value than the one that runs.

mod contract;
mod contract_error;
mod decimal;
pub mod import;
mod input_type;
pub(crate) mod pointer;
mod registry;
mod schema;
pub(crate) mod source;

pub use contract::{ResourceRef, Risk, ToolContract, is_valid_label};
pub use contract_error::{
    ResourceIdProblem, SourceLocation, ToolContractError, ToolContractErrorKind,
};
pub use input_type::{InputField, InputType, ProjectionError};
pub use registry::ToolRegistry;
pub use schema::{QUOTE_LIMIT, Violation};

#[cfg(test)]
mod conformance_tests;
#[cfg(test)]
mod contract_tests;
#[cfg(test)]
mod import_tests;
