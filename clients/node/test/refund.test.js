// The Node.js executor runs the refund flow against a real toolgate:
// allowed; approval required → a human approves with a real identity token
// → the retry is allowed and consumes the approval; and through the
// execution ledger: begin, execute, complete, and a retry that gets the
// stored result without refunding twice; a refund whose answer never came
// is reconciled, not repeated. Started by the Rust
// integration test `node::the_node_clients_run_the_refund_flow_and_grpc_web`
// with TOOLGATE_ADDR, TOOLGATE_PROTO_DIR and TOOLGATE_TEST_APPROVER_TOKEN.
"use strict";

const test = require("node:test");
const assert = require("node:assert/strict");
const crypto = require("node:crypto");

const { connect, call } = require("../toolgate_client");
const { authorizeRefund, act, executeRefund, DemoProvider, authContext } = require("../refund_example");

const clients = connect();
const { authorization, approvals, ledger } = clients;
const APPROVER = process.env.TOOLGATE_TEST_APPROVER_TOKEN;
const sha256 = (text) => crypto.createHash("sha256").update(text, "utf8").digest("hex");

test("a small refund is allowed, with the canonical arguments and their hash", async () => {
  const r = await authorizeRefund(
    authorization,
    '{ "reason": "late", "currency": "USD", "amount_cents": 2500, "order_id": "ord_1001" }',
    "node-refund-1",
  );
  assert.equal(r.decision, "DECISION_ALLOW", JSON.stringify(r.error));
  assert.equal(r.normalized_arguments, '{"amount_cents":2500,"currency":"USD","order_id":"ord_1001","reason":"late"}');
  assert.equal(r.arguments_sha256, sha256(r.normalized_arguments));
  assert.match(r.idempotency_key, /^refund_order:[0-9a-f]{64}$/);
  assert.equal(r.conflict_key, "acme:Order:ord_1001");
  assert.equal(r.risk, "RISK_LEVEL_FINANCIAL");
  assert.match(act(r), /^allowed: run refund_order/);
});

test("a string amount is a schema violation with a model-safe answer", async () => {
  const r = await authorizeRefund(
    authorization,
    '{"order_id":"ord_1001","amount_cents":"2500","currency":"USD","reason":"late"}',
    "node-refund-2",
  );
  assert.equal(r.decision, "DECISION_DENY");
  assert.equal(r.error.code, "schema_violation");
  assert.equal(JSON.parse(r.error.details_json).violations[0].pointer, "/amount_cents");
  assert.equal(JSON.parse(r.model_output).error.code, "schema_violation");
});

test("a large refund waits for a human, who approves; the retry is allowed once per operation", async () => {
  const args = JSON.stringify({ order_id: "ord_1001", amount_cents: 25000, currency: "USD", reason: "damaged" });
  const required = await authorizeRefund(authorization, args, "node-refund-big");
  assert.equal(required.decision, "DECISION_APPROVAL_REQUIRED");
  assert.equal(required.error.code, "approval_required");
  const approvalId = required.approval.approval_id;
  assert.ok(approvalId);
  assert.match(act(required), /^waiting for a human/);

  const pending = await authorizeRefund(authorization, args, "node-refund-big", { approvalId });
  assert.equal(pending.error.code, "approval_pending");

  const shown = (await call(approvals, "GetApproval", { identity_token: APPROVER, approval_id: approvalId })).approval;
  assert.equal(shown.status, "APPROVAL_STATUS_PENDING");
  assert.equal(shown.arguments_sha256, required.arguments_sha256);
  const decided = await call(approvals, "DecideApproval", {
    identity_token: APPROVER,
    approval_id: approvalId,
    verdict: "VERDICT_APPROVE",
    arguments_sha256: shown.arguments_sha256,
    reason: "confirmed with the customer",
  });
  assert.equal(decided.error, null);
  assert.equal(decided.approval.status, "APPROVAL_STATUS_APPROVED");
  assert.equal(decided.approval.decided_by, "dana");

  const allowed = await authorizeRefund(authorization, args, "node-refund-big", { approvalId });
  assert.equal(allowed.decision, "DECISION_ALLOW", JSON.stringify(allowed.error));
  const other = await authorizeRefund(authorization, args, "node-refund-other", { approvalId });
  // Another operation: the approval is bound to its request_id (DESIGN §4).
  assert.equal(other.error.code, "approval_mismatch");
  const consumed = (await call(approvals, "GetApproval", { identity_token: APPROVER, approval_id: approvalId })).approval;
  assert.equal(consumed.consumed_by_idempotency_key, allowed.idempotency_key);
});

test("through the ledger the refund runs once: a retry gets the stored result", async () => {
  const provider = new DemoProvider();
  const args = JSON.stringify({ order_id: "ord_1001", amount_cents: 4200, currency: "USD", reason: "late" });
  const first = await executeRefund(clients, args, "node-ledger-1", provider);
  assert.equal(first.kind, "succeeded", JSON.stringify(first.error));
  assert.deepEqual(first.result, { refund_id: "re_1", amount_cents: 4200 });
  assert.equal(provider.calls, 1);

  // The executor retries the same operation (same request_id): COMPLETED
  // with the stored result, and the provider is not called again.
  const retry = await executeRefund(clients, args, "node-ledger-1", provider);
  assert.equal(retry.kind, "completed", JSON.stringify(retry.error));
  assert.deepEqual(retry.result, first.result);
  assert.equal(provider.calls, 1);

  // The ledger's record says the same.
  const key = (await authorizeRefund(authorization, args, "node-ledger-1")).idempotency_key;
  const record = (await call(ledger, "GetExecution", { auth: authContext(), idempotency_key: key })).execution;
  assert.equal(record.state, "EXECUTION_STATE_SUCCEEDED");
  assert.equal(record.attempt, 1);
  assert.deepEqual(JSON.parse(record.result_json), first.result);

  // A new operation (another request_id) is a new refund.
  const other = await executeRefund(clients, args, "node-ledger-2", provider);
  assert.equal(other.kind, "succeeded");
  assert.equal(provider.calls, 2);
});

test("a refund whose answer never came is reconciled, never run again", async () => {
  const provider = new DemoProvider();
  // The provider refunds, but the answer is lost on the way back.
  const lost = {
    calls: 0,
    async refund(a, key, ms) {
      this.calls += 1;
      await provider.refund(a, key, ms);
      throw { timeout: true };
    },
    findRefund: (key) => provider.findRefund(key),
  };
  const args = JSON.stringify({ order_id: "ord_1001", amount_cents: 1300, currency: "USD", reason: "late" });
  const first = await executeRefund(clients, args, "node-ledger-lost", lost);
  assert.equal(first.kind, "unknown");
  assert.equal(first.error.code, "timeout_unknown");
  // The retry does not refund again: it asks the provider and reconciles.
  const retry = await executeRefund(clients, args, "node-ledger-lost", lost);
  assert.equal(retry.kind, "reconciled", JSON.stringify(retry.error));
  assert.deepEqual(retry.result, { refund_id: "re_1", amount_cents: 1300 });
  const settled = await executeRefund(clients, args, "node-ledger-lost", lost);
  assert.equal(settled.kind, "completed");
  assert.deepEqual(settled.result, retry.result);
  assert.equal(lost.calls, 1);
});

test.after(() => {
  authorization.close();
  approvals.close();
  ledger.close();
});
