//! `toolgate test`: the policy test cases of a folder, run through the
//! decision pipeline ([`super::policy_cases`]); each failing case with a
//! diff, then `N passed, M failed`.

use std::path::PathBuf;
use std::process::ExitCode;

use super::policy_cases;
use super::report::report;

#[derive(clap::Args)]
pub(super) struct TestArgs {
    /// The policy folder (overrides `--policies`).
    dir: Option<PathBuf>,
    #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
    policies: PathBuf,
    /// Also fail unless every policy determined at least one passing case.
    #[arg(long)]
    require_coverage: bool,
}

pub(super) async fn run(args: TestArgs) -> anyhow::Result<ExitCode> {
    let dir = args.dir.unwrap_or(args.policies);
    Ok(match policy_cases::run(&dir).await {
        Ok(outcome) => {
            print!("{}", outcome.render());
            if outcome.success(args.require_coverage) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(errors) => {
            report(&errors);
            ExitCode::FAILURE
        }
    })
}
