// The README's refund, from a Node.js executor: ask toolgate before the tool
// runs, then act on the answer. Run: node refund_example.js [amount_cents] [approval_id]
"use strict";

const { connect, call } = require("./toolgate_client");

// Trusted data the executor loads from its own database: the order and its tenant.
const ENTITIES = JSON.stringify([
  {
    uid: { type: "Order", id: "ord_1001" },
    parents: [{ type: "Tenant", id: "acme" }],
    attrs: {
      tenant: { __entity: { type: "Tenant", id: "acme" } },
      owner: { __entity: { type: "User", id: "alice" } },
      status: "delivered",
      total_cents: 50000,
    },
  },
]);

/**
 * One Authorize call for refund_order. `modelArguments` are the bytes exactly
 * as the model produced them; the auth context comes from YOUR authentication.
 */
function authorizeRefund(
  authorization,
  modelArguments,
  requestId,
  { approvalId = "", identityToken = "", beginExecution = false } = {},
) {
  return call(authorization, "Authorize", {
    tool: "refund_order",
    arguments: Buffer.from(modelArguments),
    auth: authContext(identityToken),
    call_id: "call_7", // the model's tool-call id: echoed only
    request_id: requestId, // the business operation: same id = same operation
    approval_id: approvalId,
    entities_json: ENTITIES,
    // With it, an ALLOW also begins the execution in the ledger (`execution`).
    begin_execution: beginExecution,
  });
}

/** Who is calling: from YOUR authentication, never from the model. */
function authContext(identityToken = "") {
  return {
    subject_id: "bob",
    tenant_id: "acme",
    roles: ["support_agent"],
    scopes: ["orders:read", "orders:refund"],
    agent_id: "support-bot",
    session_id: "s-42",
    identity_token: identityToken,
  };
}

/**
 * Authorize, begin, execute, complete: the refund runs at most once per
 * request_id, however often the executor retries. `provider` is the payment
 * provider: `refund(args, idempotencyKey, timeoutMs)` resolves to the result,
 * rejects with `{ timeout: true }` when no answer came (it may have
 * happened) or `{ code, message, retryable }` when it was refused;
 * `findRefund(idempotencyKey)` resolves to the result or null, to reconcile.
 * Resolves to `{ kind, result?, error?, retryAfterMs? }`.
 */
async function executeRefund({ authorization, ledger }, modelArguments, requestId, provider, options = {}) {
  const r = await authorizeRefund(authorization, modelArguments, requestId, { ...options, beginExecution: true });
  if (r.decision === "DECISION_APPROVAL_REQUIRED") return { kind: "approval_required", error: r.error };
  if (r.decision !== "DECISION_ALLOW") return { kind: "denied", error: r.error };
  const e = r.execution;
  switch (e.outcome) {
    case "BEGIN_OUTCOME_COMPLETED":
      // It ran before (a retry of the same operation): the stored outcome, never a second refund.
      return e.state === "EXECUTION_STATE_SUCCEEDED"
        ? { kind: "completed", result: JSON.parse(e.result_json) }
        : { kind: "failed", error: e.error };
    case "BEGIN_OUTCOME_IN_PROGRESS":
      // Another executor holds the lease: do not run it; ask again later.
      return { kind: "in_progress", retryAfterMs: Number(e.retry_after_ms) };
    case "BEGIN_OUTCOME_RECONCILE_REQUIRED":
      // It may have run: find out from the provider, by the idempotency key.
      return reconcileRefund(ledger, r.idempotency_key, provider, options.identityToken);
    case "BEGIN_OUTCOME_ACQUIRED":
      break;
    default:
      return { kind: "refused", error: e.error };
  }
  const complete = (status, extra = {}) =>
    call(ledger, "CompleteExecution", {
      auth: authContext(options.identityToken),
      idempotency_key: r.idempotency_key,
      fencing_token: e.fencing_token, // a uint64, as a string
      status,
      ...extra,
    });
  let result;
  try {
    // Run what was authorized (never a re-parse of the model's text), under
    // the time budget, with the idempotency key passed on to the provider.
    result = await provider.refund(JSON.parse(r.normalized_arguments), r.idempotency_key, Number(r.timeout_ms));
  } catch (failure) {
    if (failure.timeout) {
      // It may have happened: say so. The next Begin answers
      // RECONCILE_REQUIRED, never ACQUIRED, so nobody refunds twice.
      const c = await complete("COMPLETION_STATUS_UNKNOWN");
      return { kind: "unknown", error: c.error };
    }
    const error = {
      code: failure.code,
      category: "payment",
      message: failure.message,
      retryable: failure.retryable,
      resolution: failure.retryable ? "retry_same_key" : "stop",
      expose_to_model: true,
      details_json: "{}",
    };
    await complete(failure.retryable ? "COMPLETION_STATUS_FAILED_RETRYABLE" : "COMPLETION_STATUS_FAILED_FINAL", { error });
    return { kind: "failed", error };
  }
  const c = await complete("COMPLETION_STATUS_SUCCEEDED", { result_json: JSON.stringify(result) });
  // UNKNOWN with output_invalid: it happened, but the result is not what the contract says.
  return c.state === "EXECUTION_STATE_SUCCEEDED" ? { kind: "succeeded", result } : { kind: "unknown", result, error: c.error };
}

/** Settles a refund whose outcome is unknown by asking the provider what happened. */
async function reconcileRefund(ledger, idempotencyKey, provider, identityToken = "") {
  const found = await provider.findRefund(idempotencyKey);
  const r = await call(ledger, "ReconcileExecution", {
    auth: authContext(identityToken),
    idempotency_key: idempotencyKey,
    applied: found !== null,
    result_json: found !== null ? JSON.stringify(found) : "",
  });
  return r.error ? { kind: "refused", error: r.error } : { kind: "reconciled", result: found };
}

/** A stand-in payment provider that remembers refunds by idempotency key. */
class DemoProvider {
  constructor() {
    this.refunds = new Map();
    this.calls = 0;
  }

  async refund(args, idempotencyKey) {
    this.calls += 1;
    const result = { refund_id: `re_${this.refunds.size + 1}`, amount_cents: args.amount_cents };
    this.refunds.set(idempotencyKey, result);
    return result;
  }

  async findRefund(idempotencyKey) {
    return this.refunds.get(idempotencyKey) ?? null;
  }
}

/** What the executor does with the answer. */
function act(r) {
  switch (r.decision) {
    case "DECISION_ALLOW":
      // Run what was authorized — normalized_arguments — never your own re-parse.
      return `allowed: run refund_order with ${r.normalized_arguments} (idempotency key ${r.idempotency_key}, ${r.timeout_ms} ms)`;
    case "DECISION_APPROVAL_REQUIRED":
      return `waiting for a human: approval ${r.approval.approval_id}`;
    default:
      // model_output is the model-safe JSON to hand back to the model.
      return `denied: ${r.model_output}`;
  }
}

async function main() {
  const amount = Number(process.argv[2] || 2500);
  const approvalId = process.argv[3] || "";
  const clients = connect();
  const args = JSON.stringify({ order_id: "ord_1001", amount_cents: amount, currency: "USD", reason: "damaged" });
  const requestId = `refund-ord_1001-${amount}`;
  const r = await authorizeRefund(clients.authorization, args, requestId, { approvalId });
  console.log(act(r));
  if (r.decision === "DECISION_ALLOW") {
    // The same call through the execution ledger: the refund runs once; run
    // this script again and the stored result comes back.
    const outcome = await executeRefund(clients, args, requestId, new DemoProvider(), { approvalId });
    console.log(`ledger: ${outcome.kind} ${JSON.stringify(outcome.result ?? outcome.error)}`);
  }
}

module.exports = { ENTITIES, authContext, authorizeRefund, act, executeRefund, reconcileRefund, DemoProvider };

if (require.main === module) {
  main().catch((e) => {
    console.error(e.message);
    process.exit(1);
  });
}
