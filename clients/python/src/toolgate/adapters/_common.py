"""What both adapters share: one guarded call of a framework's tool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar, Union

from toolgate._aio import AsyncGate
from toolgate._core import ReconcileFn
from toolgate._gate import Gate
from toolgate._types import Auth, RunResult

G = TypeVar("G", Gate, AsyncGate)

RequestId = Callable[[str, str, str], str]
"""`request_id(tool_name, call_id, raw_arguments)`: the business operation a
call belongs to (same id = same operation: a retry returns the stored result)."""


def call_id_as_request_id(tool_name: str, call_id: str, raw_arguments: str) -> str:
    """The default: each model tool call is its own operation."""
    return f"{tool_name}:{call_id}"


@dataclass(frozen=True)
class Guard(Generic[G]):
    """How a framework's tools are guarded: through `gate` (a `Gate`, or an
    `AsyncGate` for a framework on asyncio), as `auth`."""

    gate: G
    auth: Auth
    request_id: RequestId = call_id_as_request_id
    entities_json: Optional[Callable[[str, Any], str]] = None  # (tool, parsed arguments) -> entities JSON
    reconcile: Optional[ReconcileFn] = None
    on_result: Optional[Callable[[str, RunResult], None]] = None  # (tool, result): observe each outcome

    def entities_for(self, tool: str, raw_arguments: str) -> str:
        if self.entities_json is None:
            return ""
        import json
        try:
            parsed = json.loads(raw_arguments)
        except ValueError:
            return ""  # toolgate refuses the arguments itself, with invalid_json
        return self.entities_json(tool, parsed)

    def run(self, tool: str, call_id: str, raw_arguments: str, fn: Callable[[Any, str, Any], Any]) -> RunResult:
        """One call through a `Gate`."""
        assert isinstance(self.gate, Gate), "Guard.run needs a Gate; use arun with an AsyncGate"
        outcome = self.gate.run(tool, raw_arguments, self.auth, self.request_id(tool, call_id, raw_arguments), fn,
                                reconcile=self.reconcile, call_id=call_id,
                                entities_json=self.entities_for(tool, raw_arguments))
        return self._observed(tool, outcome)

    async def arun(self, tool: str, call_id: str, raw_arguments: str, fn: Callable[[Any, str, Any], Any]) -> RunResult:
        """One call through an `AsyncGate`, on the caller's event loop."""
        assert isinstance(self.gate, AsyncGate), "Guard.arun needs an AsyncGate; use run with a Gate"
        outcome = await self.gate.run(tool, raw_arguments, self.auth, self.request_id(tool, call_id, raw_arguments),
                                      fn, reconcile=self.reconcile, call_id=call_id,
                                      entities_json=self.entities_for(tool, raw_arguments))
        return self._observed(tool, outcome)

    def _observed(self, tool: str, outcome: RunResult) -> RunResult:
        if self.on_result is not None:
            self.on_result(tool, outcome)
        return outcome
