//! Why a contract cannot be loaded, and where: the one error type of contract loading, with
//! the file, line and column of the offending key and a stable diagnostic code per kind.
//!
//! Owns the wording and codes of load errors. Must not decide what is an error (the contract
//! and registry rules do) or print anything (`toolgate check` renders these with miette).

use std::fmt;
use std::path::{Path, PathBuf};

use jsonschema::ValidationError;
use miette::{NamedSource, SourceSpan};

use super::source::Position;

/// A place in a file: `path:line:column`, or just the path when the place is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLocation {
    /// The file.
    pub path: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column in characters, when known.
    pub column: Option<usize>,
}

impl SourceLocation {
    pub(super) fn new(path: &Path, position: Option<Position>) -> Self {
        SourceLocation {
            path: path.to_path_buf(),
            line: position.map(|position| position.line),
            column: position.map(|position| position.column),
        }
    }
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// A contract that cannot be loaded, and where: `policies/tools/x.json:12:5: unknown field
/// `foo`, expected one of …`. As a miette diagnostic it carries a stable code
/// (`toolgate::tools::…`, from its kind) and the file's text with the offending key labelled.
#[derive(Debug)]
pub struct ToolContractError(Box<ErrorParts>);

/// Boxed so that `Result<_, ToolContractError>` stays one pointer wide.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{location}: {kind}")]
#[diagnostic(forward(kind))]
struct ErrorParts {
    location: SourceLocation,
    kind: ToolContractErrorKind,
    #[source_code]
    source_code: Option<NamedSource<String>>,
    #[label("here")]
    span: Option<SourceSpan>,
}

impl ToolContractError {
    /// An error about a file whose text could not be read.
    pub(super) fn io(path: &Path, error: std::io::Error) -> Self {
        ToolContractError(Box::new(ErrorParts {
            location: SourceLocation::new(path, None),
            kind: ToolContractErrorKind::Io(error),
            source_code: None,
            span: None,
        }))
    }

    /// An error about `text` (the file at `path`), at `position` when known.
    pub(super) fn in_text(
        path: &Path,
        text: &str,
        position: Option<Position>,
        kind: ToolContractErrorKind,
    ) -> Self {
        ToolContractError(Box::new(ErrorParts {
            location: SourceLocation::new(path, position),
            kind,
            source_code: Some(NamedSource::new(
                path.display().to_string(),
                text.to_owned(),
            )),
            span: position.map(|position| SourceSpan::from(position.offset)),
        }))
    }

    /// What is wrong.
    #[must_use]
    pub fn kind(&self) -> &ToolContractErrorKind {
        &self.0.kind
    }

    /// Where it is wrong.
    #[must_use]
    pub fn location(&self) -> &SourceLocation {
        &self.0.location
    }
}

impl fmt::Display for ToolContractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for ToolContractError {}

impl miette::Diagnostic for ToolContractError {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.0.code()
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.0.help()
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.0.source_code()
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = miette::LabeledSpan> + '_>> {
        self.0.labels()
    }
}

/// What is wrong with a contract file. Messages are lowercase, with the file's text in
/// backticks.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[non_exhaustive]
pub enum ToolContractErrorKind {
    /// The file or directory could not be read.
    #[error("cannot read: {0}")]
    #[diagnostic(code(toolgate::tools::io))]
    Io(#[source] std::io::Error),
    /// The text is not JSON.
    #[error("invalid JSON: {message}")]
    #[diagnostic(code(toolgate::tools::syntax))]
    Syntax {
        /// serde_json's description, without its position.
        message: String,
    },
    /// An object has the same key twice; which one wins differs between parsers.
    #[error("duplicate key `{key}`")]
    #[diagnostic(code(toolgate::tools::duplicate_key))]
    DuplicateKey {
        /// The key, unescaped.
        key: String,
    },
    /// The top-level value is not an object.
    #[error("a tool contract must be a JSON object")]
    #[diagnostic(code(toolgate::tools::not_an_object))]
    NotAnObject,
    /// A field the format does not define.
    #[error("unknown field `{field}`, expected one of {}", backticked(expected))]
    #[diagnostic(code(toolgate::tools::unknown_field))]
    UnknownField {
        /// The field as written.
        field: String,
        /// The fields allowed where it appeared.
        expected: &'static [&'static str],
    },
    /// A field is missing or has the wrong JSON type.
    #[error("{message}")]
    #[diagnostic(code(toolgate::tools::invalid_field))]
    InvalidField {
        /// serde's description, without its position.
        message: String,
    },
    /// `name` does not match `^[A-Za-z0-9_-]{1,64}$`.
    #[error("invalid tool name `{name}`")]
    #[diagnostic(
        code(toolgate::tools::invalid_name),
        help("a tool name is 1 to 64 ASCII letters, digits, `_` or `-`")
    )]
    InvalidName {
        /// The name as written.
        name: String,
    },
    /// A `labels` entry is not a label.
    #[error("invalid label `{label}`")]
    #[diagnostic(
        code(toolgate::tools::invalid_label),
        help("a label is 1 to 64 lowercase ASCII letters, digits or `_`, starting with a letter")
    )]
    InvalidLabel {
        /// The label as written.
        label: String,
    },
    /// `risk` is not one of the five.
    #[error("unknown risk `{risk}`")]
    #[diagnostic(
        code(toolgate::tools::unknown_risk),
        help("risk is one of `read`, `write`, `external`, `financial`, `destructive`")
    )]
    UnknownRisk {
        /// The risk as written.
        risk: String,
    },
    /// `timeoutMs` is 0.
    #[error("`timeoutMs` must be at least 1")]
    #[diagnostic(code(toolgate::tools::zero_timeout))]
    ZeroTimeout,
    /// `approvalTtlSeconds` is 0.
    #[error("`approvalTtlSeconds` must be at least 1")]
    #[diagnostic(code(toolgate::tools::zero_approval_ttl))]
    ZeroApprovalTtl,
    /// `maxAttempts` is 0.
    #[error("`maxAttempts` must be at least 1")]
    #[diagnostic(
        code(toolgate::tools::zero_max_attempts),
        help("`maxAttempts` counts the first attempt too; leave it out for the ledger's default")
    )]
    ZeroMaxAttempts,
    /// A schema's `$schema` names a dialect other than Draft 2020-12.
    #[error("`{field}` must be JSON Schema draft 2020-12, not `{uri}`")]
    #[diagnostic(
        code(toolgate::tools::unsupported_dialect),
        help("omit `$schema` or set it to `https://json-schema.org/draft/2020-12/schema`")
    )]
    UnsupportedDialect {
        /// `inputSchema` or `outputSchema`.
        field: &'static str,
        /// The `$schema` as written.
        uri: String,
    },
    /// `inputSchema` does not say `"type": "object"` at its top.
    #[error("`inputSchema` must have `\"type\": \"object\"` at its top")]
    #[diagnostic(code(toolgate::tools::not_object_schema))]
    NotObjectSchema,
    /// A schema uses a `format` nobody checks.
    #[error("`{field}` uses unknown format `{format}`")]
    #[diagnostic(
        code(toolgate::tools::unknown_format),
        help(
            "unknown formats are refused so that a typo cannot switch a check off; known: date-time, date, time, duration, email, idn-email, hostname, idn-hostname, ipv4, ipv6, uri, uri-reference, iri, iri-reference, uri-template, uuid, json-pointer, relative-json-pointer, regex, decimal"
        )
    )]
    UnknownFormat {
        /// `inputSchema` or `outputSchema`.
        field: &'static str,
        /// The format as written.
        format: String,
    },
    /// A schema does not compile: invalid against the 2020-12 meta-schema, an unresolvable
    /// `$ref` (nothing is fetched), a bad regular expression.
    #[error("`{field}` is not a valid JSON Schema: {error}")]
    #[diagnostic(code(toolgate::tools::invalid_schema))]
    InvalidSchema {
        /// `inputSchema` or `outputSchema`.
        field: &'static str,
        /// jsonschema's error.
        error: Box<ValidationError<'static>>,
    },
    /// A field that holds a JSON pointer does not hold a valid one.
    #[error("`{field}` is not a valid JSON pointer: `{pointer}`")]
    #[diagnostic(
        code(toolgate::tools::invalid_pointer),
        help(
            "a JSON pointer (RFC 6901) is empty or starts with `/`, and writes `~` as `~0` and `/` as `~1`"
        )
    )]
    InvalidPointer {
        /// `resource.idPointer` or `sensitive[<index>]`.
        field: String,
        /// The pointer as written.
        pointer: String,
    },
    /// The input schema does not guarantee a string at `resource.idPointer`.
    #[error(
        "`resource.idPointer` `{pointer}` is not a required string in `inputSchema`: {problem}"
    )]
    #[diagnostic(
        code(toolgate::tools::resource_id_not_required_string),
        help(
            "every property along the pointer must be declared in `properties` and listed in `required` of an object schema (`\"type\": \"object\"`), and the last one must have `\"type\": \"string\"`"
        )
    )]
    ResourceIdNotRequiredString {
        /// The pointer as written.
        pointer: String,
        /// The first property along it that breaks the rule.
        problem: ResourceIdProblem,
    },
    /// Two files define the same tool.
    #[error("duplicate tool name `{name}`, first defined in `{}`", first.display())]
    #[diagnostic(code(toolgate::tools::duplicate_name))]
    DuplicateName {
        /// The name.
        name: String,
        /// The file that defined it first.
        first: PathBuf,
    },
}

/// Why `resource.idPointer` is not guaranteed to be a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceIdProblem {
    /// The schema holding property `segment` does not say `"type": "object"`.
    ParentNotObject {
        /// The property.
        segment: String,
    },
    /// Property `segment` is not declared in `properties`.
    NotDeclared {
        /// The property.
        segment: String,
    },
    /// Property `segment` is not listed in `required`.
    NotRequired {
        /// The property.
        segment: String,
    },
    /// The pointed-at property does not say `"type": "string"` (or the pointer is `""`).
    NotString,
}

impl fmt::Display for ResourceIdProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResourceIdProblem::ParentNotObject { segment } => write!(
                f,
                "the schema holding `{segment}` does not have `\"type\": \"object\"`"
            ),
            ResourceIdProblem::NotDeclared { segment } => {
                write!(f, "`{segment}` is not declared in `properties`")
            }
            ResourceIdProblem::NotRequired { segment } => {
                write!(f, "`{segment}` is not listed in `required`")
            }
            ResourceIdProblem::NotString => f.write_str("it does not have `\"type\": \"string\"`"),
        }
    }
}

fn backticked(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
