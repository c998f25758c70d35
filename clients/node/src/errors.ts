// ToolgateError: what the SDK throws. A refusal toolgate answered with an
// envelope (a refused approval decision: self-approval, another tenant, a
// stale hash) or a call that failed as a request (a gRPC status): never a
// raw grpc-js ServiceError (or a Connect error, on gRPC-Web).
import type { ErrorEnvelope } from "./types.js";

/** Toolgate's error: the envelope's fields, and the gRPC status when the call itself failed. */
export class ToolgateError extends Error {
  /** The envelope's code, or the gRPC status name in lower case (`unavailable`, `unauthenticated`, …). */
  readonly code: string;
  readonly category: string;
  readonly resolution: string;
  readonly retryable: boolean;
  /** The envelope's details, parsed (an object). */
  readonly details: Record<string, unknown>;
  /** The gRPC status name (`UNAVAILABLE`, …) when the call failed; undefined for an envelope. */
  readonly grpcStatus?: string;
  /** The envelope as the SDK types it. */
  readonly envelope: ErrorEnvelope;

  constructor(envelope: ErrorEnvelope, grpcStatus?: string) {
    super(`${envelope.code}: ${envelope.message}`);
    this.name = "ToolgateError";
    this.envelope = envelope;
    this.code = envelope.code;
    this.category = envelope.category;
    this.resolution = envelope.resolution;
    this.retryable = envelope.retryable;
    this.details = parseDetails(envelope.detailsJson);
    this.grpcStatus = grpcStatus;
  }
}

function parseDetails(text: string): Record<string, unknown> {
  try {
    const value: unknown = JSON.parse(text || "{}");
    return value !== null && typeof value === "object" && !Array.isArray(value) ? (value as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

/** Statuses after which the same call may be tried again (the ledger is keyed by the idempotency key). */
const RETRYABLE = new Set(["UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"]);

/** A failed call, by its gRPC status name and message, as the SDK's error. */
export function transportError(status: string, message: string): ToolgateError {
  const retryable = RETRYABLE.has(status);
  return new ToolgateError(
    {
      code: status.toLowerCase(),
      category: "transport",
      message: message || status,
      retryable,
      resolution: retryable ? "retry_same_key" : "stop",
      exposeToModel: false,
      exposeToUser: false,
      detailsJson: "{}",
    },
    status,
  );
}
