"""The README's refund example: an executor asks toolgate before refunding,
and runs the refund through the execution ledger so that a retry is the same
refund, never a second one.

Run against a sidecar started with `cargo run --release -- serve`:

    pip install ./clients/python
    python clients/python/refund_example.py                      # 25.00: allowed
    python clients/python/refund_example.py 25000                # 250.00: approval required
    python clients/python/refund_example.py 25000 APPROVAL_ID    # after a human approved it
"""

import json
from typing import NamedTuple, Optional

import grpc

from sdk_example import ENTITIES  # trusted data the executor loaded (never from the model)
from toolgate_client import default_addr, load_stubs


def auth_context(common, tenant: str = "acme"):
    """Who is calling: from the executor's authentication, never from the model."""
    return common.AuthContext(
        subject_id="bob", tenant_id=tenant, roles=["support_agent"],
        scopes=["orders:read", "orders:refund"], agent_id="support-bot", session_id="s-42")


def authorize_refund(stub, pb, common, model_arguments: bytes, request_id: str, tenant: str = "acme",
                     approval_id: str = "", begin_execution: bool = False):
    """Asks toolgate whether the model's refund call may run.

    After a human approved it, the executor asks again with the same arguments
    and request_id, and the approval_id it got with APPROVAL_REQUIRED. With
    begin_execution, an ALLOW also begins the execution in the ledger and the
    answer carries it in `execution`.
    """
    return stub.Authorize(pb.AuthorizeRequest(
        tool="refund_order",
        arguments=model_arguments,  # the bytes exactly as the model produced them
        auth=auth_context(common, tenant),
        call_id="call_7",            # the model's tool-call id: echoed only
        request_id=request_id,       # the business operation: same id = same operation
        approval_id=approval_id,     # empty until a human approved this call
        entities_json=ENTITIES,
        begin_execution=begin_execution,
    ), timeout=5)


def run(stub, pb, common, amount_cents: int = 2500, approval_id: str = ""):
    args = json.dumps({"order_id": "ord_1001", "amount_cents": amount_cents, "currency": "USD",
                       "reason": "late"}).encode()
    r = authorize_refund(stub, pb, common, args, request_id="refund-ord_1001-1",
                         approval_id=approval_id)
    if r.decision == pb.DECISION_ALLOW:
        # Run the tool with r.normalized_arguments, under r.timeout_ms,
        # using r.idempotency_key with the payment provider.
        print("allowed:", r.normalized_arguments, "key", r.idempotency_key, "budget", r.timeout_ms, "ms")
    elif r.decision == pb.DECISION_APPROVAL_REQUIRED:
        print("waiting for a human: approval", r.approval.approval_id)
    else:
        # Hand r.model_output back to the model; it says what went wrong and what to do.
        print("denied:", r.error.code, r.model_output)
    return r


class Outcome(NamedTuple):
    """What the executor ends up telling the model about one refund call.

    kind is one of: "succeeded" (it ran now), "completed" (it ran before:
    the stored result), "failed" (the stored or new error), "unknown" (it
    timed out: reconcile before anything else), "reconciled", "in_progress"
    (another executor runs it: ask again after retry_after_ms), "denied",
    "approval_required", "refused" (the ledger refused the key).
    """

    kind: str
    result: Optional[dict] = None
    error: Optional[object] = None  # an ErrorEnvelope
    retry_after_ms: int = 0


class ProviderError(Exception):
    """The payment provider refused: retryable or not."""

    def __init__(self, code: str, message: str, retryable: bool):
        super().__init__(message)
        self.code, self.message, self.retryable = code, message, retryable


def execute_refund(stub, ledger, pb, lpb, common, model_arguments: bytes, request_id: str, provider,
                   approval_id: str = "") -> Outcome:
    """Authorize, begin, execute, complete: the refund runs at most once per request_id.

    `provider` is the payment provider: `refund(arguments, idempotency_key, timeout_ms) -> dict`,
    raising TimeoutError when the answer did not come (the refund may have
    happened) or ProviderError when it was refused; and `find_refund(idempotency_key)`
    to reconcile.
    """
    r = authorize_refund(stub, pb, common, model_arguments, request_id, approval_id=approval_id,
                         begin_execution=True)
    if r.decision == pb.DECISION_APPROVAL_REQUIRED:
        return Outcome("approval_required", error=r.error)
    if r.decision != pb.DECISION_ALLOW:
        return Outcome("denied", error=r.error)
    e = r.execution
    if e.outcome == lpb.BEGIN_OUTCOME_COMPLETED:
        # It ran before (a retry of the same operation): the stored outcome, never a second refund.
        if e.state == lpb.EXECUTION_STATE_SUCCEEDED:
            return Outcome("completed", result=json.loads(e.result_json))
        return Outcome("failed", error=e.error)
    if e.outcome == lpb.BEGIN_OUTCOME_IN_PROGRESS:
        # Another executor holds the lease: do not run it; ask again later.
        return Outcome("in_progress", retry_after_ms=e.retry_after_ms)
    if e.outcome == lpb.BEGIN_OUTCOME_RECONCILE_REQUIRED:
        # It may have run: find out from the provider, by the idempotency key.
        return reconcile_refund(ledger, lpb, common, r.idempotency_key, provider)
    if e.outcome != lpb.BEGIN_OUTCOME_ACQUIRED:
        return Outcome("refused", error=e.error)

    def complete(status, result_json="", error=None):
        return ledger.CompleteExecution(lpb.CompleteExecutionRequest(
            auth=auth_context(common), idempotency_key=r.idempotency_key, fencing_token=e.fencing_token,
            status=status, result_json=result_json, error=error), timeout=5)

    try:
        # Run what was authorized (never a re-parse of the model's text), under the
        # time budget, with the idempotency key passed on to the provider.
        result = provider.refund(json.loads(r.normalized_arguments), idempotency_key=r.idempotency_key,
                                 timeout_ms=r.timeout_ms)
    except TimeoutError:
        # The refund may have happened: say so. The next Begin answers
        # RECONCILE_REQUIRED, never ACQUIRED, so nobody refunds twice.
        c = complete(lpb.COMPLETION_STATUS_UNKNOWN)
        return Outcome("unknown", error=c.error)
    except ProviderError as failure:
        status = lpb.COMPLETION_STATUS_FAILED_RETRYABLE if failure.retryable else lpb.COMPLETION_STATUS_FAILED_FINAL
        error = common.ErrorEnvelope(
            code=failure.code, category="payment", message=failure.message, retryable=failure.retryable,
            resolution="retry_same_key" if failure.retryable else "stop", expose_to_model=True, details_json="{}")
        complete(status, error=error)  # kept: a later Begin of a final failure returns it
        return Outcome("failed", error=error)
    c = complete(lpb.COMPLETION_STATUS_SUCCEEDED, result_json=json.dumps(result))
    if c.state == lpb.EXECUTION_STATE_SUCCEEDED:
        return Outcome("succeeded", result=result)
    # UNKNOWN with output_invalid: it happened, but the result is not what the contract says.
    return Outcome("unknown", result=result, error=c.error)


def reconcile_refund(ledger, lpb, common, idempotency_key: str, provider) -> Outcome:
    """Settles a refund whose outcome is unknown by asking the provider what happened."""
    found = provider.find_refund(idempotency_key)
    r = ledger.ReconcileExecution(lpb.ReconcileExecutionRequest(
        auth=auth_context(common), idempotency_key=idempotency_key, applied=found is not None,
        result_json=json.dumps(found) if found is not None else ""), timeout=5)
    if r.HasField("error"):
        return Outcome("refused", error=r.error)
    return Outcome("reconciled", result=found)


class DemoProvider:
    """A stand-in payment provider that remembers refunds by idempotency key."""

    def __init__(self):
        self.refunds = {}

    def refund(self, arguments, idempotency_key, timeout_ms):
        self.refunds[idempotency_key] = {"refund_id": f"re_{len(self.refunds) + 1}",
                                         "amount_cents": arguments["amount_cents"]}
        return self.refunds[idempotency_key]

    def find_refund(self, idempotency_key):
        return self.refunds.get(idempotency_key)


if __name__ == "__main__":
    import sys
    amount = int(sys.argv[1]) if len(sys.argv) > 1 else 2500
    approval = sys.argv[2] if len(sys.argv) > 2 else ""
    pb, pb_grpc, common, _, _, lpb, lpb_grpc = load_stubs()
    with grpc.insecure_channel(default_addr()) as channel:
        stub = pb_grpc.AuthorizationServiceStub(channel)
        r = run(stub, pb, common, amount, approval)
        if r.decision == pb.DECISION_ALLOW:
            # The same call through the execution ledger: the refund runs
            # once; run this script again and the stored result comes back.
            args = json.dumps({"order_id": "ord_1001", "amount_cents": amount, "currency": "USD",
                               "reason": "late"}).encode()
            print(execute_refund(stub, lpb_grpc.LedgerServiceStub(channel), pb, lpb, common, args,
                                 "refund-ord_1001-1", DemoProvider(), approval_id=approval))
