"""Guards the OpenAI Agents SDK's function tools with toolgate:

    from toolgate.adapters.openai_agents import guard_tools
    agent = Agent(name="support", tools=guard_tools(gate, auth, [refund_order, get_order]))

`gate` is an `AsyncGate`: the Agents SDK runs tools on its event loop, and
each call is awaited there (no thread per call). Each call the model makes
goes through `AsyncGate.run` with the model's argument
text exactly as produced: an allowed call runs the tool once per operation
with toolgate's normalized arguments; a refused one never reaches the tool,
and the model gets toolgate's `model_output` as the tool's output.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional, Sequence

from agents import FunctionTool
from agents.tool_context import ToolContext

from toolgate._aio import AsyncGate
from toolgate._core import ReconcileFn
from toolgate._types import Auth
from toolgate.adapters._common import Guard, RequestId, call_id_as_request_id

__all__ = ["guard_tool", "guard_tools"]


def guard_tool(guard: Guard[AsyncGate], tool: FunctionTool) -> FunctionTool:
    """`tool`, with every call authorized and run through `guard`."""
    inner = tool.on_invoke_tool

    async def invoke(ctx: ToolContext[Any], raw_arguments: str) -> Any:
        async def run_tool(arguments: Any, idempotency_key: str, deadline: Any) -> Any:
            # The tool gets what toolgate authorized (the normalized arguments), never the model's text.
            return await inner(ctx, json.dumps(arguments))

        outcome = await guard.arun(tool.name, ctx.tool_call_id, raw_arguments, run_tool)
        return outcome.model_output  # the result as JSON, or toolgate's refusal

    return FunctionTool(name=tool.name, description=tool.description, params_json_schema=tool.params_json_schema,
                        on_invoke_tool=invoke, strict_json_schema=tool.strict_json_schema,
                        is_enabled=tool.is_enabled)


def guard_tools(gate: AsyncGate, auth: Auth, tools: Sequence[FunctionTool], *,
                request_id: RequestId = call_id_as_request_id, entities_json: Optional[Any] = None,
                reconcile: Optional[ReconcileFn] = None, on_result: Optional[Any] = None) -> List[FunctionTool]:
    """The `tools`, guarded by toolgate through `gate` as `auth` (see `Guard`)."""
    if not isinstance(gate, AsyncGate):
        raise TypeError("toolgate.adapters.openai_agents.guard_tools needs an AsyncGate (the Agents SDK runs on asyncio)")
    guard = Guard(gate, auth, request_id, entities_json, reconcile, on_result)
    return [guard_tool(guard, t) for t in tools]

