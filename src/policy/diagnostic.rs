//! Load-time diagnostics that point at a file, a line and a column.

use std::fmt;
use std::path::{Path, PathBuf};

use miette::{Diagnostic, LabeledSpan, NamedSource, SourceSpan};

/// Whether a diagnostic stops a policy set from loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The set does not load.
    Error,
    /// The set loads; something is probably not what its author meant.
    Warning,
}

impl Severity {
    /// `"error"` or `"warning"`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
        }
    }
}

/// One problem in one file a deployment edits, located by line and column.
///
/// Displays as `path:line:column: message`, the form editors and CI logs
/// recognise; as a `miette` diagnostic it also renders the offending source.
#[derive(Debug, Clone)]
pub struct SourceDiagnostic {
    pub path: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
    pub help: Option<String>,
    pub severity: Severity,
    /// A stable kind for machines (`cedar::parse`, `cedar::validation`,
    /// `toolgate::tools::unknown_field`, …): what CI filters on.
    pub code: String,
    src: Option<NamedSource<String>>,
    span: Option<SourceSpan>,
}

impl SourceDiagnostic {
    /// A diagnostic at a byte offset of `text` (the whole file).
    #[must_use]
    pub fn at_offset(path: &Path, text: &str, offset: Option<usize>, message: String) -> Self {
        let (line, column) = offset.map_or((1, 1), |o| line_column(text, o));
        Self {
            path: path.to_path_buf(),
            line,
            column,
            message,
            help: None,
            severity: Severity::Error,
            code: codes::POLICY.to_owned(),
            src: Some(NamedSource::new(
                path.display().to_string(),
                text.to_owned(),
            )),
            span: offset.map(|o| SourceSpan::from((o, 0))),
        }
    }

    /// A diagnostic at a known line and column, without the file's text.
    #[must_use]
    pub fn at_line_column(path: &Path, line: usize, column: usize, message: String) -> Self {
        Self {
            line,
            column,
            ..Self::whole_file(path, message)
        }
    }

    /// A diagnostic for a whole file (no position known, reported at 1:1).
    #[must_use]
    pub fn whole_file(path: &Path, message: String) -> Self {
        Self {
            path: path.to_path_buf(),
            line: 1,
            column: 1,
            message,
            help: None,
            severity: Severity::Error,
            code: codes::POLICY.to_owned(),
            src: None,
            span: None,
        }
    }

    /// Builds a diagnostic from any `miette` diagnostic whose labels point
    /// into `text`; its code is the diagnostic's own, else `code`.
    #[must_use]
    pub fn from_diagnostic(path: &Path, text: &str, diag: &dyn Diagnostic, code: &str) -> Self {
        let offset = diag
            .labels()
            .and_then(|mut l| l.next())
            .map(|l: LabeledSpan| l.offset());
        let mut message = diag.to_string();
        // Cedar puts the useful part of many errors in its help text.
        let help = diag.help().map(|h| h.to_string());
        if let Some(cause) = std::error::Error::source(diag) {
            let cause = cause.to_string();
            if !message.contains(&cause) {
                message = format!("{message}: {cause}");
            }
        }
        let mut d = Self::at_offset(path, text, offset, message);
        d.help = help;
        d.code = diag
            .code()
            .map_or_else(|| code.to_owned(), |c| c.to_string());
        d
    }

    /// Sets the stable kind.
    #[must_use]
    pub fn with_code(mut self, code: &str) -> Self {
        code.clone_into(&mut self.code);
        self
    }

    /// Marks this diagnostic a warning.
    #[must_use]
    pub fn warning(mut self) -> Self {
        self.severity = Severity::Warning;
        self
    }
}

/// The stable kinds of the diagnostics toolgate raises itself (Cedar's
/// and the tool contracts' carry their own).
pub mod codes {
    pub const POLICY: &str = "toolgate::policy";
    pub const IO: &str = "toolgate::io";
    pub const SCHEMA: &str = "cedar::schema";
    pub const SCHEMA_WARNING: &str = "cedar::schema_warning";
    pub const PARSE: &str = "cedar::parse";
    pub const VALIDATION: &str = "cedar::validation";
    pub const VALIDATION_WARNING: &str = "cedar::validation_warning";
    pub const ENTITIES: &str = "cedar::entities";
    pub const REDECLARED_TYPE: &str = "toolgate::policy::redeclared_type";
    pub const UNKNOWN_RESOURCE_TYPE: &str = "toolgate::policy::unknown_resource_type";
    pub const DUPLICATE_ID: &str = "toolgate::policy::duplicate_id";
    pub const TEMPLATE: &str = "toolgate::policy::template";
    pub const BUDGET: &str = "toolgate::policy::budget";
}

impl fmt::Display for SourceDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.path.display(),
            self.line,
            self.column,
            self.message
        )?;
        if let Some(help) = &self.help {
            write!(f, " (help: {help})")?;
        }
        Ok(())
    }
}

impl std::error::Error for SourceDiagnostic {}

impl Diagnostic for SourceDiagnostic {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(&self.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.src.as_ref().map(|s| s as &dyn miette::SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        self.span.map(|s| {
            Box::new(std::iter::once(LabeledSpan::new_with_span(None, s)))
                as Box<dyn Iterator<Item = LabeledSpan>>
        })
    }
}

/// 1-based line and column (in characters) of a byte offset.
#[must_use]
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_column_counts_from_one() {
        let t = "ab\ncd\nef";
        assert_eq!(line_column(t, 0), (1, 1));
        assert_eq!(line_column(t, 4), (2, 2));
        assert_eq!(line_column(t, 6), (3, 1));
        assert_eq!(line_column(t, 99), (3, 3));
    }

    #[test]
    fn displays_as_path_line_column() {
        let d = SourceDiagnostic::at_offset(Path::new("p/a.cedar"), "x\ny", Some(2), "bad".into());
        assert_eq!(d.to_string(), "p/a.cedar:2:1: bad");
    }
}
