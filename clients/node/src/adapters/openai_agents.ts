// The OpenAI Agents SDK for JavaScript (`@openai/agents`): guard function
// tools in two lines.
//
//   const tools = guardTools([refundTool], { gate, auth });
//   const agent = new Agent({ name: "support", tools, model });
//
// The model's argument text goes to toolgate as it came; an allowed call
// invokes the tool once per operation with the authorized (normalized)
// arguments; a refused one never reaches it, and the model is shown
// toolgate's `model_output` as the tool's output.
import { guardedCall, type GuardOptions } from "../guard.js";

/* eslint-disable @typescript-eslint/no-explicit-any */
type AnyTool = { type: string; name: string; invoke?: (runContext: any, input: string, details?: any) => any; [k: string]: any };

/** The same tools, each function tool guarded by toolgate (other kinds are left as they are). */
export function guardTools<T extends AnyTool>(tools: T[], options: GuardOptions): T[] {
  return tools.map((t) => {
    if (t.type !== "function" || typeof t.invoke !== "function") return t;
    const invoke = t.invoke.bind(t);
    return {
      ...t,
      invoke: async (runContext: any, input: string, details?: any) => {
        const callId: string = details?.toolCall?.callId ?? details?.toolCall?.id ?? "";
        const outcome = await guardedCall(
          options,
          { tool: t.name, arguments: input, callId },
          // The tool parses and runs what was authorized, not the model's text.
          async (_normalized, _key, _deadline, context) => {
            const output = await invoke(runContext, context.decision.normalizedArguments, details);
            // The ledger keeps JSON: a tool's JSON text is kept as the value it encodes.
            return typeof output === "string" ? parseOr(output) : output;
          },
        );
        if (!outcome.allowed) return outcome.modelOutput;
        return typeof outcome.result === "string" ? outcome.result : JSON.stringify(outcome.result);
      },
    } as T;
  });
}

function parseOr(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
