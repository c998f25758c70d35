// The typed answers of toolgate, in the SDK's own shapes (camelCase fields,
// enums as short lowercase names). The wire shapes stay in proto/.

/** Who is calling: from YOUR authentication, never from the model. */
export interface Auth {
  subjectId: string;
  tenantId: string;
  roles?: string[];
  scopes?: string[];
  agentId?: string;
  sessionId?: string;
  /** A verified identity token, when the deployment requires one. */
  identityToken?: string;
}

/** The one error shape of every non-allow answer (DESIGN §6). */
export interface ErrorEnvelope {
  code: string;
  category: string;
  message: string;
  retryable: boolean;
  resolution: string;
  exposeToModel: boolean;
  exposeToUser: boolean;
  /** A JSON object as text. */
  detailsJson: string;
}

export type Risk = "unspecified" | "read" | "write" | "external" | "financial" | "destructive";

export type ExecutionState =
  | "unspecified"
  | "in_progress"
  | "succeeded"
  | "failed_retryable"
  | "unknown"
  | "failed_final";

export type BeginOutcome = "unspecified" | "acquired" | "in_progress" | "completed" | "reconcile_required" | "refused";

/** The ledger's answer to a begin (AuthorizeResponse.execution). */
export interface Begin {
  outcome: BeginOutcome;
  attempt: number;
  /** Only with `acquired`: a uint64 as a decimal string. */
  fencingToken: string;
  leaseExpiresAt?: Date;
  state: ExecutionState;
  resultJson: string;
  error?: ErrorEnvelope;
  retryAfterMs: number;
}

/** What every decision carries. */
interface DecisionBase {
  decisionId: string;
  callId: string;
  /** RFC 8785 canonical form of the validated arguments (empty unless they validated). */
  normalizedArguments: string;
  argumentsSha256: string;
  idempotencyKey: string;
  conflictKey: string;
  risk: Risk;
  timeoutMs: number;
  parallel: boolean;
  idempotent: boolean;
  policyVersion: string;
  toolVersion: string;
  /** JSON text to hand back to the model when the decision is not allow. */
  modelOutput: string;
  /** The ledger's answer, when the call asked to begin the execution and was allowed. */
  execution?: Begin;
  /** A ticket for BeginExecution (AuthorizeResponse.execution_ticket), when the server sends one. */
  executionTicket: string;
}

export interface Allow extends DecisionBase {
  decision: "allow";
}

export interface Deny extends DecisionBase {
  decision: "deny";
  error: ErrorEnvelope;
}

export interface ApprovalRequired extends DecisionBase {
  decision: "approval_required";
  error: ErrorEnvelope;
  approval: { approvalId: string; expiresAt?: Date };
}

/** A typed decision: switch on `decision`. */
export type Decision = Allow | Deny | ApprovalRequired;

export type ApprovalStatus = "unspecified" | "pending" | "approved" | "rejected" | "expired";

export interface Approval {
  approvalId: string;
  tenantId: string;
  requesterSubjectId: string;
  agentId: string;
  tool: string;
  toolVersion: string;
  risk: Risk;
  argumentsSha256: string;
  /** Canonical arguments with the contract's sensitive pointers redacted. */
  displayArguments: string;
  requestId: string;
  status: ApprovalStatus;
  createdAt?: Date;
  expiresAt?: Date;
  decidedBy: string;
  decidedAt?: Date;
  reason: string;
  consumedByIdempotencyKey: string;
}

export interface Execution {
  idempotencyKey: string;
  tool: string;
  state: ExecutionState;
  attempt: number;
  argumentsSha256: string;
  resultJson: string;
  error?: ErrorEnvelope;
  createdAt?: Date;
  updatedAt?: Date;
  maxAttempts: number;
  leaseExpiresAt?: Date;
}
