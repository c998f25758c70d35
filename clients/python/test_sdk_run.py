"""`Gate.run`, the exactly-once path, against the real server: a retry, a
timeout (UNKNOWN, then reconcile), a crash of the executor process between
begin and complete (a second process resumes), a concurrent duplicate, and
an approval that a second client grants while the executor waits."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from toolgate import ApprovalState, Auth, Gate, Reconciled, RunStatus, ToolError, ToolgateError

from refund_example import ENTITIES

BOB = Auth("bob", "acme", ["support_agent"], ["orders:read", "orders:refund"], agent_id="support-bot")
SMALL = '{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}'
BIG = '{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}'
HERE = Path(__file__).resolve().parent


def operation() -> str:
    return f"sdk-{uuid.uuid4()}"


class Provider:
    """A payment provider that remembers its refunds by idempotency key: the side effects."""

    def __init__(self):
        self.refunds = {}
        self.calls = 0
        self.lock = threading.Lock()

    def refund(self, arguments, idempotency_key, deadline):
        assert deadline.remaining() > 0
        with self.lock:
            self.calls += 1
            self.refunds[idempotency_key] = {"refund_id": f"re_{self.calls}", "amount_cents": arguments["amount_cents"]}
            return self.refunds[idempotency_key]

    def find(self, idempotency_key, arguments):
        found = self.refunds.get(idempotency_key)
        return Reconciled(applied=found is not None, result=found)


def test_run_executes_once_and_a_retry_returns_the_stored_result(gate):
    provider, request_id = Provider(), operation()
    first = gate.run("refund_order", SMALL, BOB, request_id, provider.refund, entities_json=ENTITIES)
    assert first.status is RunStatus.SUCCEEDED, first
    assert first.result == {"refund_id": "re_1", "amount_cents": 2500}
    assert first.model_output == '{"amount_cents":2500,"refund_id":"re_1"}'
    # The tool got the normalized arguments, and the key it must pass on.
    assert list(provider.refunds) == [first.decision.idempotency_key]
    for _ in range(2):
        again = gate.run("refund_order", SMALL, BOB, request_id, provider.refund, entities_json=ENTITIES)
        assert again.status is RunStatus.COMPLETED, again
        assert again.result == first.result
    assert provider.calls == 1


def test_a_denied_run_never_reaches_the_tool(gate):
    provider = Provider()
    out = gate.run("refund_order", SMALL, Auth("bob", "globex", ["support_agent"], ["orders:refund"]), operation(),
                   provider.refund, entities_json=ENTITIES)
    assert out.status is RunStatus.DENIED, out
    assert json.loads(out.model_output) == {"error": {
        "code": "forbidden", "message": "the resource belongs to another tenant", "resolution": "stop",
        "retryable": False}}
    assert provider.calls == 0


def test_a_tool_failure_is_recorded_and_returned(gate):
    request_id, calls = operation(), []

    def refuse(arguments, key, deadline):
        calls.append(key)
        raise ToolError("card_expired", "the card on file expired", retryable=False)

    out = gate.run("refund_order", SMALL, BOB, request_id, refuse, entities_json=ENTITIES)
    assert out.status is RunStatus.FAILED, out
    assert (out.error.code, out.error.resolution) == ("card_expired", "stop")
    again = gate.run("refund_order", SMALL, BOB, request_id, refuse, entities_json=ENTITIES)
    assert again.status is RunStatus.FAILED, again
    assert again.error.code == "card_expired", again.error
    assert len(calls) == 1


def test_a_timeout_is_unknown_and_the_retry_reconciles_never_runs_again(gate):
    provider, request_id = Provider(), operation()
    release = threading.Event()

    def slow_refund(arguments, key, deadline):
        result = provider.refund(arguments, key, deadline)  # the money moved ...
        release.wait(10)  # ... and the answer never came back in time
        return result

    started = time.monotonic()
    # A lease of 800 ms: run stops waiting when it ends (the deadline given to the tool).
    first = gate.run("refund_order", SMALL, BOB, request_id, slow_refund, entities_json=ENTITIES, lease_ms=800)
    took = time.monotonic() - started
    release.set()
    assert first.status is RunStatus.UNKNOWN, first
    assert (first.error.code, first.error.resolution) == ("timeout_unknown", "reconcile"), first.error
    assert 0.7 < took < 3.0, took
    assert provider.calls == 1
    # Without a reconcile callback the retry is told to reconcile; it does not run.
    told = gate.run("refund_order", SMALL, BOB, request_id, slow_refund, entities_json=ENTITIES)
    assert told.status is RunStatus.RECONCILE_REQUIRED, told
    assert told.error.code == "reconcile_required", told.error
    retry = gate.run("refund_order", SMALL, BOB, request_id, slow_refund, entities_json=ENTITIES,
                     reconcile=provider.find)
    assert retry.status is RunStatus.RECONCILED, retry
    assert (retry.applied, retry.result) == (True, {"refund_id": "re_1", "amount_cents": 2500})
    again = gate.run("refund_order", SMALL, BOB, request_id, slow_refund, entities_json=ENTITIES,
                     reconcile=provider.find)
    assert again.status is RunStatus.COMPLETED, again
    assert again.result == retry.result
    assert provider.calls == 1


def test_a_tool_that_raises_timeout_error_is_unknown(gate):
    provider, request_id = Provider(), operation()

    def times_out(arguments, key, deadline):
        provider.refund(arguments, key, deadline)
        raise TimeoutError("the provider did not answer")

    first = gate.run("refund_order", SMALL, BOB, request_id, times_out, entities_json=ENTITIES)
    assert first.status is RunStatus.UNKNOWN, first
    retry = gate.run("refund_order", SMALL, BOB, request_id, times_out, entities_json=ENTITIES,
                     reconcile=provider.find)
    assert retry.status is RunStatus.RECONCILED and retry.applied, retry
    assert provider.calls == 1


def executor(addr, request_id, mode, effects):
    return subprocess.Popen(
        [sys.executable, str(HERE / "sdk_executor_process.py"), addr, request_id, mode, str(effects)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())


def test_a_crash_between_begin_and_complete_is_resumed_by_a_second_process(addr, gate, tmp_path):
    request_id, effects = operation(), tmp_path / "effects.jsonl"
    crashing = executor(addr, request_id, "crash", effects)
    try:
        wait_for_effect(crashing, effects)
    finally:
        crashing.kill()  # SIGKILL: nothing reaches CompleteExecution
        crashing.communicate(timeout=10)
    assert crashing.returncode == -9
    # A second process takes over: IN_PROGRESS while the dead one's lease lives,
    # then RECONCILE_REQUIRED; it asks the provider and records the refund.
    resumed = executor(addr, request_id, "resume", effects)
    out, err = resumed.communicate(timeout=30)
    assert resumed.returncode == 0, err
    report = json.loads(out)
    assert report["saw"][0] == "in_progress", report
    assert report["status"] == "reconciled", report
    assert report["result"] == json.loads(effects.read_text().splitlines()[0])["result"]
    assert len(effects.read_text().splitlines()) == 1  # one refund, ever
    done = gate.run("refund_order", SMALL, BOB, request_id, lambda *a: pytest.fail("ran twice"),
                    entities_json=ENTITIES)
    assert done.status is RunStatus.COMPLETED, done
    assert done.result == report["result"]


def wait_for_effect(process, effects):
    for _ in range(200):  # the refund happened: the process is between begin and complete
        if effects.exists() and effects.read_text():
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    pytest.fail("the executor never made its refund")


def test_a_late_executor_whose_call_was_settled_meanwhile_stops_with_lease_lost(addr, gate, tmp_path):
    request_id, effects = operation(), tmp_path / "effects.jsonl"
    late = executor(addr, request_id, "late", effects)
    try:
        wait_for_effect(late, effects)
        late.send_signal(signal.SIGSTOP)  # paused mid-call, past its 1 s lease
        time.sleep(1.3)
        provider = Provider()
        provider.refunds[json.loads(effects.read_text())["key"]] = {"refund_id": "re_late", "amount_cents": 2500}
        settled = gate.run("refund_order", SMALL, BOB, request_id, lambda *a: pytest.fail("ran twice"),
                           entities_json=ENTITIES, reconcile=provider.find)
        assert settled.status is RunStatus.RECONCILED and settled.applied, settled
    finally:
        late.send_signal(signal.SIGCONT)
    out, err = late.communicate(timeout=30)
    assert late.returncode == 0, err
    # Its lease is gone and someone settled the call: it stops, reporting nothing.
    assert json.loads(out) == {"status": "lease_lost", "code": "lease_lost"}
    done = gate.run("refund_order", SMALL, BOB, request_id, lambda *a: pytest.fail("ran twice"),
                    entities_json=ENTITIES)
    assert (done.status, done.result) == (RunStatus.COMPLETED, {"refund_id": "re_late", "amount_cents": 2500})


def test_a_concurrent_duplicate_never_runs_twice(addr):
    provider, request_id = Provider(), operation()
    started, release = threading.Event(), threading.Event()
    both = threading.Barrier(2)

    def slow_refund(arguments, key, deadline):
        started.set()
        release.wait(5)
        return provider.refund(arguments, key, deadline)

    outcomes = []

    def one(wait):
        with Gate(addr) as g:  # each its own connection, as two executors would be
            both.wait(5)
            outcomes.append(g.run("refund_order", SMALL, BOB, request_id, slow_refund, entities_json=ENTITIES,
                                  wait=wait))

    threads = [threading.Thread(target=one, args=(0,)) for _ in range(2)]
    for t in threads:
        t.start()
    assert started.wait(5)
    def waits():
        with Gate(addr) as g:
            outcomes.append(g.run("refund_order", SMALL, BOB, request_id, slow_refund, entities_json=ENTITIES,
                                  wait=10))

    waiting = threading.Thread(target=waits)
    waiting.start()
    time.sleep(0.3)
    release.set()
    for t in threads + [waiting]:
        t.join(15)
    statuses = sorted(o.status.value for o in outcomes)
    assert statuses == ["completed", "in_progress", "succeeded"], outcomes
    # The one that waited got the stored result; the other was told when to ask again.
    by_status = {o.status: o for o in outcomes}
    assert by_status[RunStatus.COMPLETED].result == by_status[RunStatus.SUCCEEDED].result
    assert by_status[RunStatus.IN_PROGRESS].retry_after_ms > 0
    assert provider.calls == 1


def test_an_approval_is_awaited_granted_by_a_second_client_and_runs_once(gate, approver_gate, requester_token):
    provider, request_id = Provider(), operation()
    asked = gate.run("refund_order", BIG, BOB, request_id, provider.refund, entities_json=ENTITIES)
    assert asked.status is RunStatus.APPROVAL_REQUIRED, asked
    approval_id = asked.decision.approval_id
    assert approval_id and json.loads(asked.model_output)["error"]["code"] == "approval_required"

    # The approver's UI: the pending approval is listed, shown, and approved
    # while the executor waits.
    pending = approver_gate.list_approvals(status=ApprovalState.PENDING)
    assert approval_id in [a.approval_id for a in pending.approvals]
    with pytest.raises(ToolgateError) as own:
        gate.decide(approver_gate.get_approval(approval_id), True, "mine", identity_token=requester_token)
    assert (own.value.code, own.value.grpc_status) == ("forbidden", None), own.value.error
    decided_at, waited = [], threading.Event()

    def approve():
        waited.wait(10)
        time.sleep(0.3)
        shown = approver_gate.get_approval(approval_id)
        decided_at.append(time.monotonic())
        approver_gate.decide(shown, True, "damaged in transit")

    approver = threading.Thread(target=approve)
    approver.start()
    assert gate.wait_for_approval(approval_id, 0.2, identity_token=requester_token).status is ApprovalState.PENDING
    waited.set()
    granted = gate.wait_for_approval(approval_id, 10, identity_token=requester_token)
    returned_at = time.monotonic()
    approver.join(5)
    assert granted.status is ApprovalState.APPROVED, granted
    assert granted.decided_by == "dana"
    assert returned_at >= decided_at[0]

    ran = gate.run("refund_order", BIG, BOB, request_id, provider.refund, entities_json=ENTITIES,
                   approval_id=approval_id)
    assert ran.status is RunStatus.SUCCEEDED, ran
    again = gate.run("refund_order", BIG, BOB, request_id, provider.refund, entities_json=ENTITIES,
                     approval_id=approval_id)
    assert again.status is RunStatus.COMPLETED, again
    assert provider.calls == 1
    # Once decided, waiting again returns at once.
    assert gate.wait_for_approval(approval_id, 5, identity_token=requester_token).status is ApprovalState.APPROVED
