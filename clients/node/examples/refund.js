// The README's refund from a Node.js executor, with @toolgate/client: ask
// toolgate before the tool runs, run it once through the execution ledger.
// Run against a sidecar: node examples/refund.js [amount_cents] [request_id]
// (TOOLGATE_ADDR, default 127.0.0.1:50051).
import { Gate, ToolError } from "@toolgate/client";

// Trusted data the executor loads from its own database: the order and its tenant.
export const ENTITIES = JSON.stringify([
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

// Who is calling: from YOUR authentication, never from the model.
export const BOB = {
  subjectId: "bob",
  tenantId: "acme",
  roles: ["support_agent"],
  scopes: ["orders:read", "orders:refund"],
  agentId: "support-bot",
  sessionId: "s-42",
};

/** A stand-in payment provider that remembers refunds by idempotency key. */
export class DemoProvider {
  constructor() {
    this.refunds = new Map();
    this.calls = 0;
  }

  async refund(args, idempotencyKey) {
    this.calls += 1;
    if (args.amount_cents <= 0) throw new ToolError("invalid_amount", "nothing to refund");
    const result = { refund_id: `re_${this.refunds.size + 1}`, amount_cents: args.amount_cents };
    this.refunds.set(idempotencyKey, result);
    return result;
  }

  // For a call whose outcome is unknown: did the refund happen?
  async find({ idempotencyKey }) {
    const found = this.refunds.get(idempotencyKey);
    return found ? { applied: true, result: found } : { applied: false };
  }
}

/** One refund through toolgate: `modelArguments` are the model's bytes, as they came. */
export function refund(gate, provider, modelArguments, requestId, options = {}) {
  return gate.run(
    "refund_order",
    modelArguments,
    BOB,
    requestId,
    // Runs at most once per request id, with the authorized arguments.
    (args, idempotencyKey) => provider.refund(args, idempotencyKey),
    { entitiesJson: ENTITIES, reconcile: (info) => provider.find(info), ...options },
  );
}

async function main() {
  const amount = Number(process.argv[2] || 2500);
  const requestId = process.argv[3] || `refund-ord_1001-${amount}`;
  const gate = new Gate(process.env.TOOLGATE_ADDR || "127.0.0.1:50051");
  const args = JSON.stringify({ order_id: "ord_1001", amount_cents: amount, currency: "USD", reason: "damaged" });
  try {
    const r = await refund(gate, new DemoProvider(), args, requestId);
    switch (r.status) {
      case "succeeded":
      case "completed":
        console.log(`${r.status}: ${JSON.stringify(r.result)}`);
        break;
      case "approval_required":
        console.log(`waiting for a human: approval ${r.decision.approval.approvalId}`);
        break;
      case "denied":
        // model_output is the model-safe JSON to hand back to the model.
        console.log(`denied: ${r.decision.modelOutput}`);
        break;
      default:
        console.log(`${r.status}: ${JSON.stringify(r.error)}`);
    }
  } finally {
    gate.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e) => {
    console.error(e.message);
    process.exit(1);
  });
}
