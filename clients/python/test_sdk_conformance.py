"""The shared conformance cases (clients/conformance/cases.json, run by the
TypeScript SDK too) against the real server: `cases` through
`Gate.authorize`, and `sdk_semantics`, the SDK's own choices (refusals,
timeouts, waits, retries), each by the runner of its name."""

import json
import socket
import threading
import time
import uuid

from toolgate import ApprovalState, Auth, Gate, GateConfig, RunStatus, ToolgateError, Verdict


def load(repo):
    return json.loads((repo / "clients" / "conformance" / "cases.json").read_text(encoding="utf-8"))


def load_cases(repo):
    return load(repo)["cases"]


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


# -- sdk_semantics ---------------------------------------------------------------

class Semantics:
    """What the sdk_semantics runners share: the server, the tokens, and the
    authorize cases a semantics case names as its call."""

    def __init__(self, addr, calls, tokens):
        self.addr, self.calls, self.tokens = addr, calls, tokens

    def call(self, given):
        """The named case's request, under a request id no other run uses."""
        req = dict(self.calls[given["call"]]["request"])
        req["request_id"] = f"{req.get('request_id', 'sdk')}-{uuid.uuid4()}"
        return req

    def run(self, gate, req, fn, **kwargs):
        return gate.run(req["tool"], req["arguments"], Auth(**req["auth"]), req["request_id"], fn,
                        entities_json=req.get("entities_json", ""), **kwargs)

    def pending_approval(self, gate, given):
        req = self.call(given)
        d = gate.authorize(req["tool"], req["arguments"], Auth(**req["auth"]), request_id=req["request_id"],
                           entities_json=req.get("entities_json", ""))
        assert d.verdict is Verdict.APPROVAL_REQUIRED, d
        return d.approval_id


def raised_as(want, failure):
    """The differences between the error raised and the case's expectation."""
    got = {"raises": type(failure).__name__, "code": failure.code, "resolution": failure.resolution,
           "retryable": failure.retryable,
           "grpc_status": failure.grpc_status.name if failure.grpc_status is not None else None}
    return [f"{k} = {got[k]!r}, expected {v!r}" for k, v in want.items() if got[k] != v]


def refused_decision_raises(s, case):
    given, want = case["given"], case["expect"]
    with Gate(s.addr) as gate:
        approval = gate.get_approval(s.pending_approval(gate, given), identity_token=s.tokens["approver"])
        try:
            answered = gate.decide(approval, True, "conformance", identity_token=s.tokens[given["decider"]])
        except ToolgateError as failure:
            return raised_as(want, failure)
    return [f"decide returned {answered!r} instead of raising"]


def timed_out_wait_returns_the_pending_approval(s, case):
    given, want = case["given"], case["expect"]
    with Gate(s.addr) as gate:
        approval_id = s.pending_approval(gate, given)
        started = time.monotonic()
        got = gate.wait_for_approval(approval_id, given["wait_seconds"], identity_token=s.tokens[given["waiter"]])
        took = time.monotonic() - started
    problems = [] if got.status is ApprovalState(want["status"]) else [f"status {got.status}"]
    if got.approval_id != approval_id:
        problems.append(f"another approval {got.approval_id}")
    if not given["wait_seconds"] <= took < want["within_seconds"]:
        problems.append(f"returned after {took:.2f} s")
    return problems


def in_progress_waits_30_seconds_by_default(s, case):
    given, want = case["given"], case["expect"]
    problems = []
    if GateConfig().in_progress_wait != want["default_wait_seconds"]:
        problems.append(f"GateConfig().in_progress_wait = {GateConfig().in_progress_wait}")
    req, holding, outcomes = s.call(given), threading.Event(), {}

    def hold(arguments, key, deadline):
        holding.set()
        time.sleep(given["hold_seconds"])
        return {"refund_id": "re_held", "amount_cents": arguments["amount_cents"]}

    def first():
        with Gate(s.addr) as gate:
            outcomes["first"] = s.run(gate, req, hold)

    runner = threading.Thread(target=first)
    runner.start()
    assert holding.wait(10), "the first executor never ran its tool"
    with Gate(s.addr) as gate:  # its own connection, as a second executor's
        outcomes["second"] = s.run(gate, req, lambda *a: problems.append("the tool ran twice"))
    runner.join(15)
    for who in ("first", "second"):
        if outcomes[who].status is not RunStatus(want[who]):
            problems.append(f"{who}: {outcomes[who].status} ({outcomes[who].error})")
    if outcomes["second"].result != outcomes["first"].result:
        problems.append(f"second result {outcomes['second'].result!r}")
    return problems


def retries_unavailable_3_times_with_backoff(s, case):
    want = case["expect"]
    options = dict(GateConfig(s.addr).channel_options())
    policy = json.loads(options["grpc.service_config"])["methodConfig"][0]["retryPolicy"]
    got = {"max_attempts": policy["maxAttempts"],
           "initial_backoff_seconds": float(policy["initialBackoff"].rstrip("s")),
           "backoff_multiplier": policy["backoffMultiplier"],
           "max_backoff_seconds": float(policy["maxBackoff"].rstrip("s")),
           "retryable_status_codes": policy["retryableStatusCodes"]}
    problems = [f"{k} = {got[k]!r}, expected {v!r}" for k, v in want.items() if got[k] != v]
    if options.get("grpc.enable_retries") != 1:
        problems.append("retries are not enabled on the channel")
    return problems


def a_failed_call_raises_the_sdk_error(s, case):
    given, want = case["given"], case["expect"]
    with socket.socket() as probe:  # a loopback port that was free a moment ago: nobody listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    req = s.call(given)
    with Gate(f"127.0.0.1:{port}") as gate:
        try:
            d = gate.authorize(req["tool"], req["arguments"], Auth(**req["auth"]), request_id=req["request_id"])
        except ToolgateError as failure:
            return raised_as(want, failure)
    return [f"authorize answered {d.verdict} instead of raising"]


RUNNERS = {f.__name__: f for f in (refused_decision_raises, timed_out_wait_returns_the_pending_approval,
                                   in_progress_waits_30_seconds_by_default, retries_unavailable_3_times_with_backoff,
                                   a_failed_call_raises_the_sdk_error)}


def test_every_sdk_semantics_case_holds(repo, addr, approver_token, requester_token):
    shared = load(repo)
    cases = shared["sdk_semantics"]["cases"]
    names = [c["name"] for c in cases]
    # Every case has its runner here, and every runner its case.
    assert sorted(names) == sorted(RUNNERS), names
    s = Semantics(addr, {c["name"]: c for c in shared["cases"]},
                  {"approver": approver_token, "requester": requester_token})
    failures = [f"{c['name']}: {p}" for c in cases for p in RUNNERS[c["name"]](s, c)]
    assert failures == [], "\n".join(failures)
