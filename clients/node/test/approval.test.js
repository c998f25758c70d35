// The approval flow through the SDK against the real sidecar: the
// executor's run waits (over WatchApprovals) while a second client, an
// approver with a real identity token, finds the approval and approves it;
// the run then goes on, and the tool runs once.
import test from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import { BOB, DemoProvider, ENTITIES, refund } from "../examples/refund.js";
import { APPROVER, fresh, gate, refundArgs } from "./support.js";

const sha256 = (text) => createHash("sha256").update(text, "utf8").digest("hex");

test("a run waits for approval, a second client approves, the tool runs once", async () => {
  const executor = gate();
  const approver = gate({ identityToken: APPROVER });
  try {
    const provider = new DemoProvider();
    const id = fresh("approval");
    const args = refundArgs(25000);
    // The executor's run: approval required, then it waits for the verdict.
    const running = refund(executor, provider, args, id, { awaitApproval: { timeoutMs: 15000, identityToken: APPROVER } });

    // The approver: the pending approval appears; it is read and approved.
    let pending;
    for (let i = 0; i < 100 && !pending; i++) {
      const page = await approver.listApprovals({ status: "pending" });
      pending = page.approvals.find((a) => a.requestId === id);
      if (!pending) await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.ok(pending, "the approval was listed");
    assert.equal(pending.tool, "refund_order");
    assert.equal(pending.requesterSubjectId, "bob");
    assert.equal(pending.risk, "financial");
    const shown = await approver.getApproval(pending.approvalId);
    assert.equal(shown.status, "pending");
    assert.equal(JSON.parse(shown.displayArguments).amount_cents, 25000);
    assert.equal(shown.argumentsSha256, sha256(JSON.stringify({ amount_cents: 25000, currency: "USD", order_id: "ord_1001", reason: "late" })));
    assert.equal(provider.calls, 0, "nothing ran before the approval");
    const decided = await approver.decideApproval(pending.approvalId, "approve", shown.argumentsSha256, {
      reason: "confirmed with the customer",
    });
    assert.equal(decided.status, "approved");
    assert.equal(decided.decidedBy, "dana");

    const r = await running;
    assert.equal(r.status, "succeeded", JSON.stringify(r));
    assert.deepEqual(r.result, { refund_id: "re_1", amount_cents: 25000 });
    assert.equal(provider.calls, 1);
    const consumed = await approver.getApproval(pending.approvalId);
    assert.equal(consumed.consumedByIdempotencyKey, r.decision.idempotencyKey);

    // The same operation again, with its approval: the stored result.
    const again = await refund(executor, provider, args, id, { approvalId: pending.approvalId });
    assert.equal(again.status, "completed");
    assert.equal(provider.calls, 1);
  } finally {
    executor.close();
    approver.close();
  }
});

test("a rejected approval: the run ends approval_required with the verdict, the tool never runs", async () => {
  const executor = gate();
  const approver = gate({ identityToken: APPROVER });
  try {
    const first = await executor.authorize({
      tool: "refund_order",
      arguments: refundArgs(26000),
      auth: BOB,
      requestId: fresh("approval-reject"),
      entitiesJson: ENTITIES,
    });
    assert.equal(first.decision, "approval_required");
    assert.equal(first.error.code, "approval_required");
    const id = first.approval.approvalId;
    const waiting = executor.waitForApproval(id, 15000, { identityToken: APPROVER });
    const shown = await approver.getApproval(id);
    await approver.decideApproval(id, "reject", shown.argumentsSha256, { reason: "not eligible" });
    const verdict = await waiting;
    assert.equal(verdict.status, "rejected");
    assert.equal(verdict.reason, "not eligible");
    // Waiting on an approval already decided answers at once.
    const late = await executor.waitForApproval(id, 15000, { identityToken: APPROVER });
    assert.equal(late.status, "rejected");
    // And a wait that times out answers the approval as it is: still pending.
    const other = await executor.authorize({
      tool: "refund_order",
      arguments: refundArgs(27000),
      auth: BOB,
      requestId: fresh("approval-timeout"),
      entitiesJson: ENTITIES,
    });
    const started = Date.now();
    const still = await executor.waitForApproval(other.approval.approvalId, 300, { identityToken: APPROVER });
    assert.equal(still.status, "pending");
    assert.ok(Date.now() - started < 3000);
  } finally {
    executor.close();
    approver.close();
  }
});
