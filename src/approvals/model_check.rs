//! An exhaustive model check of the approval state machine (issue 18,
//! point 12) with `stateright`: one call that needs an approval, several
//! executors making it, a gateway making it without a request id, two
//! approvers deciding at once, the expiry sweep, over a bounded clock.
//!
//! The model holds no rule of its own: every step of the approvals is the
//! server's own pure rules ([`Approvals`]: `pending_for_call`, `gateway`,
//! `decide`, `consume`, `expire_due`; [`check_use`], the pipeline's check
//! of a presented approval) applied to the table as a store applies them
//! (the stores' differential test holds each backend to the same rules).
//! What the model adds is the world: executors that request an approval
//! (sometimes losing the answer), present the one they know under one of
//! two idempotency keys (the same operation retried, or another one),
//! crash at any step and restart knowing nothing; a gateway caller that
//! names no approval; approvers who approve or reject whatever they see,
//! stale views included; the sweep; time.
//!
//! Proven over every interleaving (the `always` properties):
//! - an approval is consumed by at most one idempotency key (runs under
//!   the same key, a retry of one operation, are what the ledger dedups);
//! - nothing runs on an approval that is not APPROVED and unexpired at
//!   that moment (rejected, expired or never approved);
//! - a decision once recorded never changes, and none is recorded on an
//!   approval past its expiry;
//! - at most one PENDING approval per call.
//!
//! And the model is not vacuous: the `sometimes` properties find a run
//! where an approval is approved and consumed, one where a retry with the
//! same key is served again, one where a gateway call consumes an
//! approval an executor requested, and one where the sweep expires one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use stateright::{Checker, Model, Property};

use super::machine::{Approvals, Call, check_use};
use super::{
    ApprovalDecision, ApprovalRecord, ApprovalStatus, ApprovalUse, DecideOutcome, GatewayApproval,
    NewApproval, PendingLimits,
};
use crate::tools::Risk;

/// Executors making the call.
const EXECUTORS: usize = 2;
/// Approvers deciding.
const APPROVERS: [&str; 2] = ["carol", "dave"];
/// The idempotency keys executors present approvals under.
const KEYS: [&str; 2] = ["k1", "k2"];
/// The gateway caller's idempotency key.
const GATEWAY_KEY: &str = "kg";
/// The executors' request id; the gateway's calls carry another.
const REQUEST: &str = "r1";
const GATEWAY_REQUEST: &str = "g";
/// How long a PENDING approval waits, and an APPROVED one lasts, in ticks.
const PENDING_TTL: i64 = 2;
const APPROVED_TTL: i64 = 2;
/// The most approvals ever made: with the clock's bound, what bounds the
/// state space.
const MAX_APPROVALS: u8 = 2;
/// The last tick: the clock stops here, when whatever was made or
/// approved at tick 0 is due. One tick more (with three approvals) grows
/// the space past the time the suite can give it in a debug build.
const LAST_TICK: i64 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    now: i64,
    approvals: Approvals,
    /// Approvals made so far (the next id's number).
    made: u8,
    /// The approval id each executor knows (`None`: never asked, lost the
    /// answer, or crashed and restarted).
    executors: [Option<String>; EXECUTORS],
    // ---- The world, as no party of the protocol sees it.
    /// Every (approval, key) a call ran with.
    runs: BTreeSet<(String, String)>,
    /// Each approval's decision when it was recorded: (approved, by, at).
    decisions: BTreeMap<String, (bool, String, i64)>,
    /// Set when a step broke a property that is checked at the step.
    ran_unusable: bool,
    decided_after_expiry: bool,
    decided_twice: bool,
    // ---- Coverage (what the records themselves do not show).
    served_again: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Action {
    /// Executor `e` makes the call and an approval is requested (or the
    /// pending one found). An answer lost on the way is this step then a
    /// crash.
    Request(usize),
    /// Executor `e` presents the approval it knows under `key`.
    Present { e: usize, key: &'static str },
    /// The gateway caller makes the call, naming no approval.
    Gateway,
    /// An approver decides approval `id`.
    Decide {
        approver: &'static str,
        approve: bool,
        id: String,
    },
    /// Executor `e` crashes and restarts, forgetting what it knew.
    Crash(usize),
    /// The expiry sweep.
    Sweep,
    /// Time passes.
    Tick,
}

#[derive(Debug, Clone, Copy)]
struct ApprovalModel;

/// The call, as the executors (`REQUEST`) or the gateway make it.
fn new_approval(id: String, request_id: &str, now: i64) -> NewApproval {
    NewApproval {
        approval_id: id,
        tenant_id: "acme".into(),
        requester_subject_id: "alice".into(),
        agent_id: "agent".into(),
        tool: "refund_order".into(),
        tool_version: "1".into(),
        risk: Risk::Financial,
        arguments_sha256: "aa".into(),
        display_arguments: "{}".into(),
        request_id: request_id.into(),
        created_at: now,
        expires_at: now + PENDING_TTL,
        why: crate::approvals::ApprovalWhy::default(),
        limits: PendingLimits::default(),
    }
}

fn next_id(s: &State) -> String {
    format!("a{}", s.made + 1)
}

/// Whether `record`, as it was just before a call ran with it, allowed the
/// run: APPROVED by an approver and unexpired.
fn allowed_run(record: Option<&ApprovalRecord>, s: &State) -> bool {
    record.is_some_and(|r| {
        r.status == ApprovalStatus::Approved
            && r.expires_at > s.now
            && s.decisions.get(&r.approval_id).is_some_and(|d| d.0)
    })
}

impl ApprovalModel {
    /// A call ran with approval `id` under `key`; `before` is the record
    /// as the consuming step found it.
    fn ran(s: &mut State, before: Option<&ApprovalRecord>, id: &str, key: &str, first: bool) {
        if !allowed_run(before, s) {
            s.ran_unusable = true;
        }
        if !first {
            s.served_again = true;
        }
        s.runs.insert((id.to_owned(), key.to_owned()));
    }

    /// Counts one more approval made, or refuses the step when it would
    /// exceed the model's bound.
    fn made_one(s: &mut State, created: bool) -> Option<()> {
        if created {
            if s.made >= MAX_APPROVALS {
                return None;
            }
            s.made += 1;
        }
        Some(())
    }
}

impl Model for ApprovalModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            approvals: Approvals::default(),
            made: 0,
            executors: std::array::from_fn(|_| None),
            runs: BTreeSet::new(),
            decisions: BTreeMap::new(),
            ran_unusable: false,
            decided_after_expiry: false,
            decided_twice: false,
            served_again: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (e, known) in s.executors.iter().enumerate() {
            match known {
                None => actions.push(Action::Request(e)),
                Some(_) => {
                    for key in KEYS {
                        actions.push(Action::Present { e, key });
                    }
                    actions.push(Action::Crash(e));
                }
            }
        }
        actions.push(Action::Gateway);
        // Approvers act on what they listed, maybe a while ago: any record.
        for r in s.approvals.records() {
            for approver in APPROVERS {
                for approve in [true, false] {
                    actions.push(Action::Decide {
                        approver,
                        approve,
                        id: r.approval_id.clone(),
                    });
                }
            }
        }
        actions.push(Action::Sweep);
        if s.now < LAST_TICK {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Request(e) => {
                let new = new_approval(next_id(&s), REQUEST, s.now);
                let (record, created) = s.approvals.pending_for_call(&new, s.now).ok()?;
                Self::made_one(&mut s, created)?;
                s.executors[e] = Some(record.approval_id);
            }
            Action::Present { e, key } => {
                let id = s.executors[e].clone()?;
                let new = new_approval(String::new(), REQUEST, s.now);
                let before = s.approvals.get("acme", &id).cloned();
                // The pipeline's check of the presented approval, then the
                // store's consumption.
                let checked = before
                    .as_ref()
                    .is_some_and(|r| check_use(r, &Call::of(&new), key, s.now).is_ok());
                if checked
                    && let ApprovalUse::Consumed { first } =
                        s.approvals.consume("acme", &id, key, s.now)
                {
                    Self::ran(&mut s, before.as_ref(), &id, key, first);
                }
            }
            Action::Gateway => {
                let new = new_approval(next_id(&s), GATEWAY_REQUEST, s.now);
                let answer = s.approvals.gateway(&new, GATEWAY_KEY, s.now).ok()?;
                match answer {
                    GatewayApproval::Requested(_) => Self::made_one(&mut s, true)?,
                    GatewayApproval::Consumed { record, first } => {
                        let before = last.approvals.get("acme", &record.approval_id).cloned();
                        Self::ran(
                            &mut s,
                            before.as_ref(),
                            &record.approval_id,
                            GATEWAY_KEY,
                            first,
                        );
                    }
                    GatewayApproval::Pending(_) | GatewayApproval::Rejected(_) => {}
                }
            }
            Action::Decide {
                approver,
                approve,
                id,
            } => {
                let d = ApprovalDecision {
                    approve,
                    decided_by: approver.into(),
                    reason: "looked".into(),
                    decided_at: s.now,
                    approved_expires_at: s.now + APPROVED_TTL,
                };
                let before = s.approvals.get("acme", &id).cloned();
                if let DecideOutcome::Decided(_) = s.approvals.decide("acme", &id, &d) {
                    if before.is_none_or(|r| r.expires_at <= s.now) {
                        s.decided_after_expiry = true;
                    }
                    if s.decisions.contains_key(&id) {
                        s.decided_twice = true;
                    }
                    s.decisions.insert(id, (approve, approver.into(), s.now));
                }
            }
            Action::Crash(e) => s.executors[e] = None,
            Action::Sweep => {
                s.approvals.expire_due(s.now);
            }
            Action::Tick => s.now += 1,
        }
        // The executors are alike (the same call, the same keys): which
        // one knows what does not matter, so states that differ only by
        // their order are one (a symmetry reduction; no property names an
        // executor).
        s.executors.sort();
        // A step that changes nothing (a decision refused, a sweep with
        // nothing due, a refused presentation) leads nowhere new.
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "an approval is consumed by at most one key",
                |_, s: &State| {
                    s.approvals.records().iter().all(|r| {
                        let keys: Vec<_> = s
                            .runs
                            .iter()
                            .filter(|(id, _)| *id == r.approval_id)
                            .collect();
                        keys.iter()
                            .all(|(_, k)| r.consumed_by_idempotency_key.as_ref() == Some(k))
                    })
                },
            ),
            Property::always(
                "nothing runs on a rejected, expired or never-approved approval",
                |_, s: &State| !s.ran_unusable,
            ),
            Property::always("a decision once made never changes", |_, s: &State| {
                !s.decided_twice
                    && s.approvals.records().iter().all(|r| {
                        match (s.decisions.get(&r.approval_id), r.status) {
                            (None, status) => {
                                r.decided_by.is_none()
                                    && matches!(
                                        status,
                                        ApprovalStatus::Pending | ApprovalStatus::Expired
                                    )
                            }
                            (Some((approved, by, at)), status) => {
                                r.decided_by.as_ref() == Some(by)
                                    && r.decided_at == Some(*at)
                                    && if *approved {
                                        matches!(
                                            status,
                                            ApprovalStatus::Approved | ApprovalStatus::Expired
                                        )
                                    } else {
                                        status == ApprovalStatus::Rejected
                                    }
                            }
                        }
                    })
            }),
            Property::always("no decision is accepted after expiry", |_, s: &State| {
                !s.decided_after_expiry
            }),
            Property::always("at most one pending approval per call", |_, s: &State| {
                let mut pending = BTreeMap::<&str, usize>::new();
                for r in s.approvals.records() {
                    if r.status == ApprovalStatus::Pending {
                        // Every other field of the call is the same here.
                        *pending.entry(r.request_id.as_str()).or_default() += 1;
                    }
                }
                pending.values().all(|n| *n <= 1)
            }),
            Property::sometimes("an approval is approved and consumed", |_, s: &State| {
                !s.runs.is_empty()
            }),
            Property::sometimes(
                "a retry with the same key is served again",
                |_, s: &State| s.served_again,
            ),
            Property::sometimes(
                "a gateway call consumes an executor's approval",
                |_, s: &State| {
                    s.approvals.records().iter().any(|r| {
                        r.request_id == REQUEST
                            && r.consumed_by_idempotency_key.as_deref() == Some(GATEWAY_KEY)
                    })
                },
            ),
            // Only the sweep expires a decided approval (a call lapses
            // PENDING ones only).
            Property::sometimes("the sweep expires an approved approval", |_, s: &State| {
                s.approvals
                    .records()
                    .iter()
                    .any(|r| r.status == ApprovalStatus::Expired && r.decided_by.is_some())
            }),
        ]
    }
}

#[test]
fn the_approval_state_machine_holds_its_invariants_in_every_interleaving() {
    let started = Instant::now();
    let checker = ApprovalModel.checker().spawn_bfs().join();
    checker.assert_properties();
    let (states, unique) = (checker.state_count(), checker.unique_state_count());
    eprintln!(
        "approval model: {unique} unique states ({states} visited, depth {}) in {:?}",
        checker.max_depth(),
        started.elapsed()
    );
    // The exact size of the space explored: a change of the rules or of
    // the model that changes it must be looked at, not slip by.
    assert_eq!(unique, EXPECTED_UNIQUE_STATES, "{states} visited");
}

/// The unique states the check above explores.
const EXPECTED_UNIQUE_STATES: usize = 31_770;
