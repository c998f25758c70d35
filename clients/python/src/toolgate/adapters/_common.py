"""What both adapters share: one guarded call of a framework's tool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from toolgate._gate import Gate, ReconcileFn
from toolgate._types import Auth, RunResult

RequestId = Callable[[str, str, str], str]
"""`request_id(tool_name, call_id, raw_arguments)`: the business operation a
call belongs to (same id = same operation: a retry returns the stored result)."""


def call_id_as_request_id(tool_name: str, call_id: str, raw_arguments: str) -> str:
    """The default: each model tool call is its own operation."""
    return f"{tool_name}:{call_id}"


@dataclass(frozen=True)
class Guard:
    """How a framework's tools are guarded: through `gate`, as `auth`."""

    gate: Gate
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
        outcome = self.gate.run(tool, raw_arguments, self.auth, self.request_id(tool, call_id, raw_arguments), fn,
                                reconcile=self.reconcile, call_id=call_id,
                                entities_json=self.entities_for(tool, raw_arguments))
        if self.on_result is not None:
            self.on_result(tool, outcome)
        return outcome
