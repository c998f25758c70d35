//! The approval state machine of DESIGN §4 and §11.3 as pure rules: what
//! each store call answers and writes, given the approvals as they are.
//!
//! Two levels. The rules of one record ([`decide`], [`expire`],
//! [`consume`], [`check_use`]) take the record and say what to answer and
//! what the record becomes. The rules of a call that looks at several
//! records (the one PENDING approval of a call and the caps on PENDING
//! ones, the gateway's lookup) are methods of [`Approvals`], the whole
//! table held in memory. Every backend must answer and write exactly what
//! these rules say: the stores' differential test
//! (`store/machine_suite.rs`) runs random sequences of calls on a real
//! store and on [`Approvals`] and compares every answer and every record,
//! and the model check (`model_check.rs`) proves the rules' invariants in
//! every interleaving of executors, a gateway, approvers, expiry and
//! crashes.
//!
//! Not here: who may decide (Cedar's `decide_approval`, where the example
//! policies forbid approving one's own request), and the arguments hash an
//! approver was shown (the desk checks it before it records a decision).
//! No IO, no clock: time is an argument.

use super::{
    ApprovalDecision, ApprovalRecord, ApprovalStatus, ApprovalUse, DecideOutcome, GatewayApproval,
    NewApproval, PendingScope,
};
use crate::clock::UnixMillis;
use crate::tools::Risk;

/// The call an approval is presented for, or that looks for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    pub tenant_id: &'a str,
    pub requester_subject_id: &'a str,
    pub tool: &'a str,
    pub tool_version: &'a str,
    pub risk: Risk,
    pub arguments_sha256: &'a str,
    /// The request id the approval must be bound to; `None` for a gateway
    /// call (DESIGN §11.3), which seldom carries the same one twice.
    pub request_id: Option<&'a str>,
}

impl<'a> Call<'a> {
    /// The call `new` requests an approval for, request id included.
    #[must_use]
    pub fn of(new: &'a NewApproval) -> Self {
        Self {
            tenant_id: &new.tenant_id,
            requester_subject_id: &new.requester_subject_id,
            tool: &new.tool,
            tool_version: &new.tool_version,
            risk: new.risk,
            arguments_sha256: &new.arguments_sha256,
            request_id: Some(&new.request_id),
        }
    }

    /// The same call without its request id: a gateway's binding.
    #[must_use]
    pub fn any_request(self) -> Self {
        Self {
            request_id: None,
            ..self
        }
    }

    /// Whether `record` is bound to this call: tenant, requester, tool,
    /// tool version, risk and arguments hash, and the request id unless
    /// this is a gateway's binding.
    #[must_use]
    pub fn binds(&self, record: &ApprovalRecord) -> bool {
        record.tenant_id == self.tenant_id
            && record.requester_subject_id == self.requester_subject_id
            && record.tool == self.tool
            && record.tool_version == self.tool_version
            && record.risk == self.risk
            && record.arguments_sha256 == self.arguments_sha256
            && self.request_id.is_none_or(|id| record.request_id == id)
    }
}

/// Why a presented approval cannot be used by a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Bound to another call (`approval_mismatch`).
    Mismatch,
    /// Nobody decided yet, and it has not expired (`approval_pending`).
    Pending,
    /// Past its expiry, decided or not (`approval_expired`).
    Expired,
    /// An approver said no (`approval_rejected`).
    Rejected,
    /// Another idempotency key consumed it (`approval_consumed`).
    ConsumedByOther,
}

/// Whether a PENDING approval is still waiting at `now`.
#[must_use]
pub fn waiting(record: &ApprovalRecord, now: UnixMillis) -> bool {
    record.status == ApprovalStatus::Pending && record.expires_at > now
}

/// Whether an approval may be consumed at `now`: APPROVED and unexpired.
#[must_use]
pub fn usable(record: &ApprovalRecord, now: UnixMillis) -> bool {
    record.status == ApprovalStatus::Approved && record.expires_at > now
}

/// Whether the approval `call` presents may be used by it at `now` under
/// the idempotency key `key`: bound to the call, APPROVED, unexpired, and
/// consumed by nobody or by this key (a retry of the same operation). The
/// consumption itself is [`consume`], in the store's transaction.
///
/// # Errors
/// The [`Refusal`] the call is answered with.
pub fn check_use(
    record: &ApprovalRecord,
    call: &Call<'_>,
    key: &str,
    now: UnixMillis,
) -> Result<(), Refusal> {
    if !call.binds(record) {
        return Err(Refusal::Mismatch);
    }
    match record.status {
        ApprovalStatus::Pending if record.expires_at > now => Err(Refusal::Pending),
        ApprovalStatus::Pending | ApprovalStatus::Expired => Err(Refusal::Expired),
        ApprovalStatus::Rejected => Err(Refusal::Rejected),
        ApprovalStatus::Approved if record.expires_at <= now => Err(Refusal::Expired),
        ApprovalStatus::Approved => match &record.consumed_by_idempotency_key {
            Some(k) if k != key => Err(Refusal::ConsumedByOther),
            _ => Ok(()),
        },
    }
}

/// A decision on `record`: the record decided, or `None` when it is not
/// PENDING or has expired by `d.decided_at` (the first decision wins, and
/// nobody decides what has expired). An approval keeps its own expiry
/// when rejected; approved, it is usable until `d.approved_expires_at`.
#[must_use]
pub fn decide(record: &ApprovalRecord, d: &ApprovalDecision) -> Option<ApprovalRecord> {
    if !waiting(record, d.decided_at) {
        return None;
    }
    let mut decided = record.clone();
    decided.status = if d.approve {
        ApprovalStatus::Approved
    } else {
        ApprovalStatus::Rejected
    };
    decided.decided_by = Some(d.decided_by.clone());
    decided.decided_at = Some(d.decided_at);
    decided.reason = Some(d.reason.clone());
    if d.approve {
        decided.expires_at = d.approved_expires_at;
    }
    Some(decided)
}

/// What the expiry sweep makes of `record` at `now`: EXPIRED when it is
/// PENDING, or APPROVED and unconsumed, and its expiry has come; else
/// `None`. A consumed approval keeps its state: it records what ran.
#[must_use]
pub fn expire(record: &ApprovalRecord, now: UnixMillis) -> Option<ApprovalRecord> {
    let open = match record.status {
        ApprovalStatus::Pending => true,
        ApprovalStatus::Approved => record.consumed_by_idempotency_key.is_none(),
        ApprovalStatus::Rejected | ApprovalStatus::Expired => false,
    };
    (open && record.expires_at <= now).then(|| ApprovalRecord {
        status: ApprovalStatus::Expired,
        ..record.clone()
    })
}

/// Consuming `record` for the operation `key` at `now`: the answer, and
/// the record bound to `key` when this is the first consumption. Only an
/// APPROVED, unexpired approval is consumed, by the first key only; the
/// same key again is served again (`first: false`); another key is
/// refused, whatever the approval's state.
#[must_use]
pub fn consume(
    record: &ApprovalRecord,
    key: &str,
    now: UnixMillis,
) -> (ApprovalUse, Option<ApprovalRecord>) {
    match (&record.consumed_by_idempotency_key, usable(record, now)) {
        (Some(k), _) if k != key => (ApprovalUse::ConsumedByOther, None),
        (Some(_), true) => (ApprovalUse::Consumed { first: false }, None),
        (None, true) => (
            ApprovalUse::Consumed { first: true },
            Some(ApprovalRecord {
                consumed_by_idempotency_key: Some(key.to_owned()),
                ..record.clone()
            }),
        ),
        (_, false) => (ApprovalUse::NotUsable, None),
    }
}

/// A new PENDING approval from `new`.
#[must_use]
pub fn created(new: &NewApproval) -> ApprovalRecord {
    ApprovalRecord {
        approval_id: new.approval_id.clone(),
        tenant_id: new.tenant_id.clone(),
        requester_subject_id: new.requester_subject_id.clone(),
        agent_id: new.agent_id.clone(),
        tool: new.tool.clone(),
        tool_version: new.tool_version.clone(),
        risk: new.risk,
        arguments_sha256: new.arguments_sha256.clone(),
        display_arguments: new.display_arguments.clone(),
        request_id: new.request_id.clone(),
        status: ApprovalStatus::Pending,
        created_at: new.created_at,
        expires_at: new.expires_at,
        decided_by: None,
        decided_at: None,
        reason: None,
        consumed_by_idempotency_key: None,
        why: new.why.clone(),
    }
}

/// Every approval of a store, held in memory: the rules of the calls that
/// read more than one record. A call that fails writes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Approvals {
    /// Oldest first (`created_at`, then id), as the stores order them.
    records: Vec<ApprovalRecord>,
}

impl Approvals {
    /// Every approval, oldest first.
    #[must_use]
    pub fn records(&self) -> &[ApprovalRecord] {
        &self.records
    }

    /// The approval with this id in this tenant.
    #[must_use]
    pub fn get(&self, tenant_id: &str, approval_id: &str) -> Option<&ApprovalRecord> {
        self.records
            .iter()
            .find(|r| r.tenant_id == tenant_id && r.approval_id == approval_id)
    }

    /// One tenant's approvals in id order (`list_approvals`).
    #[must_use]
    pub fn list(&self, tenant_id: &str) -> Vec<ApprovalRecord> {
        let mut out: Vec<_> = self
            .records
            .iter()
            .filter(|r| r.tenant_id == tenant_id)
            .cloned()
            .collect();
        out.sort_by(|a, b| a.approval_id.cmp(&b.approval_id));
        out
    }

    fn position(&self, tenant_id: &str, approval_id: &str) -> Option<usize> {
        self.records
            .iter()
            .position(|r| r.tenant_id == tenant_id && r.approval_id == approval_id)
    }

    fn replace(&mut self, record: ApprovalRecord) {
        if let Some(i) = self.position(&record.tenant_id, &record.approval_id)
            && let Some(slot) = self.records.get_mut(i)
        {
            *slot = record;
        }
    }

    fn insert(&mut self, record: ApprovalRecord) {
        let at = self.records.partition_point(|r| {
            (r.created_at, &r.approval_id) <= (record.created_at, &record.approval_id)
        });
        self.records.insert(at, record);
    }

    /// Marks EXPIRED the PENDING approvals of exactly `call` whose expiry
    /// has come: a lapsed approval is no longer the one a call waits for,
    /// so the call may request a new one.
    fn lapse_pending_of(&mut self, call: &Call<'_>, now: UnixMillis) {
        for r in &mut self.records {
            if call.binds(r) && r.status == ApprovalStatus::Pending && r.expires_at <= now {
                r.status = ApprovalStatus::Expired;
            }
        }
    }

    /// `Store::pending_approval_for_call`: the PENDING, unexpired approval
    /// bound to exactly `new`'s call (the same call gets the same approval
    /// until it expires), else `new` as a PENDING approval if it fits
    /// under the caps; the flag is true when created.
    ///
    /// # Errors
    /// The cap a new approval would exceed; nothing is then written.
    pub fn pending_for_call(
        &mut self,
        new: &NewApproval,
        now: UnixMillis,
    ) -> Result<(ApprovalRecord, bool), PendingScope> {
        let mut next = self.clone();
        let answer = next.pending_lapsed_first(new, now)?;
        *self = next;
        Ok(answer)
    }

    /// [`Self::pending_for_call`], writing as it goes (the caller discards
    /// the writes of a refusal).
    fn pending_lapsed_first(
        &mut self,
        new: &NewApproval,
        now: UnixMillis,
    ) -> Result<(ApprovalRecord, bool), PendingScope> {
        let call = Call::of(new);
        self.lapse_pending_of(&call, now);
        if let Some(r) = self
            .records
            .iter()
            .find(|r| call.binds(r) && r.status == ApprovalStatus::Pending)
        {
            return Ok((r.clone(), false));
        }
        let waiting_in_tenant = || {
            self.records
                .iter()
                .filter(|r| r.tenant_id == new.tenant_id && waiting(r, now))
        };
        let subject = waiting_in_tenant()
            .filter(|r| r.requester_subject_id == new.requester_subject_id)
            .count();
        let tenant = waiting_in_tenant().count();
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        if let Some(scope) = PendingScope::exceeded(new.limits, count(subject), count(tenant)) {
            return Err(scope);
        }
        let record = created(new);
        self.insert(record.clone());
        Ok((record, true))
    }

    /// `Store::get_approval` then [`decide`], in one step
    /// (`Store::decide_approval`).
    pub fn decide(
        &mut self,
        tenant_id: &str,
        approval_id: &str,
        d: &ApprovalDecision,
    ) -> DecideOutcome {
        let Some(record) = self.get(tenant_id, approval_id).cloned() else {
            return DecideOutcome::NotFound;
        };
        match decide(&record, d) {
            Some(decided) => {
                self.replace(decided.clone());
                DecideOutcome::Decided(decided)
            }
            None => DecideOutcome::AlreadyDecided(record),
        }
    }

    /// [`consume`] of the approval with this id in this tenant
    /// (`Store::consume_approval`); one not found is not usable.
    pub fn consume(
        &mut self,
        tenant_id: &str,
        approval_id: &str,
        key: &str,
        now: UnixMillis,
    ) -> ApprovalUse {
        let Some(record) = self.get(tenant_id, approval_id) else {
            return ApprovalUse::NotUsable;
        };
        let (answer, write) = consume(record, key, now);
        if let Some(consumed) = write {
            self.replace(consumed);
        }
        answer
    }

    /// The expiry sweep (`Store::expire_due`): every approval [`expire`]
    /// marks, as marked, in id order.
    pub fn expire_due(&mut self, now: UnixMillis) -> Vec<ApprovalRecord> {
        let mut out = Vec::new();
        for r in &mut self.records {
            if let Some(expired) = expire(r, now) {
                *r = expired.clone();
                out.push(expired);
            }
        }
        out.sort_by(|a, b| a.approval_id.cmp(&b.approval_id));
        out
    }

    /// `Store::approval_for_gateway_call` (DESIGN §11.3): among the
    /// approvals bound to `new`'s call minus its request id, oldest first,
    /// the usable one `key` consumed; else the oldest usable unconsumed
    /// one, consumed by `key`; else the oldest waiting one; else the
    /// latest if it is REJECTED and unexpired; else
    /// [`Self::pending_for_call`]. First of all, like any call that may
    /// create an approval, the lapsed PENDING ones of exactly this call
    /// are marked EXPIRED.
    ///
    /// # Errors
    /// The cap a new approval would exceed; nothing is then written.
    pub fn gateway(
        &mut self,
        new: &NewApproval,
        key: &str,
        now: UnixMillis,
    ) -> Result<GatewayApproval, PendingScope> {
        let mut next = self.clone();
        let answer = next.gateway_in(new, key, now)?;
        *self = next;
        Ok(answer)
    }

    fn gateway_in(
        &mut self,
        new: &NewApproval,
        key: &str,
        now: UnixMillis,
    ) -> Result<GatewayApproval, PendingScope> {
        let call = Call::of(new);
        self.lapse_pending_of(&call, now);
        let any = call.any_request();
        // `records` is oldest first.
        let mine = || self.records.iter().filter(|r| any.binds(r));
        if let Some(record) =
            mine().find(|r| usable(r, now) && r.consumed_by_idempotency_key.as_deref() == Some(key))
        {
            return Ok(GatewayApproval::Consumed {
                record: record.clone(),
                first: false,
            });
        }
        if let Some(record) =
            mine().find(|r| usable(r, now) && r.consumed_by_idempotency_key.is_none())
        {
            let (_, consumed) = consume(record, key, now);
            if let Some(record) = consumed {
                self.replace(record.clone());
                return Ok(GatewayApproval::Consumed {
                    record,
                    first: true,
                });
            }
        }
        if let Some(record) = mine().find(|r| waiting(r, now)) {
            return Ok(GatewayApproval::Pending(record.clone()));
        }
        if let Some(latest) = mine().next_back()
            && latest.status == ApprovalStatus::Rejected
            && latest.expires_at > now
        {
            return Ok(GatewayApproval::Rejected(latest.clone()));
        }
        Ok(match self.pending_lapsed_first(new, now)? {
            (record, true) => GatewayApproval::Requested(record),
            (record, false) => GatewayApproval::Pending(record),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approvals::PendingLimits;

    fn new(id: &str, request_id: &str, now: UnixMillis) -> NewApproval {
        NewApproval {
            approval_id: id.into(),
            tenant_id: "t1".into(),
            requester_subject_id: "alice".into(),
            agent_id: "agent".into(),
            tool: "refund_order".into(),
            tool_version: "1".into(),
            risk: Risk::Financial,
            arguments_sha256: "ab".into(),
            display_arguments: "{}".into(),
            request_id: request_id.into(),
            created_at: now,
            expires_at: now + 10,
            why: crate::approvals::ApprovalWhy::default(),
            limits: PendingLimits::default(),
        }
    }

    fn decision(approve: bool, at: UnixMillis) -> ApprovalDecision {
        ApprovalDecision {
            approve,
            decided_by: "bob".into(),
            reason: "ok".into(),
            decided_at: at,
            approved_expires_at: at + 5,
        }
    }

    #[test]
    fn the_first_decision_wins_and_none_is_taken_after_expiry() {
        let pending = created(&new("a1", "r1", 0));
        let approved = decide(&pending, &decision(true, 3)).unwrap();
        assert_eq!(
            (approved.status, approved.expires_at, approved.decided_at),
            (ApprovalStatus::Approved, 8, Some(3))
        );
        assert_eq!(decide(&approved, &decision(false, 4)), None);
        let rejected = decide(&pending, &decision(false, 3)).unwrap();
        assert_eq!(
            (rejected.status, rejected.expires_at),
            (ApprovalStatus::Rejected, 10)
        );
        assert_eq!(decide(&pending, &decision(true, 10)), None);
    }

    #[test]
    fn an_approval_is_consumed_by_its_first_key_only() {
        let approved = decide(&created(&new("a1", "r1", 0)), &decision(true, 1)).unwrap();
        let (answer, used) = consume(&approved, "k1", 2);
        assert_eq!(answer, ApprovalUse::Consumed { first: true });
        let used = used.unwrap();
        assert_eq!(used.consumed_by_idempotency_key.as_deref(), Some("k1"));
        assert_eq!(
            consume(&used, "k1", 3),
            (ApprovalUse::Consumed { first: false }, None)
        );
        assert_eq!(
            consume(&used, "k2", 3),
            (ApprovalUse::ConsumedByOther, None)
        );
        // Past its expiry: the same key is no longer served, another is
        // still told it was consumed by another operation.
        assert_eq!(consume(&used, "k1", 6), (ApprovalUse::NotUsable, None));
        assert_eq!(
            consume(&used, "k2", 6),
            (ApprovalUse::ConsumedByOther, None)
        );
        assert_eq!(consume(&approved, "k1", 6), (ApprovalUse::NotUsable, None));
        // A consumed approval is never swept; an unconsumed one is, when due.
        assert_eq!(expire(&used, 100), None);
        assert_eq!(expire(&approved, 5), None);
        assert_eq!(
            expire(&approved, 6).map(|r| r.status),
            Some(ApprovalStatus::Expired)
        );
    }

    #[test]
    fn a_presented_approval_is_checked_against_the_whole_call() {
        let n = new("a1", "r1", 0);
        let approved = decide(&created(&n), &decision(true, 1)).unwrap();
        let call = Call::of(&n);
        assert_eq!(check_use(&approved, &call, "k", 2), Ok(()));
        let other_request = NewApproval {
            request_id: "r2".into(),
            ..n.clone()
        };
        assert_eq!(
            check_use(&approved, &Call::of(&other_request), "k", 2),
            Err(Refusal::Mismatch)
        );
        // A gateway's binding leaves the request id out (DESIGN §11.3).
        assert_eq!(
            check_use(&approved, &Call::of(&other_request).any_request(), "k", 2),
            Ok(())
        );
        let other_version = NewApproval {
            tool_version: "2".into(),
            ..n.clone()
        };
        assert_eq!(
            check_use(&approved, &Call::of(&other_version).any_request(), "k", 2),
            Err(Refusal::Mismatch)
        );
        assert_eq!(check_use(&approved, &call, "k", 6), Err(Refusal::Expired));
        let pending = created(&n);
        assert_eq!(check_use(&pending, &call, "k", 2), Err(Refusal::Pending));
        assert_eq!(check_use(&pending, &call, "k", 10), Err(Refusal::Expired));
        let rejected = decide(&pending, &decision(false, 1)).unwrap();
        assert_eq!(check_use(&rejected, &call, "k", 2), Err(Refusal::Rejected));
        let (_, used) = consume(&approved, "k", 2);
        assert_eq!(
            check_use(&used.unwrap(), &call, "k2", 2),
            Err(Refusal::ConsumedByOther)
        );
    }

    #[test]
    fn the_same_call_waits_for_one_approval_until_it_lapses_and_caps_refuse_without_writing() {
        let mut table = Approvals::default();
        let (a1, created1) = table.pending_for_call(&new("a1", "r1", 0), 0).unwrap();
        assert_eq!((a1.approval_id.as_str(), created1), ("a1", true));
        let (again, created2) = table.pending_for_call(&new("a2", "r1", 5), 5).unwrap();
        assert_eq!((again.approval_id.as_str(), created2), ("a1", false));
        let (a3, created3) = table.pending_for_call(&new("a3", "r1", 10), 10).unwrap();
        assert_eq!((a3.approval_id.as_str(), created3), ("a3", true));
        assert_eq!(
            table.get("t1", "a1").map(|r| r.status),
            Some(ApprovalStatus::Expired)
        );
        let capped = NewApproval {
            limits: PendingLimits {
                per_subject: 1,
                per_tenant: 5,
            },
            ..new("a4", "r2", 11)
        };
        let before = table.clone();
        assert_eq!(
            table.pending_for_call(&capped, 11),
            Err(PendingScope::Subject)
        );
        assert_eq!(table, before);
    }

    #[test]
    fn a_gateway_call_consumes_the_oldest_usable_approval_of_its_call() {
        let mut table = Approvals::default();
        table.pending_for_call(&new("a1", "r1", 0), 0).unwrap();
        table.pending_for_call(&new("a2", "r2", 1), 1).unwrap();
        // Waiting: the oldest one is named, nothing is created.
        assert_eq!(
            table.gateway(&new("g1", "g", 2), "k1", 2),
            Ok(GatewayApproval::Pending(
                table.get("t1", "a1").unwrap().clone()
            ))
        );
        table.decide("t1", "a2", &decision(true, 2));
        table.decide("t1", "a1", &decision(true, 3));
        let Ok(GatewayApproval::Consumed {
            record,
            first: true,
        }) = table.gateway(&new("g2", "g", 4), "k1", 4)
        else {
            panic!("not consumed")
        };
        assert_eq!(record.approval_id, "a1");
        let Ok(GatewayApproval::Consumed {
            record,
            first: false,
        }) = table.gateway(&new("g3", "g", 5), "k1", 5)
        else {
            panic!("not served again")
        };
        assert_eq!(record.approval_id, "a1");
        let Ok(GatewayApproval::Consumed {
            record,
            first: true,
        }) = table.gateway(&new("g4", "g", 5), "k2", 5)
        else {
            panic!("the other approval is not consumed")
        };
        assert_eq!(record.approval_id, "a2");
        // Both consumed and expired: a new approval is requested.
        let Ok(GatewayApproval::Requested(record)) = table.gateway(&new("g5", "g", 20), "k3", 20)
        else {
            panic!("nothing requested")
        };
        assert_eq!(
            (record.approval_id.as_str(), record.status),
            ("g5", ApprovalStatus::Pending)
        );
        table.decide("t1", "g5", &decision(false, 21));
        let Ok(GatewayApproval::Rejected(record)) = table.gateway(&new("g6", "g", 22), "k3", 22)
        else {
            panic!("not rejected")
        };
        assert_eq!(record.approval_id, "g5");
    }
}
