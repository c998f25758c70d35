// Wire (proto-loader objects: snake_case, enum names, uint64 as strings)
// to the SDK's typed shapes, and back.
import type {
  Approval,
  ApprovalStatus,
  Auth,
  Begin,
  BeginOutcome,
  Decision,
  ErrorEnvelope,
  Execution,
  ExecutionState,
  Risk,
} from "./types.js";
import type * as pb from "./pb.js";

/** A Timestamp as proto-loader gives it, or as proto3 JSON gives it (RFC 3339 text: the gRPC-Web client). */
type Stamp = pb.Timestamp__Output | string | null | undefined;

/** "RISK_LEVEL_FINANCIAL" → "financial" (the enum's prefix dropped, lowercased). */
function short<T extends string>(value: string | undefined, prefix: string): T {
  if (!value) return "unspecified" as T;
  return (value.startsWith(prefix) ? value.slice(prefix.length) : value).toLowerCase() as T;
}

/** A Timestamp as proto-loader gives it ({seconds, nanos}) or as proto3 JSON (RFC 3339 text). */
export function timestamp(t: Stamp): Date | undefined {
  if (!t) return undefined;
  if (typeof t === "string") return new Date(t);
  const ms = Number(t.seconds ?? 0) * 1000 + Math.floor(Number(t.nanos ?? 0) / 1e6);
  return ms === 0 ? undefined : new Date(ms);
}

export function toTimestamp(d: Date): pb.Timestamp {
  const ms = d.getTime();
  return { seconds: String(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 };
}

export function envelope(e: pb.ErrorEnvelope__Output | null | undefined): ErrorEnvelope | undefined {
  if (!e) return undefined;
  return {
    code: e.code,
    category: e.category,
    message: e.message,
    retryable: Boolean(e.retryable),
    resolution: e.resolution,
    exposeToModel: Boolean(e.expose_to_model),
    exposeToUser: Boolean(e.expose_to_user),
    detailsJson: e.details_json || "{}",
  };
}

export function toEnvelope(e: ErrorEnvelope): pb.ErrorEnvelope {
  return {
    code: e.code,
    category: e.category,
    message: e.message,
    retryable: e.retryable,
    resolution: e.resolution,
    expose_to_model: e.exposeToModel,
    expose_to_user: e.exposeToUser,
    details_json: e.detailsJson,
  };
}

export function authContext(auth: Auth, identityToken = ""): pb.AuthContext {
  return {
    subject_id: auth.subjectId,
    tenant_id: auth.tenantId,
    roles: auth.roles ?? [],
    scopes: auth.scopes ?? [],
    agent_id: auth.agentId ?? "",
    session_id: auth.sessionId ?? "",
    identity_token: auth.identityToken ?? identityToken,
  };
}

export const risk = (r: string): Risk => short<Risk>(r, "RISK_LEVEL_");
export const executionState = (s: string): ExecutionState => short<ExecutionState>(s, "EXECUTION_STATE_");

export function begin(e: pb.BeginExecutionResponse__Output | null | undefined): Begin | undefined {
  if (!e) return undefined;
  return {
    outcome: short<BeginOutcome>(e.outcome, "BEGIN_OUTCOME_"),
    attempt: Number(e.attempt ?? 0),
    fencingToken: String(e.fencing_token ?? "0"),
    leaseExpiresAt: timestamp(e.lease_expires_at),
    state: executionState(e.state),
    resultJson: e.result_json ?? "",
    error: envelope(e.error),
    retryAfterMs: Number(e.retry_after_ms ?? 0),
  };
}

export function decision(r: pb.AuthorizeResponse__Output): Decision {
  const base = {
    decisionId: r.decision_id,
    callId: r.call_id,
    normalizedArguments: r.normalized_arguments,
    argumentsSha256: r.arguments_sha256,
    idempotencyKey: r.idempotency_key,
    conflictKey: r.conflict_key,
    risk: risk(r.risk),
    timeoutMs: Number(r.timeout_ms ?? 0),
    parallel: Boolean(r.parallel),
    idempotent: Boolean(r.idempotent),
    policyVersion: r.policy_version,
    toolVersion: r.tool_version,
    modelOutput: r.model_output,
    execution: begin(r.execution),
    executionTicket: r.execution_ticket ?? "",
  };
  switch (r.decision) {
    case "DECISION_ALLOW":
      return { ...base, decision: "allow" };
    case "DECISION_APPROVAL_REQUIRED":
      return {
        ...base,
        decision: "approval_required",
        error: envelope(r.error) as ErrorEnvelope,
        approval: { approvalId: r.approval?.approval_id ?? "", expiresAt: timestamp(r.approval?.expires_at) },
      };
    case "DECISION_DENY":
      return { ...base, decision: "deny", error: envelope(r.error) as ErrorEnvelope };
    default:
      // Fail closed: an answer this SDK does not know is a refusal.
      throw new Error(`toolgate: unknown decision ${JSON.stringify(r.decision)}`);
  }
}

export function approval(a: pb.Approval__Output): Approval {
  return {
    approvalId: a.approval_id,
    tenantId: a.tenant_id,
    requesterSubjectId: a.requester_subject_id,
    agentId: a.agent_id,
    tool: a.tool,
    toolVersion: a.tool_version,
    risk: risk(a.risk),
    argumentsSha256: a.arguments_sha256,
    displayArguments: a.display_arguments,
    requestId: a.request_id,
    status: short<ApprovalStatus>(a.status, "APPROVAL_STATUS_"),
    createdAt: timestamp(a.created_at),
    expiresAt: timestamp(a.expires_at),
    decidedBy: a.decided_by,
    decidedAt: timestamp(a.decided_at),
    reason: a.reason,
    consumedByIdempotencyKey: a.consumed_by_idempotency_key,
  };
}

export function execution(e: pb.Execution__Output): Execution {
  return {
    idempotencyKey: e.idempotency_key,
    tool: e.tool,
    state: executionState(e.state),
    attempt: Number(e.attempt ?? 0),
    argumentsSha256: e.arguments_sha256,
    resultJson: e.result_json,
    error: envelope(e.error),
    createdAt: timestamp(e.created_at),
    updatedAt: timestamp(e.updated_at),
    maxAttempts: Number(e.max_attempts ?? 0),
    leaseExpiresAt: timestamp(e.lease_expires_at),
  };
}
