//! `toolgate tools import`'s IO (DESIGN §11.5): an MCP `tools/list` read from a file or a
//! live MCP server, and the contract files written from it.
//!
//! A file holds one `tools/list` result (or a whole JSON-RPC response), strictly decoded
//! ([`decode::parse_strict`]). A live server is reached through the official Rust SDK
//! (`rmcp`): a command line run as a child process speaking stdio, or a Streamable HTTP URL;
//! the client initializes, then asks `tools/list` page after page while `nextCursor` says
//! more follow, at most [`MAX_PAGES`] pages, each answer bounded by the caller's timeout and
//! re-read through the same strict decoder as a file, so both sources are read by one rule
//! ([`crate::tools::import::read_page`]).
//!
//! Writing: every tool is checked before anything is written (a refused name or a repeated
//! one writes nothing); a contract that does not exist yet is written, one that says the
//! same is left alone, and one that differs is written only when forced, otherwise only its
//! diff is reported. Each file is written whole (a temporary file renamed over it), so a
//! sidecar watching the folder never reads half a contract.
//!
//! Must not: decide a contract's content (that is `tools::import`), or print (`main` renders
//! the [`Report`]). Logs nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rmcp::ServiceExt as _;
use rmcp::model::PaginatedRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};

use crate::decode::{self, DecodeError};
use crate::tools::Risk;
use crate::tools::import::{
    self, Change, ContractPlan, ImportError, McpTool, ToolsPage, ensure_unique, plan_contract,
};

/// At most this many `tools/list` pages are asked of a live server.
pub const MAX_PAGES: usize = 100;

/// Limits of a `tools/list` document (a file, or one page re-read): 16 MiB, 64 levels.
pub const LIST_LIMITS: decode::Limits = decode::Limits {
    max_bytes: 16 * 1024 * 1024,
    max_depth: 64,
};

/// Where the tool list comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file holding a `tools/list` result or a whole JSON-RPC response.
    File(PathBuf),
    /// An MCP server started as this command line (program, then arguments), over stdio.
    Stdio(Vec<String>),
    /// An MCP server at this Streamable HTTP endpoint, with a bearer token if one is given.
    Http {
        url: String,
        bearer_token: Option<String>,
    },
}

/// The tools read, and whether the list is known to be incomplete (a file holding a page
/// whose `nextCursor` says more follow).
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    pub tools: Vec<McpTool>,
    pub incomplete: bool,
}

/// Why tools could not be listed or contracts not written.
#[derive(Debug, thiserror::Error)]
pub enum McpImportError {
    #[error("cannot read `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the tools/list document is not acceptable JSON: {0}")]
    Json(#[from] DecodeError),
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error("no command line to start the MCP server")]
    NoCommand,
    #[error("cannot start the MCP server `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("the MCP session could not be initialized: {0}")]
    Initialize(#[source] Box<rmcp::service::ClientInitializeError>),
    #[error("tools/list failed: {0}")]
    Request(#[source] Box<rmcp::ServiceError>),
    #[error("the MCP server's tools/list answer could not be re-encoded: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the MCP server did not answer {what} within {seconds} s")]
    Timeout { what: &'static str, seconds: u64 },
    #[error("the MCP server's tool list has more than {MAX_PAGES} pages")]
    TooManyPages,
    #[error("the MCP server repeated a nextCursor: its pagination does not end")]
    CursorRepeated,
    #[error("cannot write `{path}`: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl McpImportError {
    /// Stable machine-readable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read_failed",
            Self::Json(_) => "invalid_json",
            Self::Import(error) => error.code(),
            Self::NoCommand | Self::Spawn { .. } | Self::Initialize(_) | Self::Request(_) => {
                "mcp_unreachable"
            }
            Self::Encode(_) => "invalid_json",
            Self::Timeout { .. } => "mcp_timeout",
            Self::TooManyPages | Self::CursorRepeated => "pagination_unbounded",
            Self::Write { .. } => "write_failed",
        }
    }
}

/// Reads the tool list from `source`; `timeout` bounds each step of a live session (start
/// and initialization, each page, the shutdown).
///
/// # Errors
/// [`McpImportError`]: unreadable or unacceptable input, an unreachable or failing server,
/// a refused or repeated tool name.
pub async fn list_tools(source: &Source, timeout: Duration) -> Result<Listing, McpImportError> {
    let listing = match source {
        Source::File(path) => {
            let bytes = std::fs::read(path).map_err(|source| McpImportError::Read {
                path: path.clone(),
                source,
            })?;
            let page = import::read_page(&decode::parse_strict(&bytes, &LIST_LIMITS)?)?;
            Listing {
                incomplete: page.next_cursor.is_some(),
                tools: page.tools,
            }
        }
        Source::Stdio(command) => {
            let (program, args) = command.split_first().ok_or(McpImportError::NoCommand)?;
            let mut child = tokio::process::Command::new(program);
            // A server that does not answer in time is killed, not left behind, even when
            // the runtime ends before rmcp's own cleanup runs.
            child.args(args).kill_on_drop(true);
            let transport =
                TokioChildProcess::new(child).map_err(|source| McpImportError::Spawn {
                    program: program.clone(),
                    source,
                })?;
            session(transport, timeout).await?
        }
        Source::Http { url, bearer_token } => {
            // reqwest's rustls has no crypto provider of its own here: ring, as tonic's TLS
            // uses. An error means one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(token) = bearer_token {
                config = config.auth_header(token.as_str());
            }
            session(StreamableHttpClientTransport::from_config(config), timeout).await?
        }
    };
    ensure_unique(&listing.tools)?;
    Ok(listing)
}

/// Initializes an MCP client session over `transport`, lists every page, closes the session.
async fn session<T, E, A>(transport: T, timeout: Duration) -> Result<Listing, McpImportError>
where
    T: rmcp::transport::IntoTransport<rmcp::RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let seconds = timeout.as_secs();
    let mut client = tokio::time::timeout(timeout, ().serve(transport))
        .await
        .map_err(|_| McpImportError::Timeout {
            what: "initialize",
            seconds,
        })?
        .map_err(|error| McpImportError::Initialize(Box::new(error)))?;
    let listed = list_pages(&client, timeout).await;
    // Closing stops a child process too (stdin closed, then SIGTERM, then kill).
    let _ = client.close_with_timeout(timeout).await;
    Ok(Listing {
        tools: listed?,
        incomplete: false,
    })
}

async fn list_pages(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    timeout: Duration,
) -> Result<Vec<McpTool>, McpImportError> {
    let mut tools = Vec::new();
    let mut cursors = std::collections::HashSet::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let params = PaginatedRequestParams::default().with_cursor(cursor.take());
        let result = tokio::time::timeout(timeout, client.list_tools(Some(params)))
            .await
            .map_err(|_| McpImportError::Timeout {
                what: "tools/list",
                seconds: timeout.as_secs(),
            })?
            .map_err(|error| McpImportError::Request(Box::new(error)))?;
        // Re-read as a file is read: one rule for both sources.
        let text = serde_json::to_vec(&result).map_err(McpImportError::Encode)?;
        let ToolsPage {
            tools: page,
            next_cursor,
        } = import::read_page(&decode::parse_strict(&text, &LIST_LIMITS)?)?;
        tools.extend(page);
        match next_cursor {
            None => return Ok(tools),
            Some(next) if !cursors.insert(next.clone()) => {
                return Err(McpImportError::CursorRepeated);
            }
            Some(next) => cursor = Some(next),
        }
    }
    Err(McpImportError::TooManyPages)
}

/// What `import_into` may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Write contracts that differ from the existing ones.
    pub force: bool,
    /// Write nothing; report what would be done.
    pub dry_run: bool,
}

/// What happened to one contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new contract file was written (or would be, in a dry run).
    Created,
    /// The existing contract already says this.
    Unchanged,
    /// The existing contract differed and was replaced (forced; or would be, in a dry run).
    Updated,
    /// The existing contract differs and was left as it is (not forced).
    Withheld,
}

/// One contract's line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: PathBuf,
    pub outcome: Outcome,
    pub risk: Risk,
    pub has_resource: bool,
    /// The diff from the existing contract, for an updated or withheld one.
    pub diff: Option<String>,
}

/// What an import did, tool by tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub entries: Vec<Entry>,
    pub dry_run: bool,
    pub incomplete: bool,
}

impl Report {
    /// Whether a changed contract was not written: the import is not complete until it is
    /// looked at (`--force`).
    #[must_use]
    pub fn withheld(&self) -> bool {
        self.entries
            .iter()
            .any(|entry| entry.outcome == Outcome::Withheld)
    }

    /// The report as text: each diff, one line per contract, a summary, and what the author
    /// still has to do.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::new();
        for entry in &self.entries {
            if let Some(diff) = &entry.diff {
                out.push_str(diff);
            }
        }
        let mut counts = [0usize; 4];
        for entry in &self.entries {
            let (index, verb) = match (entry.outcome, self.dry_run) {
                (Outcome::Created, false) => (0, "created"),
                (Outcome::Created, true) => (0, "would create"),
                (Outcome::Unchanged, _) => (1, "unchanged"),
                (Outcome::Updated, false) => (2, "updated"),
                (Outcome::Updated, true) => (2, "would update"),
                (Outcome::Withheld, _) => (3, "differs, not written"),
            };
            if let Some(count) = counts.get_mut(index) {
                *count += 1;
            }
            let resource = if entry.has_resource {
                ""
            } else {
                "; resource: null (set it if the tool acts on one)"
            };
            out.push_str(&format!(
                "{verb}: {} (risk {}{resource})\n",
                entry.path.display(),
                entry.risk
            ));
        }
        let [created, unchanged, updated, withheld] = counts;
        let (created_verb, updated_verb) = if self.dry_run {
            ("to create", "to update")
        } else {
            ("created", "updated")
        };
        out.push_str(&format!(
            "{} tool(s): {created} {created_verb}, {unchanged} unchanged, {updated} {updated_verb}, \
             {withheld} differ and not written\n",
            self.entries.len(),
        ));
        if self.dry_run {
            out.push_str("dry run: nothing was written\n");
        }
        if withheld > 0 {
            out.push_str("review the diff above; --force writes it\n");
        }
        if self.incomplete {
            out.push_str(
                "warning: the file holds one page of the list (it has a nextCursor); \
                 import from the server to get every tool\n",
            );
        }
        out
    }
}

/// Writes the contracts of `listing` into `<policies>/tools/` as `options` allow.
///
/// # Errors
/// [`McpImportError::Read`] or [`McpImportError::Write`] on a file that cannot be read or
/// written; files already written stay written (each is whole).
pub fn import_into(
    policies: &Path,
    listing: &Listing,
    options: Options,
) -> Result<Report, McpImportError> {
    let folder = policies.join("tools");
    let mut planned = Vec::with_capacity(listing.tools.len());
    for tool in &listing.tools {
        let path = folder.join(format!("{}.json", tool.name));
        let existing = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(McpImportError::Read { path, source }),
        };
        let label = format!("tools/{}.json", tool.name);
        planned.push((path, plan_contract(tool, existing.as_deref(), &label)));
    }
    let mut entries = Vec::with_capacity(planned.len());
    for (path, plan) in planned {
        let ContractPlan {
            text,
            change,
            risk,
            has_resource,
            ..
        } = plan;
        let (outcome, diff) = match change {
            Change::Create => (Outcome::Created, None),
            Change::Unchanged => (Outcome::Unchanged, None),
            Change::Update { diff } if options.force => (Outcome::Updated, Some(diff)),
            Change::Update { diff } => (Outcome::Withheld, Some(diff)),
        };
        if matches!(outcome, Outcome::Created | Outcome::Updated) && !options.dry_run {
            write_whole(&folder, &path, &text)?;
        }
        entries.push(Entry {
            path,
            outcome,
            risk,
            has_resource,
            diff,
        });
    }
    Ok(Report {
        entries,
        dry_run: options.dry_run,
        incomplete: listing.incomplete,
    })
}

/// Writes `text` to `path` through a temporary file in `folder` renamed over it.
fn write_whole(folder: &Path, path: &Path, text: &str) -> Result<(), McpImportError> {
    let failed = |source| McpImportError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(folder).map_err(failed)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let staging = folder.join(format!(".{name}.import-{}", std::process::id()));
    std::fs::write(&staging, text).map_err(failed)?;
    std::fs::rename(&staging, path).map_err(|source| {
        let _ = std::fs::remove_file(&staging);
        failed(source)
    })
}
