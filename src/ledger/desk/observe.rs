//! What every ledger call leaves behind: one audit event and one
//! metric count per transition.

use std::time::Instant;

use super::{ExecutorAuth, LedgerDesk};
use crate::audit::{AuditEvent, LedgerAudit};
use crate::envelope::ErrorCode;
use crate::identity::Caller;
use crate::ledger::{BeginAnswer, ExecutionState, Settled};
use crate::metrics::UNKNOWN_TOOL;

/// Who made one ledger call, and when it arrived: what its audit event and
/// metrics need besides the answer.
pub(super) struct Seen<'a> {
    pub(super) operation: &'static str,
    /// The transport identity.
    pub(super) peer: &'a str,
    pub(super) principal: Option<&'a Caller>,
    pub(super) decision_id: &'a str,
    pub(super) idempotency_key: &'a str,
    pub(super) started: Instant,
}

impl<'a> Seen<'a> {
    /// A call on the `LedgerService` (no decision began it).
    pub(super) fn request(
        operation: &'static str,
        auth: &'a ExecutorAuth,
        principal: Option<&'a Caller>,
        idempotency_key: &'a str,
        started: Instant,
    ) -> Self {
        Self {
            operation,
            peer: &auth.peer,
            principal,
            decision_id: "",
            idempotency_key,
            started,
        }
    }
}

impl LedgerDesk {
    /// Audits and counts a begin.
    pub(super) async fn observe_begin(
        &self,
        seen: &Seen<'_>,
        tool: &str,
        arguments_sha256: &str,
        answer: &BeginAnswer,
    ) {
        let state = answer.state.map_or("", ExecutionState::as_str);
        let code = answer.error.as_ref().map_or("", |e| e.code.as_str());
        let audit = LedgerAudit {
            reported: "",
            outcome: answer.outcome.as_str(),
            state,
            code,
            attempt: answer.attempt,
            ..self.ledger_audit(seen, tool, arguments_sha256)
        };
        self.observe(seen, &audit, answer.outcome.as_str()).await;
    }

    /// Audits and counts a completion or reconciliation (`None`: no record).
    pub(super) async fn observe_settled(
        &self,
        seen: &Seen<'_>,
        reported: &'static str,
        settled: Option<&Settled>,
    ) {
        let record = settled.and_then(|s| s.record.as_ref());
        let (tool, sha, attempt) = record.map_or(("", "", 0), |r| {
            (r.tool.as_str(), r.arguments_sha256.as_str(), r.attempt)
        });
        let code = settled
            .and_then(|s| s.error.as_ref())
            .map_or("", |e| e.code.as_str());
        // Settled answers carry toolgate's own codes only; anything else
        // would be a bug, counted as `other` rather than minting a series.
        let outcome = match settled {
            None => "not_found",
            Some(_) if code.is_empty() => "ok",
            Some(_) => ErrorCode::parse(code).map_or("other", ErrorCode::as_str),
        };
        let audit = LedgerAudit {
            reported,
            outcome,
            state: settled
                .and_then(|s| s.state)
                .map_or("", ExecutionState::as_str),
            code,
            attempt,
            ..self.ledger_audit(seen, tool, sha)
        };
        self.observe(seen, &audit, outcome).await;
    }

    /// The fields of a ledger event that do not depend on the answer.
    pub(super) fn ledger_audit<'a>(
        &self,
        seen: &'a Seen<'a>,
        tool: &'a str,
        arguments_sha256: &'a str,
    ) -> LedgerAudit<'a> {
        LedgerAudit {
            operation: seen.operation,
            principal: seen.principal,
            peer: seen.peer,
            decision_id: seen.decision_id,
            idempotency_key: seen.idempotency_key,
            arguments_sha256,
            tool,
            tool_version: "",
            policy_version: "",
            reported: "",
            outcome: "",
            state: "",
            code: "",
            attempt: 0,
        }
    }

    /// A lapsed operation ([`crate::ledger::Lapsed`]): its releases
    /// counted, and one audit event (operation `lapse`, no peer: the sweep
    /// made it) in its tenant.
    pub(super) async fn observe_lapse(&self, lapsed: &crate::ledger::Lapsed) {
        for name in &lapsed.released {
            self.metrics.budget_released(name);
        }
        let tenant = Caller {
            subject_id: String::new(),
            tenant_id: lapsed.tenant_id.clone(),
            scopes: Vec::new(),
            roles: Vec::new(),
            agent_id: String::new(),
            session_id: String::new(),
        };
        let engine = self.engine.load();
        let contract = engine.tools().get(&lapsed.tool);
        let state = ExecutionState::FailedFinal.as_str();
        let event = AuditEvent::ledger(
            &LedgerAudit {
                operation: "lapse",
                principal: Some(&tenant),
                peer: "",
                decision_id: "",
                idempotency_key: &lapsed.idempotency_key,
                arguments_sha256: &lapsed.arguments_sha256,
                tool: &lapsed.tool,
                tool_version: contract.map_or("", |c| c.version.as_str()),
                policy_version: engine.version(),
                reported: "",
                outcome: "lapsed",
                state,
                code: "",
                attempt: lapsed.attempt,
            },
            std::time::Duration::ZERO,
        );
        self.metrics.ledger(
            "lapse",
            contract.map_or(UNKNOWN_TOOL, |c| c.name.as_str()),
            "lapsed",
            state,
        );
        let _ = self.audit.record(event).await;
    }

    pub(super) async fn observe(
        &self,
        seen: &Seen<'_>,
        audit: &LedgerAudit<'_>,
        outcome: &'static str,
    ) {
        // A call that will not happen frees what it was charged (DESIGN
        // §13.1): after the transition, so a crash in between leaves the
        // charge (more used than spent, never less).
        if audit.state == ExecutionState::FailedFinal.as_str()
            && let Some(principal) = seen.principal
        {
            let now = self.clock.now_ms();
            match self
                .store
                .release_charges(&principal.tenant_id, seen.idempotency_key, now)
                .await
            {
                Ok(names) => {
                    for name in &names {
                        self.metrics.budget_released(name);
                    }
                }
                Err(e) => {
                    self.store_failure(&e);
                }
            }
        }
        let engine = self.engine.load();
        let contract = engine.tools().get(audit.tool);
        let event = AuditEvent::ledger(
            &LedgerAudit {
                tool_version: contract.map_or("", |c| c.version.as_str()),
                policy_version: engine.version(),
                ..*audit
            },
            seen.started.elapsed(),
        );
        self.metrics.ledger(
            seen.operation,
            contract.map_or(UNKNOWN_TOOL, |c| c.name.as_str()),
            outcome,
            audit.state,
        );
        // The transition is already durable in the store (or nothing was
        // written): a full audit queue is counted and logged by `record`,
        // and the answer stands.
        let _ = self.audit.record(event).await;
    }
}
