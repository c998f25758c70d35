// Gate: one connection to toolgate, and the calls an executor and an
// approval tool make over it.
import * as grpc from "@grpc/grpc-js";

import { ToolgateError, transportError } from "./errors.js";
import type * as pb from "./pb.js";
import { loadServices } from "./proto.js";
import type { Approval, Auth, Decision, ErrorEnvelope, Execution } from "./types.js";
import * as wire from "./wire.js";

/** The unary calls the SDK makes: each method's request and answer, as generated from proto/. */
interface Unary {
  Authorize: [pb.AuthorizeRequest, pb.AuthorizeResponse__Output];
  CompleteExecution: [pb.CompleteExecutionRequest, pb.CompleteExecutionResponse__Output];
  ReconcileExecution: [pb.ReconcileExecutionRequest, pb.ReconcileExecutionResponse__Output];
  GetExecution: [pb.GetExecutionRequest, pb.GetExecutionResponse__Output];
  ListApprovals: [pb.ListApprovalsRequest, pb.ListApprovalsResponse__Output];
  GetApproval: [pb.GetApprovalRequest, pb.GetApprovalResponse__Output];
  DecideApproval: [pb.DecideApprovalRequest, pb.DecideApprovalResponse__Output];
  GetPolicyStatus: [pb.GetPolicyStatusRequest, pb.GetPolicyStatusResponse__Output];
}
/** grpc-js reads `waitForReady` from a call's options; its CallOptions type does not name it. */
type CallOptions = grpc.CallOptions & { waitForReady?: boolean };
type UnaryMethod<M extends keyof Unary> = (
  request: Unary[M][0],
  options: CallOptions,
  callback: (err: grpc.ServiceError | null, response?: Unary[M][1]) => void,
) => grpc.ClientUnaryCall;

/** TLS to the sidecar; with `cert` and `key`, mutual TLS (a client certificate). */
export interface TlsOptions {
  /** PEM of the CA that signed the server's certificate; else the system's roots. */
  ca?: string | Buffer;
  /** PEM of the client certificate chain (mTLS). */
  cert?: string | Buffer;
  /** PEM of the client certificate's private key (mTLS). */
  key?: string | Buffer;
  /** The name to check the server's certificate against, when it is not the target's host. */
  serverName?: string;
}

/**
 * Retries of a call that failed before the server saw it, as gRPC's retry
 * policy (service config `retryPolicy`): attempts with exponential backoff,
 * on the listed status codes only.
 */
export interface RetryPolicy {
  /** Attempts in all, the first included (gRPC caps it at 5). Default 3; 1 turns retries off. */
  maxAttempts?: number;
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  backoffMultiplier?: number;
  /** Status names, e.g. ["UNAVAILABLE"] (the default). */
  retryableStatusCodes?: string[];
}

/**
 * How a Gate reaches toolgate. The defaults (`DEFAULTS`) are the shared SDK
 * semantics of clients/conformance/cases.json (`sdk_semantics`), which the
 * Python SDK follows too.
 */
export interface GateConfig {
  /** TLS or mTLS; without it (and without `credentials`), plaintext: loopback and unix: only. */
  tls?: TlsOptions;
  /** Channel credentials of your own (overrides `tls`). */
  credentials?: grpc.ChannelCredentials;
  /** The deadline of each call, from when it starts. Default 5000 ms. */
  timeoutMs?: number;
  /** Retries on UNAVAILABLE (gRPC's retry policy). */
  retry?: RetryPolicy;
  /** Wait for the channel to be ready instead of failing fast (gRPC's wait-for-ready). Default false. */
  waitForReady?: boolean;
  /** The identity token sent where a call needs one and none is given. */
  identityToken?: string;
  /** Extra gRPC channel options. */
  channelOptions?: grpc.ChannelOptions;
  /** The folder of toolgate/v1/*.proto (default: the package's own). */
  protoDir?: string;
  /** How long `run` waits, by default, while another executor holds the operation. Default 30000 ms. */
  inProgressWaitMs?: number;
}

/** The earlier name of GateConfig. */
export type GateOptions = GateConfig;

/** The defaults of a GateConfig. */
export const DEFAULTS = {
  timeoutMs: 5000,
  inProgressWaitMs: 30000,
  retry: { maxAttempts: 3, initialBackoffMs: 100, maxBackoffMs: 1000, backoffMultiplier: 2, retryableStatusCodes: ["UNAVAILABLE"] },
} as const;

/** One Authorize call. `arguments` are the bytes exactly as the model produced them. */
export interface AuthorizeRequest {
  tool: string;
  arguments: string | Uint8Array;
  auth: Auth;
  /** The business operation: same id = same operation (required unless the tool only reads). */
  requestId?: string;
  /** The model's tool-call id: echoed only. */
  callId?: string;
  /** An approval to present for this exact call. */
  approvalId?: string;
  /** Trusted Cedar entities (a JSON array) from your own database. */
  entitiesJson?: string;
  /** Refuse unless the loaded contract has this version. */
  toolVersion?: string;
  /** The executor's deadline for this call. */
  deadline?: Date;
  /** Also begin the execution in the ledger when allowed (what `run` does). */
  beginExecution?: boolean;
  /** The lease of that begin; 0: the tool's timeout plus the server's margin. */
  leaseMs?: number;
}

/** A tool's own failure, known not to be an unknown outcome: `run` reports it as failed. */
export class ToolError extends Error {
  readonly code: string;
  readonly retryable: boolean;
  readonly exposeToModel: boolean;
  constructor(code: string, message: string, options: { retryable?: boolean; exposeToModel?: boolean } = {}) {
    super(message);
    this.name = "ToolError";
    this.code = code;
    this.retryable = options.retryable ?? false;
    this.exposeToModel = options.exposeToModel ?? true;
  }
}

/** Why `run` stopped waiting for the tool. */
export class DeadlineError extends Error {
  /** `timeout` (the tool's time budget) or `lease` (the ledger's lease ended first). */
  readonly reason: "timeout" | "lease";
  constructor(cause: "timeout" | "lease") {
    super(cause === "lease" ? "the execution's lease ended" : "the tool's time budget ran out");
    this.name = "DeadlineError";
    this.reason = cause;
  }
}

/** What `run` hands the tool besides its arguments. */
export interface RunContext {
  /** Aborted when the deadline passes or the lease ends: stop, nothing more may be done under it. */
  signal: AbortSignal;
  attempt: number;
  tool: string;
  decision: Decision;
}

/** The tool: runs with the authorized (normalized) arguments, passes the key on to its provider. */
export type ToolFn<A = unknown, R = unknown> = (
  normalizedArguments: A,
  idempotencyKey: string,
  deadline: Date,
  context: RunContext,
) => Promise<R> | R;

/** What a reconcile callback learned from the provider, by the idempotency key. */
export type Reconciliation = { applied: true; result: unknown } | { applied: false };

export interface ReconcileInfo {
  tool: string;
  idempotencyKey: string;
  normalizedArguments: string;
  /** Why the outcome is unknown (`timeout_unknown`, `lease_expired`, `output_invalid`, …). */
  error?: ErrorEnvelope;
}

export interface RunOptions {
  callId?: string;
  approvalId?: string;
  entitiesJson?: string;
  toolVersion?: string;
  leaseMs?: number;
  /**
   * Asked when the outcome of an earlier attempt is unknown (it may have
   * run): find out from the provider by the idempotency key. Without it,
   * such a call ends `unknown` or `reconcile_required`; the tool never runs
   * a second time either way.
   */
  reconcile?: (info: ReconcileInfo) => Promise<Reconciliation> | Reconciliation;
  /** How long to wait while another executor holds the operation. Default: the config's `inProgressWaitMs` (30000 ms); 0: do not wait. */
  waitInProgressMs?: number;
  /** When approval is required: wait for it (over WatchApprovals) this long, then authorize again. */
  awaitApproval?: { timeoutMs: number; identityToken?: string };
  /** After the deadline, how long to let the tool settle before its outcome is called unknown. Default 1000 ms. */
  graceMs?: number;
}

/** How `run` ended. Only `succeeded` means the tool ran in this call. */
export type RunResult =
  | { status: "succeeded"; result: unknown; decision: Decision; attempt: number }
  | { status: "completed"; result: unknown; decision: Decision }
  | { status: "reconciled"; applied: true; result: unknown; decision: Decision }
  | { status: "failed"; error: ErrorEnvelope; decision: Decision }
  | { status: "unknown"; error: ErrorEnvelope; decision: Decision; result?: unknown }
  | { status: "reconcile_required"; error: ErrorEnvelope; decision: Decision }
  | { status: "in_progress"; retryAfterMs: number; error?: ErrorEnvelope; decision: Decision }
  | { status: "lease_lost"; error: ErrorEnvelope; decision: Decision; result?: unknown }
  | { status: "refused"; error: ErrorEnvelope; decision: Decision }
  | { status: "denied"; decision: Decision }
  | { status: "approval_required"; decision: Decision; approval?: Approval };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const SERVICES = [
  "toolgate.v1.AuthorizationService",
  "toolgate.v1.ApprovalService",
  "toolgate.v1.LedgerService",
  "toolgate.v1.PolicyService",
];

/** gRPC's service config for the retry policy. */
export function serviceConfig(retry: RetryPolicy = {}): string {
  const seconds = (ms: number) => `${(ms / 1000).toFixed(3)}s`;
  const maxAttempts = retry.maxAttempts ?? DEFAULTS.retry.maxAttempts;
  if (maxAttempts <= 1) return JSON.stringify({ methodConfig: [] });
  return JSON.stringify({
    methodConfig: [
      {
        name: SERVICES.map((service) => ({ service })),
        retryPolicy: {
          maxAttempts,
          initialBackoff: seconds(retry.initialBackoffMs ?? DEFAULTS.retry.initialBackoffMs),
          maxBackoff: seconds(retry.maxBackoffMs ?? DEFAULTS.retry.maxBackoffMs),
          backoffMultiplier: retry.backoffMultiplier ?? DEFAULTS.retry.backoffMultiplier,
          retryableStatusCodes: retry.retryableStatusCodes ?? [...DEFAULTS.retry.retryableStatusCodes],
        },
      },
    ],
  });
}

function credentialsFor(options: GateConfig): grpc.ChannelCredentials {
  if (options.credentials) return options.credentials;
  const tls = options.tls;
  if (!tls) return grpc.credentials.createInsecure();
  if ((tls.cert === undefined) !== (tls.key === undefined)) {
    throw new Error("toolgate: mTLS needs both tls.cert and tls.key");
  }
  const buf = (v?: string | Buffer) => (v === undefined ? null : Buffer.from(v));
  return grpc.credentials.createSsl(buf(tls.ca), buf(tls.key), buf(tls.cert));
}

/**
 * A connection to toolgate: `new Gate("127.0.0.1:50051")`, `new Gate("unix:/run/toolgate.sock")`,
 * `new Gate(target, config)`. Every method answers the SDK's typed values or
 * throws ToolgateError (never a grpc-js ServiceError).
 */
export class Gate {
  readonly target: string;
  readonly timeoutMs: number;
  readonly inProgressWaitMs: number;
  readonly #waitForReady: boolean;
  readonly #identityToken: string;
  readonly #authorization: grpc.Client;
  readonly #approvals: grpc.Client;
  readonly #ledger: grpc.Client;
  readonly #policy: grpc.Client;

  constructor(target: string, options: GateConfig = {}) {
    this.target = target;
    this.timeoutMs = options.timeoutMs ?? DEFAULTS.timeoutMs;
    this.inProgressWaitMs = options.inProgressWaitMs ?? DEFAULTS.inProgressWaitMs;
    this.#waitForReady = options.waitForReady ?? false;
    this.#identityToken = options.identityToken ?? "";
    const services = loadServices(options.protoDir);
    const credentials = credentialsFor(options);
    const channelOptions: grpc.ChannelOptions = {
      "grpc.service_config": serviceConfig(options.retry),
      "grpc.enable_retries": (options.retry?.maxAttempts ?? DEFAULTS.retry.maxAttempts) > 1 ? 1 : 0,
      ...(options.tls?.serverName
        ? {
            "grpc.ssl_target_name_override": options.tls.serverName,
            "grpc.default_authority": options.tls.serverName,
          }
        : {}),
      ...options.channelOptions,
    };
    this.#authorization = new services.AuthorizationService(target, credentials, channelOptions);
    // The other clients share the first one's channel.
    const channelOverride = this.#authorization.getChannel();
    const shared = { ...channelOptions, channelOverride };
    this.#approvals = new services.ApprovalService(target, credentials, shared);
    this.#ledger = new services.LedgerService(target, credentials, shared);
    this.#policy = new services.PolicyService(target, credentials, shared);
  }

  /** Closes the connection. */
  close(): void {
    this.#authorization.close();
  }

  /** One unary call; a failed one rejects with ToolgateError, its gRPC status kept. */
  #call<M extends keyof Unary>(client: grpc.Client, method: M, request: Unary[M][0], timeoutMs = this.timeoutMs): Promise<Unary[M][1]> {
    // The loaded service client has one method per rpc, typed as generated (Unary).
    const call = (client as unknown as Record<M, UnaryMethod<M>>)[method].bind(client);
    return new Promise((resolve, reject) => {
      const deadline = new Date(Date.now() + timeoutMs);
      call(request, { deadline, waitForReady: this.#waitForReady }, (err, response) =>
        err || !response ? reject(asToolgateError(err)) : resolve(response),
      );
    });
  }

  #token(given?: string): string {
    return given ?? this.#identityToken;
  }

  /** Asks whether a model's proposed tool call may run, and how. */
  async authorize(request: AuthorizeRequest): Promise<Decision> {
    const r = await this.#call(this.#authorization, "Authorize", {
      tool: request.tool,
      arguments: typeof request.arguments === "string" ? Buffer.from(request.arguments, "utf8") : Buffer.from(request.arguments),
      auth: wire.authContext(request.auth, this.#identityToken),
      call_id: request.callId ?? "",
      request_id: request.requestId ?? "",
      approval_id: request.approvalId ?? "",
      deadline: request.deadline ? wire.toTimestamp(request.deadline) : null,
      entities_json: request.entitiesJson ?? "",
      tool_version: request.toolVersion ?? "",
      begin_execution: request.beginExecution ?? false,
      lease_ms: request.leaseMs ?? 0,
    });
    return wire.decision(r);
  }

  /**
   * Runs `fn` at most once per operation (tool + request id + arguments):
   * authorize with begin_execution, run `fn(normalizedArguments,
   * idempotencyKey, deadline, context)` under the deadline and the lease,
   * then record how it ended. A retry of the same operation returns the
   * stored result; an outcome that may have happened goes to
   * `options.reconcile`, never to a second run.
   */
  async run<A = unknown, R = unknown>(
    tool: string,
    rawArguments: string | Uint8Array,
    auth: Auth,
    requestId: string,
    fn: ToolFn<A, R>,
    options: RunOptions = {},
  ): Promise<RunResult> {
    const waitUntil = Date.now() + (options.waitInProgressMs ?? this.inProgressWaitMs);
    let approvalId = options.approvalId;
    let approvalWaited = false;
    let reconciledNotApplied = false;
    for (;;) {
      const d = await this.authorize({
        tool,
        arguments: rawArguments,
        auth,
        requestId,
        callId: options.callId,
        approvalId,
        entitiesJson: options.entitiesJson,
        toolVersion: options.toolVersion,
        beginExecution: true,
        leaseMs: options.leaseMs,
      });
      if (d.decision === "deny") return { status: "denied", decision: d };
      if (d.decision === "approval_required") {
        const wait = options.awaitApproval;
        if (!wait || approvalWaited) return { status: "approval_required", decision: d };
        approvalWaited = true;
        const approval = await this.waitForApproval(d.approval.approvalId, wait.timeoutMs, {
          identityToken: wait.identityToken ?? auth.identityToken,
        });
        if (approval.status !== "approved") return { status: "approval_required", decision: d, approval };
        approvalId = approval.approvalId;
        continue;
      }
      const e = d.execution;
      if (!e) throw new Error("toolgate: an allow without the ledger's answer to begin_execution");
      switch (e.outcome) {
        case "acquired":
          return this.#execute(tool, d, auth, fn, options);
        case "completed":
          return e.state === "succeeded"
            ? { status: "completed", result: JSON.parse(e.resultJson), decision: d }
            : { status: "failed", error: e.error as ErrorEnvelope, decision: d };
        case "in_progress": {
          const pause = Math.max(e.retryAfterMs, 50);
          if (Date.now() + pause > waitUntil) {
            return { status: "in_progress", retryAfterMs: e.retryAfterMs, error: e.error, decision: d };
          }
          await sleep(pause);
          continue;
        }
        case "reconcile_required": {
          if (reconciledNotApplied) {
            // Settled as not applied a moment ago, yet not acquirable: stop rather than loop.
            return { status: "reconcile_required", error: e.error as ErrorEnvelope, decision: d };
          }
          const settled = await this.#reconcile(tool, d, auth, e.error, options);
          if (settled === "not_applied") {
            // It never happened: the operation may now run (as its next attempt).
            reconciledNotApplied = true;
            continue;
          }
          if (settled === "in_progress") {
            if (Date.now() + 200 > waitUntil) {
              return { status: "in_progress", retryAfterMs: 200, decision: d };
            }
            await sleep(200);
            continue;
          }
          return settled;
        }
        default:
          return { status: "refused", error: e.error as ErrorEnvelope, decision: d };
      }
    }
  }

  async #execute(tool: string, d: Decision, auth: Auth, fn: ToolFn<any, any>, options: RunOptions): Promise<RunResult> {
    const e = d.execution!;
    const key = d.idempotencyKey;
    const now = Date.now();
    const budget = d.timeoutMs > 0 ? now + d.timeoutMs : Number.POSITIVE_INFINITY;
    const lease = e.leaseExpiresAt ? e.leaseExpiresAt.getTime() : Number.POSITIVE_INFINITY;
    const deadlineMs = Math.min(budget, lease);
    const cause: "timeout" | "lease" = lease <= budget ? "lease" : "timeout";
    const complete = (status: pb.CompleteExecutionRequest["status"], extra: Partial<pb.CompleteExecutionRequest> = {}) =>
      this.#completeWithRetries({
        auth: wire.authContext(auth, this.#identityToken),
        idempotency_key: key,
        fencing_token: e.fencingToken,
        status,
        ...extra,
      });

    if (!Number.isFinite(deadlineMs) || deadlineMs <= now) {
      // No time left to run it in: it did not run, and may run again.
      const error = toolEnvelope(new ToolError("deadline_exhausted", "no time was left to run the tool", { retryable: true }));
      await complete("COMPLETION_STATUS_FAILED_RETRYABLE", { error: wire.toEnvelope(error) });
      return { status: "failed", error, decision: d };
    }

    const controller = new AbortController();
    const deadline = new Date(deadlineMs);
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<{ expired: true }>((resolve) => {
      timer = setTimeout(() => {
        controller.abort(new DeadlineError(cause));
        resolve({ expired: true });
      }, deadlineMs - now);
    });
    const running = (async () => fn(JSON.parse(d.normalizedArguments), key, deadline, {
      signal: controller.signal,
      attempt: e.attempt,
      tool,
      decision: d,
    }))().then(
      (result) => ({ ok: true as const, result }),
      (failure: unknown) => ({ ok: false as const, failure }),
    );
    let outcome = await Promise.race([running, expired]);
    clearTimeout(timer);
    if ("expired" in outcome) {
      // Let a tool that heard the signal settle; past the grace, it may still be running.
      const grace = new Promise<null>((resolve) => setTimeout(() => resolve(null), options.graceMs ?? 1000));
      const late = await Promise.race([running, grace]);
      if (late === null) {
        const c = await complete("COMPLETION_STATUS_UNKNOWN");
        const error = c.error ? (wire.envelope(c.error) as ErrorEnvelope) : unknownEnvelope(cause);
        if (c.error?.code === "lease_lost") return { status: "lease_lost", error, decision: d };
        return { status: "unknown", error, decision: d };
      }
      outcome = late;
    }

    if (outcome.ok) {
      let resultJson: string;
      try {
        resultJson = JSON.stringify(outcome.result ?? null);
      } catch {
        resultJson = "";
      }
      if (resultJson === "" || resultJson === undefined) {
        // It ran, but its result cannot be recorded: an unknown outcome, never a second run.
        const c = await complete("COMPLETION_STATUS_UNKNOWN");
        return { status: "unknown", error: wire.envelope(c.error) ?? unknownEnvelope("timeout"), decision: d, result: outcome.result };
      }
      const c = await complete("COMPLETION_STATUS_SUCCEEDED", { result_json: resultJson });
      const state = wire.executionState(c.state);
      if (state === "succeeded") return { status: "succeeded", result: outcome.result, decision: d, attempt: e.attempt };
      const error = wire.envelope(c.error) as ErrorEnvelope;
      if (error?.code === "lease_lost") return { status: "lease_lost", error, decision: d, result: outcome.result };
      return { status: "unknown", error, decision: d, result: outcome.result };
    }

    const failure = outcome.failure;
    if (failure instanceof ToolError) {
      const error = toolEnvelope(failure);
      const status = failure.retryable ? "COMPLETION_STATUS_FAILED_RETRYABLE" : "COMPLETION_STATUS_FAILED_FINAL";
      const c = await complete(status, { error: wire.toEnvelope(error) });
      if (c.error?.code === "lease_lost") return { status: "lease_lost", error: wire.envelope(c.error)!, decision: d };
      return { status: "failed", error, decision: d };
    }
    // Anything else (a crash of the tool, a provider that did not answer): it may have happened.
    const c = await complete("COMPLETION_STATUS_UNKNOWN");
    if (c.error?.code === "lease_lost") return { status: "lease_lost", error: wire.envelope(c.error)!, decision: d };
    const why = unknownEnvelope("timeout");
    if (!options.reconcile) return { status: "unknown", error: why, decision: d };
    const settled = await this.#reconcile(tool, d, auth, why, options);
    if (settled === "not_applied" || settled === "in_progress") return { status: "unknown", error: why, decision: d };
    return settled;
  }

  /** CompleteExecution, repeated on UNAVAILABLE: the same completion is acknowledged again. */
  async #completeWithRetries(request: pb.CompleteExecutionRequest): Promise<pb.CompleteExecutionResponse__Output> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.#call(this.#ledger, "CompleteExecution", request);
      } catch (err) {
        const status = (err as ToolgateError).grpcStatus;
        if (attempt >= 5 || (status !== "UNAVAILABLE" && status !== "DEADLINE_EXCEEDED")) throw err;
        await sleep(100 * 2 ** attempt);
      }
    }
  }

  async #reconcile(
    tool: string,
    d: Decision,
    auth: Auth,
    why: ErrorEnvelope | undefined,
    options: RunOptions,
  ): Promise<RunResult | "not_applied" | "in_progress"> {
    const error = why ?? unknownEnvelope("timeout");
    if (!options.reconcile) return { status: "reconcile_required", error, decision: d };
    const found = await options.reconcile({
      tool,
      idempotencyKey: d.idempotencyKey,
      normalizedArguments: d.normalizedArguments,
      error: why,
    });
    const r = await this.reconcileExecution(auth, d.idempotencyKey, found);
    if (r.error) {
      if (r.error.code === "operation_in_progress") return "in_progress";
      return { status: "refused", error: r.error, decision: d };
    }
    if (!found.applied) return "not_applied";
    return { status: "reconciled", applied: true, result: found.result, decision: d };
  }

  /** Settles an operation whose outcome is unknown. */
  async reconcileExecution(
    auth: Auth,
    idempotencyKey: string,
    found: Reconciliation,
  ): Promise<{ state: string; error?: ErrorEnvelope }> {
    const r = await this.#call(this.#ledger, "ReconcileExecution", {
      auth: wire.authContext(auth, this.#identityToken),
      idempotency_key: idempotencyKey,
      applied: found.applied,
      result_json: found.applied ? JSON.stringify(found.result ?? null) : "",
    });
    return { state: wire.executionState(r.state), error: wire.envelope(r.error) };
  }

  /** The ledger's record of one operation; null when the caller's tenant has none. */
  async getExecution(auth: Auth, idempotencyKey: string): Promise<Execution | null> {
    try {
      const r = await this.#call(this.#ledger, "GetExecution", {
        auth: wire.authContext(auth, this.#identityToken),
        idempotency_key: idempotencyKey,
      });
      return r.execution ? wire.execution(r.execution) : null;
    } catch (err) {
      if ((err as ToolgateError).grpcStatus === "NOT_FOUND") return null;
      throw err;
    }
  }

  /** Pending (or other) approvals of the token's tenant, one page. */
  async listApprovals(
    options: { identityToken?: string; status?: Approval["status"]; pageSize?: number; pageToken?: string } = {},
  ): Promise<{ approvals: Approval[]; nextPageToken: string }> {
    const r = await this.#call(this.#approvals, "ListApprovals", {
      identity_token: this.#token(options.identityToken),
      status: `APPROVAL_STATUS_${(options.status ?? "unspecified").toUpperCase()}` as pb.ListApprovalsRequest["status"],
      page_size: options.pageSize ?? 0,
      page_token: options.pageToken ?? "",
    });
    return { approvals: (r.approvals ?? []).map(wire.approval), nextPageToken: r.next_page_token };
  }

  /** One approval, with its redacted display arguments. */
  async getApproval(approvalId: string, options: { identityToken?: string } = {}): Promise<Approval> {
    const r = await this.#call(this.#approvals, "GetApproval", {
      identity_token: this.#token(options.identityToken),
      approval_id: approvalId,
    });
    if (!r.approval) throw transportError("INTERNAL", "toolgate answered GetApproval without an approval");
    return wire.approval(r.approval);
  }

  /**
   * Approves or rejects. `argumentsSha256` is the hash of the arguments the
   * approver was shown (from getApproval): a mismatch is refused. A refusal
   * (self-approval, another tenant, a stale hash, …) throws ToolgateError
   * with toolgate's envelope; otherwise the decided approval.
   */
  async decideApproval(
    approvalId: string,
    verdict: "approve" | "reject",
    argumentsSha256: string,
    options: { identityToken?: string; reason?: string } = {},
  ): Promise<Approval> {
    const r = await this.#call(this.#approvals, "DecideApproval", {
      identity_token: this.#token(options.identityToken),
      approval_id: approvalId,
      verdict: verdict === "approve" ? "VERDICT_APPROVE" : "VERDICT_REJECT",
      arguments_sha256: argumentsSha256,
      reason: options.reason ?? "",
    });
    const refused = wire.envelope(r.error);
    if (refused) throw new ToolgateError(refused);
    if (!r.approval) throw transportError("INTERNAL", "toolgate answered DecideApproval without an approval");
    return wire.approval(r.approval);
  }

  /**
   * Waits until the approval is decided or expires (over WatchApprovals),
   * at most `timeoutMs`; answers the approval as it then is (still
   * `pending` when the time ran out). The identity token is one of the
   * approval's tenant.
   */
  async waitForApproval(approvalId: string, timeoutMs: number, options: { identityToken?: string } = {}): Promise<Approval> {
    const token = this.#token(options.identityToken);
    const until = Date.now() + timeoutMs;
    for (;;) {
      const left = until - Date.now();
      const settled = await this.#watchOnce(approvalId, token, Math.max(left, 0));
      if (settled) return settled;
      // The time ran out, or the watch ended (server restart, missed events): read it as it is.
      const now = await this.getApproval(approvalId, { identityToken: token });
      if (now.status !== "pending" || Date.now() >= until) return now;
      await sleep(Math.min(200, Math.max(until - Date.now(), 0)));
    }
  }

  /** One watch: the approval once it is no longer pending, or null when the watch ended first. */
  #watchOnce(approvalId: string, token: string, timeoutMs: number): Promise<Approval | null> {
    return new Promise((resolve, reject) => {
      const watch = (this.#approvals as unknown as {
        WatchApprovals(request: pb.WatchApprovalsRequest, options: grpc.CallOptions): grpc.ClientReadableStream<pb.WatchApprovalsResponse__Output>;
      }).WatchApprovals.bind(this.#approvals);
      const stream = watch({ identity_token: token }, { deadline: new Date(Date.now() + timeoutMs) });
      let done = false;
      const finish = (value: Approval | null, err?: unknown) => {
        if (done) return;
        done = true;
        stream.cancel();
        if (err) reject(asToolgateError(err));
        else resolve(value);
      };
      stream.on("data", (message: pb.WatchApprovalsResponse__Output) => {
        const a = message.event?.approval;
        if (a && a.approval_id === approvalId) {
          const approval = wire.approval(a);
          if (approval.status !== "pending") finish(approval);
        }
      });
      stream.on("error", (err: grpc.ServiceError) => {
        if (err.code === grpc.status.UNAUTHENTICATED || err.code === grpc.status.PERMISSION_DENIED) finish(null, err);
        else finish(null);
      });
      stream.on("end", () => finish(null));
      // The stream is open once its headers came: an approval decided
      // before that is read here rather than missed.
      stream.on("metadata", () => {
        this.getApproval(approvalId, { identityToken: token }).then(
          (a) => {
            if (a.status !== "pending") finish(a);
          },
          (err) => finish(null, err),
        );
      });
    });
  }

  /** The live policy set's version, for operators. */
  async policyVersion(): Promise<string> {
    const r = await this.#call(this.#policy, "GetPolicyStatus", {});
    return r.policy_version;
  }
}

function toolEnvelope(e: ToolError): ErrorEnvelope {
  return {
    code: e.code,
    category: "tool",
    message: e.message,
    retryable: e.retryable,
    resolution: e.retryable ? "retry_same_key" : "stop",
    exposeToModel: e.exposeToModel,
    exposeToUser: false,
    detailsJson: "{}",
  };
}

function unknownEnvelope(cause: "timeout" | "lease"): ErrorEnvelope {
  return {
    code: "timeout_unknown",
    category: "execution",
    message: cause === "lease" ? "the lease ended before the tool did: it may have run" : "the tool did not answer in time: it may have run",
    retryable: false,
    resolution: "reconcile",
    exposeToModel: true,
    exposeToUser: false,
    detailsJson: "{}",
  };
}

/** A grpc-js failure (or an answer without a body) as the SDK's error. */
function asToolgateError(err: unknown): ToolgateError {
  if (err instanceof ToolgateError) return err;
  const e = err as Partial<grpc.ServiceError> | null;
  const code = typeof e?.code === "number" ? e.code : grpc.status.INTERNAL;
  const name = grpc.status[code] ?? "UNKNOWN";
  return transportError(name, e?.details ?? (err ? String(err) : "toolgate answered without a body"));
}
