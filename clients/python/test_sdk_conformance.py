"""The shared conformance cases (clients/conformance/cases.json, run by the
TypeScript SDK too) through `Gate.authorize`, against the real server."""

import json

from toolgate import Auth, Gate, Verdict


def load_cases(repo):
    return json.loads((repo / "clients" / "conformance" / "cases.json").read_text(encoding="utf-8"))["cases"]


def test_every_shared_case_answers_as_expected(repo, addr):
    cases = load_cases(repo)
    assert len(cases) >= 8
    names = [c["name"] for c in cases]
    assert len(set(names)) == len(names), names
    codes = {c["expect"].get("code") for c in cases}
    assert {"", "forbidden", "approval_required", "invalid_json", "schema_violation", "tool_not_found"} <= codes
    failures = []
    with Gate(addr) as gate:
        for case in cases:
            req, want = case["request"], case["expect"]
            d = gate.authorize(req["tool"], req["arguments"], Auth(**req["auth"]),
                               request_id=req.get("request_id", ""), entities_json=req.get("entities_json", ""),
                               tool_version=req.get("tool_version", ""))
            got = {
                "decision": d.verdict.value,
                "code": d.error.code if d.error else "",
                "retryable": d.error.retryable if d.error else False,
                "resolution": d.error.resolution if d.error else "",
                "idempotency_key": d.idempotency_key,
                "arguments_sha256": d.arguments_sha256,
                "normalized_arguments": d.normalized_arguments,
                "conflict_key": d.conflict_key,
            }
            for field, value in want.items():
                if got[field] != value:
                    failures.append(f"{case['name']}: {field} = {got[field]!r}, expected {value!r}")
            if d.verdict is Verdict.ALLOW:
                if d.model_output or d.error:
                    failures.append(f"{case['name']}: an allowed call carries an error")
            else:
                shown = json.loads(d.model_output)["error"]
                if shown["code"] != want["code"]:
                    failures.append(f"{case['name']}: model_output code {shown['code']!r}")
            if d.verdict is Verdict.APPROVAL_REQUIRED and not d.approval_id:
                failures.append(f"{case['name']}: no approval_id")
    assert failures == []


def test_bytes_and_text_arguments_are_sent_as_given(gate):
    auth = Auth("bob", "acme", ["support_agent"], ["orders:read"])
    for raw in ('{"order_id":"ord_1001"', b'{"order_id":"ord_1001"'):
        d = gate.authorize("get_order", raw, auth)
        assert d.verdict is Verdict.DENY
        assert (d.error.code, d.error.details) == ("invalid_json", {"position": 22, "reason": "unexpected_end"}), d.error
    ok = gate.authorize("get_order", b'{"order_id":"ord_1001"}', auth)
    # The same bytes, completed, parse: the call is then refused further on (no Order entity given).
    assert (ok.verdict, ok.error.code) == (Verdict.DENY, "resource_not_found"), ok.error
