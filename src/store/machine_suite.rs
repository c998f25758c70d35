//! The differential check of a backend's approvals against the pure rules
//! of [`crate::approvals::machine`]: seeded random sequences of calls
//! (requests for approvals, gateway lookups, decisions, consumptions,
//! expiry sweeps, reads, clock steps) run on the backend and on an
//! [`Approvals`] table in memory; every answer and every record must be
//! the same. A store whose SQL drifts from the rules fails here with the
//! seed and the step that disagreed.

use super::suite::Backend;
use super::{ApprovalDecision, Store, StoreError};
use crate::approvals::machine::Approvals;
use crate::approvals::{ApprovalRecord, ApprovalStatus, NewApproval, PendingLimits, PendingScope};
use crate::clock::UnixMillis;
use crate::tools::Risk;

/// Sequences run, each on a tenant of its own.
pub const SEQUENCES: u64 = 150;
/// Calls per sequence.
pub const STEPS: usize = 24;
/// Far beyond every sequence's clock: the closing sweep's time.
const FAR: UnixMillis = 1_000_000_000;

/// splitmix64: a small, seeded, reproducible generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        let i = usize::try_from(self.below(from.len() as u64)).unwrap();
        from[i]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// One sequence's world: its tenant, clock and the ids it made.
struct Sequence {
    seed: u64,
    tenant: String,
    /// A tenant with no approvals of this sequence: where every id is
    /// not found.
    stranger: String,
    now: UnixMillis,
    ids: Vec<String>,
    limits: PendingLimits,
}

/// The approval ids of one backend's run, unique across its sequences and
/// sorting as they are made in any collation (fixed width, letters and
/// digits only).
struct Ids(u64);

impl Ids {
    fn fresh(&mut self) -> String {
        self.0 += 1;
        format!("a{:07}", self.0)
    }
}

impl Sequence {
    fn new_approval(&self, rng: &mut Rng, id: String) -> NewApproval {
        NewApproval {
            approval_id: id,
            tenant_id: self.tenant.clone(),
            requester_subject_id: rng.pick(&["alice", "bob"]).into(),
            agent_id: "agent".into(),
            tool: "refund_order".into(),
            tool_version: if rng.chance(10) { "2" } else { "1" }.into(),
            risk: if rng.chance(10) {
                Risk::Write
            } else {
                Risk::Financial
            },
            arguments_sha256: rng.pick(&["aa", "bb"]).into(),
            display_arguments: r#"{"amount":5}"#.into(),
            request_id: rng.pick(&["r1", "r2", "r3"]).into(),
            created_at: self.now,
            expires_at: self.now + 2 + i64::try_from(rng.below(8)).unwrap(),
            why: crate::approvals::ApprovalWhy::default(),
            limits: self.limits,
        }
    }

    /// An id this sequence made (created or refused), or one nobody made.
    fn some_id(&self, rng: &mut Rng) -> String {
        if self.ids.is_empty() || rng.chance(5) {
            return "a-none".into();
        }
        let i = usize::try_from(rng.below(self.ids.len() as u64)).unwrap();
        self.ids[i].clone()
    }

    /// This sequence's tenant, now and then another.
    fn tenant(&self, rng: &mut Rng) -> String {
        if rng.chance(5) {
            self.stranger.clone()
        } else {
            self.tenant.clone()
        }
    }
}

/// A cap refusal as the rules say it; any other store failure fails the
/// test.
fn capped<T>(answer: Result<T, StoreError>, at: &str) -> Result<T, PendingScope> {
    match answer {
        Ok(v) => Ok(v),
        Err(StoreError::PendingLimit(scope)) => Err(scope),
        Err(e) => panic!("{at}: the store failed: {e}"),
    }
}

/// One step of a sequence on both sides; panics where they disagree.
async fn step(
    store: &dyn Store,
    rules: &mut Approvals,
    seq: &mut Sequence,
    ids: &mut Ids,
    rng: &mut Rng,
    at: &str,
) {
    match rng.below(100) {
        0..=21 => {
            let new = seq.new_approval(rng, ids.fresh());
            seq.ids.push(new.approval_id.clone());
            let expected = rules.pending_for_call(&new, seq.now);
            let got = capped(store.pending_approval_for_call(new, seq.now).await, at);
            assert_eq!(got, expected, "{at}: pending_approval_for_call");
        }
        22..=37 => {
            let new = seq.new_approval(rng, ids.fresh());
            seq.ids.push(new.approval_id.clone());
            let key = rng.pick(&["k1", "k2", "k3"]);
            let expected = rules.gateway(&new, key, seq.now);
            let got = capped(store.approval_for_gateway_call(new, key, seq.now).await, at);
            assert_eq!(got, expected, "{at}: approval_for_gateway_call");
        }
        38..=59 => {
            let (tenant, id) = (seq.tenant(rng), seq.some_id(rng));
            let d = ApprovalDecision {
                approve: rng.chance(70),
                decided_by: rng.pick(&["carol", "dave"]).into(),
                reason: "looked at it".into(),
                decided_at: seq.now,
                approved_expires_at: seq.now + 1 + i64::try_from(rng.below(6)).unwrap(),
            };
            let expected = rules.decide(&tenant, &id, &d);
            let got = store.decide_approval(&tenant, &id, d).await.unwrap();
            assert_eq!(got, expected, "{at}: decide_approval {id}");
        }
        60..=77 => {
            let (tenant, id) = (seq.tenant(rng), seq.some_id(rng));
            let key = rng.pick(&["k1", "k2", "k3"]);
            let expected = rules.consume(&tenant, &id, key, seq.now);
            let got = store
                .consume_approval(&tenant, &id, key, seq.now)
                .await
                .unwrap();
            assert_eq!(got, expected, "{at}: consume_approval {id} {key}");
        }
        78..=85 => {
            let expected = rules.expire_due(seq.now);
            let mut got = store.expire_due(seq.now).await.unwrap();
            // The order of a sweep's answer is not part of the contract.
            got.sort_by(|a, b| a.approval_id.cmp(&b.approval_id));
            assert_eq!(got, expected, "{at}: expire_due");
        }
        86..=89 => {
            let (tenant, id) = (seq.tenant(rng), seq.some_id(rng));
            let expected = rules.get(&tenant, &id).cloned();
            let got = store.get_approval(&tenant, &id).await.unwrap();
            assert_eq!(got, expected, "{at}: get_approval {id}");
        }
        _ => seq.now += 1 + i64::try_from(rng.below(4)).unwrap(),
    }
}

/// Every record of `tenant` is the same on both sides.
async fn same_records(store: &dyn Store, rules: &Approvals, tenant: &str, at: &str) {
    let got = store
        .list_approvals(tenant, None, None, 10_000)
        .await
        .unwrap();
    assert_eq!(got, rules.list(tenant), "{at}: the records differ");
}

/// [`SEQUENCES`] seeded sequences of [`STEPS`] calls, each on its own
/// tenant of one database, on the backend and on the pure rules: every
/// answer, and every record after each sequence, is the same. Each
/// sequence ends with a sweep far in the future (compared too), after
/// which none of its approvals can change, so the next sequence's sweeps
/// see only its own.
pub async fn approvals_follow_the_pure_rules(backend: &dyn Backend) {
    let store = &*backend.open().await;
    let mut rules = Approvals::default();
    let mut ids = Ids(0);
    let mut answers = 0usize;
    for seed in 0..SEQUENCES {
        let mut rng = Rng(seed);
        let mut seq = Sequence {
            seed,
            tenant: format!("s{seed}"),
            stranger: format!("s{seed}x"),
            now: 1_000,
            ids: Vec::new(),
            limits: PendingLimits {
                per_subject: if rng.chance(50) { 2 } else { 100 },
                per_tenant: if rng.chance(50) { 3 } else { 1_000 },
            },
        };
        for i in 0..STEPS {
            let at = format!("seed {} step {i}", seq.seed);
            step(store, &mut rules, &mut seq, &mut ids, &mut rng, &at).await;
            answers += 1;
        }
        let at = format!("seed {seed} end");
        same_records(store, &rules, &seq.tenant, &at).await;
        same_records(store, &rules, &seq.stranger, &at).await;
        let expected = rules.expire_due(FAR);
        let mut got = store.expire_due(FAR).await.unwrap();
        got.sort_by(|a, b| a.approval_id.cmp(&b.approval_id));
        assert_eq!(got, expected, "{at}: the closing sweep");
        same_records(store, &rules, &seq.tenant, &at).await;
    }
    // The sequences reach every kind of record (not a vacuous run): the
    // exact counts of these seeds, the same on every backend.
    let records = rules.records();
    let count = |f: &dyn Fn(&ApprovalRecord) -> bool| records.iter().filter(|r| f(r)).count();
    let consumed = count(&|r| r.consumed_by_idempotency_key.is_some());
    let rejected = count(&|r| r.status == ApprovalStatus::Rejected);
    let approved_then_expired =
        count(&|r| r.status == ApprovalStatus::Expired && r.decided_by.is_some());
    eprintln!(
        "approvals vs the pure rules: {SEQUENCES} sequences, {answers} steps, {} approvals \
         ({consumed} consumed, {rejected} rejected, {approved_then_expired} approved then expired)",
        records.len()
    );
    assert_eq!(
        (records.len(), consumed, rejected, approved_then_expired),
        (855, 80, 91, 132)
    );
}
