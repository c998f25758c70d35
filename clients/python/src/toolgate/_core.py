"""What `Gate` and `AsyncGate` share: the requests they send and how each
answer is read, with no IO. The two clients differ only in how they wait
(threads and `time.sleep`, or `asyncio`); every rule of the exactly-once run
and of the approval calls lives here once."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import grpc

from toolgate._types import (APPROVAL_STATUSES, Approval, ApprovalState, Auth, Deadline, Decision, ErrorInfo,
                             Reconciled, RunResult, RunStatus, ToolError, ToolgateError, from_rpc_error)
from toolgate.v1 import approval_pb2, authorization_pb2, common_pb2, ledger_pb2

ToolFn = Callable[[Any, str, Deadline], Any]
"""`fn(normalized_arguments, idempotency_key, deadline)`: the tool (AsyncGate also awaits a coroutine function)."""
ReconcileFn = Callable[[str, Any], Optional[Reconciled]]
"""`reconcile(idempotency_key, normalized_arguments)`: whether the call's side effect happened (None: not known)."""


@dataclass(frozen=True)
class Call:
    """One call to authorize, as `authorize` and `run` are given it."""

    tool: str
    raw_arguments: Union[str, bytes]
    auth: Auth
    request_id: str = ""
    call_id: str = ""
    approval_id: str = ""
    entities_json: str = ""
    tool_version: str = ""
    begin_execution: bool = False
    lease_ms: int = 0

    def request(self) -> authorization_pb2.AuthorizeRequest:
        # The model's text is sent as its UTF-8 bytes: toolgate parses, normalizes and hashes them.
        raw = self.raw_arguments.encode() if isinstance(self.raw_arguments, str) else bytes(self.raw_arguments)
        return authorization_pb2.AuthorizeRequest(
            tool=self.tool, arguments=raw, auth=self.auth.to_proto(), call_id=self.call_id,
            request_id=self.request_id, approval_id=self.approval_id, entities_json=self.entities_json,
            tool_version=self.tool_version, begin_execution=self.begin_execution, lease_ms=self.lease_ms)


@dataclass(frozen=True)
class Step:
    """What `run` does after one Authorize with begin_execution: wait
    `pause` seconds and ask again, end with `result`, reconcile (`reconcile`
    true, `error` saying why), or run the tool (`execution`)."""

    decision: Optional[Decision] = None
    pause: float = 0.0
    result: Optional[RunResult] = None
    reconcile: bool = False
    error: Optional[ErrorInfo] = None
    execution: Optional[ledger_pb2.BeginExecutionResponse] = None


def after_begin(r: authorization_pb2.AuthorizeResponse, give_up: float) -> Step:
    """The step after `r`; `give_up` is when waiting on IN_PROGRESS ends (time.monotonic())."""
    e = r.execution
    pause = max(e.retry_after_ms, 50) / 1000.0
    if r.decision == authorization_pb2.DECISION_ALLOW and r.HasField("execution") \
            and e.outcome == ledger_pb2.BEGIN_OUTCOME_IN_PROGRESS and time.monotonic() + pause < give_up:
        return Step(pause=pause)
    decision = Decision.from_proto(r)
    if decision.verdict.value == "approval_required":
        return Step(decision, result=RunResult(RunStatus.APPROVAL_REQUIRED, decision, error=decision.error))
    if not decision.allowed:
        return Step(decision, result=RunResult(RunStatus.DENIED, decision, error=decision.error))
    if not r.HasField("execution"):
        # Fail closed: without a ledger entry nothing may run.
        return Step(decision, result=RunResult(RunStatus.REFUSED, decision, error=ErrorInfo(
            code="internal", message="toolgate allowed the call without beginning its execution",
            resolution="stop")))
    error = ErrorInfo.from_proto(e.error) if e.HasField("error") else None
    if e.outcome == ledger_pb2.BEGIN_OUTCOME_COMPLETED:
        if e.state == ledger_pb2.EXECUTION_STATE_SUCCEEDED:
            return Step(decision, result=RunResult(RunStatus.COMPLETED, decision, result=_loads(e.result_json)))
        return Step(decision, result=RunResult(RunStatus.FAILED, decision, error=error))
    if e.outcome == ledger_pb2.BEGIN_OUTCOME_IN_PROGRESS:
        return Step(decision, result=RunResult(RunStatus.IN_PROGRESS, decision, error=error,
                                               retry_after_ms=e.retry_after_ms))
    if e.outcome == ledger_pb2.BEGIN_OUTCOME_RECONCILE_REQUIRED:
        return Step(decision, reconcile=True, error=error)
    if e.outcome != ledger_pb2.BEGIN_OUTCOME_ACQUIRED:
        return Step(decision, result=RunResult(RunStatus.REFUSED, decision, error=error))
    return Step(decision, execution=e)


def deadline_of(decision: Decision, e: ledger_pb2.BeginExecutionResponse) -> Deadline:
    """The tool's time budget, cut to the ledger lease."""
    budget = time.time() + decision.timeout_ms / 1000.0 if decision.timeout_ms else float("inf")
    lease = e.lease_expires_at.ToMicroseconds() / 1e6 if e.HasField("lease_expires_at") else budget
    return Deadline(min(budget, lease))


def arguments_of(decision: Decision) -> Any:
    return json.loads(decision.normalized_arguments)


@dataclass(frozen=True)
class Completion:
    """What the ledger is told after the tool returned, raised or outlived
    its deadline; `raise_after` is raised to the caller once it is recorded."""

    status: ledger_pb2.CompletionStatus
    result_json: str = ""
    error: Optional[common_pb2.ErrorEnvelope] = None
    value: Any = None
    raise_after: Optional[BaseException] = None

    def request(self, auth: Auth, decision: Decision,
                e: ledger_pb2.BeginExecutionResponse) -> ledger_pb2.CompleteExecutionRequest:
        return ledger_pb2.CompleteExecutionRequest(
            auth=auth.to_proto(), idempotency_key=decision.idempotency_key, fencing_token=e.fencing_token,
            status=self.status, result_json=self.result_json, error=self.error)


EXPIRED = Completion(ledger_pb2.COMPLETION_STATUS_UNKNOWN)
"""The deadline passed and the tool still runs: it may have happened."""


def returned(value: Any) -> Completion:
    try:
        result_json = json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError):
        return Completion(ledger_pb2.COMPLETION_STATUS_UNKNOWN, raise_after=TypeError(
            "the tool function's result is not JSON-serializable; recorded UNKNOWN"))
    return Completion(ledger_pb2.COMPLETION_STATUS_SUCCEEDED, result_json=result_json, value=value)


def raised(failure: BaseException) -> Completion:
    if isinstance(failure, ToolError):
        envelope = common_pb2.ErrorEnvelope(
            code=failure.code, category=failure.category, message=failure.message, retryable=failure.retryable,
            resolution="retry_same_key" if failure.retryable else "stop", expose_to_model=True,
            details_json=json.dumps(failure.details))
        return Completion(ledger_pb2.COMPLETION_STATUS_FAILED_RETRYABLE if failure.retryable
                          else ledger_pb2.COMPLETION_STATUS_FAILED_FINAL, error=envelope)
    if isinstance(failure, (TimeoutError, asyncio.TimeoutError)):
        return EXPIRED
    # A bug or a crash in the tool function: recorded UNKNOWN (it may have
    # acted), then raised to the caller.
    return Completion(ledger_pb2.COMPLETION_STATUS_UNKNOWN, raise_after=failure)


def after_completion(decision: Decision, done: Completion, c: ledger_pb2.CompleteExecutionResponse) -> RunResult:
    """How the run ended, once the ledger answered the completion."""
    if done.raise_after is not None:
        raise done.raise_after
    answered = ErrorInfo.from_proto(c.error) if c.HasField("error") else None
    if answered is not None and answered.code == "lease_lost":
        return RunResult(RunStatus.LEASE_LOST, decision, error=answered)
    if done.error is not None:
        return RunResult(RunStatus.FAILED, decision, error=ErrorInfo.from_proto(done.error))
    if c.state == ledger_pb2.EXECUTION_STATE_SUCCEEDED:
        return RunResult(RunStatus.SUCCEEDED, decision, result=done.value)
    return RunResult(RunStatus.UNKNOWN, decision, result=done.value, error=answered)


def reconcile_request(auth: Auth, decision: Decision, found: Reconciled) -> ledger_pb2.ReconcileExecutionRequest:
    return ledger_pb2.ReconcileExecutionRequest(
        auth=auth.to_proto(), idempotency_key=decision.idempotency_key, applied=found.applied,
        result_json=json.dumps(found.result, separators=(",", ":")) if found.applied else "")


def after_reconcile(decision: Decision, found: Reconciled, r: ledger_pb2.ReconcileExecutionResponse) -> RunResult:
    if r.HasField("error"):
        return RunResult(RunStatus.REFUSED, decision, error=ErrorInfo.from_proto(r.error))
    return RunResult(RunStatus.RECONCILED, decision, result=found.result if found.applied else None,
                     applied=found.applied)


def list_approvals_request(token: str, status: Optional[ApprovalState], page_size: int,
                           page_token: str) -> approval_pb2.ListApprovalsRequest:
    wanted: approval_pb2.ApprovalStatus = approval_pb2.APPROVAL_STATUS_UNSPECIFIED
    for value, state in APPROVAL_STATUSES.items():
        if state is status:
            wanted = value
    return approval_pb2.ListApprovalsRequest(identity_token=token, status=wanted, page_size=page_size,
                                             page_token=page_token)


def decide_request(token: str, approval: Approval, approve: bool, reason: str) -> approval_pb2.DecideApprovalRequest:
    return approval_pb2.DecideApprovalRequest(
        identity_token=token, approval_id=approval.approval_id,
        verdict=approval_pb2.VERDICT_APPROVE if approve else approval_pb2.VERDICT_REJECT,
        arguments_sha256=approval.arguments_sha256, reason=reason)


def decided(r: approval_pb2.DecideApprovalResponse) -> Approval:
    """The decided approval; a refusal (self-approval, another tenant, a
    stale hash, …) raises ToolgateError with toolgate's envelope."""
    if r.HasField("error"):
        raise ToolgateError(ErrorInfo.from_proto(r.error))
    return Approval.from_proto(r.approval)


def settled_event(event: approval_pb2.WatchApprovalsResponse, approval_id: str) -> Optional[Approval]:
    """The approval, if this watch event says it is no longer pending."""
    a = event.event.approval
    if a.approval_id != approval_id:
        return None
    approval = Approval.from_proto(a)
    return None if approval.status is ApprovalState.PENDING else approval


def watch_timed_out(failure: Union[grpc.RpcError, ToolgateError]) -> bool:
    """After a watch (or its first read) failed: True when the wait's time
    ran out (the approval is then answered as it is), False when the server
    was unreachable (watch again after a moment); any other failure is
    raised, as ToolgateError."""
    error = failure if isinstance(failure, ToolgateError) else from_rpc_error(failure)
    if error.grpc_status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    if error.grpc_status != grpc.StatusCode.UNAVAILABLE:
        raise error from None
    return False


def _loads(text: str) -> Any:
    return json.loads(text) if text else None
