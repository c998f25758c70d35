// @toolgate/client: ask toolgate before a tool runs, run it exactly once.
export { Gate, ToolError, DeadlineError, DEFAULTS, serviceConfig } from "./gate.js";
export { ToolgateError } from "./errors.js";
export type {
  AuthorizeRequest,
  GateConfig,
  GateOptions,
  Reconciliation,
  ReconcileInfo,
  RetryPolicy,
  RunContext,
  RunOptions,
  RunResult,
  TlsOptions,
  ToolFn,
} from "./gate.js";
export { guardedCall } from "./guard.js";
export type { GuardOptions, GuardedOutcome } from "./guard.js";
export { protoDir, loadServices } from "./proto.js";
export type * from "./types.js";
