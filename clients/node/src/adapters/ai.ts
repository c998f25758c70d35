// The Vercel AI SDK (`ai`): guard a tool set in two lines.
//
//   const tools = guardTools({ refund_order: refundTool }, { gate, auth });
//   await generateText({ model, tools, prompt });
//
// An allowed call runs the tool's `execute` once per operation with the
// authorized (normalized) arguments; a refused one never reaches it, and
// the model is shown toolgate's `model_output` as the tool's result.
import { guardedCall, type GuardOptions } from "../guard.js";

/* eslint-disable @typescript-eslint/no-explicit-any */
type AnyTool = { execute?: (input: any, options: any) => any; [k: string]: any };

/** The same tools, each `execute` guarded by toolgate (tools without one are left as they are). */
export function guardTools<T extends Record<string, AnyTool>>(tools: T, options: GuardOptions): T {
  const guarded: Record<string, AnyTool> = {};
  for (const [name, t] of Object.entries(tools)) {
    const execute = t.execute;
    if (typeof execute !== "function") {
      guarded[name] = t;
      continue;
    }
    guarded[name] = {
      ...t,
      execute: async (input: unknown, callOptions: { toolCallId: string; abortSignal?: AbortSignal }) => {
        const outcome = await guardedCall(
          options,
          // The AI SDK hands over parsed input; toolgate canonicalizes it again.
          { tool: name, arguments: JSON.stringify(input ?? {}), callId: callOptions.toolCallId },
          (normalized, idempotencyKey, deadline, context) =>
            execute(normalized, {
              ...callOptions,
              abortSignal: callOptions.abortSignal
                ? AbortSignal.any([callOptions.abortSignal, context.signal])
                : context.signal,
              toolgate: { idempotencyKey, deadline, attempt: context.attempt },
            }),
        );
        // A refusal is the tool's result as far as the model can tell: the model-safe JSON.
        return outcome.allowed ? outcome.result : JSON.parse(outcome.modelOutput);
      },
    };
  }
  return guarded as T;
}

/** What a guarded `execute` finds in its options beside the AI SDK's own. */
export interface ToolgateExecuteContext {
  toolgate: { idempotencyKey: string; deadline: Date; attempt: number };
}
