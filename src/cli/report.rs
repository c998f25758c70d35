//! What the subcommands share: how a policy set that does not load is
//! reported (every diagnostic, file:line and source).

use crate::policy::{LoadErrors, PolicyEngine};

/// Prints every load problem as `file:line:col: message` (the form editors
/// and CI logs recognise), then each with its source snippet.
pub(super) fn report(errors: &LoadErrors) {
    for e in &errors.errors {
        eprintln!("error: {e}");
    }
    for w in &errors.warnings {
        eprintln!("warning: {w}");
    }
    let handler = miette::GraphicalReportHandler::new();
    for e in &errors.errors {
        let mut out = String::new();
        if handler.render_report(&mut out, e).is_ok() {
            eprintln!("{out}");
        }
    }
}

/// The policy set in `policies`, or every diagnostic printed and an error.
pub(super) fn load_or_report(policies: &std::path::Path) -> anyhow::Result<PolicyEngine> {
    PolicyEngine::load(policies).map_err(|errors| {
        report(&errors);
        anyhow::anyhow!("the policy set in `{}` is invalid", policies.display())
    })
}

/// The built sidecar, or its error with every policy diagnostic printed
/// (file:line and the source) when the policy set is what failed.
pub(super) fn built(
    result: Result<crate::server::Services, crate::server::ServerError>,
) -> anyhow::Result<crate::server::Services> {
    result.map_err(|e| {
        if let crate::server::ServerError::Policies { errors, .. } = &e {
            report(errors);
        }
        anyhow::Error::new(e)
    })
}
