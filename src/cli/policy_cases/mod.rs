//! `toolgate test`: policy test cases (`policies/tests/*.json`, DESIGN §8)
//! run through the real decision pipeline.
//!
//! A call case goes through [`crate::decision::ToolCallAuthorizer::authorize`], exactly as
//! `toolgate authorize` and the gRPC server decide: strict decoding of the
//! raw argument text, the tool's schema, hashing, entities, the approval
//! check, Cedar. `"approved": true` presents a real approval: the runner
//! records one for this exact call in a throwaway in-memory store and
//! grants it through the store, then presents its id, so the pipeline
//! verifies the binding and evaluates with `context.approved = true`
//! itself. (A call rejected before hashing cannot be bound to an approval;
//! it is decided as it is.) A `decide_approval` case asks Cedar the
//! question the approval desk asks ([`PolicyEngine::decide_approval`]).
//!
//! This module does no evaluation of its own and never touches a
//! deployment's store. It must not be on the serving path.

pub mod format;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::format::{
    CallCase, CaseFile, DecideApprovalCase, Expectation, Question, ViewApprovalCase,
};
use crate::access::TenantScope;
use crate::approvals::desk::{approver_refusal, viewer_refusal};
use crate::approvals::{self, ApprovalRecord, ApprovalStatus, NewApproval};
use crate::audit::AuditSink;
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, Overrides};
use crate::decision::{AuthorizeInput, Decision, Door};
use crate::policy::{LoadErrors, PolicyDecision, PolicyEngine, PolicyReloader, SourceDiagnostic};
use crate::store::{ApprovalDecision, Store};

/// The answer a case got, in the terms of its expectation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actual {
    /// `allow`, `deny`, `approval_required`, or `invalid_request` when the
    /// request itself was refused (an executor error, not a decision).
    pub decision: String,
    pub code: Option<String>,
    pub policies: Vec<String>,
    pub message: Option<String>,
}

/// One case's result.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub file: PathBuf,
    pub line: usize,
    pub name: String,
    pub expect: Expectation,
    pub actual: Actual,
}

impl CaseResult {
    /// Whether the answer is the one expected.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.diff().is_empty()
    }

    /// Each differing field as a `-` expected and a `+` actual line.
    #[must_use]
    pub fn diff(&self) -> Vec<String> {
        let (e, a) = (&self.expect, &self.actual);
        let mut out = Vec::new();
        let mut field = |name: &str, expected: String, actual: String| {
            if expected != actual {
                out.push(format!("- {name}: {expected}"));
                out.push(format!("+ {name}: {actual}"));
            }
        };
        field(
            "decision",
            e.decision.as_str().to_owned(),
            a.decision.clone(),
        );
        field("code", show(e.code.as_deref()), show(a.code.as_deref()));
        field(
            "policies",
            format!("[{}]", e.policies.join(", ")),
            format!("[{}]", a.policies.join(", ")),
        );
        if let Some(message) = &e.message {
            field("message", show(Some(message)), show(a.message.as_deref()));
        }
        out
    }
}

fn show(v: Option<&str>) -> String {
    v.map_or_else(|| "(none)".to_owned(), |s| format!("`{s}`"))
}

/// Everything one run found.
#[derive(Debug, Clone)]
pub struct TestReport {
    pub results: Vec<CaseResult>,
    /// Case files that could not be read or parsed (their cases did not run).
    pub invalid_files: Vec<SourceDiagnostic>,
    /// Every policy id of the set.
    pub policies: BTreeSet<String>,
    /// The ids that determined the answer of at least one passing case.
    pub covered: BTreeSet<String>,
}

impl TestReport {
    #[must_use]
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.passed()).count()
    }

    #[must_use]
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }

    /// Policies no passing case shows deciding anything.
    #[must_use]
    pub fn uncovered(&self) -> Vec<&str> {
        self.policies
            .difference(&self.covered)
            .map(String::as_str)
            .collect()
    }

    /// Whether the run succeeded: every file valid, every case passed and,
    /// when `require_coverage`, every policy covered.
    #[must_use]
    pub fn success(&self, require_coverage: bool) -> bool {
        self.invalid_files.is_empty()
            && self.failed() == 0
            && (!require_coverage || self.uncovered().is_empty())
    }

    /// The report for a terminal or a CI log: each invalid file, each
    /// failing case with its diff, the coverage, and last the summary line
    /// `N passed, M failed`.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::new();
        for d in &self.invalid_files {
            let _ = writeln!(out, "error: {d}");
        }
        for r in self.results.iter().filter(|r| !r.passed()) {
            let _ = writeln!(out, "FAIL {}:{}: {}", r.file.display(), r.line, r.name);
            for line in r.diff() {
                let _ = writeln!(out, "  {line}");
            }
        }
        let uncovered = self.uncovered();
        let _ = write!(
            out,
            "coverage: {}/{} policies determined a passing case",
            self.policies.len() - uncovered.len(),
            self.policies.len()
        );
        if uncovered.is_empty() {
            out.push('\n');
        } else {
            let _ = writeln!(out, "; never: {}", uncovered.join(", "));
        }
        let _ = writeln!(out, "{} passed, {} failed", self.passed(), self.failed());
        out
    }
}

/// Loads the policy folder `dir` and runs every case file in `dir/tests/`.
///
/// # Errors
/// [`LoadErrors`] when the policy set itself does not load (as `toolgate
/// check` reports them).
pub async fn run(dir: &Path) -> Result<TestReport, LoadErrors> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let policies = Arc::new(PolicyReloader::load(dir, Arc::clone(&clock))?);
    let live = policies.live().load_full();
    let mut report = TestReport {
        results: Vec::new(),
        invalid_files: Vec::new(),
        policies: live.policy_ids().into_iter().collect(),
        covered: BTreeSet::new(),
    };
    for (path, file) in case_files(&dir.join("tests"), &mut report.invalid_files) {
        for case in file.cases {
            let actual = match &case.question {
                Question::Call(call) => decide_call(dir, &clock, &policies, call).await,
                Question::DecideApproval(d) => decide_approval(&live, d),
                Question::ViewApproval(v) => view_approval(&live, v),
            };
            let result = CaseResult {
                file: path.clone(),
                line: case.line,
                name: case.name,
                expect: case.expect,
                actual,
            };
            if result.passed() {
                report
                    .covered
                    .extend(result.actual.policies.iter().cloned());
            }
            report.results.push(result);
        }
    }
    Ok(report)
}

/// Every `*.json` file of `tests`, parsed, in name order; a folder that
/// does not exist holds no cases.
fn case_files(tests: &Path, invalid: &mut Vec<SourceDiagnostic>) -> Vec<(PathBuf, CaseFile)> {
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(tests) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            invalid.push(
                SourceDiagnostic::whole_file(tests, format!("cannot read the folder: {e}"))
                    .with_code(format::CODE),
            );
            Vec::new()
        }
    };
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| {
                Box::new(
                    SourceDiagnostic::whole_file(&path, format!("cannot read: {e}"))
                        .with_code(format::CODE),
                )
            })
            .and_then(|text| format::parse(&path, &text));
        match parsed {
            Ok(file) => files.push((path, file)),
            Err(d) => invalid.push(*d),
        }
    }
    files
}

/// One call through the pipeline, on a fresh in-memory store: the
/// sidecar's own wiring ([`crate::server::assemble`]) with nothing audited.
async fn decide_call(
    dir: &Path,
    clock: &Arc<dyn Clock>,
    policies: &Arc<PolicyReloader>,
    call: &CallCase,
) -> Actual {
    let config = Config::with_defaults(Overrides {
        policies: Some(dir.to_path_buf()),
        store: Some(":memory:".to_owned()),
        ..Overrides::default()
    });
    let mut config = match config {
        Ok(c) => c,
        Err(e) => return refused(format!("cannot configure the pipeline: {e}")),
    };
    config.audit.sink = AuditSink::Discard;
    let services =
        match crate::server::assemble(&config, Arc::clone(clock), Arc::clone(policies)).await {
            Ok(s) => s,
            Err(e) => return refused(format!("cannot wire the pipeline: {e}")),
        };
    let (authorizer, store) = (&services.authorizer, &services.store);
    if let Err(e) = replay_history(authorizer, call).await {
        return refused(e);
    }
    let mut input = case_input(call, &call.tool, &call.arguments, call.request_id.clone());
    let first = authorizer.authorize(&input).await;
    if call.approved
        && let Ok(outcome) = &first
        && !outcome.arguments_sha256.is_empty()
    {
        match grant(&authorizer.engine(), &**store, &**clock, call, outcome).await {
            Ok(approval_id) => input.approval_id = approval_id,
            Err(e) => return refused(e),
        }
        return actual(authorizer.authorize(&input).await);
    }
    actual(first)
}

/// A call of the case's caller, with its entities, at the executor's door.
fn case_input(call: &CallCase, tool: &str, arguments: &str, request_id: String) -> AuthorizeInput {
    AuthorizeInput {
        tool: tool.to_owned(),
        arguments: arguments.as_bytes().to_vec(),
        caller: Some(call.caller.clone()),
        call_id: String::new(),
        request_id,
        approval_id: String::new(),
        deadline: None,
        entities_json: call.entities_json.clone(),
        tool_version: String::new(),
        identity_token: String::new(),
        peer: String::new(),
        // A case is the policy author's own: it may be of any tenant.
        tenants: TenantScope::Any,
        door: Door::Executor,
        action: String::new(),
    }
}

/// The case's `history`, decided in order on the case's store by the
/// case's caller: each allowed call charged as the sidecar would charge it.
async fn replay_history(
    authorizer: &crate::decision::ToolCallAuthorizer,
    call: &CallCase,
) -> Result<(), String> {
    for (entry, h) in call.history.iter().enumerate() {
        for n in 0..h.repeat {
            let input = case_input(call, &h.tool, &h.arguments, format!("history-{entry}-{n}"));
            authorizer
                .authorize(&input)
                .await
                .map_err(|e| format!("`history` call {entry} is not a valid request: {e}"))?;
        }
    }
    Ok(())
}

/// Records and grants an approval bound to exactly this call, as a human
/// approving it in an approval UI would; returns its id.
async fn grant(
    engine: &PolicyEngine,
    store: &dyn Store,
    clock: &dyn Clock,
    call: &CallCase,
    outcome: &crate::decision::AuthorizeOutcome,
) -> Result<String, String> {
    let tool = engine
        .tools()
        .get(&call.tool)
        .ok_or_else(|| format!("unknown tool `{}`", call.tool))?;
    let arguments: serde_json::Value = serde_json::from_str(&outcome.normalized_arguments)
        .map_err(|e| format!("normalized arguments: {e}"))?;
    let now = clock.now_ms();
    let hour = 3_600_000;
    let (record, _) = store
        .pending_approval_for_call(
            NewApproval {
                approval_id: uuid::Uuid::now_v7().to_string(),
                tenant_id: call.caller.tenant_id.clone(),
                requester_subject_id: call.caller.subject_id.clone(),
                agent_id: call.caller.agent_id.clone(),
                tool: tool.name.clone(),
                tool_version: tool.version.clone(),
                risk: tool.risk,
                arguments_sha256: outcome.arguments_sha256.clone(),
                display_arguments: approvals::display_arguments(&arguments, &tool.sensitive),
                request_id: call.request_id.clone(),
                created_at: now,
                expires_at: now + hour,
                why: approvals::ApprovalWhy::of_call(None, &outcome.budgets, engine.budgets()),
                limits: approvals::PendingLimits::default(),
            },
            now,
        )
        .await
        .map_err(|e| e.to_string())?;
    store
        .decide_approval(
            &record.tenant_id,
            &record.approval_id,
            ApprovalDecision {
                approve: true,
                decided_by: "toolgate-test".into(),
                reason: "granted by the test case".into(),
                decided_at: now,
                approved_expires_at: now + hour,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(record.approval_id)
}

fn actual(
    outcome: Result<crate::decision::AuthorizeOutcome, crate::envelope::RequestError>,
) -> Actual {
    match outcome {
        Ok(o) => Actual {
            decision: o.decision.as_str().to_owned(),
            code: o.error.as_ref().map(|e| e.code.as_str().to_owned()),
            policies: sorted(o.policies),
            message: o.error.map(|e| e.message),
        },
        Err(e) => refused(e.to_string()),
    }
}

/// The request itself could not be decided.
fn refused(message: String) -> Actual {
    Actual {
        decision: "invalid_request".into(),
        code: None,
        policies: Vec::new(),
        message: Some(message),
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Cedar's `decide_approval` for an approval of `d.tool` requested by
/// `d.requester` in `d.tenant`.
fn decide_approval(engine: &PolicyEngine, d: &DecideApprovalCase) -> Actual {
    let record = match case_approval(engine, &d.tenant, &d.requester, &d.tool) {
        Ok(record) => record,
        Err(actual) => return actual,
    };
    let decision = engine.decide_approval(&d.approver, &record.subject(), d.verdict);
    // The desk's own mapping of the answer, so a case sees what an approver would.
    approval_actual(&decision, approver_refusal(&decision))
}

/// Cedar's `view_approval` for an approval of `v.tool` requested by
/// `v.requester` in `v.tenant`.
fn view_approval(engine: &PolicyEngine, v: &ViewApprovalCase) -> Actual {
    let record = match case_approval(engine, &v.tenant, &v.requester, &v.tool) {
        Ok(record) => record,
        Err(actual) => return actual,
    };
    let decision = engine.view_approval(&v.viewer, &record.subject());
    // The desk's own mapping of the answer, so a case sees what a viewer would.
    approval_actual(&decision, viewer_refusal(&decision))
}

/// A pending approval of `tool` requested by `requester` in `tenant`, as
/// the store would hold it.
fn case_approval(
    engine: &PolicyEngine,
    tenant: &str,
    requester: &str,
    tool: &str,
) -> Result<ApprovalRecord, Actual> {
    let Some(tool) = engine.tools().get(tool) else {
        return Err(refused(format!("unknown tool `{tool}`")));
    };
    Ok(ApprovalRecord {
        approval_id: "policy-test-approval".into(),
        tenant_id: tenant.to_owned(),
        requester_subject_id: requester.to_owned(),
        agent_id: String::new(),
        tool: tool.name.clone(),
        tool_version: tool.version.clone(),
        risk: tool.risk,
        arguments_sha256: String::new(),
        display_arguments: String::new(),
        request_id: String::new(),
        status: ApprovalStatus::Pending,
        created_at: 0,
        expires_at: 0,
        decided_by: None,
        decided_at: None,
        reason: None,
        consumed_by_idempotency_key: None,
        why: approvals::ApprovalWhy::default(),
    })
}

/// A case's view of Cedar's answer on an approval and the desk's refusal.
fn approval_actual(
    decision: &Result<PolicyDecision, crate::policy::DecideError>,
    refusal: Option<crate::envelope::Envelope>,
) -> Actual {
    let policies = match &decision {
        Ok(
            PolicyDecision::Allow { policies }
            | PolicyDecision::Deny { policies, .. }
            | PolicyDecision::Errored { policies }
            | PolicyDecision::ApprovalRequired { policies, .. },
        ) => sorted(policies.clone()),
        Err(_) => Vec::new(),
    };
    match refusal {
        None => Actual {
            decision: Decision::Allow.as_str().into(),
            code: None,
            policies,
            message: None,
        },
        Some(envelope) => Actual {
            decision: Decision::Deny.as_str().into(),
            code: Some(envelope.code.as_str().to_owned()),
            policies,
            message: Some(envelope.message),
        },
    }
}
