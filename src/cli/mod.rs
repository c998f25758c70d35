//! The `toolgate` command line: one file per subcommand, each with its
//! arguments, its report and its tests; `main.rs` only calls [`main`].
//!
//! Every subcommand runs on one runtime, built here: the one `serve` needs
//! (its blocking pool runs the SQLite store's calls and policy reloads).
//! What the subcommands print is theirs; what they decide is the library's.
//! `toolgate test` runs [`policy_cases`], `toolgate tools import` reads
//! [`mcp`]; neither is on the serving path.

mod authorize;
mod check;
mod check_config;
mod dev;
pub mod mcp;
mod mcp_schema;
pub mod policy_cases;
mod report;
mod schema;
mod serve;
mod test;
mod tools_import;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "toolgate",
    version,
    about = "Authorization sidecar for AI-agent tool executors"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar.
    Serve(serve::ServeArgs),
    /// Load and validate the configuration (file, TOOLGATE_* environment,
    /// flags) without serving; exit non-zero on the first problem.
    CheckConfig(serve::ServeArgs),
    /// Load and validate the policy folder; exit non-zero with file:line diagnostics.
    Check(check::CheckArgs),
    /// Run the policy test cases (`DIR/tests/*.json`) through the decision
    /// pipeline; list each failing case with a diff, end with `N passed, M
    /// failed`, and exit 1 on any failure or invalid case file.
    Test(test::TestArgs),
    /// Print the combined Cedar schema.
    Schema(schema::SchemaArgs),
    /// One decision from the command line, without a server. Prints the
    /// answer as JSON; exit 0 for allow, 2 for deny, 3 for approval required.
    Authorize(authorize::AuthorizeArgs),
    /// DEVELOPMENT ONLY: a local key set and identity tokens, to try the
    /// approval flow without an identity provider. Production verifies the
    /// provider's tokens against its published key set.
    #[command(subcommand)]
    Dev(dev::DevCommand),
    /// Tool contracts and MCP: import them from an MCP server, print one as
    /// an MCP server publishes it.
    #[command(subcommand)]
    Tools(ToolsCommand),
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// Write contract skeletons (`POLICIES/tools/<name>.json`) from an MCP
    /// server's `tools/list`: from a file (`--file`), a Streamable HTTP
    /// endpoint (`--url`) or a server started over stdio (the command line
    /// after `--`). A contract that exists and differs is shown as a diff and
    /// written only with `--force`. Exit 0 when every contract is written or
    /// unchanged, 3 when a changed one was not written, 1 on an error (2 is
    /// a usage error).
    Import(tools_import::ImportArgs),
    /// Print a tool's MCP `inputSchema` with its COAZ-MCP declared mapping
    /// (`x-authzen-mapping`), as the configuration's `[authzen]` pointers
    /// and identity claim names make it: what an MCP server publishes in
    /// `tools/list` so that a gateway enforcing through toolgate's AuthZEN
    /// door sends exactly what toolgate reads.
    McpSchema(mcp_schema::McpSchemaArgs),
}

/// The command line's entry point: parses the arguments, runs the
/// subcommand on the one runtime, prints an error as `toolgate: …`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match runtime().and_then(|runtime| runtime.block_on(run(cli.command))) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("toolgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The one runtime of every subcommand. The blocking pool runs the SQLite
/// store's calls (one connection behind a mutex) and policy reloads:
/// threads beyond a few would only wait on that mutex, each holding a stack
/// and allocator pages (tokio's default allows 512).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(8)
        .enable_all()
        .build()?)
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => serve::run(args).await,
        Command::CheckConfig(args) => check_config::run(args),
        Command::Check(args) => Ok(check::run(&args)),
        Command::Test(args) => test::run(args).await,
        Command::Schema(args) => schema::run(&args),
        Command::Authorize(args) => authorize::run(args).await,
        Command::Dev(command) => dev::run(command),
        Command::Tools(ToolsCommand::Import(args)) => tools_import::run(args).await,
        Command::Tools(ToolsCommand::McpSchema(args)) => mcp_schema::run(args),
    }
}

/// The example policy folder of the repository, for the subcommands' tests.
#[cfg(test)]
fn example_policies() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::report::load_or_report;
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn an_invalid_policy_folder_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tools")).unwrap();
        std::fs::write(dir.path().join("bad.cedar"), "permit(").unwrap();
        let error = load_or_report(dir.path()).err().unwrap();
        assert_eq!(
            error.to_string(),
            format!("the policy set in `{}` is invalid", dir.path().display())
        );
    }
}
