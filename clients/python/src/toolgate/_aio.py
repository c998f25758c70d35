"""`AsyncGate`: `Gate` on asyncio (grpc.aio), for executors and agent
frameworks that run on an event loop: no thread per call, a coroutine tool
awaited on the caller's loop. The rules are `_core`'s, the same as `Gate`'s."""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

import grpc
import grpc.aio

from toolgate import _core
from toolgate._config import GateConfig, as_config
from toolgate._types import (Approval, ApprovalPage, ApprovalState, Auth, Decision, ErrorInfo, Execution, Reconciled,
                             RunResult, RunStatus, ToolgateError, ToolInfo, from_rpc_error)
from toolgate.v1 import (approval_pb2, approval_pb2_grpc, authorization_pb2, authorization_pb2_grpc, ledger_pb2,
                         ledger_pb2_grpc)

AsyncToolFn = Callable[[Any, str, Any], Any]
"""`fn(normalized_arguments, idempotency_key, deadline)`: a coroutine function, or a plain one (run in a thread)."""
AsyncReconcileFn = Callable[[str, Any], Union[Optional[Reconciled], Awaitable[Optional[Reconciled]]]]
"""`reconcile(idempotency_key, normalized_arguments)`, plain or a coroutine function."""


@dataclass(frozen=True)
class _Stubs:
    authz: authorization_pb2_grpc.AuthorizationServiceStub
    ledger: ledger_pb2_grpc.LedgerServiceStub
    approvals: approval_pb2_grpc.ApprovalServiceStub

    @classmethod
    def on(cls, channel: grpc.aio.Channel) -> "_Stubs":
        return cls(authorization_pb2_grpc.AuthorizationServiceStub(channel),
                   ledger_pb2_grpc.LedgerServiceStub(channel), approval_pb2_grpc.ApprovalServiceStub(channel))


class AsyncGate:
    """A connection to toolgate on asyncio: `AsyncGate("127.0.0.1:50051")`
    or `AsyncGate(GateConfig(...))`, used as `async with`. The same calls as
    `Gate`, awaited; the same typed answers; failures raise `ToolgateError`.

    The channel is opened on first use, on the running event loop (a
    grpc.aio channel belongs to one loop): a gate made outside any loop,
    then used by a framework that runs its own, works. Used from another
    loop later, it opens a new channel there. `channel` is one you made,
    used as it is.
    """

    def __init__(self, config: Union[GateConfig, str] = GateConfig(), *,
                 channel: Optional[grpc.aio.Channel] = None):
        self.config = as_config(config)
        self._owned = channel is None
        self._channel = channel
        self._stubs: Optional[_Stubs] = None if channel is None else _Stubs.on(channel)
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    @property
    def timeout(self) -> float:
        return self.config.timeout

    def _bound(self) -> _Stubs:
        loop = asyncio.get_running_loop()
        if self._stubs is not None and (not self._owned or self._loop is loop):
            return self._stubs
        # A new loop (or the first): the old channel, if any, belonged to a
        # loop that is gone and cannot be closed from here.
        opts = self.config.channel_options()
        if self.config.secure:
            creds = grpc.ssl_channel_credentials(self.config.root_certificates, self.config.private_key,
                                                 self.config.certificate_chain)
            self._channel = grpc.aio.secure_channel(self.config.target, creds, options=opts)
        else:
            self._channel = grpc.aio.insecure_channel(self.config.target, options=opts)
        self._loop = loop
        self._stubs = _Stubs.on(self._channel)
        return self._stubs

    async def close(self) -> None:
        if self._owned and self._channel is not None and self._loop is asyncio.get_running_loop():
            await self._channel.close()
        if self._owned:
            self._channel, self._stubs, self._loop = None, None, None

    async def __aenter__(self) -> "AsyncGate":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _call(self, method: Callable[[_Stubs], Any], request: Any, timeout: Optional[float] = None) -> Any:
        """One unary call; a failed one raises ToolgateError (never grpc.RpcError)."""
        try:
            return await method(self._bound())(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as failure:
            raise from_rpc_error(failure) from None

    # -- authorization ------------------------------------------------------

    async def authorize(self, tool: str, raw_arguments: Union[str, bytes], auth: Auth, *, request_id: str = "",
                        call_id: str = "", approval_id: str = "", entities_json: str = "", tool_version: str = "",
                        begin_execution: bool = False, lease_ms: int = 0) -> Decision:
        """`Gate.authorize`, awaited."""
        call = _core.Call(tool, raw_arguments, auth, request_id, call_id, approval_id, entities_json, tool_version,
                          begin_execution, lease_ms)
        return Decision.from_proto(await self._call(lambda s: s.authz.Authorize, call.request()))

    async def list_tools(self, auth: Auth) -> list[ToolInfo]:
        r = await self._call(lambda s: s.authz.ListTools, authorization_pb2.ListToolsRequest(auth=auth.to_proto()))
        return [ToolInfo.from_proto(t) for t in r.tools]

    # -- the exactly-once run -------------------------------------------------

    async def run(self, tool: str, raw_arguments: Union[str, bytes], auth: Auth, request_id: str, fn: AsyncToolFn,
                  *, reconcile: Optional[AsyncReconcileFn] = None, approval_id: str = "", call_id: str = "",
                  entities_json: str = "", tool_version: str = "", lease_ms: int = 0,
                  wait: Optional[float] = None) -> RunResult:
        """`Gate.run`, awaited. A coroutine `fn` is awaited on this loop and
        cancelled if it is still running at the deadline (recorded UNKNOWN:
        it may have acted); a plain `fn` runs in a thread, as in `Gate`."""
        call = _core.Call(tool, raw_arguments, auth, request_id, call_id, approval_id, entities_json, tool_version,
                          True, lease_ms)
        give_up = time.monotonic() + (self.config.in_progress_wait if wait is None else wait)
        while True:
            step = _core.after_begin(await self._call(lambda s: s.authz.Authorize, call.request()), give_up)
            if not step.pause:
                break
            await asyncio.sleep(step.pause)
        if step.result is not None:
            return step.result
        assert step.decision is not None  # INVARIANT: every step but a pause carries its decision
        if step.reconcile:
            return await self._reconcile(step.decision, auth, reconcile, step.error)
        assert step.execution is not None
        return await self._execute(step.decision, auth, step.execution, fn)

    async def _execute(self, decision: Decision, auth: Auth, e: ledger_pb2.BeginExecutionResponse,
                       fn: AsyncToolFn) -> RunResult:
        deadline = _core.deadline_of(decision, e)
        arguments = _core.arguments_of(decision)

        async def call() -> _core.Completion:
            try:
                if inspect.iscoroutinefunction(fn):
                    value = await fn(arguments, decision.idempotency_key, deadline)
                else:
                    value = await asyncio.to_thread(fn, arguments, decision.idempotency_key, deadline)
                    if inspect.isawaitable(value):
                        value = await value
            except Exception as failure:  # a cancellation at the deadline is not the tool's failure
                return _core.raised(failure)
            return _core.returned(value)

        try:
            completion = await asyncio.wait_for(call(), None if deadline.at == float("inf")
                                                else deadline.remaining())
        except asyncio.TimeoutError:
            # The deadline passed: the tool may have acted.
            completion = _core.EXPIRED
        c = await self._call(lambda s: s.ledger.CompleteExecution, completion.request(auth, decision, e))
        return _core.after_completion(decision, completion, c)

    async def _reconcile(self, decision: Decision, auth: Auth, reconcile: Optional[AsyncReconcileFn],
                         error: Optional[ErrorInfo]) -> RunResult:
        found = None
        if reconcile is not None:
            answer = reconcile(decision.idempotency_key, _core.arguments_of(decision))
            found = await answer if inspect.isawaitable(answer) else answer
        if found is None:
            return RunResult(RunStatus.RECONCILE_REQUIRED, decision, error=error)
        r = await self._call(lambda s: s.ledger.ReconcileExecution, _core.reconcile_request(auth, decision, found))
        return _core.after_reconcile(decision, found, r)

    async def get_execution(self, auth: Auth, idempotency_key: str) -> Execution:
        r = await self._call(lambda s: s.ledger.GetExecution, ledger_pb2.GetExecutionRequest(
            auth=auth.to_proto(), idempotency_key=idempotency_key))
        return Execution.from_proto(r.execution)

    # -- approvals ------------------------------------------------------------

    def _token(self, identity_token: Optional[str]) -> str:
        return self.config.identity_token if identity_token is None else identity_token

    async def list_approvals(self, *, status: Optional[ApprovalState] = None, page_size: int = 0,
                             page_token: str = "", identity_token: Optional[str] = None) -> ApprovalPage:
        request = _core.list_approvals_request(self._token(identity_token), status, page_size, page_token)
        return ApprovalPage.from_proto(await self._call(lambda s: s.approvals.ListApprovals, request))

    async def get_approval(self, approval_id: str, *, identity_token: Optional[str] = None) -> Approval:
        return await self._get_approval(approval_id, self._token(identity_token), self.timeout)

    async def _get_approval(self, approval_id: str, token: str, timeout: float) -> Approval:
        r = await self._call(lambda s: s.approvals.GetApproval, approval_pb2.GetApprovalRequest(
            identity_token=token, approval_id=approval_id), timeout=timeout)
        return Approval.from_proto(r.approval)

    async def decide(self, approval: Approval, approve: bool, reason: str, *,
                     identity_token: Optional[str] = None) -> Approval:
        """`Gate.decide`, awaited: a refusal raises ToolgateError."""
        request = _core.decide_request(self._token(identity_token), approval, approve, reason)
        return _core.decided(await self._call(lambda s: s.approvals.DecideApproval, request))

    async def wait_for_approval(self, approval_id: str, timeout: float, *,
                                identity_token: Optional[str] = None) -> Approval:
        """`Gate.wait_for_approval`, awaited: the approval once decided or
        expired, or as it is (PENDING) when `timeout` seconds ran out."""
        token = self._token(identity_token)
        stop_at = time.monotonic() + timeout
        while True:
            left = stop_at - time.monotonic()
            if left <= 0:
                return await self._get_approval(approval_id, token, self.timeout)
            stream = self._bound().approvals.WatchApprovals(
                approval_pb2.WatchApprovalsRequest(identity_token=token), timeout=left)
            try:
                current = await self._get_approval(approval_id, token, max(0.001, min(self.timeout, left)))
                if current.status is not ApprovalState.PENDING:
                    return current
                async for event in stream:
                    settled = _core.settled_event(event, approval_id)
                    if settled is not None:
                        return settled
            except (grpc.RpcError, ToolgateError) as failure:
                if not _core.watch_timed_out(failure):
                    await asyncio.sleep(min(0.2, max(0.0, stop_at - time.monotonic())))
            finally:
                stream.cancel()
