"""The Python executor test: the README refund example against a real server,
through to a human approving the large refund on a second client, and the
refund run through the execution ledger: once per operation, even when the
first attempt times out after the money moved.

Ordinary pytest tests (the fixtures, and the environment they need, are in
conftest.py), run by the Rust integration test
`python::the_python_executor_runs_the_refund_example` with
`python -m pytest clients/python`.
"""

import hashlib
import json

import grpc
import pytest
import rfc8785

import approver_example
import refund_example

BIG_REFUND = {"order_id": "ord_1001", "amount_cents": 25000, "currency": "USD", "reason": "damaged"}


def test_allowed_refund_and_independent_idempotency_key(stub, pb, common):
    r = refund_example.run(stub, pb, common)
    assert r.decision == pb.DECISION_ALLOW, r
    assert r.normalized_arguments == '{"amount_cents":2500,"currency":"USD","order_id":"ord_1001","reason":"late"}'
    args = json.loads(r.normalized_arguments)
    assert r.arguments_sha256 == hashlib.sha256(rfc8785.dumps(args)).hexdigest()
    key = {"arguments": args, "request_id": "refund-ord_1001-1", "subject_id": "bob",
           "tenant_id": "acme", "tool_name": "refund_order"}
    assert r.idempotency_key == "refund_order:" + hashlib.sha256(rfc8785.dumps(key)).hexdigest(), r.idempotency_key
    assert r.conflict_key == "acme:Order:ord_1001"


def test_allowed_read(stub, pb, common):
    r = stub.Authorize(pb.AuthorizeRequest(
        tool="get_order", arguments=b'{"order_id":"ord_1001"}',
        auth=common.AuthContext(subject_id="bob", tenant_id="acme", roles=["support_agent"], scopes=["orders:read"]),
        entities_json=refund_example.ENTITIES), timeout=5)
    assert r.decision == pb.DECISION_ALLOW, r
    assert r.risk == common.RISK_LEVEL_READ


def test_schema_violation(stub, pb, common):
    r = refund_example.authorize_refund(
        stub, pb, common, b'{"order_id":"ord_1001","amount_cents":"2500","currency":"USD","reason":"late"}', "refund-2")
    assert r.decision == pb.DECISION_DENY
    assert r.error.code == "schema_violation", r.error
    assert r.error.resolution == "repair_arguments"
    details = json.loads(r.error.details_json)
    assert details["violations"][0]["pointer"] == "/amount_cents"
    assert json.loads(r.model_output)["error"]["code"] == "schema_violation"


def test_cross_tenant_deny(stub, pb, common):
    r = refund_example.authorize_refund(
        stub, pb, common, b'{"order_id":"ord_1001","amount_cents":100,"currency":"USD","reason":"late"}', "refund-3",
        tenant="globex")
    assert r.decision == pb.DECISION_DENY
    assert r.error.code == "forbidden", r.error
    assert r.error.message == "the resource belongs to another tenant"


def test_approval_required(stub, pb, common):
    args = b'{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}'
    r = refund_example.authorize_refund(stub, pb, common, args, "refund-4")
    assert r.decision == pb.DECISION_APPROVAL_REQUIRED, r
    assert r.error.code == "approval_required"
    assert r.approval.approval_id
    again = refund_example.authorize_refund(stub, pb, common, args, "refund-4")
    assert again.approval.approval_id == r.approval.approval_id


@pytest.fixture
def pending_big_refund(stub, pb, common):
    """`pending_big_refund(request_id)`: the model's arguments for the large
    refund and the APPROVAL_REQUIRED answer to them."""
    def pending(request_id: str):
        args = json.dumps(BIG_REFUND).encode()
        r = refund_example.authorize_refund(stub, pb, common, args, request_id)
        assert r.decision == pb.DECISION_APPROVAL_REQUIRED, r
        assert r.approval.approval_id
        return args, r
    return pending


def test_approved_refund_runs_once_per_operation(stub, pb, common, apb, approvals, approver_token,
                                                 pending_big_refund):
    args, required = pending_big_refund("refund-5")
    approval_id = required.approval.approval_id

    shown = approver_example.review(approvals, apb, approver_token, approval_id)
    assert shown.status == apb.APPROVAL_STATUS_PENDING, shown
    assert (shown.requester_subject_id, shown.tool, shown.risk) == ("bob", "refund_order", common.RISK_LEVEL_FINANCIAL)
    canonical = rfc8785.dumps(json.loads(args))
    assert shown.arguments_sha256 == hashlib.sha256(canonical).hexdigest(), shown.arguments_sha256
    assert shown.display_arguments == canonical.decode()  # refund_order has no sensitive pointers
    assert "refund_order 1.2.0 (RISK_LEVEL_FINANCIAL)" in approver_example.show(shown, apb, common)

    decided = approver_example.decide(approvals, apb, approver_token, shown, approve=True, reason="damaged in transit")
    assert not decided.HasField("error"), decided.error
    assert decided.approval.status == apb.APPROVAL_STATUS_APPROVED
    assert (decided.approval.decided_by, decided.approval.reason) == ("dana", "damaged in transit")

    allowed = refund_example.authorize_refund(stub, pb, common, args, "refund-5", approval_id=approval_id)
    assert allowed.decision == pb.DECISION_ALLOW, allowed
    assert not allowed.HasField("error"), allowed.error
    assert approver_example.review(approvals, apb, approver_token, approval_id).consumed_by_idempotency_key \
        == allowed.idempotency_key
    # A retry of the same operation (same idempotency key) may reuse the approval ...
    retried = refund_example.authorize_refund(stub, pb, common, args, "refund-5", approval_id=approval_id)
    assert retried.decision == pb.DECISION_ALLOW, retried
    assert retried.idempotency_key == allowed.idempotency_key
    # ... another operation may not: the approval is bound to its request_id.
    other = refund_example.authorize_refund(stub, pb, common, args, "refund-5b", approval_id=approval_id)
    assert other.decision == pb.DECISION_DENY, other
    assert other.error.code == "approval_mismatch", other.error  # bound to its request_id (DESIGN §4)
    assert other.error.resolution == "request_new_approval"


def test_only_an_authorized_approver_may_decide(stub, pb, common, apb, approvals, approver_token,
                                                non_approver_token, requester_token, pending_big_refund):
    _, required = pending_big_refund("refund-6")
    approval_id = required.approval.approval_id
    shown = approver_example.review(approvals, apb, approver_token, approval_id)

    no_role = approver_example.decide(approvals, apb, non_approver_token, shown, approve=True, reason="looks fine")
    assert not no_role.HasField("approval")
    assert (no_role.error.code, no_role.error.message) == (
        "forbidden", "this approver may not decide this approval"), no_role.error
    own = approver_example.decide(approvals, apb, requester_token, shown, approve=True, reason="my own request")
    assert (own.error.code, own.error.message) == ("forbidden", "nobody may approve their own request"), own.error
    # The executor has no identity token at all: it cannot even read the approval.
    unauthenticated = approver_example.decide(approvals, apb, "", shown, approve=True, reason="executor")
    assert unauthenticated.error.code == "unauthorized", unauthenticated.error
    with pytest.raises(grpc.RpcError) as refused:
        approver_example.review(approvals, apb, "", approval_id)
    e = refused.value
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
    assert e.details() == "the identity token is not valid", e.details()

    assert approver_example.review(approvals, apb, approver_token, approval_id).status == apb.APPROVAL_STATUS_PENDING
    still_pending = refund_example.authorize_refund(
        stub, pb, common, json.dumps(BIG_REFUND).encode(), "refund-6", approval_id=approval_id)
    assert still_pending.decision == pb.DECISION_DENY, still_pending
    assert still_pending.error.code == "approval_pending", still_pending.error


SMALL_REFUND = b'{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}'


class CountingProvider(refund_example.DemoProvider):
    """The payment provider, counting the refunds it actually made (the side effects).

    `fail_after_refund` makes the next call refund and then fail to answer:
    TimeoutError (the executor cannot know it happened) or Crash (the executor
    process dies before it can report anything)."""

    def __init__(self, fail_after_refund=None):
        super().__init__()
        self.side_effects = 0
        self.fail_after_refund = fail_after_refund

    def refund(self, arguments, idempotency_key, timeout_ms):
        assert timeout_ms > 0
        result = super().refund(arguments, idempotency_key, timeout_ms)
        self.side_effects += 1
        failure, self.fail_after_refund = self.fail_after_refund, None
        if failure is not None:
            raise failure()
        return result


class Crash(Exception):
    """The executor process dies mid-call (never caught by execute_refund)."""


@pytest.fixture
def execute(stub, ledger, pb, lpb, common):
    """`execute(request_id, provider)`: the small refund through the ledger."""
    def run(request_id, provider):
        return refund_example.execute_refund(stub, ledger, pb, lpb, common, SMALL_REFUND, request_id, provider)
    return run


def test_a_refund_runs_once_through_the_ledger(execute):
    provider = CountingProvider()
    first = execute("refund-ledger-1", provider)
    assert first.kind == "succeeded", first
    assert first.result == {"refund_id": "re_1", "amount_cents": 2500}
    # The model retries the same operation: the stored result, no second refund.
    for _ in range(2):
        again = execute("refund-ledger-1", provider)
        assert again.kind == "completed", again
        assert again.result == first.result
    assert provider.side_effects == 1
    # A new operation is a new refund.
    assert execute("refund-ledger-2", provider).kind == "succeeded"
    assert provider.side_effects == 2


def test_a_retry_after_a_timeout_never_refunds_twice(execute):
    provider = CountingProvider(fail_after_refund=TimeoutError)
    first = execute("refund-ledger-timeout", provider)
    assert first.kind == "unknown", first
    assert first.error.code == "timeout_unknown", first.error
    assert first.error.resolution == "reconcile"
    assert provider.side_effects == 1
    # The retry is told to reconcile, asks the provider, and records what happened.
    retry = execute("refund-ledger-timeout", provider)
    assert retry.kind == "reconciled", retry
    assert retry.result == {"refund_id": "re_1", "amount_cents": 2500}
    # From then on the stored result is the answer.
    again = execute("refund-ledger-timeout", provider)
    assert again.kind == "completed", again
    assert again.result == retry.result
    assert provider.side_effects == 1


def test_a_retry_while_the_first_executor_may_still_run_waits(execute):
    provider = CountingProvider(fail_after_refund=Crash)
    with pytest.raises(Crash):
        execute("refund-ledger-crash", provider)
    assert provider.side_effects == 1
    # Its lease (the tool's timeout plus a margin) still runs: nobody else may run it.
    for _ in range(3):
        retry = execute("refund-ledger-crash", provider)
        assert retry.kind == "in_progress", retry
        assert 0 < retry.retry_after_ms <= 1000, retry
    assert provider.side_effects == 1

