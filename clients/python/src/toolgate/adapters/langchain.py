"""Guards LangChain tools (langchain-core) with toolgate:

    from toolgate.adapters.langchain import guard_tools
    tools = guard_tools(gate, auth, [refund_order, get_order])

Each returned tool has the wrapped tool's name, description and argument
schema, so the model is offered the same tools. A call goes through
`Gate.run`: an allowed call runs the wrapped tool once per operation with
toolgate's normalized arguments; a refused one never reaches it, and the
ToolMessage the model gets carries toolgate's `model_output`.

LangChain hands tools the model's arguments already parsed (a dict); they
are sent to toolgate as that dict's JSON text, which toolgate validates,
normalizes and hashes like any other.
"""

from __future__ import annotations

import contextvars
import json
from typing import Any, List, Optional, Sequence

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, PrivateAttr

from toolgate._core import ReconcileFn
from toolgate._gate import Gate
from toolgate._types import Auth
from toolgate.adapters._common import Guard, RequestId, call_id_as_request_id

__all__ = ["GuardedTool", "guard_tool", "guard_tools"]

_call_id: contextvars.ContextVar[str] = contextvars.ContextVar("toolgate_call_id", default="")


def _tool_call_id(value: Any) -> str:
    if isinstance(value, dict) and value.get("type") == "tool_call":
        return str(value.get("id") or "")
    return ""


class GuardedTool(BaseTool):
    """A LangChain tool whose every call is authorized and run through toolgate."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _inner: BaseTool = PrivateAttr()
    _guard: Guard[Gate] = PrivateAttr()

    def __init__(self, inner: BaseTool, guard: Guard[Gate]):
        # A JSON-schema args_schema: LangChain passes the model's arguments
        # through unvalidated and uncoerced; toolgate validates them.
        schema = inner.tool_call_schema
        if not isinstance(schema, dict):
            schema = schema.model_json_schema() if hasattr(schema, "model_json_schema") else schema.schema()
        super().__init__(name=inner.name, description=inner.description, args_schema=schema)
        self._inner = inner
        self._guard = guard

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        token = _call_id.set(_tool_call_id(input))
        try:
            return super().invoke(input, config, **kwargs)
        finally:
            _call_id.reset(token)

    async def ainvoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        token = _call_id.set(_tool_call_id(input))
        try:
            return await super().ainvoke(input, config, **kwargs)
        finally:
            _call_id.reset(token)

    def _run(self, **arguments: Any) -> Any:
        arguments.pop("run_manager", None)
        raw = json.dumps(arguments, separators=(",", ":"))

        def run_tool(normalized: Any, idempotency_key: str, deadline: Any) -> Any:
            return self._inner.invoke(normalized)

        outcome = self._guard.run(self.name, _call_id.get(), raw, run_tool)
        return outcome.model_output  # the result as JSON, or toolgate's refusal


def guard_tool(guard: Guard[Gate], tool: BaseTool) -> GuardedTool:
    return GuardedTool(tool, guard)


def guard_tools(gate: Gate, auth: Auth, tools: Sequence[BaseTool], *,
                request_id: RequestId = call_id_as_request_id, entities_json: Optional[Any] = None,
                reconcile: Optional[ReconcileFn] = None, on_result: Optional[Any] = None) -> List[GuardedTool]:
    """The `tools`, guarded by toolgate through `gate` as `auth` (see `Guard`)."""
    guard = Guard(gate, auth, request_id, entities_json, reconcile, on_result)
    return [guard_tool(guard, t) for t in tools]
