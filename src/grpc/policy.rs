//! `PolicyService`: the live policy set and the last reload's error, for operators.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{convert, pb};
use crate::policy::{PolicyReloader, PolicyStatus, Severity, SourceDiagnostic};

/// The policy status API.
#[derive(Debug, Clone)]
pub struct PolicyApi {
    reloader: Arc<PolicyReloader>,
}

impl PolicyApi {
    pub fn new(reloader: Arc<PolicyReloader>) -> Self {
        Self { reloader }
    }
}

#[tonic::async_trait]
impl pb::policy_service_server::PolicyService for PolicyApi {
    async fn get_policy_status(
        &self,
        request: Request<pb::GetPolicyStatusRequest>,
    ) -> Result<Response<pb::GetPolicyStatusResponse>, Status> {
        let pb::GetPolicyStatusRequest {} = request.into_inner();
        Ok(Response::new(status(self.reloader.status())))
    }
}

fn status(s: PolicyStatus) -> pb::GetPolicyStatusResponse {
    let PolicyStatus {
        policy_version,
        loaded_at,
        policy_count,
        tool_count,
        warnings,
        last_reload_error,
        reloads_succeeded,
        reloads_failed,
    } = s;
    pb::GetPolicyStatusResponse {
        policy_version,
        loaded_at: Some(convert::timestamp(loaded_at)),
        policy_count: u32::try_from(policy_count).unwrap_or(u32::MAX),
        tool_count: u32::try_from(tool_count).unwrap_or(u32::MAX),
        last_reload_error: last_reload_error.map(|f| pb::PolicyReloadError {
            failed_at: Some(convert::timestamp(f.at)),
            diagnostics: f.diagnostics.iter().map(diagnostic).collect(),
        }),
        reloads_succeeded,
        reloads_failed,
        warnings: warnings.iter().map(diagnostic).collect(),
    }
}

fn diagnostic(d: &SourceDiagnostic) -> pb::PolicyDiagnostic {
    pb::PolicyDiagnostic {
        file: d.path.display().to_string(),
        line: u32::try_from(d.line).unwrap_or(u32::MAX),
        column: u32::try_from(d.column).unwrap_or(u32::MAX),
        severity: match d.severity {
            Severity::Error => pb::DiagnosticSeverity::Error,
            Severity::Warning => pb::DiagnosticSeverity::Warning,
        }
        .into(),
        code: d.code.clone(),
        message: d.message.clone(),
        help: d.help.clone().unwrap_or_default(),
    }
}
