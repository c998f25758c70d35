//! Tool contracts: one `policies/tools/<name>.json` file parsed, checked and compiled into an
//! immutable [`ToolContract`].
//!
//! Owns the contract file format (DESIGN §3.1, MCP field names), every load-time rule about a
//! single contract, and validation of a call's arguments and a tool's result against the
//! contract's schemas. Must not read files (the registry does), fetch anything, or know about
//! Cedar or gRPC; whether `resource.type` names a declared entity type is checked by the
//! policy layer, which can point at it with [`ToolContract::location_of`] or
//! [`ToolContract::offset_of`].

use std::fmt;
use std::path::{Path, PathBuf};

use jsonschema::Validator;
use serde::Deserialize;
use serde_json::Value;

use super::contract_error::{
    ResourceIdProblem, SourceLocation, ToolContractError, ToolContractErrorKind,
};
use super::input_type::InputType;
use super::pointer;
use super::schema::{self, Formats, Violation};
use super::source::{self, Position};

/// How much a tool can do; each risk is a Cedar action group (`Action::"risk:<as_str>"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Risk {
    /// Reads only.
    Read,
    /// Changes state the deployment owns.
    Write,
    /// Reaches outside (sends mail, calls third parties).
    External,
    /// Moves money.
    Financial,
    /// Deletes or destroys.
    Destructive,
}

impl Risk {
    /// Every risk, least to most severe.
    pub const ALL: [Risk; 5] = [
        Risk::Read,
        Risk::Write,
        Risk::External,
        Risk::Financial,
        Risk::Destructive,
    ];

    /// The name used in contracts, Cedar and the wire: `"read"`, `"write"`, `"external"`,
    /// `"financial"`, `"destructive"`.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Risk::Read => "read",
            Risk::Write => "write",
            Risk::External => "external",
            Risk::Financial => "financial",
            Risk::Destructive => "destructive",
        }
    }

    /// The risk named `name` (exactly, lowercase, as [`as_str`](Self::as_str) writes it).
    #[must_use]
    pub fn parse(name: &str) -> Option<Risk> {
        Risk::ALL.into_iter().find(|risk| risk.as_str() == name)
    }
}

impl fmt::Display for Risk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The Cedar resource a call acts on: `<entity_type>::"<string at id_pointer in the arguments>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRef {
    /// Cedar entity type name, e.g. `Order`.
    pub entity_type: String,
    /// JSON pointer into the arguments; the input schema guarantees a string is there.
    pub id_pointer: String,
}

/// A validated tool contract. Every field satisfies the load-time rules: a valid name, a
/// non-zero timeout and approval TTL, valid pointers, an object input schema that compiled,
/// and a resource id the input schema guarantees to be a string.
#[derive(Debug)]
pub struct ToolContract {
    /// `^[A-Za-z0-9_-]{1,64}$`; also the Cedar action id.
    pub name: String,
    /// Echoed in decisions and audit; approvals are bound to it.
    pub version: String,
    /// Free text (`""` when absent).
    pub description: String,
    /// How much the tool can do.
    pub risk: Risk,
    /// Re-running the same operation is harmless (`false` when absent).
    pub idempotent: bool,
    /// May run concurrently with other calls (`false` when absent).
    pub parallel: bool,
    /// The tool's own time limit, at least 1.
    pub timeout_ms: u64,
    /// The resource the call acts on, if any.
    pub resource: Option<ResourceRef>,
    /// JSON pointers redacted from audit logs and approval display.
    pub sensitive: Vec<String>,
    /// What a session has touched once this tool was allowed in it (DESIGN
    /// §13.2), each `^[a-z][a-z0-9_]{0,63}$`, sorted, no duplicates.
    pub labels: Vec<String>,
    /// How long a granted approval stays usable, at least 1 (900 when absent).
    pub approval_ttl_seconds: u64,
    /// How many attempts the execution ledger allows one operation, at least 1; `None` when
    /// absent (the ledger's configured default applies).
    pub max_attempts: Option<u32>,
    /// The `inputSchema` as written.
    pub input_schema_json: Value,
    /// The `outputSchema` as written, if any.
    pub output_schema_json: Option<Value>,
    /// `context.input`'s type, derived from `inputSchema`; always an [`InputType::Record`].
    pub input_type: InputType,
    /// The file the contract was loaded from.
    pub source_path: PathBuf,
    /// That file's text, exactly as loaded (for diagnostics and the policy version hash).
    pub source_text: String,
    input_validator: Validator,
    output_validator: Option<Validator>,
}

impl ToolContract {
    /// Parses and checks the contract `text`; `path` is where it came from, for diagnostics.
    ///
    /// # Errors
    /// [`ToolContractError`] located at the offending key (see [`ToolContractErrorKind`]).
    pub fn parse(path: &Path, text: &str) -> Result<ToolContract, ToolContractError> {
        Loader { path, text }.load()
    }

    /// Every violation of `args` against `inputSchema`, at most `cap` (at least one), in
    /// document order; empty means valid. No coercion: `"100"` is not an integer.
    #[must_use]
    pub fn validate_input(&self, args: &Value, cap: usize) -> Vec<Violation> {
        schema::violations(&self.input_validator, args, cap)
    }

    /// Every violation of `result` against `outputSchema`, like
    /// [`validate_input`](Self::validate_input); empty when the tool has no output schema.
    #[must_use]
    pub fn validate_output(&self, result: &Value, cap: usize) -> Vec<Violation> {
        self.output_validator
            .as_ref()
            .map(|validator| schema::violations(validator, result, cap))
            .unwrap_or_default()
    }

    /// The resource id in `args`: the string at `resource.id_pointer`. `None` when the tool
    /// has no resource, or `args` was not validated (a valid value always has it).
    #[must_use]
    pub fn resource_id<'a>(&self, args: &'a Value) -> Option<&'a str> {
        let resource = self.resource.as_ref()?;
        args.pointer(&resource.id_pointer)?.as_str()
    }

    /// Where the member at `pointer` (e.g. `/resource/type`) is in the contract file: its
    /// key for an object member, its first byte for an array element; the file alone when the
    /// pointer names nothing there.
    #[must_use]
    pub fn location_of(&self, pointer: &str) -> SourceLocation {
        SourceLocation::new(
            &self.source_path,
            source::locate(&self.source_text, pointer),
        )
    }

    /// The byte offset in [`source_text`](Self::source_text) of the member at `pointer`, as
    /// [`location_of`](Self::location_of) finds it.
    #[must_use]
    pub fn offset_of(&self, pointer: &str) -> Option<usize> {
        source::locate(&self.source_text, pointer).map(|position| position.offset)
    }

    /// An error about this contract at `pointer`, with the file's text attached.
    fn error_at(&self, pointer: &str, kind: ToolContractErrorKind) -> ToolContractError {
        ToolContractError::in_text(
            &self.source_path,
            &self.source_text,
            source::locate(&self.source_text, pointer),
            kind,
        )
    }

    /// The error for a second contract named like `first`.
    pub(crate) fn duplicate_of(&self, first: &ToolContract) -> ToolContractError {
        self.error_at(
            "/name",
            ToolContractErrorKind::DuplicateName {
                name: self.name.clone(),
                first: first.source_path.clone(),
            },
        )
    }
}

/// The fields of a contract, in MCP's spelling.
pub(super) const CONTRACT_FIELDS: &[&str] = &[
    "name",
    "version",
    "description",
    "risk",
    "idempotent",
    "parallel",
    "timeoutMs",
    "resource",
    "sensitive",
    "labels",
    "approvalTtlSeconds",
    "maxAttempts",
    "inputSchema",
    "outputSchema",
];

/// The fields of `resource`.
const RESOURCE_FIELDS: &[&str] = &["type", "idPointer"];

const DEFAULT_APPROVAL_TTL_SECONDS: u64 = 900;

/// The file format. Serialization is a boundary: this is parsed, then checked into a
/// [`ToolContract`]. Keep the field list in `CONTRACT_FIELDS`.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a tool contract object"
)]
struct RawContract {
    name: String,
    version: String,
    #[serde(default)]
    description: String,
    risk: String,
    #[serde(default)]
    idempotent: bool,
    #[serde(default)]
    parallel: bool,
    timeout_ms: u64,
    #[serde(default)]
    resource: Option<RawResource>,
    #[serde(default)]
    sensitive: Vec<String>,
    #[serde(default)]
    labels: Vec<String>,
    #[serde(default = "default_approval_ttl")]
    approval_ttl_seconds: u64,
    #[serde(default)]
    max_attempts: Option<u32>,
    input_schema: Value,
    #[serde(default)]
    output_schema: Option<Value>,
}

/// `resource`. Keep the field list in `RESOURCE_FIELDS`.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a resource object with `type` and `idPointer`"
)]
struct RawResource {
    #[serde(rename = "type")]
    entity_type: String,
    id_pointer: String,
}

fn default_approval_ttl() -> u64 {
    DEFAULT_APPROVAL_TTL_SECONDS
}

/// The `$schema` values accepted: Draft 2020-12 only, since both validation and the Cedar
/// type mapping read the schema with 2020-12's semantics (`items`, `prefixItems`).
const DIALECTS: [&str; 4] = [
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2020-12/schema#",
    "http://json-schema.org/draft/2020-12/schema",
    "http://json-schema.org/draft/2020-12/schema#",
];

struct Loader<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Loader<'_> {
    fn error_at(&self, pointer: &str, kind: ToolContractErrorKind) -> ToolContractError {
        let position = source::locate(self.text, pointer);
        ToolContractError::in_text(self.path, self.text, position, kind)
    }

    /// An error from serde_json, located where serde_json says.
    fn serde_error(
        &self,
        error: &serde_json::Error,
        kind: impl FnOnce(String) -> ToolContractErrorKind,
    ) -> ToolContractError {
        let position = (error.line() > 0)
            .then(|| Position::from_line_column(self.text, error.line(), error.column()));
        let full = error.to_string();
        let suffix = format!(" at line {} column {}", error.line(), error.column());
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
        ToolContractError::in_text(self.path, self.text, position, kind(message))
    }

    fn load(&self) -> Result<ToolContract, ToolContractError> {
        let document: Value = serde_json::from_str(self.text).map_err(|error| {
            self.serde_error(&error, |message| ToolContractErrorKind::Syntax { message })
        })?;
        if let Some((pointer, position)) = source::first_duplicate_key(self.text) {
            let key = pointer::segments(&pointer).last().unwrap_or_default();
            return Err(ToolContractError::in_text(
                self.path,
                self.text,
                Some(position),
                ToolContractErrorKind::DuplicateKey { key },
            ));
        }
        let Value::Object(fields) = &document else {
            return Err(self.error_at("", ToolContractErrorKind::NotAnObject));
        };
        self.check_known_fields(fields, "", CONTRACT_FIELDS)?;
        if let Some(Value::Object(resource)) = fields.get("resource") {
            self.check_known_fields(resource, "/resource", RESOURCE_FIELDS)?;
        }
        let raw: RawContract = serde_json::from_str(self.text).map_err(|error| {
            self.serde_error(&error, |message| ToolContractErrorKind::InvalidField {
                message,
            })
        })?;
        self.check(raw)
    }

    fn check_known_fields(
        &self,
        object: &serde_json::Map<String, Value>,
        at: &str,
        expected: &'static [&'static str],
    ) -> Result<(), ToolContractError> {
        match object.keys().find(|key| !expected.contains(&key.as_str())) {
            None => Ok(()),
            Some(field) => {
                let mut pointer = at.to_owned();
                pointer::push(&mut pointer, field);
                Err(self.error_at(
                    &pointer,
                    ToolContractErrorKind::UnknownField {
                        field: field.clone(),
                        expected,
                    },
                ))
            }
        }
    }

    fn check(&self, raw: RawContract) -> Result<ToolContract, ToolContractError> {
        if !is_valid_name(&raw.name) {
            return Err(self.error_at(
                "/name",
                ToolContractErrorKind::InvalidName { name: raw.name },
            ));
        }
        let risk = Risk::parse(&raw.risk).ok_or_else(|| {
            self.error_at(
                "/risk",
                ToolContractErrorKind::UnknownRisk {
                    risk: raw.risk.clone(),
                },
            )
        })?;
        if raw.timeout_ms == 0 {
            return Err(self.error_at("/timeoutMs", ToolContractErrorKind::ZeroTimeout));
        }
        if raw.approval_ttl_seconds == 0 {
            return Err(self.error_at(
                "/approvalTtlSeconds",
                ToolContractErrorKind::ZeroApprovalTtl,
            ));
        }
        if raw.max_attempts == Some(0) {
            return Err(self.error_at("/maxAttempts", ToolContractErrorKind::ZeroMaxAttempts));
        }
        for (index, sensitive) in raw.sensitive.iter().enumerate() {
            if !pointer::is_valid(sensitive) {
                return Err(self.error_at(
                    &format!("/sensitive/{index}"),
                    ToolContractErrorKind::InvalidPointer {
                        field: format!("sensitive[{index}]"),
                        pointer: sensitive.clone(),
                    },
                ));
            }
        }
        let mut labels = raw.labels.clone();
        for (index, label) in raw.labels.iter().enumerate() {
            if !is_valid_label(label) {
                return Err(self.error_at(
                    &format!("/labels/{index}"),
                    ToolContractErrorKind::InvalidLabel {
                        label: label.clone(),
                    },
                ));
            }
        }
        labels.sort();
        labels.dedup();
        let input_validator = self.compile("inputSchema", &raw.input_schema)?;
        let output_validator = raw
            .output_schema
            .as_ref()
            .map(|schema| self.compile("outputSchema", schema))
            .transpose()?;
        let resource = raw
            .resource
            .map(|resource| self.check_resource(resource, &raw.input_schema))
            .transpose()?;
        let input_type =
            InputType::from_schema(&raw.input_schema).unwrap_or(InputType::Record(Vec::new()));
        Ok(ToolContract {
            name: raw.name,
            version: raw.version,
            description: raw.description,
            risk,
            idempotent: raw.idempotent,
            parallel: raw.parallel,
            timeout_ms: raw.timeout_ms,
            resource,
            sensitive: raw.sensitive,
            labels,
            approval_ttl_seconds: raw.approval_ttl_seconds,
            max_attempts: raw.max_attempts,
            input_schema_json: raw.input_schema,
            output_schema_json: raw.output_schema,
            input_type,
            source_path: self.path.to_path_buf(),
            source_text: self.text.to_owned(),
            input_validator,
            output_validator,
        })
    }

    fn compile(&self, field: &'static str, schema: &Value) -> Result<Validator, ToolContractError> {
        let at = format!("/{field}");
        if let Some(uri) = schema.get("$schema")
            && !uri.as_str().is_some_and(|uri| DIALECTS.contains(&uri))
        {
            let uri = uri.as_str().map_or_else(|| uri.to_string(), str::to_owned);
            return Err(self.error_at(
                &format!("{at}/$schema"),
                ToolContractErrorKind::UnsupportedDialect { field, uri },
            ));
        }
        if field == "inputSchema" && schema.get("type") != Some(&Value::from("object")) {
            let pointer = if schema.get("type").is_some() {
                format!("{at}/type")
            } else {
                at.clone()
            };
            return Err(self.error_at(&pointer, ToolContractErrorKind::NotObjectSchema));
        }
        schema::compile_schema(schema, Formats::Asserted, None).map_err(|error| {
            let pointer = format!("{at}{}", schema::error_pointer(&error));
            // Point at the deepest part of the schema that exists in the file.
            let pointer = if source::locate(self.text, &pointer).is_some() {
                pointer
            } else {
                at.clone()
            };
            let kind = match schema::unknown_format(&error) {
                Some(format) => ToolContractErrorKind::UnknownFormat { field, format },
                None => ToolContractErrorKind::InvalidSchema { field, error },
            };
            self.error_at(&pointer, kind)
        })
    }

    fn check_resource(
        &self,
        resource: RawResource,
        input_schema: &Value,
    ) -> Result<ResourceRef, ToolContractError> {
        const AT: &str = "/resource/idPointer";
        if !pointer::is_valid(&resource.id_pointer) {
            return Err(self.error_at(
                AT,
                ToolContractErrorKind::InvalidPointer {
                    field: "resource.idPointer".to_owned(),
                    pointer: resource.id_pointer,
                },
            ));
        }
        if let Err(problem) = required_string_at(input_schema, &resource.id_pointer) {
            return Err(self.error_at(
                AT,
                ToolContractErrorKind::ResourceIdNotRequiredString {
                    pointer: resource.id_pointer,
                    problem,
                },
            ));
        }
        Ok(ResourceRef {
            entity_type: resource.entity_type,
            id_pointer: resource.id_pointer,
        })
    }
}

/// `^[A-Za-z0-9_-]{1,64}$`.
pub(super) fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

/// Whether `label` is a session label (DESIGN §13.2): `^[a-z][a-z0-9_]{0,63}$`,
/// the same rule as a budget's name.
#[must_use]
pub fn is_valid_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    (1..=64).contains(&bytes.len())
        && bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
}

/// Whether every value valid against `schema` has a string at `pointer`: each property along
/// the pointer is declared and required by an object schema, and the last is a string.
fn required_string_at(schema: &Value, pointer: &str) -> Result<(), ResourceIdProblem> {
    let mut node = schema;
    for segment in pointer::segments(pointer) {
        if node.get("type") != Some(&Value::from("object")) {
            return Err(ResourceIdProblem::ParentNotObject { segment });
        }
        let Some(child) = node
            .get("properties")
            .and_then(|properties| properties.get(&segment))
        else {
            return Err(ResourceIdProblem::NotDeclared { segment });
        };
        let required = node
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|names| names.iter().any(|name| name.as_str() == Some(&segment)));
        if !required {
            return Err(ResourceIdProblem::NotRequired { segment });
        }
        node = child;
    }
    // The root is an object schema (checked before), so `""` ends here too.
    if node.get("type") == Some(&Value::from("string")) {
        Ok(())
    } else {
        Err(ResourceIdProblem::NotString)
    }
}
