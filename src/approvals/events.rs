//! Approval events for watchers (`WatchApprovals`): created, decided,
//! expired, consumed.
//!
//! A broadcast channel: publishing never waits for a subscriber, so a slow
//! or gone watcher cannot block a decision. A watcher that falls behind by
//! more than the buffer learns it (`Lagged`) and must re-list. Events other
//! replicas cause arrive through the store's relay; when that relay may
//! have missed some, it announces a gap, and every current watcher must
//! re-list too: never a silent gap.

use std::sync::Arc;

use tokio::sync::{broadcast, watch};

use super::ApprovalRecord;

/// What happened to an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalEventKind {
    Created,
    Decided,
    Expired,
    Consumed,
}

/// Why a watch ended: after each, a UI lists again (with a fresh token
/// for [`WatchEnd::TokenExpired`]) and watches anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The caller's token reached its `exp`: a watch is no longer than its token.
    TokenExpired,
    /// The watcher fell this many events behind.
    Lagged(u64),
    /// Events from other replicas may have been missed.
    Gap,
    /// The hub is gone (the server is stopping).
    Closed,
}

/// One event, with the approval as it is after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalEvent {
    pub kind: ApprovalEventKind,
    pub approval: ApprovalRecord,
}

/// The in-process hub of approval events.
#[derive(Debug, Clone)]
pub struct ApprovalEvents {
    tx: broadcast::Sender<Arc<ApprovalEvent>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// How many gaps were announced so far.
    gaps: Arc<watch::Sender<u64>>,
}

impl ApprovalEvents {
    /// A hub that buffers `capacity` events per slow watcher.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        Self {
            tx,
            metrics: None,
            gaps: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Counts every event by the state the approval enters
    /// (`toolgate_approvals_total{state}`): every transition this replica
    /// makes is published here, so this is the one place that sees them all.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Announces an event this replica caused, and counts it;
    /// `consumed_by` fills in the consuming key for
    /// [`ApprovalEventKind::Consumed`].
    pub fn publish(
        &self,
        kind: ApprovalEventKind,
        approval: &ApprovalRecord,
        consumed_by: Option<&str>,
    ) {
        self.count(kind, approval);
        self.announce(kind, approval, consumed_by);
    }

    /// Announces an event another replica caused (and counted): watchers
    /// here see it, metrics summed over replicas count it once.
    pub fn relay(&self, kind: ApprovalEventKind, approval: &ApprovalRecord) {
        self.announce(kind, approval, None);
    }

    fn count(&self, kind: ApprovalEventKind, approval: &ApprovalRecord) {
        if let Some(m) = &self.metrics {
            m.approval_state(match kind {
                ApprovalEventKind::Created => "pending",
                ApprovalEventKind::Decided => match approval.status {
                    super::ApprovalStatus::Approved => "approved",
                    super::ApprovalStatus::Rejected => "rejected",
                    super::ApprovalStatus::Pending | super::ApprovalStatus::Expired => "decided",
                },
                ApprovalEventKind::Expired => "expired",
                ApprovalEventKind::Consumed => "consumed",
            });
        }
    }

    fn announce(
        &self,
        kind: ApprovalEventKind,
        approval: &ApprovalRecord,
        consumed_by: Option<&str>,
    ) {
        let mut approval = approval.clone();
        if let Some(key) = consumed_by {
            approval.consumed_by_idempotency_key = Some(key.to_owned());
        }
        // No subscriber is not an error: nobody is watching.
        let _ = self.tx.send(Arc::new(ApprovalEvent { kind, approval }));
    }

    /// A new watcher, seeing every event from now on.
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<ApprovalEvent>> {
        self.tx.subscribe()
    }

    /// Tells every current watcher that events may have been missed (the
    /// feed from other replicas was interrupted): each must list again.
    pub fn announce_gap(&self) {
        self.gaps.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes whenever a gap is announced after this call; take it
    /// together with [`Self::subscribe`].
    #[must_use]
    pub fn gaps(&self) -> watch::Receiver<u64> {
        self.gaps.subscribe()
    }
}

impl Default for ApprovalEvents {
    fn default() -> Self {
        Self::new(1024)
    }
}
