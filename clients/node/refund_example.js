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
function authorizeRefund(authorization, modelArguments, requestId, { approvalId = "", identityToken = "" } = {}) {
  return call(authorization, "Authorize", {
    tool: "refund_order",
    arguments: Buffer.from(modelArguments),
    auth: {
      subject_id: "bob",
      tenant_id: "acme",
      roles: ["support_agent"],
      scopes: ["orders:read", "orders:refund"],
      agent_id: "support-bot",
      session_id: "s-42",
      identity_token: identityToken,
    },
    call_id: "call_7", // the model's tool-call id: echoed only
    request_id: requestId, // the business operation: same id = same operation
    approval_id: approvalId,
    entities_json: ENTITIES,
  });
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
  const { authorization } = connect();
  const args = JSON.stringify({ order_id: "ord_1001", amount_cents: amount, currency: "USD", reason: "damaged" });
  const r = await authorizeRefund(authorization, args, `refund-ord_1001-${amount}`, { approvalId });
  console.log(act(r));
}

module.exports = { ENTITIES, authorizeRefund, act };

if (require.main === module) {
  main().catch((e) => {
    console.error(e.message);
    process.exit(1);
  });
}
