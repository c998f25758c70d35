//! `toolgate authorize`: one decision from the command line, through the
//! sidecar's own pipeline, without a server. Prints the answer as JSON;
//! exit 0 for allow, 2 for deny, 3 for approval required.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;

use super::report::built;
use crate::access::TenantScope;
use crate::audit::AuditSink;
use crate::clock::SystemClock;
use crate::config::{Config, Overrides};
use crate::decision::{AuthorizeInput, AuthorizeOutcome, Decision, Door};
use crate::identity::Caller;
use crate::server;

#[derive(clap::Args)]
pub(super) struct AuthorizeArgs {
    #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
    policies: PathBuf,
    /// Where approvals are recorded (default: in memory, discarded).
    #[arg(long, default_value = ":memory:")]
    store: String,
    #[arg(long)]
    tool: String,
    /// The arguments exactly as the model produced them.
    #[arg(long)]
    args: String,
    #[arg(long)]
    subject: String,
    #[arg(long)]
    tenant: String,
    #[arg(long = "scope")]
    scopes: Vec<String>,
    #[arg(long = "role")]
    roles: Vec<String>,
    #[arg(long, default_value = "")]
    agent: String,
    #[arg(long, default_value = "")]
    session: String,
    #[arg(long, default_value = "")]
    request_id: String,
    #[arg(long, default_value = "")]
    approval_id: String,
    /// A file holding the trusted entities (a Cedar entity JSON array).
    #[arg(long)]
    entities: Option<PathBuf>,
}

pub(super) async fn run(args: AuthorizeArgs) -> anyhow::Result<ExitCode> {
    let mut config = Config::with_defaults(Overrides {
        policies: Some(args.policies.clone()),
        store: Some(args.store.clone()),
        ..Overrides::default()
    })?;
    // The answer is printed; no audit log is kept for a one-off decision.
    config.audit.sink = AuditSink::Discard;
    let services = built(server::build(&config, Arc::new(SystemClock)).await)?;
    let input = args.input()?;
    let outcome = services.authorizer.authorize(&input).await?;
    println!("{}", serde_json::to_string_pretty(&answer(&outcome))?);
    Ok(exit_code(outcome.decision))
}

impl AuthorizeArgs {
    /// The question, as the executor door would ask it: the operator's own,
    /// on the command line, so of any tenant.
    fn input(self) -> anyhow::Result<AuthorizeInput> {
        let entities_json = match &self.entities {
            Some(p) => {
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
            }
            None => String::new(),
        };
        Ok(AuthorizeInput {
            tool: self.tool,
            arguments: self.args.into_bytes(),
            caller: Some(Caller {
                subject_id: self.subject,
                tenant_id: self.tenant,
                scopes: self.scopes,
                roles: self.roles,
                agent_id: self.agent,
                session_id: self.session,
            }),
            call_id: String::new(),
            request_id: self.request_id,
            approval_id: self.approval_id,
            deadline: None,
            entities_json,
            tool_version: String::new(),
            identity_token: String::new(),
            peer: String::new(),
            tenants: TenantScope::Any,
            door: Door::Executor,
            action: String::new(),
        })
    }
}

/// The JSON `authorize` prints.
fn answer(outcome: &AuthorizeOutcome) -> serde_json::Value {
    serde_json::json!({
        "decision": outcome.decision.as_str(),
        "code": outcome.error.as_ref().map(|e| e.code.as_str()),
        "message": outcome.error.as_ref().map(|e| e.message.clone()),
        "details": outcome.error.as_ref().map(|e| serde_json::Value::Object(e.details.clone())),
        "policies": outcome.policies,
        "normalized_arguments": outcome.normalized_arguments,
        "arguments_sha256": outcome.arguments_sha256,
        "idempotency_key": outcome.idempotency_key,
        "conflict_key": outcome.conflict_key,
        "timeout_ms": outcome.timeout_ms,
        "approval_id": outcome.approval.as_ref().map(|a| a.0.clone()),
        "budgets": outcome.budgets,
        "policy_version": outcome.policy_version,
    })
}

/// 0 allow, 2 deny, 3 approval required (1 stays an error's).
fn exit_code(decision: Decision) -> ExitCode {
    match decision {
        Decision::Allow => ExitCode::SUCCESS,
        Decision::Deny => ExitCode::from(2),
        Decision::ApprovalRequired => ExitCode::from(3),
    }
}

#[cfg(test)]
mod tests {
    use super::super::example_policies;
    use super::*;

    fn args(tool: &str, arguments: &str) -> AuthorizeArgs {
        AuthorizeArgs {
            policies: example_policies(),
            store: ":memory:".into(),
            tool: tool.into(),
            args: arguments.into(),
            subject: "bob".into(),
            tenant: "acme".into(),
            scopes: vec![],
            roles: vec![],
            agent: String::new(),
            session: String::new(),
            request_id: String::new(),
            approval_id: String::new(),
            entities: None,
        }
    }

    #[tokio::test]
    async fn an_unknown_tool_is_denied_with_its_code() {
        let a = args("no_such_tool", "{}");
        let config = Config::with_defaults(Overrides {
            policies: Some(a.policies.clone()),
            store: Some(a.store.clone()),
            ..Overrides::default()
        })
        .unwrap();
        let services = server::build(&config, Arc::new(SystemClock)).await.unwrap();
        let outcome = services
            .authorizer
            .authorize(&a.input().unwrap())
            .await
            .unwrap();
        let json = answer(&outcome);
        assert_eq!(json["decision"], "deny");
        assert_eq!(json["code"], "tool_not_found");
        assert_eq!(json["idempotency_key"], "");
        assert_eq!(exit_code(outcome.decision), ExitCode::from(2));
    }

    #[test]
    fn a_missing_entities_file_is_an_error_naming_it() {
        let mut a = args("refund_order", "{}");
        a.entities = Some(PathBuf::from("/nonexistent/entities.json"));
        let error = a.input().unwrap_err();
        assert_eq!(error.to_string(), "reading /nonexistent/entities.json");
    }
}
