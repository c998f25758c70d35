// Gate.run runs a tool exactly once per operation against the real
// sidecar: across a retry, a provider whose answer never came (UNKNOWN →
// the reconcile callback), a tool that outlives its lease, a crash of the
// executor process between begin and complete (a second process resumes),
// and a concurrent duplicate.
import test from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { ToolError } from "@toolgate/client";
import { BOB, DemoProvider, ENTITIES, refund } from "../examples/refund.js";
import { fresh, gate, refundArgs } from "./support.js";

const g = gate();
test.after(() => g.close());

/** Gate.run of a refund of `amount` cents for bob, with the order's entities. */
const runRefund = (amount, id, fn, options = {}, through = g) =>
  through.run("refund_order", refundArgs(amount), BOB, id, fn, { entitiesJson: ENTITIES, ...options });

test("a retry of the same operation gets the stored result; the tool ran once", async () => {
  const provider = new DemoProvider();
  const id = fresh("run-retry");
  const first = await refund(g, provider, refundArgs(4200), id);
  assert.equal(first.status, "succeeded", JSON.stringify(first));
  assert.deepEqual(first.result, { refund_id: "re_1", amount_cents: 4200 });
  assert.equal(first.attempt, 1);
  // The model sent other bytes for the same arguments: the same operation.
  const retry = await refund(g, provider, '{"reason":"late","currency":"USD","amount_cents":4200,"order_id":"ord_1001"}', id);
  assert.equal(retry.status, "completed", JSON.stringify(retry));
  assert.deepEqual(retry.result, first.result);
  assert.equal(provider.calls, 1);
  const record = await g.getExecution(BOB, first.decision.idempotencyKey);
  assert.equal(record.state, "succeeded");
  assert.equal(record.attempt, 1);
  assert.deepEqual(JSON.parse(record.resultJson), first.result);
  // Another operation is another refund.
  const other = await refund(g, provider, refundArgs(4200), fresh("run-retry-other"));
  assert.equal(other.status, "succeeded");
  assert.equal(provider.calls, 2);
});

test("a tool's own refusal is recorded as failed, and a retry does not run it again", async () => {
  const provider = new DemoProvider();
  const id = fresh("run-final");
  const failed = await runRefund(900, id, () => {
    provider.calls += 1;
    throw new ToolError("card_expired", "the card on file expired");
  });
  assert.equal(failed.status, "failed");
  assert.equal(failed.error.code, "card_expired");
  assert.equal(failed.error.retryable, false);
  const again = await refund(g, provider, refundArgs(900), id);
  assert.equal(again.status, "failed");
  assert.equal(again.error.code, "card_expired");
  assert.equal(provider.calls, 1);
});

test("a provider whose answer never came: UNKNOWN, settled by the reconcile callback, never run twice", async () => {
  const provider = new DemoProvider();
  let calls = 0;
  const reconciles = [];
  const id = fresh("run-lost");
  const lost = await runRefund(
    1300,
    id,
    async (a, key) => {
      calls += 1;
      await provider.refund(a, key); // it happened...
      throw new Error("socket hang up"); // ...but the answer was lost
    },
    {
      reconcile: (info) => {
        reconciles.push(info);
        return provider.find(info);
      },
    },
  );
  assert.equal(lost.status, "reconciled", JSON.stringify(lost));
  assert.deepEqual(lost.result, { refund_id: "re_1", amount_cents: 1300 });
  assert.equal(reconciles.length, 1);
  assert.equal(reconciles[0].idempotencyKey, lost.decision.idempotencyKey);
  assert.equal(reconciles[0].tool, "refund_order");
  const settled = await refund(g, provider, refundArgs(1300), id);
  assert.equal(settled.status, "completed");
  assert.deepEqual(settled.result, lost.result);
  assert.equal(calls, 1);
  assert.equal(provider.calls, 1);
});

test("a timeout without a reconcile callback is UNKNOWN; the retry reconciles; the tool never runs twice", async () => {
  const provider = new DemoProvider();
  let calls = 0;
  const id = fresh("run-timeout");
  const slow = async (a, key) => {
    calls += 1;
    await provider.refund(a, key);
    // The answer does not come before the deadline (here: the short lease).
    await new Promise((resolve) => setTimeout(resolve, 5000));
    return "late";
  };
  const started = Date.now();
  const first = await runRefund(2100, id, slow, { leaseMs: 600, graceMs: 100 });
  assert.equal(first.status, "unknown", JSON.stringify(first));
  assert.equal(first.error.code, "timeout_unknown");
  assert.ok(Date.now() - started < 3000, "run stopped waiting at the deadline");
  const retry = await refund(g, provider, refundArgs(2100), id);
  assert.equal(retry.status, "reconciled", JSON.stringify(retry));
  assert.deepEqual(retry.result, { refund_id: "re_1", amount_cents: 2100 });
  assert.equal(calls, 1);
  assert.equal(provider.calls, 1);
  const record = await g.getExecution(BOB, first.decision.idempotencyKey);
  assert.equal(record.state, "succeeded");
});

test("a lost lease stops the call: the tool's signal aborts at the lease's end", async () => {
  let aborted;
  const id = fresh("run-lease");
  const r = await runRefund(
    2200,
    id,
    (a, key, deadline, { signal }) =>
      new Promise((resolve, reject) => {
        // A tool that heeds the signal stops before it does anything.
        signal.addEventListener("abort", () => {
          aborted = { reason: signal.reason.reason, at: Date.now(), deadline: deadline.getTime() };
          reject(signal.reason);
        });
      }),
    { leaseMs: 500, graceMs: 500 },
  );
  assert.equal(aborted.reason, "lease");
  assert.ok(aborted.at >= aborted.deadline - 50, "not before the lease's end");
  // It stopped: its outcome is unknown to toolgate (it may have started), never run again.
  assert.equal(r.status, "unknown");
  const again = await runRefund(2200, id, () => assert.fail("ran twice"));
  assert.equal(again.status, "reconcile_required");
  assert.equal(again.error.code, "reconcile_required");
});

test("a concurrent duplicate waits for the first and gets its result; the tool ran once", async () => {
  const provider = new DemoProvider();
  const id = fresh("run-concurrent");
  let running = 0;
  let most = 0;
  const fn = async (a, key) => {
    running += 1;
    most = Math.max(most, running);
    await new Promise((resolve) => setTimeout(resolve, 300));
    running -= 1;
    return provider.refund(a, key);
  };
  const second = gate(); // another connection, as another executor has
  const results = await Promise.all([
    runRefund(3100, id, fn),
    runRefund(3100, id, fn),
    runRefund(3100, id, fn, {}, second),
  ]).finally(() => second.close());
  const statuses = results.map((r) => r.status).sort();
  assert.deepEqual(statuses, ["completed", "completed", "succeeded"], JSON.stringify(results));
  for (const r of results) assert.deepEqual(r.result, { refund_id: "re_1", amount_cents: 3100 });
  assert.equal(provider.calls, 1);
  assert.equal(most, 1);
});

/** Runs test/fixtures/executor.js; resolves with its stdout lines once `until` matches one, or at exit. */
function executor(mode, requestId, file, until) {
  const script = fileURLToPath(new URL("./fixtures/executor.js", import.meta.url));
  const child = spawn(process.execPath, [script, mode, requestId, file], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`executor ${mode} took too long: ${out}${err}`));
    }, 20000);
    child.stdout.on("data", (chunk) => {
      out += chunk;
      if (until && out.split("\n").includes(until)) {
        clearTimeout(timer);
        resolve({ child, lines: out.trim().split("\n") });
      }
    });
    child.stderr.on("data", (chunk) => (err += chunk));
    child.on("exit", (code) => {
      clearTimeout(timer);
      if (code !== 0 && !until) reject(new Error(`executor ${mode} exited ${code}: ${err}`));
      resolve({ child, code, lines: out.trim().split("\n") });
    });
  });
}

test("an executor killed between begin and complete: a second process resumes by reconciling, never a second refund", async () => {
  const file = join(mkdtempSync(join(tmpdir(), "toolgate-provider-")), "provider.json");
  writeFileSync(file, JSON.stringify({ calls: 0, refunds: {} }));
  const id = fresh("run-crash");
  const { child } = await executor("crash", id, file, "applied");
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve(signal)));
  child.kill("SIGKILL");
  assert.equal(await exited, "SIGKILL");
  assert.equal(JSON.parse(readFileSync(file, "utf8")).calls, 1);

  // Another process, same operation: it waits out the dead one's lease,
  // then asks the provider instead of refunding again.
  const resumed = await executor("resume", id, file);
  assert.equal(resumed.code, 0);
  const outcome = JSON.parse(resumed.lines.at(-1));
  assert.equal(outcome.status, "reconciled", resumed.lines.join("\n"));
  assert.deepEqual(outcome.result, { refund_id: "re_1", amount_cents: 1700 });
  assert.equal(JSON.parse(readFileSync(file, "utf8")).calls, 1);

  // And once more: the stored result.
  const again = await executor("resume", id, file);
  assert.equal(JSON.parse(again.lines.at(-1)).status, "completed");
  assert.equal(JSON.parse(readFileSync(file, "utf8")).calls, 1);
});
