// The framework adapters, exercised through the frameworks themselves with
// their own test models (no network): the Vercel AI SDK with MockLanguageModelV3
// from `ai/test`, the OpenAI Agents SDK with a Model of our own implementing
// its interface. An allowed call reaches the tool once; a denied call never
// reaches it, and the model is shown toolgate's model_output.
import test from "node:test";
import assert from "node:assert/strict";

import { generateText, stepCountIs, tool as aiTool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { Agent, Runner, Usage, setTracingDisabled, tool as agentTool } from "@openai/agents";
import { z } from "zod";

import { guardTools as guardAi } from "@toolgate/client/ai";
import { guardTools as guardAgents } from "@toolgate/client/openai-agents";

import { BOB, DemoProvider, ENTITIES } from "../examples/refund.js";
import { fresh, gate } from "./support.js";

setTracingDisabled(true);

const refundInput = z.object({
  order_id: z.string(),
  amount_cents: z.number(),
  currency: z.string(),
  reason: z.string(),
});

/** The same refund for both: allowed for 25.00; over the order's total (500.00) it is denied. */
const SMALL = '{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}';
const TOO_BIG = '{"order_id":"ord_1001","amount_cents":90000,"currency":"USD","reason":"late"}';

// ---- Vercel AI SDK --------------------------------------------------------

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** A scripted model: first a call of refund_order with `input`, then text. */
function scriptedAiModel(input, toolCallId) {
  let step = 0;
  return new MockLanguageModelV3({
    doGenerate: async () => {
      step += 1;
      if (step === 1) {
        return {
          content: [{ type: "tool-call", toolCallId, toolName: "refund_order", input }],
          finishReason: { unified: "tool-calls", raw: "tool_calls" },
          usage,
          warnings: [],
        };
      }
      return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
    },
  });
}

/** What the model was shown as the tool's result, in its second call. */
function aiToolResult(model, toolCallId) {
  const prompt = model.doGenerateCalls[1].prompt;
  const part = prompt.flatMap((m) => (m.role === "tool" ? m.content : [])).find((p) => p.toolCallId === toolCallId);
  assert.ok(part, JSON.stringify(prompt));
  return part.output;
}

async function runAi(input, provider) {
  const g = gate();
  const toolCallId = fresh("call");
  const tools = guardAi(
    {
      refund_order: aiTool({
        description: "Refund an order",
        inputSchema: refundInput,
        execute: (args, { toolgate }) => provider.refund(args, toolgate.idempotencyKey),
      }),
    },
    { gate: g, auth: BOB, entitiesJson: () => ENTITIES },
  );
  const model = scriptedAiModel(input, toolCallId);
  try {
    const result = await generateText({ model, tools, prompt: "refund my order", stopWhen: stepCountIs(3) });
    return { result, model, toolCallId };
  } finally {
    g.close();
  }
}

test("Vercel AI SDK: an allowed call reaches the tool once, with the authorized arguments", async () => {
  const provider = new DemoProvider();
  const { result, model, toolCallId } = await runAi(SMALL, provider);
  assert.equal(provider.calls, 1);
  assert.deepEqual(aiToolResult(model, toolCallId), { type: "json", value: { refund_id: "re_1", amount_cents: 2500 } });
  assert.equal(result.text, "done");
});

test("Vercel AI SDK: a denied call never reaches the tool; the model sees model_output", async () => {
  const provider = new DemoProvider();
  const { model, toolCallId } = await runAi(TOO_BIG, provider);
  assert.equal(provider.calls, 0);
  const shown = aiToolResult(model, toolCallId);
  assert.equal(shown.type, "json");
  // Exactly what toolgate answered for this call.
  const g = gate();
  const d = await g.authorize({ tool: "refund_order", arguments: TOO_BIG, auth: BOB, requestId: fresh("x"), entitiesJson: ENTITIES });
  g.close();
  assert.equal(d.decision, "deny");
  assert.deepEqual(shown.value, JSON.parse(d.modelOutput));
  assert.equal(shown.value.error.code, d.error.code);
});

// ---- OpenAI Agents SDK ----------------------------------------------------

/** A Model of our own (the SDK's interface): calls refund_order with `input`, then answers. */
class ScriptedModel {
  constructor(input, callId) {
    this.input = input;
    this.callId = callId;
    this.requests = [];
  }

  async getResponse(request) {
    this.requests.push(request);
    const output =
      this.requests.length === 1
        ? [{ type: "function_call", callId: this.callId, name: "refund_order", arguments: this.input, status: "completed" }]
        : [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "done" }] }];
    return { usage: new Usage(), output };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse() {
    throw new Error("not streamed in this test");
  }
}

/** What the model was shown as the tool's output, in its second request. */
function agentToolOutput(model) {
  const input = model.requests[1].input;
  const item = input.find((i) => i.type === "function_call_result" && i.callId === model.callId);
  assert.ok(item, JSON.stringify(input));
  return typeof item.output === "string" ? item.output : item.output.text;
}

async function runAgent(input, provider) {
  const g = gate();
  const model = new ScriptedModel(input, fresh("call"));
  const refund = agentTool({
    name: "refund_order",
    description: "Refund an order",
    parameters: refundInput,
    execute: async (args) => JSON.stringify(await provider.refund(args, "")),
  });
  const agent = new Agent({ name: "support", instructions: "help", model, tools: guardAgents([refund], { gate: g, auth: BOB, entitiesJson: () => ENTITIES }) });
  try {
    const result = await new Runner({ tracingDisabled: true }).run(agent, "refund my order");
    return { result, model };
  } finally {
    g.close();
  }
}

test("OpenAI Agents SDK: an allowed call reaches the tool once", async () => {
  const provider = new DemoProvider();
  const { result, model } = await runAgent(SMALL, provider);
  assert.equal(provider.calls, 1);
  assert.deepEqual(JSON.parse(agentToolOutput(model)), { refund_id: "re_1", amount_cents: 2500 });
  assert.equal(result.finalOutput, "done");
});

test("OpenAI Agents SDK: a denied call never reaches the tool; the model sees model_output", async () => {
  const provider = new DemoProvider();
  const { model } = await runAgent(TOO_BIG, provider);
  assert.equal(provider.calls, 0);
  const g = gate();
  const d = await g.authorize({ tool: "refund_order", arguments: TOO_BIG, auth: BOB, requestId: fresh("x"), entitiesJson: ENTITIES });
  g.close();
  assert.equal(d.decision, "deny");
  assert.equal(agentToolOutput(model), d.modelOutput);
});
