"""The typed values of the SDK: who calls, what toolgate decided, how a run ended."""

from __future__ import annotations

import datetime as _dt
import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from toolgate.v1 import approval_pb2, authorization_pb2, common_pb2


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


def _risk_name(value: int) -> str:
    name = common_pb2.RiskLevel.Name(value) if value in common_pb2.RiskLevel.values() else "RISK_LEVEL_UNSPECIFIED"
    return name.removeprefix("RISK_LEVEL_").lower()


@dataclass(frozen=True)
class Decision:
    """What `Gate.authorize` answered.

    On ALLOW, run the tool with `normalized_arguments` (never a re-parse of the
    model's text), under `timeout_ms`, passing `idempotency_key` on. On DENY
    or APPROVAL_REQUIRED, give the model `model_output`: it says what went
    wrong and what to do. `envelope` is the answer as it came (the proto).
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
    envelope: authorization_pb2.AuthorizeResponse

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
        expires = r.approval.expires_at.ToDatetime(tzinfo=_dt.timezone.utc) \
            if r.HasField("approval") and r.approval.HasField("expires_at") else None
        model_output = r.model_output or (error.model_output() if error is not None and verdict is not Verdict.ALLOW
                                          else "")
        return cls(verdict=verdict, decision_id=r.decision_id, call_id=r.call_id,
                   normalized_arguments=r.normalized_arguments, arguments_sha256=r.arguments_sha256,
                   idempotency_key=r.idempotency_key, conflict_key=r.conflict_key, risk=_risk_name(r.risk),
                   timeout_ms=r.timeout_ms, parallel=r.parallel, idempotent=r.idempotent,
                   approval_id=r.approval.approval_id if r.HasField("approval") else "",
                   approval_expires_at=expires, error=error, model_output=model_output,
                   policy_version=r.policy_version, tool_version=r.tool_version, envelope=r)


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


def approval_state(a: approval_pb2.Approval) -> ApprovalState:
    return APPROVAL_STATUSES.get(a.status, ApprovalState.UNSPECIFIED)


class ApprovalTimeout(TimeoutError):
    """`wait_for_approval` saw no decision within its timeout."""


class GateError(Exception):
    """A refusal from toolgate outside a decision (e.g. DecideApproval's error
    envelope); `error` is the envelope."""

    def __init__(self, error: ErrorInfo):
        super().__init__(f"{error.code}: {error.message}")
        self.error = error
