//! `toolgate tools mcp-schema`: a tool's MCP `inputSchema` with its
//! COAZ-MCP declared mapping (`x-authzen-mapping`), as the configuration's
//! `[authzen]` pointers and identity claim names make it.

use std::path::PathBuf;
use std::process::ExitCode;

use super::report::load_or_report;
use crate::authzen::{declared_mapping, mcp_input_schema};
use crate::config::{Config, Overrides};

#[derive(clap::Args)]
pub(super) struct McpSchemaArgs {
    /// The tool's name.
    tool: String,
    /// The configuration file (default `./toolgate.toml` if present).
    #[arg(long, env = "TOOLGATE_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long)]
    policies: Option<PathBuf>,
}

/// Prints the schema; exit 1 naming an unknown tool.
pub(super) fn run(args: McpSchemaArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(
        args.config.as_deref(),
        Overrides {
            policies: args.policies,
            ..Overrides::default()
        },
    )?;
    let engine = load_or_report(&config.policies)?;
    let Some(contract) = engine.tools().get(&args.tool) else {
        eprintln!(
            "error: no tool `{}` in {}",
            args.tool,
            config.policies.display()
        );
        return Ok(ExitCode::FAILURE);
    };
    let mapping = declared_mapping(&config.authzen, &config.verifier.claims);
    let schema = mcp_input_schema(&contract.input_schema_json, &mapping);
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(ExitCode::SUCCESS)
}
