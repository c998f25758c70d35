"""The typed values of the SDK: who calls, what toolgate decided, how a run ended."""

from __future__ import annotations

import datetime as _dt
import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import grpc

from toolgate.v1 import approval_pb2, authorization_pb2, common_pb2, ledger_pb2


@dataclass(frozen=True)
class Auth:
    """Who is calling: from the executor's own authentication, never from the model."""

    subject_id: str
    tenant_id: str
    roles: Sequence[str] = ()
    scopes: Sequence[str] = ()
    agent_id: str = ""
    session_id: str = ""
    identity_token: str = ""

    def to_proto(self) -> common_pb2.AuthContext:
        return common_pb2.AuthContext(
            subject_id=self.subject_id, tenant_id=self.tenant_id, roles=list(self.roles),
            scopes=list(self.scopes), agent_id=self.agent_id, session_id=self.session_id,
            identity_token=self.identity_token)


@dataclass(frozen=True)
class ErrorInfo:
    """toolgate's error envelope: a stable `code`, and what to do (`resolution`)."""

    code: str
    category: str = ""
    message: str = ""
    retryable: bool = False
    resolution: str = ""
    expose_to_model: bool = False
    expose_to_user: bool = False
    details: dict = field(default_factory=dict)

    @classmethod
    def from_proto(cls, e: common_pb2.ErrorEnvelope) -> "ErrorInfo":
        try:
            details = json.loads(e.details_json) if e.details_json else {}
        except ValueError:
            details = {}
        return cls(code=e.code, category=e.category, message=e.message, retryable=e.retryable,
                   resolution=e.resolution, expose_to_model=e.expose_to_model, expose_to_user=e.expose_to_user,
                   details=details if isinstance(details, dict) else {})

    def model_output(self) -> str:
        """The envelope as a model may see it: `{"error": {code, message, resolution, retryable}}`."""
        body = {"code": self.code, "message": self.message, "resolution": self.resolution,
                "retryable": self.retryable}
        return json.dumps({"error": body}, sort_keys=True, separators=(",", ":"))


class Verdict(str, enum.Enum):
    """toolgate's answer to one call."""

    ALLOW = "allow"
    DENY = "deny"
    APPROVAL_REQUIRED = "approval_required"


# DECISION_ALLOW -> Verdict.ALLOW, ...: each verdict is the proto's value of the same name.
_VERDICTS = {authorization_pb2.Decision.Value(f"DECISION_{v.name}"): v for v in Verdict}


def _timestamp(message: Any, name: str) -> Optional[_dt.datetime]:
    """A Timestamp field as an aware UTC datetime; None when unset."""
    if not message.HasField(name):
        return None
    return getattr(message, name).ToDatetime(tzinfo=_dt.timezone.utc)


def _risk_name(value: int) -> str:
    name = common_pb2.RiskLevel.Name(value) if value in common_pb2.RiskLevel.values() else "RISK_LEVEL_UNSPECIFIED"
    return name.removeprefix("RISK_LEVEL_").lower()


@dataclass(frozen=True)
class Decision:
    """What `Gate.authorize` answered.

    On ALLOW, run the tool with `normalized_arguments` (never a re-parse of the
    model's text), under `timeout_ms`, passing `idempotency_key` on. On DENY
    or APPROVAL_REQUIRED, give the model `model_output`: it says what went
    wrong and what to do.
    """

    verdict: Verdict
    decision_id: str
    call_id: str
    normalized_arguments: str
    arguments_sha256: str
    idempotency_key: str
    conflict_key: str
    risk: str
    timeout_ms: int
    parallel: bool
    idempotent: bool
    approval_id: str
    approval_expires_at: Optional[_dt.datetime]
    error: Optional[ErrorInfo]
    model_output: str
    policy_version: str
    tool_version: str

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW

    @classmethod
    def from_proto(cls, r: authorization_pb2.AuthorizeResponse) -> "Decision":
        # An unknown or unspecified decision is a refusal: fail closed.
        verdict = _VERDICTS.get(r.decision, Verdict.DENY)
        error = ErrorInfo.from_proto(r.error) if r.HasField("error") else None
        if verdict is not Verdict.ALLOW and error is None:
            error = ErrorInfo(code="internal", message="toolgate answered without a decision", resolution="stop")
        expires = _timestamp(r.approval, "expires_at") if r.HasField("approval") else None
        model_output = r.model_output or (error.model_output() if error is not None and verdict is not Verdict.ALLOW
                                          else "")
        return cls(verdict=verdict, decision_id=r.decision_id, call_id=r.call_id,
                   normalized_arguments=r.normalized_arguments, arguments_sha256=r.arguments_sha256,
                   idempotency_key=r.idempotency_key, conflict_key=r.conflict_key, risk=_risk_name(r.risk),
                   timeout_ms=r.timeout_ms, parallel=r.parallel, idempotent=r.idempotent,
                   approval_id=r.approval.approval_id if r.HasField("approval") else "",
                   approval_expires_at=expires, error=error, model_output=model_output,
                   policy_version=r.policy_version, tool_version=r.tool_version)


@dataclass(frozen=True)
class Deadline:
    """When the tool must be done: the tool's time budget, cut to the ledger lease."""

    at: float  # time.time() seconds

    def remaining(self) -> float:
        """Seconds left (0 when passed)."""
        return max(0.0, self.at - time.time())

    @property
    def expired(self) -> bool:
        return time.time() >= self.at

    def as_datetime(self) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(self.at, tz=_dt.timezone.utc)


class ToolError(Exception):
    """Raised by a tool function when the tool refused or failed *without* a
    side effect: recorded as FAILED_RETRYABLE (a later run may try again) or
    FAILED_FINAL. Any other exception, and TimeoutError, records UNKNOWN."""

    def __init__(self, code: str, message: str, *, retryable: bool = False, category: str = "tool",
                 details: Optional[dict] = None):
        super().__init__(message)
        self.code, self.message, self.retryable, self.category = code, message, retryable, category
        self.details = details or {}


@dataclass(frozen=True)
class Reconciled:
    """What a reconcile callback found out: whether the call's side effect
    happened (`applied`) and, if so, its result."""

    applied: bool
    result: Any = None


class RunStatus(str, enum.Enum):
    """How `Gate.run` ended.

    SUCCEEDED: the tool ran now. COMPLETED: it ran before (a retry): the stored
    result or error. FAILED: the tool failed (ToolError). UNKNOWN: it may have
    run (timeout, lease lost mid-call, a crash of the tool function): the next
    run reconciles. RECONCILED: a reconcile callback settled an unknown
    outcome. RECONCILE_REQUIRED: it may have run and no reconcile callback was
    given. IN_PROGRESS: another executor holds the call. LEASE_LOST: the
    ledger refused the completion (someone settled the call meanwhile).
    DENIED / APPROVAL_REQUIRED: toolgate refused or wants a human. REFUSED:
    the ledger refused the key (e.g. reused with other arguments).
    """

    SUCCEEDED = "succeeded"
    COMPLETED = "completed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RECONCILED = "reconciled"
    RECONCILE_REQUIRED = "reconcile_required"
    IN_PROGRESS = "in_progress"
    LEASE_LOST = "lease_lost"
    DENIED = "denied"
    APPROVAL_REQUIRED = "approval_required"
    REFUSED = "refused"


@dataclass(frozen=True)
class RunResult:
    """The end of one `Gate.run`: `status`, the tool's `result` (when it ran,
    now or before), the `error` otherwise, and the `decision`."""

    status: RunStatus
    decision: Decision
    result: Any = None
    error: Optional[ErrorInfo] = None
    retry_after_ms: int = 0
    applied: Optional[bool] = None  # RECONCILED: whether the side effect had happened

    @property
    def ok(self) -> bool:
        return self.status in (RunStatus.SUCCEEDED, RunStatus.COMPLETED) or (
            self.status is RunStatus.RECONCILED and bool(self.applied))

    @property
    def model_output(self) -> str:
        """What to hand back to the model: the result as JSON, or the error envelope."""
        if self.ok:
            return json.dumps(self.result, sort_keys=True, separators=(",", ":"))
        if self.status in (RunStatus.DENIED, RunStatus.APPROVAL_REQUIRED):
            return self.decision.model_output
        if self.error is not None:
            return self.error.model_output()
        return ErrorInfo(code=self.status.value, message=f"the call is {self.status.value}",
                         resolution="retry_same_key" if self.status is RunStatus.IN_PROGRESS else "stop",
                         retryable=self.status is RunStatus.IN_PROGRESS).model_output()


class ApprovalState(str, enum.Enum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    UNSPECIFIED = "unspecified"


# APPROVAL_STATUS_PENDING -> ApprovalState.PENDING, ... (UNSPECIFIED included).
APPROVAL_STATUSES = {approval_pb2.ApprovalStatus.Value(f"APPROVAL_STATUS_{s.name}"): s for s in ApprovalState}


@dataclass(frozen=True)
class Approval:
    """One approval as toolgate holds it: what it is bound to (`tool`,
    `arguments_sha256`, `request_id`, the requester), `display_arguments`
    (the canonical arguments with the contract's sensitive pointers
    redacted), and where it stands (`status`, who decided, why)."""

    approval_id: str
    tenant_id: str
    requester_subject_id: str
    agent_id: str
    tool: str
    tool_version: str
    risk: str
    arguments_sha256: str
    display_arguments: str
    request_id: str
    status: ApprovalState
    created_at: Optional[_dt.datetime]
    expires_at: Optional[_dt.datetime]
    decided_by: str
    decided_at: Optional[_dt.datetime]
    reason: str
    consumed_by_idempotency_key: str

    @classmethod
    def from_proto(cls, a: approval_pb2.Approval) -> "Approval":
        return cls(approval_id=a.approval_id, tenant_id=a.tenant_id, requester_subject_id=a.requester_subject_id,
                   agent_id=a.agent_id, tool=a.tool, tool_version=a.tool_version, risk=_risk_name(a.risk),
                   arguments_sha256=a.arguments_sha256, display_arguments=a.display_arguments,
                   request_id=a.request_id, status=APPROVAL_STATUSES.get(a.status, ApprovalState.UNSPECIFIED),
                   created_at=_timestamp(a, "created_at"), expires_at=_timestamp(a, "expires_at"),
                   decided_by=a.decided_by, decided_at=_timestamp(a, "decided_at"), reason=a.reason,
                   consumed_by_idempotency_key=a.consumed_by_idempotency_key)


@dataclass(frozen=True)
class ApprovalPage:
    """One page of `list_approvals`; `next_page_token` asks for the next (empty: the last)."""

    approvals: List[Approval]
    next_page_token: str

    @classmethod
    def from_proto(cls, r: approval_pb2.ListApprovalsResponse) -> "ApprovalPage":
        return cls([Approval.from_proto(a) for a in r.approvals], r.next_page_token)


@dataclass(frozen=True)
class Execution:
    """The ledger's record of one operation (`get_execution`)."""

    idempotency_key: str
    tool: str
    state: str  # in_progress, succeeded, failed_retryable, unknown, failed_final (or unspecified)
    attempt: int
    arguments_sha256: str
    result: Any  # the stored result, parsed; None unless it succeeded
    error: Optional[ErrorInfo]
    created_at: Optional[_dt.datetime]
    updated_at: Optional[_dt.datetime]
    max_attempts: int
    lease_expires_at: Optional[_dt.datetime]

    @classmethod
    def from_proto(cls, e: ledger_pb2.Execution) -> "Execution":
        state = ledger_pb2.ExecutionState.Name(e.state) if e.state in ledger_pb2.ExecutionState.values() \
            else "EXECUTION_STATE_UNSPECIFIED"
        return cls(idempotency_key=e.idempotency_key, tool=e.tool,
                   state=state.removeprefix("EXECUTION_STATE_").lower(), attempt=e.attempt,
                   arguments_sha256=e.arguments_sha256, result=json.loads(e.result_json) if e.result_json else None,
                   error=ErrorInfo.from_proto(e.error) if e.HasField("error") else None,
                   created_at=_timestamp(e, "created_at"), updated_at=_timestamp(e, "updated_at"),
                   max_attempts=e.max_attempts, lease_expires_at=_timestamp(e, "lease_expires_at"))


@dataclass(frozen=True)
class ToolInfo:
    """One tool the caller may call (`list_tools`): its contract as loaded."""

    name: str
    version: str
    description: str
    risk: str
    input_schema: Any
    output_schema: Any
    parallel: bool
    idempotent: bool
    timeout_ms: int

    @classmethod
    def from_proto(cls, t: authorization_pb2.ToolInfo) -> "ToolInfo":
        return cls(name=t.name, version=t.version, description=t.description, risk=_risk_name(t.risk),
                   input_schema=json.loads(t.input_schema_json) if t.input_schema_json else None,
                   output_schema=json.loads(t.output_schema_json) if t.output_schema_json else None,
                   parallel=t.parallel, idempotent=t.idempotent, timeout_ms=t.timeout_ms)


class ToolgateError(Exception):
    """What the SDK raises: a refusal from toolgate outside a decision (e.g.
    DecideApproval's error envelope: self-approval, another tenant, a stale
    hash) or a call that failed as a request (a gRPC status: the server
    unreachable, the caller unauthenticated). `error` is the envelope;
    `code`, `message`, `resolution`, `retryable` and `details` are its
    fields. `grpc_status` is the gRPC status code when the call itself
    failed (`code` is then that status's name in lower case, e.g.
    `unavailable`), None for an envelope toolgate answered with."""

    def __init__(self, error: ErrorInfo, *, grpc_status: Optional[grpc.StatusCode] = None):
        super().__init__(f"{error.code}: {error.message}")
        self.error = error
        self.grpc_status = grpc_status

    @property
    def code(self) -> str:
        return self.error.code

    @property
    def message(self) -> str:
        return self.error.message

    @property
    def resolution(self) -> str:
        return self.error.resolution

    @property
    def retryable(self) -> bool:
        return self.error.retryable

    @property
    def details(self) -> dict:
        return self.error.details


# What to do after a gRPC status, as an envelope's resolution says it.
_STATUS_RESOLUTIONS = {
    grpc.StatusCode.UNAVAILABLE: ("retry_same_key", True),
    grpc.StatusCode.DEADLINE_EXCEEDED: ("retry_same_key", True),
    grpc.StatusCode.RESOURCE_EXHAUSTED: ("retry_same_key", True),
}


def from_rpc_error(failure: grpc.RpcError) -> ToolgateError:
    """A failed call (sync or asyncio) as the SDK's error, its status kept."""
    code = failure.code() if callable(getattr(failure, "code", None)) else grpc.StatusCode.UNKNOWN
    details = failure.details() if callable(getattr(failure, "details", None)) else ""
    resolution, retryable = _STATUS_RESOLUTIONS.get(code, ("stop", False))
    return ToolgateError(ErrorInfo(code=code.name.lower(), category="transport", message=details or code.name,
                                   retryable=retryable, resolution=resolution), grpc_status=code)
