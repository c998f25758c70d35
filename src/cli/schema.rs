//! `toolgate schema`: the combined Cedar schema (the folder's own and the
//! generated tool actions), as the validator checks the policies against it.

use std::path::PathBuf;
use std::process::ExitCode;

use super::report::load_or_report;

#[derive(clap::Args)]
pub(super) struct SchemaArgs {
    #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
    policies: PathBuf,
}

pub(super) fn run(args: &SchemaArgs) -> anyhow::Result<ExitCode> {
    let engine = load_or_report(&args.policies)?;
    print!("{}", engine.schema_text());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::super::example_policies;
    use crate::policy::PolicyEngine;

    #[test]
    fn the_schema_names_every_tool_action() {
        let engine = PolicyEngine::load(&example_policies()).unwrap();
        let schema = engine.schema_text();
        for tool in engine.tools().iter().map(|c| &c.name) {
            assert!(
                schema.contains(&format!("action \"{tool}\"")),
                "no action for {tool} in:\n{schema}"
            );
        }
    }
}
