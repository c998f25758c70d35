"""The framework adapters, exercised through the frameworks themselves with
their own scripted models (no network): the OpenAI Agents SDK's
`agents.testing.ScriptedModel` driven by `Runner`, and langchain-core's
`GenericFakeChatModel` in a tool-calling loop. An allowed call reaches the
tool (once per operation); a refused one never does, and the model gets
toolgate's `model_output` as the tool's answer."""

import json
import uuid

from toolgate import Auth, RunStatus

from refund_example import ENTITIES

BOB = Auth("bob", "acme", ["support_agent"], ["orders:read", "orders:refund"], agent_id="support-bot")
OTHER_TENANT = Auth("bob", "globex", ["support_agent"], ["orders:read", "orders:refund"], agent_id="support-bot")
# The model's text, not canonical: toolgate normalizes it before the tool sees it.
MODEL_ARGS = '{ "reason": "late", "currency": "USD", "amount_cents": 2500, "order_id": "ord_1001" }'
FORBIDDEN = {"error": {"code": "forbidden", "message": "the resource belongs to another tenant",
                       "resolution": "stop", "retryable": False}}


def entities(tool, arguments):
    return ENTITIES


def per_test_operation():
    """request ids unique to this test run, one per model tool call."""
    run = uuid.uuid4().hex
    return lambda tool, call_id, raw: f"{run}:{tool}:{call_id}"


# -- OpenAI Agents SDK --------------------------------------------------------

def openai_agent_run(gate, auth, arguments, call_ids):
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from toolgate.adapters.openai_agents import guard_tools

    refunds = []

    @function_tool
    def refund_order(order_id: str, amount_cents: int, currency: str, reason: str) -> dict:
        """Refund part or all of an order."""
        refunds.append({"order_id": order_id, "amount_cents": amount_cents, "currency": currency, "reason": reason})
        return {"refund_id": f"re_{len(refunds)}", "amount_cents": amount_cents}

    steps = [[function_call("refund_order", arguments, call_id=c)] for c in call_ids]
    model = ScriptedModel([*steps, [assistant_message("done")]])
    outcomes = []
    request_id = per_test_operation()
    agent = Agent(name="support", instructions="Refund when asked.", model=model,
                  tools=guard_tools(gate, auth, [refund_order], entities_json=entities, request_id=request_id,
                                    on_result=lambda tool, out: outcomes.append(out)))
    result = Runner.run_sync(agent, "Please refund my late order ord_1001.",
                             run_config=RunConfig(tracing_disabled=True))
    model.assert_complete()
    # What the model was given back for each tool call, in order.
    outputs = [item["output"] for call in model.calls for item in call.input
               if isinstance(item, dict) and item.get("type") == "function_call_output"]
    return result, refunds, outcomes, outputs[-len(call_ids):] if outputs else []


def test_openai_agents_allowed_call_reaches_the_tool_once(async_gate):
    result, refunds, outcomes, outputs = openai_agent_run(async_gate, BOB, MODEL_ARGS, ["call_1"])
    assert result.final_output == "done"
    assert refunds == [{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}]
    assert [o.status for o in outcomes] == [RunStatus.SUCCEEDED]
    assert json.loads(outputs[0]) == {"refund_id": "re_1", "amount_cents": 2500}


def test_openai_agents_denied_call_returns_model_output_and_never_reaches_the_tool(async_gate):
    result, refunds, outcomes, outputs = openai_agent_run(async_gate, OTHER_TENANT, MODEL_ARGS, ["call_1"])
    assert result.final_output == "done"
    assert refunds == []
    assert [o.status for o in outcomes] == [RunStatus.DENIED]
    assert json.loads(outputs[0]) == FORBIDDEN
    assert outputs[0] == outcomes[0].decision.model_output


def test_openai_agents_invalid_arguments_get_toolgates_repair_hint(async_gate):
    bad = '{"order_id":"ord_1001","amount_cents":"2500","currency":"USD","reason":"late"}'
    _, refunds, outcomes, outputs = openai_agent_run(async_gate, BOB, bad, ["call_1"])
    assert refunds == []
    shown = json.loads(outputs[0])["error"]
    assert (shown["code"], shown["resolution"]) == ("schema_violation", "repair_arguments")


def test_openai_agents_guard_needs_an_async_gate(gate):
    from agents import function_tool

    from toolgate.adapters.openai_agents import guard_tools

    @function_tool
    def noop() -> str:
        """Nothing."""
        return ""

    try:
        guard_tools(gate, BOB, [noop])
    except TypeError as refused:
        assert "needs an AsyncGate" in str(refused)
    else:
        raise AssertionError("a sync Gate was accepted")


# -- LangChain ------------------------------------------------------------------

def langchain_run(gate, auth, args):
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool

    from toolgate.adapters.langchain import guard_tools

    refunds = []

    @tool
    def refund_order(order_id: str, amount_cents: int, currency: str, reason: str) -> dict:
        """Refund part or all of an order."""
        refunds.append({"order_id": order_id, "amount_cents": amount_cents, "currency": currency, "reason": reason})
        return {"refund_id": f"re_{len(refunds)}", "amount_cents": amount_cents}

    class Seen(BaseCallbackHandler):
        """What the chat model was given, call by call (the framework's callbacks)."""

        def __init__(self):
            self.prompts = []

        def on_chat_model_start(self, serialized, messages, **kwargs):
            self.prompts.append(messages[0])

    call = {"name": "refund_order", "args": args, "id": "call_1", "type": "tool_call"}
    model = GenericFakeChatModel(messages=iter([AIMessage(content="", tool_calls=[call]), AIMessage("done")]))
    seen = Seen()
    outcomes = []
    tools = {t.name: t for t in guard_tools(gate, auth, [refund_order], entities_json=entities,
                                            request_id=per_test_operation(),
                                            on_result=lambda tool, out: outcomes.append(out))}
    # The tool-calling loop: the model asks, each tool call runs, the answers go back.
    messages = [HumanMessage("Please refund my late order ord_1001.")]
    while True:
        reply = model.invoke(messages, config={"callbacks": [seen]})
        messages.append(reply)
        if not reply.tool_calls:
            break
        for tool_call in reply.tool_calls:
            messages.append(tools[tool_call["name"]].invoke(tool_call))
    answers = [m for m in seen.prompts[-1] if isinstance(m, ToolMessage)]
    return reply, refunds, outcomes, answers


def test_langchain_allowed_call_reaches_the_tool_once(gate):
    reply, refunds, outcomes, answers = langchain_run(
        gate, BOB, {"reason": "late", "currency": "USD", "amount_cents": 2500, "order_id": "ord_1001"})
    assert reply.content == "done"
    assert refunds == [{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}]
    assert [o.status for o in outcomes] == [RunStatus.SUCCEEDED]
    assert outcomes[0].decision.normalized_arguments == \
        '{"amount_cents":2500,"currency":"USD","order_id":"ord_1001","reason":"late"}'
    assert [(a.tool_call_id, json.loads(a.content)) for a in answers] == [
        ("call_1", {"refund_id": "re_1", "amount_cents": 2500})]


def test_langchain_denied_call_returns_model_output_and_never_reaches_the_tool(gate):
    reply, refunds, outcomes, answers = langchain_run(
        gate, OTHER_TENANT, {"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"})
    assert reply.content == "done"
    assert refunds == []
    assert [o.status for o in outcomes] == [RunStatus.DENIED]
    assert [(a.tool_call_id, a.content) for a in answers] == [("call_1", outcomes[0].decision.model_output)]
    assert json.loads(answers[0].content) == FORBIDDEN


def test_langchain_arguments_are_not_coerced_before_toolgate_sees_them(gate):
    _, refunds, outcomes, answers = langchain_run(
        gate, BOB, {"order_id": "ord_1001", "amount_cents": "2500", "currency": "USD", "reason": "late"})
    assert refunds == []
    assert json.loads(answers[0].content)["error"]["code"] == "schema_violation"
