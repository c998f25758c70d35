//! `toolgate tools import`: contract skeletons from an MCP server's
//! `tools/list` ([`super::mcp`]): a file, a Streamable HTTP endpoint or a
//! server over stdio. Exit 0 when every contract is written or unchanged,
//! 3 when a changed one was withheld, 1 on an error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use super::mcp::{self, Options, Source};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["file", "url", "command"])))]
pub(super) struct ImportArgs {
    #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
    policies: PathBuf,
    /// A `tools/list` result (`{"tools": [...]}`) or a whole JSON-RPC response.
    #[arg(long)]
    file: Option<PathBuf>,
    /// The MCP server's Streamable HTTP endpoint, e.g. `http://127.0.0.1:8000/mcp`.
    #[arg(long)]
    url: Option<String>,
    /// The environment variable holding a bearer token for `--url` (never
    /// the token itself on the command line).
    #[arg(long, requires = "url", conflicts_with_all = ["file", "command"])]
    bearer_token_env: Option<String>,
    /// Bounds each step of a live session (start, each page, shutdown).
    #[arg(long, default_value_t = 30)]
    timeout_seconds: u64,
    /// Replace existing contracts that differ.
    #[arg(long)]
    force: bool,
    /// Write nothing; print what would be written and the diffs.
    #[arg(long)]
    dry_run: bool,
    /// The MCP server's command line, run over stdio.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

impl ImportArgs {
    /// Where the listing comes from; the bearer token read from the named
    /// variable, an error naming it when it is not set.
    fn source(&mut self) -> anyhow::Result<Source> {
        Ok(match (self.file.take(), self.url.take()) {
            (Some(file), _) => Source::File(file),
            (None, Some(url)) => Source::Http {
                bearer_token: self
                    .bearer_token_env
                    .as_ref()
                    .map(|name| {
                        std::env::var(name)
                            .with_context(|| format!("--bearer-token-env: `{name}` is not set"))
                    })
                    .transpose()?,
                url,
            },
            (None, None) => Source::Stdio(std::mem::take(&mut self.command)),
        })
    }
}

pub(super) async fn run(mut args: ImportArgs) -> anyhow::Result<ExitCode> {
    let source = args.source()?;
    let timeout = Duration::from_secs(args.timeout_seconds.max(1));
    let options = Options {
        force: args.force,
        dry_run: args.dry_run,
    };
    let imported = match mcp::list_tools(&source, timeout).await {
        Ok(listing) => mcp::import_into(&args.policies, &listing, options),
        Err(error) => Err(error),
    };
    Ok(match imported {
        Ok(report) => {
            print!("{}", report.render());
            if report.withheld() {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("toolgate: error[{}]: {error}", error.code());
            ExitCode::FAILURE
        }
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::super::{Cli, Command, ToolsCommand};
    use super::*;

    fn import_args(line: &[&str]) -> ImportArgs {
        let mut argv = vec!["toolgate", "tools", "import"];
        argv.extend_from_slice(line);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Tools(ToolsCommand::Import(args)) => args,
            _ => unreachable!("`tools import` parses as itself"),
        }
    }

    #[test]
    fn a_bearer_token_comes_from_the_named_variable_only() {
        let mut args = import_args(&[
            "--url",
            "http://127.0.0.1:9/mcp",
            "--bearer-token-env",
            "TOOLGATE_TEST_UNSET_TOKEN_VARIABLE",
        ]);
        let error = args.source().unwrap_err();
        assert_eq!(
            error.to_string(),
            "--bearer-token-env: `TOOLGATE_TEST_UNSET_TOKEN_VARIABLE` is not set"
        );
    }

    #[test]
    fn the_command_after_the_dashes_is_the_stdio_server() {
        let mut args = import_args(&["--", "python3", "server.py"]);
        match args.source().unwrap() {
            Source::Stdio(command) => assert_eq!(command, ["python3", "server.py"]),
            _ => panic!("not a stdio source"),
        }
    }
}
