"""`Gate`: one connection to toolgate, and the executor's safe path through it."""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from toolgate._types import (APPROVAL_STATUSES, ApprovalState, ApprovalTimeout, Auth, Deadline, Decision, ErrorInfo, GateError,
                             Reconciled, RunResult, RunStatus, ToolError, approval_state)
from toolgate.v1 import (approval_pb2, approval_pb2_grpc, authorization_pb2, authorization_pb2_grpc, common_pb2,
                         ledger_pb2, ledger_pb2_grpc)

ToolFn = Callable[[Any, str, Deadline], Any]
ReconcileFn = Callable[[str, Any], Optional[Reconciled]]

_SERVICES = ("toolgate.v1.AuthorizationService", "toolgate.v1.LedgerService", "toolgate.v1.ApprovalService")


def retry_service_config(max_attempts: int, initial_backoff: float, max_backoff: float,
                         backoff_multiplier: float) -> str:
    """gRPC's service config (gRFC A6) retrying UNAVAILABLE on toolgate's services.

    UNAVAILABLE means the call never reached a server that processed it; a
    ledger call retried after that is the same call (the ledger is keyed by
    the idempotency key), never a second run.
    """
    policy = {
        "maxAttempts": max_attempts,
        "initialBackoff": f"{initial_backoff:.3f}s",
        "maxBackoff": f"{max_backoff:.3f}s",
        "backoffMultiplier": backoff_multiplier,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    return json.dumps({"methodConfig": [{"name": [{"service": s} for s in _SERVICES], "retryPolicy": policy}]})


class Gate:
    """A connection to toolgate.

    `target` follows gRPC's naming: `host:port`, `dns:///host:port`,
    `unix:/path/to.sock`. TLS: `tls=True` with the system roots, or
    `root_certificates` (PEM bytes); mTLS adds `private_key` and
    `certificate_chain`; `server_name` overrides the name checked in the
    server's certificate. `timeout` is each call's deadline in seconds;
    retries follow gRPC's retry policy (`max_attempts`, exponential backoff,
    UNAVAILABLE only; `max_attempts=1` turns them off). `identity_token` is
    the caller's token for the approval calls. `channel` replaces all of it
    with a channel you made.
    """

    def __init__(self, target: str = "127.0.0.1:50051", *, tls: bool = False,
                 root_certificates: Optional[bytes] = None, private_key: Optional[bytes] = None,
                 certificate_chain: Optional[bytes] = None, server_name: Optional[str] = None,
                 timeout: float = 5.0, max_attempts: int = 4, initial_backoff: float = 0.1,
                 max_backoff: float = 2.0, backoff_multiplier: float = 2.0, identity_token: str = "",
                 options: Sequence[Tuple[str, Any]] = (), channel: Optional[grpc.Channel] = None):
        if timeout <= 0:
            raise ValueError("timeout must be positive (seconds)")
        self.timeout = timeout
        self.identity_token = identity_token
        if channel is None:
            opts: List[Tuple[str, Any]] = list(options)
            if max_attempts > 1:
                opts += [("grpc.enable_retries", 1),
                         ("grpc.service_config",
                          retry_service_config(max_attempts, initial_backoff, max_backoff, backoff_multiplier))]
            else:
                opts.append(("grpc.enable_retries", 0))
            if server_name:
                opts.append(("grpc.ssl_target_name_override", server_name))
            if target.startswith(("unix:", "unix-abstract:")) and \
                    not any(k == "grpc.default_authority" for k, _ in opts):
                # grpc-core's default authority for a socket path is not a
                # valid HTTP/2 :authority to toolgate's server, which resets
                # the stream; name it localhost, as the socket is.
                opts.append(("grpc.default_authority", "localhost"))
            if tls or root_certificates or private_key or certificate_chain:
                creds = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
                channel = grpc.secure_channel(target, creds, options=opts)
            else:
                channel = grpc.insecure_channel(target, options=opts)
            self._owned = True
        else:
            self._owned = False
        self.channel = channel
        self._authz = authorization_pb2_grpc.AuthorizationServiceStub(channel)
        self._ledger = ledger_pb2_grpc.LedgerServiceStub(channel)
        self._approvals = approval_pb2_grpc.ApprovalServiceStub(channel)

    def close(self) -> None:
        if self._owned:
            self.channel.close()

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- authorization ------------------------------------------------------

    def authorize(self, tool: str, raw_arguments: Union[str, bytes], auth: Auth, *, request_id: str = "",
                  call_id: str = "", approval_id: str = "", entities_json: str = "", tool_version: str = "",
                  begin_execution: bool = False, lease_ms: int = 0) -> Decision:
        """Asks toolgate whether the model's call may run. `raw_arguments`
        are the model's argument text exactly as produced (str is sent as
        UTF-8): toolgate parses, normalizes and hashes them."""
        return Decision.from_proto(self._authorize(tool, raw_arguments, auth, request_id, call_id, approval_id,
                                                   entities_json, tool_version, begin_execution, lease_ms))

    def _authorize(self, tool: str, raw_arguments: Union[str, bytes], auth: Auth, request_id: str, call_id: str,
                   approval_id: str, entities_json: str, tool_version: str, begin_execution: bool,
                   lease_ms: int) -> authorization_pb2.AuthorizeResponse:
        raw = raw_arguments.encode() if isinstance(raw_arguments, str) else bytes(raw_arguments)
        return self._authz.Authorize(authorization_pb2.AuthorizeRequest(
            tool=tool, arguments=raw, auth=auth.to_proto(), call_id=call_id, request_id=request_id,
            approval_id=approval_id, entities_json=entities_json, tool_version=tool_version,
            begin_execution=begin_execution, lease_ms=lease_ms), timeout=self.timeout)

    def list_tools(self, auth: Auth) -> List[authorization_pb2.ToolInfo]:
        return list(self._authz.ListTools(authorization_pb2.ListToolsRequest(auth=auth.to_proto()),
                                          timeout=self.timeout).tools)

    # -- the exactly-once run -------------------------------------------------

    def run(self, tool: str, raw_arguments: Union[str, bytes], auth: Auth, request_id: str, fn: ToolFn, *,
            reconcile: Optional[ReconcileFn] = None, approval_id: str = "", call_id: str = "",
            entities_json: str = "", tool_version: str = "", lease_ms: int = 0, wait: float = 0.0) -> RunResult:
        """Authorizes the call and, if allowed, runs `fn` at most once per
        operation (`request_id`), through the execution ledger.

        `fn(normalized_arguments, idempotency_key, deadline)` gets the parsed
        normalized arguments, the key to pass on to the system it calls, and
        the `Deadline` (the tool's budget cut to the ledger lease); it returns
        a JSON value (the result), raises `ToolError` for a failure without a
        side effect, or raises anything else (recorded UNKNOWN: it may have
        happened). If `fn` is still running at the deadline, `run` stops
        waiting and records UNKNOWN: the call's lease is ending, and nobody
        may run it again until it is reconciled.

        A retry of the same operation returns the stored result (COMPLETED).
        A call whose outcome is unknown goes to `reconcile(idempotency_key,
        normalized_arguments)`, which asks the system the tool calls whether
        it happened and returns `Reconciled(applied, result)` (or None: not
        known yet); `fn` is never run a second time for it.

        While another executor holds the call (IN_PROGRESS), `run` asks again
        after the ledger's `retry_after_ms` for up to `wait` seconds (0: it
        answers IN_PROGRESS at once).
        """
        give_up = time.monotonic() + wait
        while True:
            r = self._authorize(tool, raw_arguments, auth, request_id, call_id, approval_id, entities_json,
                                tool_version, True, lease_ms)
            e = r.execution
            pause = max(e.retry_after_ms, 50) / 1000.0
            if not (r.decision == authorization_pb2.DECISION_ALLOW and r.HasField("execution")
                    and e.outcome == ledger_pb2.BEGIN_OUTCOME_IN_PROGRESS and time.monotonic() + pause < give_up):
                break
            time.sleep(pause)
        decision = Decision.from_proto(r)
        if decision.verdict.value == "approval_required":
            return RunResult(RunStatus.APPROVAL_REQUIRED, decision, error=decision.error)
        if not decision.allowed:
            return RunResult(RunStatus.DENIED, decision, error=decision.error)
        if not r.HasField("execution"):
            # Fail closed: without a ledger entry nothing may run.
            return RunResult(RunStatus.REFUSED, decision, error=ErrorInfo(
                code="internal", message="toolgate allowed the call without beginning its execution",
                resolution="stop"))
        e = r.execution
        error = ErrorInfo.from_proto(e.error) if e.HasField("error") else None
        if e.outcome == ledger_pb2.BEGIN_OUTCOME_COMPLETED:
            if e.state == ledger_pb2.EXECUTION_STATE_SUCCEEDED:
                return RunResult(RunStatus.COMPLETED, decision, result=_loads(e.result_json))
            return RunResult(RunStatus.FAILED, decision, error=error)
        if e.outcome == ledger_pb2.BEGIN_OUTCOME_IN_PROGRESS:
            return RunResult(RunStatus.IN_PROGRESS, decision, error=error, retry_after_ms=e.retry_after_ms)
        if e.outcome == ledger_pb2.BEGIN_OUTCOME_RECONCILE_REQUIRED:
            return self._reconcile(decision, auth, reconcile, error)
        if e.outcome != ledger_pb2.BEGIN_OUTCOME_ACQUIRED:
            return RunResult(RunStatus.REFUSED, decision, error=error)
        return self._execute(decision, auth, e, fn)

    def _execute(self, decision: Decision, auth: Auth, e: ledger_pb2.BeginExecutionResponse,
                 fn: ToolFn) -> RunResult:
        budget = time.time() + decision.timeout_ms / 1000.0 if decision.timeout_ms else float("inf")
        lease = e.lease_expires_at.ToMicroseconds() / 1e6 if e.HasField("lease_expires_at") else budget
        deadline = Deadline(min(budget, lease))
        arguments = json.loads(decision.normalized_arguments)

        def complete(status: ledger_pb2.CompletionStatus, result_json: str = "",
                     error: Optional[common_pb2.ErrorEnvelope] = None) -> ledger_pb2.CompleteExecutionResponse:
            return self._ledger.CompleteExecution(ledger_pb2.CompleteExecutionRequest(
                auth=auth.to_proto(), idempotency_key=decision.idempotency_key, fencing_token=e.fencing_token,
                status=status, result_json=result_json, error=error), timeout=self.timeout)

        done: "queue.Queue[Tuple[str, Any]]" = queue.Queue(maxsize=1)

        def call() -> None:
            try:
                done.put(("ok", fn(arguments, decision.idempotency_key, deadline)))
            except BaseException as failure:  # handed to the waiting thread
                done.put(("raised", failure))

        threading.Thread(target=call, name=f"toolgate-run-{decision.idempotency_key[:24]}", daemon=True).start()
        try:
            kind, value = done.get(timeout=max(0.0, deadline.at - time.time()) if deadline.at != float("inf")
                                   else None)
        except queue.Empty:
            # The deadline passed and fn still runs: stop waiting, say it may have happened.
            return self._ended(decision, complete(ledger_pb2.COMPLETION_STATUS_UNKNOWN))
        if kind == "ok":
            try:
                result_json = json.dumps(value, separators=(",", ":"))
            except (TypeError, ValueError):
                self._ended(decision, complete(ledger_pb2.COMPLETION_STATUS_UNKNOWN))
                raise TypeError("the tool function's result is not JSON-serializable; recorded UNKNOWN")
            c = complete(ledger_pb2.COMPLETION_STATUS_SUCCEEDED, result_json=result_json)
            if c.state == ledger_pb2.EXECUTION_STATE_SUCCEEDED:
                return RunResult(RunStatus.SUCCEEDED, decision, result=value)
            return self._ended(decision, c, result=value)
        if isinstance(value, ToolError):
            envelope = common_pb2.ErrorEnvelope(
                code=value.code, category=value.category, message=value.message, retryable=value.retryable,
                resolution="retry_same_key" if value.retryable else "stop", expose_to_model=True,
                details_json=json.dumps(value.details))
            c = complete(ledger_pb2.COMPLETION_STATUS_FAILED_RETRYABLE if value.retryable
                         else ledger_pb2.COMPLETION_STATUS_FAILED_FINAL, error=envelope)
            if c.HasField("error") and c.error.code == "lease_lost":
                return RunResult(RunStatus.LEASE_LOST, decision, error=ErrorInfo.from_proto(c.error))
            return RunResult(RunStatus.FAILED, decision, error=ErrorInfo.from_proto(envelope))
        c = complete(ledger_pb2.COMPLETION_STATUS_UNKNOWN)
        if isinstance(value, TimeoutError):
            return self._ended(decision, c)
        # A bug or a crash in the tool function: recorded UNKNOWN (it may have
        # acted), then raised to the caller.
        raise value

    @staticmethod
    def _ended(decision: Decision, c: ledger_pb2.CompleteExecutionResponse, result: Any = None) -> RunResult:
        error = ErrorInfo.from_proto(c.error) if c.HasField("error") else None
        if error is not None and error.code == "lease_lost":
            return RunResult(RunStatus.LEASE_LOST, decision, error=error)
        if c.state == ledger_pb2.EXECUTION_STATE_SUCCEEDED:
            return RunResult(RunStatus.SUCCEEDED, decision, result=result)
        return RunResult(RunStatus.UNKNOWN, decision, result=result, error=error)

    def _reconcile(self, decision: Decision, auth: Auth, reconcile: Optional[ReconcileFn],
                   error: Optional[ErrorInfo]) -> RunResult:
        if reconcile is None:
            return RunResult(RunStatus.RECONCILE_REQUIRED, decision, error=error)
        found = reconcile(decision.idempotency_key, json.loads(decision.normalized_arguments))
        if found is None:
            return RunResult(RunStatus.RECONCILE_REQUIRED, decision, error=error)
        r = self._ledger.ReconcileExecution(ledger_pb2.ReconcileExecutionRequest(
            auth=auth.to_proto(), idempotency_key=decision.idempotency_key, applied=found.applied,
            result_json=json.dumps(found.result, separators=(",", ":")) if found.applied else ""),
            timeout=self.timeout)
        if r.HasField("error"):
            return RunResult(RunStatus.REFUSED, decision, error=ErrorInfo.from_proto(r.error))
        return RunResult(RunStatus.RECONCILED, decision, result=found.result if found.applied else None,
                         applied=found.applied)

    def get_execution(self, auth: Auth, idempotency_key: str) -> ledger_pb2.Execution:
        return self._ledger.GetExecution(ledger_pb2.GetExecutionRequest(
            auth=auth.to_proto(), idempotency_key=idempotency_key), timeout=self.timeout).execution

    # -- approvals ------------------------------------------------------------

    def _token(self, identity_token: Optional[str]) -> str:
        return self.identity_token if identity_token is None else identity_token

    def list_approvals(self, *, status: Optional[ApprovalState] = None, page_size: int = 0, page_token: str = "",
                       identity_token: Optional[str] = None) -> approval_pb2.ListApprovalsResponse:
        """The approvals this caller may view (one page; `next_page_token` for the next)."""
        wanted: approval_pb2.ApprovalStatus = approval_pb2.APPROVAL_STATUS_UNSPECIFIED
        for value, state in APPROVAL_STATUSES.items():
            if state is status:
                wanted = value
        return self._approvals.ListApprovals(approval_pb2.ListApprovalsRequest(
            identity_token=self._token(identity_token), status=wanted, page_size=page_size, page_token=page_token),
            timeout=self.timeout)

    def get_approval(self, approval_id: str, *, identity_token: Optional[str] = None) -> approval_pb2.Approval:
        return self._approvals.GetApproval(approval_pb2.GetApprovalRequest(
            identity_token=self._token(identity_token), approval_id=approval_id), timeout=self.timeout).approval

    def decide(self, approval: approval_pb2.Approval, approve: bool, reason: str, *,
               identity_token: Optional[str] = None) -> approval_pb2.Approval:
        """Approves or rejects `approval` as it was shown (bound to its
        `arguments_sha256`); a refusal raises GateError with toolgate's envelope."""
        r = self._approvals.DecideApproval(approval_pb2.DecideApprovalRequest(
            identity_token=self._token(identity_token), approval_id=approval.approval_id,
            verdict=approval_pb2.VERDICT_APPROVE if approve else approval_pb2.VERDICT_REJECT,
            arguments_sha256=approval.arguments_sha256, reason=reason), timeout=self.timeout)
        if r.HasField("error"):
            raise GateError(ErrorInfo.from_proto(r.error))
        return r.approval

    def wait_for_approval(self, approval_id: str, timeout: float, *,
                          identity_token: Optional[str] = None) -> approval_pb2.Approval:
        """Waits (over WatchApprovals) until the approval is decided or expires,
        and returns it; `approval_state(a)` says which. Raises ApprovalTimeout
        after `timeout` seconds without a decision."""
        token = self._token(identity_token)
        stop_at = time.monotonic() + timeout
        while True:
            left = stop_at - time.monotonic()
            if left <= 0:
                raise ApprovalTimeout(f"approval {approval_id} was not decided within {timeout} s")
            stream = self._approvals.WatchApprovals(approval_pb2.WatchApprovalsRequest(identity_token=token),
                                                    timeout=left)
            try:
                # The watch is open: a decision from now on arrives as an event;
                # one made before is read once here.
                current = self._approvals.GetApproval(approval_pb2.GetApprovalRequest(
                    identity_token=token, approval_id=approval_id), timeout=max(0.001, min(self.timeout, left))).approval
                if approval_state(current) is not ApprovalState.PENDING:
                    return current
                for event in _events(stream):
                    a = event.event.approval
                    if a.approval_id == approval_id and approval_state(a) is not ApprovalState.PENDING:
                        return a
            except grpc.RpcError as failure:
                if failure.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise ApprovalTimeout(f"approval {approval_id} was not decided within {timeout} s") from None
                if failure.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                time.sleep(min(0.2, max(0.0, stop_at - time.monotonic())))
            finally:
                stream.cancel()


def _events(stream: Any) -> Iterator[approval_pb2.WatchApprovalsResponse]:
    yield from stream


def _loads(text: str) -> Any:
    return json.loads(text) if text else None
