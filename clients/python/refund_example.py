"""The README's refund example: an executor asks toolgate before refunding.

Run against a sidecar started with `cargo run --release -- serve`:

    pip install -r clients/python/requirements.txt
    python clients/python/refund_example.py                      # 25.00: allowed
    python clients/python/refund_example.py 25000                # 250.00: approval required
    python clients/python/refund_example.py 25000 APPROVAL_ID    # after a human approved it
"""

import json
import tempfile

import grpc

from toolgate_client import default_addr, load_stubs

# Trusted data the executor loaded from its own database (never from the model).
ENTITIES = json.dumps([
    {"uid": {"type": "Order", "id": "ord_1001"},
     "parents": [{"type": "Tenant", "id": "acme"}],
     "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}},
               "owner": {"__entity": {"type": "User", "id": "alice"}},
               "status": "delivered", "total_cents": 50000}},
])


def authorize_refund(stub, pb, common, model_arguments: bytes, request_id: str, tenant: str = "acme",
                     approval_id: str = ""):
    """Asks toolgate whether the model's refund call may run.

    After a human approved it, the executor asks again with the same arguments
    and request_id, and the approval_id it got with APPROVAL_REQUIRED.
    """
    return stub.Authorize(pb.AuthorizeRequest(
        tool="refund_order",
        arguments=model_arguments,  # the bytes exactly as the model produced them
        auth=common.AuthContext(  # from the executor's authentication, never the model
            subject_id="bob", tenant_id=tenant, roles=["support_agent"],
            scopes=["orders:read", "orders:refund"], agent_id="support-bot", session_id="s-42"),
        call_id="call_7",            # the model's tool-call id: echoed only
        request_id=request_id,       # the business operation: same id = same operation
        approval_id=approval_id,     # empty until a human approved this call
        entities_json=ENTITIES,
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


if __name__ == "__main__":
    import sys
    amount = int(sys.argv[1]) if len(sys.argv) > 1 else 2500
    approval = sys.argv[2] if len(sys.argv) > 2 else ""
    with tempfile.TemporaryDirectory() as stubs:
        from pathlib import Path
        pb, pb_grpc, common, _, _ = load_stubs(str(Path(__file__).resolve().parents[2] / "proto"), stubs)
        with grpc.insecure_channel(default_addr()) as channel:
            run(pb_grpc.AuthorizationServiceStub(channel), pb, common, amount, approval)
