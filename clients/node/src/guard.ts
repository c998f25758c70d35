// What every framework adapter does with one tool call: run it through
// toolgate (authorize, begin, run once, complete) and turn a refusal into
// the model-safe text the model is shown instead of the tool's result.
import type { Gate, RunContext, RunOptions, RunResult } from "./gate.js";
import type { Auth, ErrorEnvelope } from "./types.js";

/** One tool call as a framework hands it over. */
export interface ToolCall {
  /** The tool's name as the framework knows it. */
  tool: string;
  /** The argument text (the model's own bytes where the framework keeps them). */
  arguments: string;
  /** The model's tool-call id. */
  callId: string;
}

export interface GuardOptions {
  gate: Gate;
  /** Who is calling: from YOUR authentication (a function to read it per call). */
  auth: Auth | ((call: ToolCall) => Auth | Promise<Auth>);
  /**
   * The business operation of a call: the same id is the same operation,
   * run once. Default: the model's tool-call id (a replay of the same model
   * step runs nothing twice).
   */
  requestId?: (call: ToolCall) => string | Promise<string>;
  /** Trusted Cedar entities for the call, from your own database. */
  entitiesJson?: (call: ToolCall) => string | undefined | Promise<string | undefined>;
  /** toolgate's name for a framework tool (default: the same name). */
  toolName?: (frameworkName: string) => string;
  /** Passed on to `Gate.run`: reconcile callback, approval wait, lease, waits. */
  run?: Omit<RunOptions, "callId" | "entitiesJson">;
}

/** What the framework gets back: the tool's result, or text for the model. */
export type GuardedOutcome =
  | { allowed: true; result: unknown; run: RunResult }
  | { allowed: false; modelOutput: string; run: RunResult };

/** The model-safe JSON of an envelope, as toolgate's own `model_output`. */
function modelOutputOf(error: ErrorEnvelope | undefined): string {
  const e = error ?? {
    code: "internal_error",
    message: "the call could not be completed",
    retryable: true,
    resolution: "retry_same_key",
    exposeToModel: true,
  };
  return JSON.stringify({
    error: {
      code: e.code,
      message: e.exposeToModel ? e.message : "the call could not be completed",
      resolution: e.resolution,
      retryable: e.retryable,
    },
  });
}

/**
 * Runs one framework tool call through toolgate. `execute` gets the
 * authorized (normalized) arguments, parsed, and is called at most once
 * per operation.
 */
export async function guardedCall(
  options: GuardOptions,
  call: ToolCall,
  execute: (normalizedArguments: unknown, idempotencyKey: string, deadline: Date, context: RunContext) => unknown,
): Promise<GuardedOutcome> {
  const auth = typeof options.auth === "function" ? await options.auth(call) : options.auth;
  const requestId = options.requestId ? await options.requestId(call) : call.callId;
  const entitiesJson = options.entitiesJson ? await options.entitiesJson(call) : undefined;
  const tool = options.toolName ? options.toolName(call.tool) : call.tool;
  const run = await options.gate.run(tool, call.arguments, auth, requestId, execute, {
    ...options.run,
    callId: call.callId,
    entitiesJson,
  });
  switch (run.status) {
    case "succeeded":
    case "completed":
    case "reconciled":
      return { allowed: true, result: run.result, run };
    case "denied":
    case "approval_required":
      return { allowed: false, modelOutput: run.decision.modelOutput, run };
    case "in_progress":
      return {
        allowed: false,
        modelOutput: modelOutputOf(
          run.error ?? {
            code: "operation_in_progress",
            category: "execution",
            message: "the same operation is running elsewhere; ask again later",
            retryable: true,
            resolution: "poll",
            exposeToModel: true,
            exposeToUser: false,
            detailsJson: "{}",
          },
        ),
        run,
      };
    default:
      return { allowed: false, modelOutput: modelOutputOf(run.error), run };
  }
}
