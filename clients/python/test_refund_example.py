"""The Python executor test: the README refund example against a real server.

Started by the Rust integration test `python::the_python_executor_runs_the_refund_example`
with TOOLGATE_ADDR, TOOLGATE_PROTO_DIR and TOOLGATE_STUB_DIR set. Prints
`N passed, M failed` and exits non-zero on any failure.
"""

import hashlib
import json
import os
import sys
import traceback

import grpc
import rfc8785

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toolgate_client import default_addr, load_stubs  # noqa: E402
import refund_example  # noqa: E402

pb, pb_grpc, common = load_stubs(os.environ["TOOLGATE_PROTO_DIR"], os.environ["TOOLGATE_STUB_DIR"])
channel = grpc.insecure_channel(default_addr())
stub = pb_grpc.AuthorizationServiceStub(channel)


def test_allowed_refund_and_independent_idempotency_key():
    r = refund_example.run(stub, pb, common)
    assert r.decision == pb.DECISION_ALLOW, r
    assert r.normalized_arguments == '{"amount_cents":2500,"currency":"USD","order_id":"ord_1001","reason":"late"}'
    args = json.loads(r.normalized_arguments)
    assert r.arguments_sha256 == hashlib.sha256(rfc8785.dumps(args)).hexdigest()
    key = {"arguments": args, "request_id": "refund-ord_1001-1", "subject_id": "bob",
           "tenant_id": "acme", "tool_name": "refund_order"}
    assert r.idempotency_key == "refund_order:" + hashlib.sha256(rfc8785.dumps(key)).hexdigest(), r.idempotency_key
    assert r.conflict_key == "acme:Order:ord_1001"


def test_allowed_read():
    r = stub.Authorize(pb.AuthorizeRequest(
        tool="get_order", arguments=b'{"order_id":"ord_1001"}',
        auth=common.AuthContext(subject_id="bob", tenant_id="acme", roles=["support_agent"], scopes=["orders:read"]),
        entities_json=refund_example.ENTITIES), timeout=5)
    assert r.decision == pb.DECISION_ALLOW, r
    assert r.risk == common.RISK_LEVEL_READ


def test_schema_violation():
    r = refund_example.authorize_refund(
        stub, pb, common, b'{"order_id":"ord_1001","amount_cents":"2500","currency":"USD","reason":"late"}', "refund-2")
    assert r.decision == pb.DECISION_DENY
    assert r.error.code == "schema_violation", r.error
    assert r.error.resolution == "repair_arguments"
    details = json.loads(r.error.details_json)
    assert details["violations"][0]["pointer"] == "/amount_cents"
    assert json.loads(r.model_output)["error"]["code"] == "schema_violation"


def test_cross_tenant_deny():
    r = refund_example.authorize_refund(
        stub, pb, common, b'{"order_id":"ord_1001","amount_cents":100,"currency":"USD","reason":"late"}', "refund-3",
        tenant="globex")
    assert r.decision == pb.DECISION_DENY
    assert r.error.code == "forbidden", r.error
    assert r.error.message == "the resource belongs to another tenant"


def test_approval_required():
    args = b'{"order_id":"ord_1001","amount_cents":25000,"currency":"USD","reason":"damaged"}'
    r = refund_example.authorize_refund(stub, pb, common, args, "refund-4")
    assert r.decision == pb.DECISION_APPROVAL_REQUIRED, r
    assert r.error.code == "approval_required"
    assert r.approval.approval_id
    again = refund_example.authorize_refund(stub, pb, common, args, "refund-4")
    assert again.approval.approval_id == r.approval.approval_id


TESTS = [test_allowed_refund_and_independent_idempotency_key, test_allowed_read, test_schema_violation,
         test_cross_tenant_deny, test_approval_required]

if __name__ == "__main__":
    passed = failed = 0
    for t in TESTS:
        try:
            t()
            passed += 1
            print(f"PASS {t.__name__}")
        except Exception:  # noqa: BLE001 - report every failure
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
