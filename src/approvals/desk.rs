//! The approval desk (DESIGN §4): what an approval UI may read and decide.
//!
//! Every call starts from a verified identity token; the tenant comes from
//! the token, never from a request field. Reading is authorized by Cedar
//! per approval (`view_approval`): `get` refuses one the caller may not
//! view, `list` and the watch (through [`ApprovalDesk::viewable`]) leave it
//! out. Deciding is authorized by Cedar (`decide_approval` on the `Approval`
//! entity), bound to the arguments hash the approver was shown, and atomic:
//! the first decision wins. This module knows nothing of gRPC.

use std::sync::Arc;

use arc_swap::ArcSwap;

use tokio::sync::{broadcast, watch};

use crate::approvals::WatchEnd;
use crate::approvals::{
    ApprovalEvent, ApprovalEventKind, ApprovalEvents, ApprovalRecord, ApprovalStatus,
};
use crate::audit::{ApprovalAudit, Audit, AuditEvent};
use crate::clock::{Clock, UnixMillis};
use crate::envelope::{Envelope, ErrorCode};
use crate::identity::{Caller, IdentityVerifier};
use crate::metrics::Metrics;
use crate::policy::{DecideError, PolicyDecision, PolicyEngine};
use crate::store::{ApprovalDecision, DecideOutcome, Store, StoreError};

/// The default page size and the most one page may hold.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// Why a desk call failed; each maps to one envelope code.
#[derive(Debug, Clone, PartialEq)]
pub struct DeskError(pub Envelope);

/// Everything an [`ApprovalDesk`] needs; none of it has a default.
#[derive(Debug)]
pub(crate) struct ApprovalDeskParts {
    pub engine: Arc<ArcSwap<PolicyEngine>>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    /// Verifies approvers' tokens; `None` refuses every call.
    pub verifier: Option<Arc<dyn IdentityVerifier>>,
    /// Where this desk's changes are announced, and watchers subscribe.
    pub events: Arc<ApprovalEvents>,
    /// Records every approval decision.
    pub audit: Arc<Audit>,
    /// Counts approval decisions and store errors.
    pub metrics: Arc<Metrics>,
    /// Open watches per verified subject and tenant (`[limits]
    /// max_watches_per_caller`).
    pub max_watches_per_caller: usize,
}

/// The approval desk.
#[derive(Debug)]
pub struct ApprovalDesk {
    engine: Arc<ArcSwap<PolicyEngine>>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    verifier: Option<Arc<dyn IdentityVerifier>>,
    events: Arc<ApprovalEvents>,
    audit: Arc<Audit>,
    metrics: Arc<Metrics>,
    watches: Arc<WatchCounts>,
}

/// The open watches of each caller (tenant, subject), and the cap.
#[derive(Debug)]
struct WatchCounts {
    cap: usize,
    open: std::sync::Mutex<std::collections::HashMap<(String, String), usize>>,
}

/// One open watch of a caller, counted until it is dropped (when the
/// watch's task ends, whatever ended it).
#[derive(Debug)]
pub struct WatchSlot {
    counts: Arc<WatchCounts>,
    key: (String, String),
    _gauge: crate::metrics::WatchGuard,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let Ok(mut open) = self.counts.open.lock() else {
            return;
        };
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// One page of approvals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalPage {
    pub approvals: Vec<ApprovalRecord>,
    /// The opaque token of the next page; empty at the end.
    pub next_page_token: String,
}

impl ApprovalDesk {
    /// A desk wired as production wires it (see [`crate::server`], its
    /// one caller outside unit tests); without a verifier every call is
    /// `unauthorized` (fail closed).
    #[must_use]
    pub(crate) fn new(parts: ApprovalDeskParts) -> Self {
        let ApprovalDeskParts {
            engine,
            store,
            clock,
            verifier,
            events,
            audit,
            metrics,
            max_watches_per_caller,
        } = parts;
        Self {
            engine,
            store,
            clock,
            verifier,
            events,
            audit,
            metrics,
            watches: Arc::new(WatchCounts {
                cap: max_watches_per_caller,
                open: std::sync::Mutex::default(),
            }),
        }
    }

    /// Counts one open watch of `caller` until the slot is dropped; refused
    /// when the caller (its subject in its tenant) already has the most
    /// open watches allowed. Others' watches are not touched.
    ///
    /// # Errors
    /// `rate_limited` (gRPC `RESOURCE_EXHAUSTED`) over the cap.
    pub fn watch_opened(&self, caller: &Caller) -> Result<WatchSlot, DeskError> {
        let key = (caller.tenant_id.clone(), caller.subject_id.clone());
        let mut open = self
            .watches
            .open
            .lock()
            .map_err(|_| DeskError(Envelope::new(ErrorCode::InternalError, "watch counts")))?;
        let n = open.entry(key.clone()).or_insert(0);
        if *n >= self.watches.cap {
            self.metrics.approval_view_refused("watch", "rate_limited");
            return Err(DeskError(
                Envelope::new(
                    ErrorCode::RateLimited,
                    "this caller has the most open approval watches allowed; close one first",
                )
                .with("limit", "max_watches_per_caller"),
            ));
        }
        *n += 1;
        Ok(WatchSlot {
            counts: Arc::clone(&self.watches),
            key,
            _gauge: self.metrics.approval_watch_opened(),
        })
    }

    /// The events hub watchers subscribe to.
    #[must_use]
    pub fn events(&self) -> &Arc<ApprovalEvents> {
        &self.events
    }

    /// A watch of the approvals of the token's tenant that its caller may
    /// view: every door that streams approval events (`WatchApprovals`, the
    /// console's live queue) reads them through one of these, so each sees
    /// the same events, filtered by the same Cedar question.
    ///
    /// The watch counts against its caller's open watches
    /// ([`Self::watch_opened`]) until it is dropped.
    ///
    /// # Errors
    /// `unauthorized`, as [`ApprovalDesk::authenticate`]; `rate_limited`
    /// over the caller's cap of open watches.
    pub async fn watch(self: &Arc<Self>, token: &str) -> Result<ApprovalWatch, DeskError> {
        let (caller, valid_for) = self.authenticate_fresh(token).await?;
        // Counted before anything is subscribed: a watch over the cap is
        // refused, and the caller's other watches keep running.
        let open = self.watch_opened(&caller)?;
        // The gap signal first, then the events: a gap announced between
        // the two is seen, never missed.
        let gaps = self.events.gaps();
        let events = self.events.subscribe();
        Ok(ApprovalWatch {
            desk: Arc::clone(self),
            _open: open,
            ends_at: tokio::time::Instant::now() + valid_for,
            caller,
            events,
            gaps,
        })
    }

    /// The verified caller of a token.
    ///
    /// # Errors
    /// `unauthorized` for any token that does not verify, or when no key set is configured.
    pub fn authenticate(&self, token: &str) -> Result<Caller, DeskError> {
        self.authenticate_until(token).map(|(caller, _)| caller)
    }

    /// The verified caller of a token, and how long the token stays valid
    /// from now (zero once its `exp` has passed, within the verifier's
    /// leeway): a watch ends then.
    ///
    /// # Errors
    /// `unauthorized`, as [`ApprovalDesk::authenticate`].
    pub fn authenticate_until(
        &self,
        token: &str,
    ) -> Result<(Caller, std::time::Duration), DeskError> {
        let Some(verifier) = &self.verifier else {
            return Err(unauthorized(
                "no identity key set is configured (--jwks-file)",
            ));
        };
        let verified = verifier.verify_with_expiry(token, self.clock.now_ms().div_euclid(1000));
        self.valid_for(verified)
    }

    /// The verified caller and how long its token stays valid from now, or
    /// the token's refusal as `unauthorized`.
    fn valid_for(
        &self,
        verified: Result<(Caller, i64), &'static str>,
    ) -> Result<(Caller, std::time::Duration), DeskError> {
        let (caller, exp) = verified.map_err(|reason| {
            DeskError(
                Envelope::new(ErrorCode::Unauthorized, "the identity token is not valid")
                    .with("reason", reason),
            )
        })?;
        let left_ms = exp
            .saturating_mul(1000)
            .saturating_sub(self.clock.now_ms())
            .max(0);
        let left = std::time::Duration::from_millis(u64::try_from(left_ms).unwrap_or(0));
        Ok((caller, left))
    }

    /// [`Self::authenticate_until`] that waits (bounded) for the key-set
    /// fetch a token's unknown key asks for: a key the identity provider
    /// published just now verifies on its first token.
    ///
    /// # Errors
    /// `unauthorized`, as [`ApprovalDesk::authenticate`].
    pub async fn authenticate_fresh(
        &self,
        token: &str,
    ) -> Result<(Caller, std::time::Duration), DeskError> {
        let Some(verifier) = &self.verifier else {
            return Err(unauthorized(
                "no identity key set is configured (--jwks-file)",
            ));
        };
        let clock = Arc::clone(&self.clock);
        let now = move || clock.now_ms().div_euclid(1000);
        let verified = verifier.verify_fresh(token, &now).await;
        self.valid_for(verified)
    }

    /// One approval of the caller's tenant, if Cedar lets the caller view it.
    ///
    /// # Errors
    /// `unauthorized`, `approval_not_found`, `forbidden` (Cedar's
    /// `view_approval` refuses this caller), `policy_error`, or `internal_error`.
    pub async fn get(&self, token: &str, approval_id: &str) -> Result<ApprovalRecord, DeskError> {
        let (caller, _) = self.authenticate_fresh(token).await?;
        let record = self
            .store
            .get_approval(&caller.tenant_id, approval_id)
            .await
            .map_err(|e| self.store_failure(&e))?
            .ok_or_else(not_found)?;
        match self.view_refusal(&caller, &record, "get") {
            None => Ok(record),
            Some(refusal) => Err(DeskError(refusal)),
        }
    }

    /// Whether `caller` may view `record` (Cedar's `view_approval`, on the
    /// live policies); a refusal is counted. The watch asks it per event.
    #[must_use]
    pub fn viewable(&self, caller: &Caller, record: &ApprovalRecord, call: &'static str) -> bool {
        self.view_refusal(caller, record, call).is_none()
    }

    /// Why `caller` may not view `record`, or `None`: one Cedar evaluation,
    /// no store read. Fails closed (see [`viewer_refusal`]).
    fn view_refusal(
        &self,
        caller: &Caller,
        record: &ApprovalRecord,
        call: &'static str,
    ) -> Option<Envelope> {
        let decision = self.engine.load().view_approval(caller, &record.subject());
        let refusal = viewer_refusal(&decision)?;
        self.metrics
            .approval_view_refused(call, refusal.code.as_str());
        Some(refusal)
    }

    /// A page of the caller's tenant's approvals, optionally of one status,
    /// holding only those the caller may view (`view_approval`, one
    /// evaluation per record read). The page is cut from the store before
    /// the filter, so a page may hold fewer than `page_size` approvals, or
    /// none, and still have a next page: pass `next_page_token` back until
    /// it is empty.
    ///
    /// # Errors
    /// `unauthorized`, `invalid_arguments` for a bad page token, `internal_error`.
    pub async fn list(
        &self,
        token: &str,
        status: Option<ApprovalStatus>,
        page_size: usize,
        page_token: &str,
    ) -> Result<ApprovalPage, DeskError> {
        let (caller, _) = self.authenticate_fresh(token).await?;
        let limit = if page_size == 0 {
            DEFAULT_PAGE
        } else {
            page_size.min(MAX_PAGE)
        };
        let after = if page_token.is_empty() {
            None
        } else {
            let bytes = hex::decode(page_token).map_err(|_| bad_page_token())?;
            Some(String::from_utf8(bytes).map_err(|_| bad_page_token())?)
        };
        // One more than asked tells whether there is a next page.
        let mut approvals = self
            .store
            .list_approvals(&caller.tenant_id, status, after, limit + 1)
            .await
            .map_err(|e| self.store_failure(&e))?;
        let next_page_token = if approvals.len() > limit {
            approvals.truncate(limit);
            approvals
                .last()
                .map(|a| hex::encode(a.approval_id.as_bytes()))
                .unwrap_or_default()
        } else {
            String::new()
        };
        approvals.retain(|record| self.viewable(&caller, record, "list"));
        Ok(ApprovalPage {
            approvals,
            next_page_token,
        })
    }

    /// Records an approver's verdict.
    ///
    /// # Errors
    /// `unauthorized`, `approval_not_found`, `approval_mismatch` (the hash
    /// shown differs), `forbidden` (Cedar refuses this approver),
    /// `approval_already_decided`, `approval_expired`, `policy_error`, `internal_error`.
    pub async fn decide(
        &self,
        token: &str,
        approval_id: &str,
        approve: bool,
        arguments_sha256: &str,
        reason: &str,
        peer: &str,
    ) -> Result<ApprovalRecord, DeskError> {
        let started = std::time::Instant::now();
        let verdict = if approve { "approve" } else { "reject" };
        let mut approver = None;
        let mut found = None;
        let result = self
            .decide_as(
                token,
                approval_id,
                approve,
                arguments_sha256,
                reason,
                &mut approver,
                &mut found,
            )
            .await;
        let outcome = match &result {
            Ok(r) if r.status == ApprovalStatus::Approved => "approved",
            Ok(_) => "rejected",
            Err(DeskError(e)) => e.code.as_str(),
        };
        self.metrics.approval_decision(outcome);
        let record = result.as_ref().ok().or(found.as_ref());
        let event = AuditEvent::approval_decision(
            ApprovalAudit {
                approval_id,
                record: record.map(ApprovalRecord::audited),
                verdict,
                policy_version: self.engine.load().version(),
                peer,
            },
            approver.as_ref(),
            outcome,
            started.elapsed(),
        );
        // The decision is already durable in the store: a full audit queue
        // is counted and logged by `record`, and the answer stands.
        let _ = self.audit.record(event).await;
        result
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the audit needs what the decision saw, even when it fails part way"
    )]
    async fn decide_as(
        &self,
        token: &str,
        approval_id: &str,
        approve: bool,
        arguments_sha256: &str,
        reason: &str,
        approver_seen: &mut Option<Caller>,
        record_seen: &mut Option<ApprovalRecord>,
    ) -> Result<ApprovalRecord, DeskError> {
        let (approver, _) = self.authenticate_fresh(token).await?;
        *approver_seen = Some(approver.clone());
        let now = self.clock.now_ms();
        let record = self
            .store
            .get_approval(&approver.tenant_id, approval_id)
            .await
            .map_err(|e| self.store_failure(&e))?
            .ok_or_else(not_found)?;
        *record_seen = Some(record.clone());
        // Whether this approver may decide comes first: one who may not
        // learns nothing about the approval's arguments or state.
        let engine = self.engine.load_full();
        let verdict = if approve { "approve" } else { "reject" };
        let decision = engine.decide_approval(&approver, &record.subject(), verdict);
        if let Some(refusal) = approver_refusal(&decision) {
            return Err(DeskError(refusal));
        }
        if record.arguments_sha256 != arguments_sha256 {
            return Err(DeskError(
                Envelope::new(
                    ErrorCode::ApprovalMismatch,
                    "the arguments shown are not the arguments of this approval",
                )
                .with("approval_id", record.approval_id.clone()),
            ));
        }
        if let Some(e) = already(&record, now) {
            return Err(e);
        }
        let ttl_seconds = engine
            .tools()
            .get(&record.tool)
            .map_or(900, |t| t.approval_ttl_seconds);
        let ttl_ms = i64::try_from(ttl_seconds)
            .unwrap_or(i64::MAX / 1000)
            .saturating_mul(1000);
        let decision = ApprovalDecision {
            approve,
            decided_by: approver.subject_id.clone(),
            reason: reason.chars().take(1000).collect(),
            decided_at: now,
            approved_expires_at: now.saturating_add(ttl_ms),
        };
        match self
            .store
            .decide_approval(&approver.tenant_id, approval_id, decision)
            .await
        {
            Ok(DecideOutcome::Decided(r)) => {
                self.events.publish(ApprovalEventKind::Decided, &r, None);
                Ok(r)
            }
            Ok(DecideOutcome::AlreadyDecided(r)) => {
                Err(already(&r, now).unwrap_or_else(|| decided_error(&r)))
            }
            Ok(DecideOutcome::NotFound) => Err(not_found()),
            Err(e) => Err(self.store_failure(&e)),
        }
    }

    fn store_failure(&self, e: &StoreError) -> DeskError {
        self.metrics.store_error();
        tracing::error!(error = %e, "store failure on the approval desk");
        DeskError(Envelope::new(
            ErrorCode::InternalError,
            "the approval store failed; retry",
        ))
    }

    /// Marks due approvals EXPIRED and announces them.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    pub async fn expire_due(&self) -> Result<usize, StoreError> {
        let expired = self
            .store
            .expire_due(self.clock.now_ms())
            .await
            .inspect_err(|_| self.metrics.store_error())?;
        for r in &expired {
            self.events.publish(ApprovalEventKind::Expired, r, None);
        }
        Ok(expired.len())
    }
}

/// An open watch of one caller's approval events (see [`ApprovalDesk::watch`]).
/// It is counted as open (`toolgate_approval_watches`) until dropped.
#[derive(Debug)]
pub struct ApprovalWatch {
    desk: Arc<ApprovalDesk>,
    _open: WatchSlot,
    ends_at: tokio::time::Instant,
    caller: Caller,
    events: broadcast::Receiver<Arc<ApprovalEvent>>,
    gaps: watch::Receiver<u64>,
}

impl ApprovalWatch {
    /// The verified caller the watch runs as.
    #[must_use]
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The next event of the caller's tenant that the caller may view
    /// (`view_approval`, one evaluation per event of its tenant, on the live
    /// policies), or why the watch is over. A slow watcher only fills its
    /// own queue: the hub is a broadcast, so nobody else waits for it.
    ///
    /// # Errors
    /// [`WatchEnd`]: the watch is over; every later call says so again.
    pub async fn next(&mut self) -> Result<Arc<ApprovalEvent>, WatchEnd> {
        loop {
            let event = tokio::select! {
                received = self.events.recv() => match received {
                    Ok(event) => event,
                    Err(broadcast::error::RecvError::Lagged(n)) => return Err(WatchEnd::Lagged(n)),
                    Err(broadcast::error::RecvError::Closed) => return Err(WatchEnd::Closed),
                },
                () = tokio::time::sleep_until(self.ends_at) => return Err(WatchEnd::TokenExpired),
                changed = self.gaps.changed() => {
                    return Err(if changed.is_ok() { WatchEnd::Gap } else { WatchEnd::Closed });
                }
            };
            if event.approval.tenant_id == self.caller.tenant_id
                && self.desk.viewable(&self.caller, &event.approval, "watch")
            {
                return Ok(event);
            }
        }
    }
}

/// Why Cedar's answer to `decide_approval` refuses the approver, or `None`
/// when it permits them. Fails closed: an evaluation error or an
/// unevaluable request refuses.
#[must_use]
pub fn approver_refusal(decision: &Result<PolicyDecision, DecideError>) -> Option<Envelope> {
    refusal(
        decision,
        "decide_approval",
        "this approver may not decide this approval",
    )
}

/// Why Cedar's answer to `view_approval` refuses the caller, or `None` when
/// it permits them. Fails closed: no permit (no view policy at all
/// included), an evaluation error or an unevaluable request refuses.
#[must_use]
pub fn viewer_refusal(decision: &Result<PolicyDecision, DecideError>) -> Option<Envelope> {
    refusal(
        decision,
        "view_approval",
        "this caller may not view this approval",
    )
}

/// The one mapping of Cedar's answer on the `Approval` entity to a refusal:
/// a deny is `forbidden` with the policy's `@reason` (else `default`).
fn refusal(
    decision: &Result<PolicyDecision, DecideError>,
    action: &'static str,
    default: &'static str,
) -> Option<Envelope> {
    match decision {
        Ok(PolicyDecision::Allow { .. }) => None,
        Ok(PolicyDecision::Deny { reason, .. }) => {
            let message = reason.clone().unwrap_or_else(|| default.to_owned());
            Some(Envelope::new(ErrorCode::Forbidden, message))
        }
        Ok(PolicyDecision::Errored { policies }) => {
            tracing::warn!(action, policies = ?policies, "approval policy error: refused (fail closed)");
            Some(Envelope::new(
                ErrorCode::PolicyError,
                "a policy could not be evaluated",
            ))
        }
        Ok(PolicyDecision::ApprovalRequired { .. }) | Err(_) => Some(Envelope::new(
            ErrorCode::InternalError,
            "the decision could not be evaluated",
        )),
    }
}

/// The error for a record that can no longer be decided, if it cannot.
fn already(record: &ApprovalRecord, now: UnixMillis) -> Option<DeskError> {
    match record.status {
        ApprovalStatus::Pending if record.expires_at > now => None,
        ApprovalStatus::Pending | ApprovalStatus::Expired => Some(DeskError(
            Envelope::new(ErrorCode::ApprovalExpired, "the approval has expired")
                .with("approval_id", record.approval_id.clone()),
        )),
        ApprovalStatus::Approved | ApprovalStatus::Rejected => Some(decided_error(record)),
    }
}

fn decided_error(record: &ApprovalRecord) -> DeskError {
    DeskError(
        Envelope::new(
            ErrorCode::ApprovalAlreadyDecided,
            "the approval was already decided",
        )
        .with("approval_id", record.approval_id.clone())
        .with("status", record.status.as_str()),
    )
}

fn unauthorized(reason: &'static str) -> DeskError {
    DeskError(
        Envelope::new(ErrorCode::Unauthorized, "the identity token is not valid")
            .with("reason", reason),
    )
}

fn not_found() -> DeskError {
    DeskError(Envelope::new(
        ErrorCode::ApprovalNotFound,
        "no such approval",
    ))
}

fn bad_page_token() -> DeskError {
    DeskError(
        Envelope::new(ErrorCode::InvalidArguments, "the page token is not valid")
            .with("reason", "bad_page_token"),
    )
}
