// Gate over a Unix socket and over mutual TLS, against the real server's
// listeners (tests/it/node.rs starts them: the socket's peer uid and the
// executor's certificate are granted authorization and ledger).
// Env: TOOLGATE_TEST_UNIX (socket path), TOOLGATE_TEST_TLS_ADDR,
// TOOLGATE_TEST_TLS_DIR (ca.pem, executor.pem, executor.key).
import test from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { Gate, ToolgateError } from "@toolgate/client";

import { DemoProvider, refund } from "../examples/refund.js";

const pem = (name) => readFileSync(join(process.env.TOOLGATE_TEST_TLS_DIR, name));
const args = JSON.stringify({ order_id: "ord_1001", amount_cents: 2500, currency: "USD", reason: "late" });

async function refundsOnce(gate) {
  const provider = new DemoProvider();
  const id = `transport-${randomUUID()}`;
  const first = await refund(gate, provider, args, id);
  assert.equal(first.status, "succeeded", JSON.stringify(first));
  const again = await refund(gate, provider, args, id);
  assert.equal(again.status, "completed");
  assert.equal(provider.calls, 1);
}

test("unix: a refund runs once over the Unix socket", async () => {
  const gate = new Gate(`unix:${process.env.TOOLGATE_TEST_UNIX}`);
  try {
    await refundsOnce(gate);
  } finally {
    gate.close();
  }
});

test("mTLS: the executor's certificate is granted; without one the handshake fails", async () => {
  const gate = new Gate(process.env.TOOLGATE_TEST_TLS_ADDR, {
    tls: { ca: pem("ca.pem"), cert: pem("executor.pem"), key: pem("executor.key"), serverName: "localhost" },
  });
  try {
    await refundsOnce(gate);
  } finally {
    gate.close();
  }
  const anonymous = new Gate(process.env.TOOLGATE_TEST_TLS_ADDR, {
    tls: { ca: pem("ca.pem"), serverName: "localhost" },
    retry: { maxAttempts: 1 },
    timeoutMs: 3000,
  });
  try {
    await assert.rejects(
      anonymous.authorize({ tool: "refund_order", arguments: args, auth: { subjectId: "bob", tenantId: "acme" }, requestId: "x" }),
      (e) => e instanceof ToolgateError && e.grpcStatus === "UNAVAILABLE" && e.code === "unavailable",
    );
  } finally {
    anonymous.close();
  }
  assert.throws(() => new Gate("localhost:1", { tls: { cert: pem("executor.pem") } }), /both tls.cert and tls.key/);
});
