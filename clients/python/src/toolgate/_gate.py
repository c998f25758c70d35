"""`Gate`: one connection to toolgate, and the executor's safe path through it."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Iterator, List, Optional, Union

import grpc

from toolgate import _core
from toolgate._config import GateConfig, as_config
from toolgate._core import ReconcileFn, ToolFn
from toolgate._types import (Approval, ApprovalPage, ApprovalState, Auth, Decision, ErrorInfo, Execution, RunResult,
                             RunStatus, ToolgateError, ToolInfo, from_rpc_error)
from toolgate.v1 import (approval_pb2, approval_pb2_grpc, authorization_pb2, authorization_pb2_grpc, ledger_pb2,
                         ledger_pb2_grpc)

class Gate:
    """A connection to toolgate: `Gate("127.0.0.1:50051")`, or
    `Gate(GateConfig(target, tls=True, timeout=3.0, identity_token=...))`.
    `channel` replaces the configured channel with one you made (the
    configuration's timeouts and waits still apply).

    Every method answers a typed value (never a protobuf message) or raises
    `ToolgateError`: toolgate's envelope of a refusal, or a failed call with
    its gRPC status kept (`grpc_status`).
    """

    def __init__(self, config: Union[GateConfig, str] = GateConfig(), *, channel: Optional[grpc.Channel] = None):
        self.config = as_config(config)
        if channel is None:
            opts = self.config.channel_options()
            if self.config.secure:
                creds = grpc.ssl_channel_credentials(self.config.root_certificates, self.config.private_key,
                                                     self.config.certificate_chain)
                channel = grpc.secure_channel(self.config.target, creds, options=opts)
            else:
                channel = grpc.insecure_channel(self.config.target, options=opts)
            self._owned = True
        else:
            self._owned = False
        self.channel = channel
        self._authz = authorization_pb2_grpc.AuthorizationServiceStub(channel)
        self._ledger = ledger_pb2_grpc.LedgerServiceStub(channel)
        self._approvals = approval_pb2_grpc.ApprovalServiceStub(channel)

    @property
    def timeout(self) -> float:
        return self.config.timeout

    def close(self) -> None:
        if self._owned:
            self.channel.close()

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: Any, request: Any, timeout: Optional[float] = None) -> Any:
        """One unary call; a failed one raises ToolgateError (never grpc.RpcError)."""
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as failure:
            raise from_rpc_error(failure) from None

    # -- authorization ------------------------------------------------------

    def authorize(self, tool: str, raw_arguments: Union[str, bytes], auth: Auth, *, request_id: str = "",
                  call_id: str = "", approval_id: str = "", entities_json: str = "", tool_version: str = "",
                  begin_execution: bool = False, lease_ms: int = 0) -> Decision:
        """Asks toolgate whether the model's call may run. `raw_arguments`
        are the model's argument text exactly as produced (str is sent as
        UTF-8): toolgate parses, normalizes and hashes them."""
        call = _core.Call(tool, raw_arguments, auth, request_id, call_id, approval_id, entities_json, tool_version,
                          begin_execution, lease_ms)
        return Decision.from_proto(self._call(self._authz.Authorize, call.request()))

    def list_tools(self, auth: Auth) -> List[ToolInfo]:
        r = self._call(self._authz.ListTools, authorization_pb2.ListToolsRequest(auth=auth.to_proto()))
        return [ToolInfo.from_proto(t) for t in r.tools]

    # -- the exactly-once run -------------------------------------------------

    def run(self, tool: str, raw_arguments: Union[str, bytes], auth: Auth, request_id: str, fn: ToolFn, *,
            reconcile: Optional[ReconcileFn] = None, approval_id: str = "", call_id: str = "",
            entities_json: str = "", tool_version: str = "", lease_ms: int = 0,
            wait: Optional[float] = None) -> RunResult:
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
        after the ledger's `retry_after_ms` for up to `wait` seconds (default
        `GateConfig.in_progress_wait`, 30 s; 0: it answers IN_PROGRESS at once).
        """
        call = _core.Call(tool, raw_arguments, auth, request_id, call_id, approval_id, entities_json, tool_version,
                          True, lease_ms)
        give_up = time.monotonic() + (self.config.in_progress_wait if wait is None else wait)
        while True:
            step = _core.after_begin(self._call(self._authz.Authorize, call.request()), give_up)
            if not step.pause:
                break
            time.sleep(step.pause)
        if step.result is not None:
            return step.result
        assert step.decision is not None  # INVARIANT: every step but a pause carries its decision
        if step.reconcile:
            return self._reconcile(step.decision, auth, reconcile, step.error)
        assert step.execution is not None
        return self._execute(step.decision, auth, step.execution, fn)

    def _execute(self, decision: Decision, auth: Auth, e: ledger_pb2.BeginExecutionResponse,
                 fn: ToolFn) -> RunResult:
        deadline = _core.deadline_of(decision, e)
        arguments = _core.arguments_of(decision)
        done: "queue.Queue[_core.Completion]" = queue.Queue(maxsize=1)

        def call() -> None:
            try:
                done.put(_core.returned(fn(arguments, decision.idempotency_key, deadline)))
            except BaseException as failure:  # handed to the waiting thread
                done.put(_core.raised(failure))

        threading.Thread(target=call, name=f"toolgate-run-{decision.idempotency_key[:24]}", daemon=True).start()
        try:
            completion = done.get(timeout=deadline.remaining() if deadline.at != float("inf") else None)
        except queue.Empty:
            # The deadline passed and fn still runs: stop waiting, say it may have happened.
            completion = _core.EXPIRED
        c = self._call(self._ledger.CompleteExecution, completion.request(auth, decision, e))
        return _core.after_completion(decision, completion, c)

    def _reconcile(self, decision: Decision, auth: Auth, reconcile: Optional[ReconcileFn],
                   error: Optional[ErrorInfo]) -> RunResult:
        found = None if reconcile is None else reconcile(decision.idempotency_key, _core.arguments_of(decision))
        if found is None:
            return RunResult(RunStatus.RECONCILE_REQUIRED, decision, error=error)
        r = self._call(self._ledger.ReconcileExecution, _core.reconcile_request(auth, decision, found))
        return _core.after_reconcile(decision, found, r)

    def get_execution(self, auth: Auth, idempotency_key: str) -> Execution:
        r = self._call(self._ledger.GetExecution, ledger_pb2.GetExecutionRequest(
            auth=auth.to_proto(), idempotency_key=idempotency_key))
        return Execution.from_proto(r.execution)

    # -- approvals ------------------------------------------------------------

    def _token(self, identity_token: Optional[str]) -> str:
        return self.config.identity_token if identity_token is None else identity_token

    def list_approvals(self, *, status: Optional[ApprovalState] = None, page_size: int = 0, page_token: str = "",
                       identity_token: Optional[str] = None) -> ApprovalPage:
        """The approvals this caller may view (one page; `next_page_token` for the next)."""
        request = _core.list_approvals_request(self._token(identity_token), status, page_size, page_token)
        return ApprovalPage.from_proto(self._call(self._approvals.ListApprovals, request))

    def get_approval(self, approval_id: str, *, identity_token: Optional[str] = None) -> Approval:
        return self._get_approval(approval_id, self._token(identity_token), self.timeout)

    def _get_approval(self, approval_id: str, token: str, timeout: float) -> Approval:
        r = self._call(self._approvals.GetApproval, approval_pb2.GetApprovalRequest(
            identity_token=token, approval_id=approval_id), timeout=timeout)
        return Approval.from_proto(r.approval)

    def decide(self, approval: Approval, approve: bool, reason: str, *,
               identity_token: Optional[str] = None) -> Approval:
        """Approves or rejects `approval` as it was shown (bound to its
        `arguments_sha256`); a refusal (self-approval, another tenant, a
        stale hash) raises ToolgateError with toolgate's envelope."""
        request = _core.decide_request(self._token(identity_token), approval, approve, reason)
        return _core.decided(self._call(self._approvals.DecideApproval, request))

    def wait_for_approval(self, approval_id: str, timeout: float, *,
                          identity_token: Optional[str] = None) -> Approval:
        """Waits (over WatchApprovals) until the approval is decided or
        expires, at most `timeout` seconds, and returns it as it then is:
        its `status` is still PENDING when the time ran out."""
        token = self._token(identity_token)
        stop_at = time.monotonic() + timeout
        while True:
            left = stop_at - time.monotonic()
            if left <= 0:
                return self._get_approval(approval_id, token, self.timeout)
            stream = self._approvals.WatchApprovals(approval_pb2.WatchApprovalsRequest(identity_token=token),
                                                    timeout=left)
            try:
                # The watch is open: a decision from now on arrives as an event;
                # one made before is read once here.
                current = self._get_approval(approval_id, token, max(0.001, min(self.timeout, left)))
                if current.status is not ApprovalState.PENDING:
                    return current
                for event in _events(stream):
                    settled = _core.settled_event(event, approval_id)
                    if settled is not None:
                        return settled
            except (grpc.RpcError, ToolgateError) as failure:
                if not _core.watch_timed_out(failure):
                    time.sleep(min(0.2, max(0.0, stop_at - time.monotonic())))
            finally:
                stream.cancel()


def _events(stream: Any) -> Iterator[approval_pb2.WatchApprovalsResponse]:
    yield from stream
