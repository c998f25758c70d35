"""The README's refund example on the SDK: the executor asks toolgate, and
the refund runs once per operation through the execution ledger.

Run against a sidecar started with `cargo run --release -- serve`:

    pip install ./clients/python
    python clients/python/sdk_example.py             # refunds 25.00 once: "succeeded"
    python clients/python/sdk_example.py             # the same operation again: "completed", no second refund
    python clients/python/sdk_example.py 25000       # 250.00: "approval_required"
"""

import json
import os
import sys

from toolgate import Auth, Gate, Reconciled

# Trusted data the executor loaded from its own database (never from the model).
ENTITIES = json.dumps([
    {"uid": {"type": "Order", "id": "ord_1001"},
     "parents": [{"type": "Tenant", "id": "acme"}],
     "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "acme"}},
               "owner": {"__entity": {"type": "User", "id": "alice"}},
               "status": "delivered", "total_cents": 50000}},
])

# Who is calling: from the executor's authentication, never from the model.
BOB = Auth(subject_id="bob", tenant_id="acme", roles=["support_agent"], scopes=["orders:read", "orders:refund"],
           agent_id="support-bot", session_id="s-42")

REFUNDS = {}  # a stand-in payment provider, remembering refunds by idempotency key


def refund(arguments, idempotency_key, deadline):
    """The tool: toolgate's normalized arguments, the key to pass on, the deadline to honour."""
    REFUNDS[idempotency_key] = {"refund_id": f"re_{len(REFUNDS) + 1}", "amount_cents": arguments["amount_cents"]}
    return REFUNDS[idempotency_key]


def find_refund(idempotency_key, arguments):
    """Asked only when an earlier run's outcome is unknown: did the refund happen?"""
    found = REFUNDS.get(idempotency_key)
    return Reconciled(applied=found is not None, result=found)


def main(argv) -> int:
    amount = int(argv[0]) if argv else 2500
    request_id = argv[1] if len(argv) > 1 else f"refund-ord_1001-{amount}"
    # The model's tool call, exactly as it produced the arguments.
    model_arguments = json.dumps({"order_id": "ord_1001", "amount_cents": amount, "currency": "USD",
                                  "reason": "late"})
    with Gate(os.environ.get("TOOLGATE_ADDR", "127.0.0.1:50051")) as gate:
        outcome = gate.run("refund_order", model_arguments, BOB, request_id, refund, reconcile=find_refund,
                           entities_json=ENTITIES)
    print(outcome.status.value, outcome.model_output)  # model_output: what the model gets back
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
