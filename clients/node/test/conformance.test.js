// The shared cases (clients/conformance/cases.json), the same file the
// Python SDK's tests run: each request through Gate.authorize against the
// real sidecar, every expected field asserted exactly; then the
// sdk_semantics cases, the choices that are the SDK's own.
import test from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";

import { DEFAULTS, Gate, ToolgateError, serviceConfig } from "@toolgate/client";

import { APPROVER, fresh, gate } from "./support.js";

const path = process.env.TOOLGATE_CONFORMANCE_CASES;
const { cases } = JSON.parse(readFileSync(path, "utf8"));

test("the shared conformance cases", async (t) => {
  assert.ok(cases.length > 0, `no cases in ${path}`);
  const g = gate();
  const seen = new Set();
  try {
    for (const c of cases) {
      assert.ok(!seen.has(c.name), `case ${c.name} twice`);
      seen.add(c.name);
      await t.test(c.name, async () => {
        const { request, expect } = c;
        const a = request.auth;
        const d = await g.authorize({
          tool: request.tool,
          arguments: request.arguments,
          auth: {
            subjectId: a.subject_id,
            tenantId: a.tenant_id,
            roles: a.roles,
            scopes: a.scopes,
            agentId: a.agent_id,
            sessionId: a.session_id,
          },
          requestId: request.request_id,
          entitiesJson: request.entities_json,
          toolVersion: request.tool_version,
        });
        const context = JSON.stringify({ decision: d.decision, error: d.error });
        assert.equal(d.decision, expect.decision, context);
        // An empty code means no error envelope at all.
        if ("code" in expect) assert.equal(d.error?.code ?? "", expect.code, context);
        if ("retryable" in expect) assert.equal(d.error?.retryable, expect.retryable, context);
        if ("resolution" in expect) assert.equal(d.error?.resolution, expect.resolution, context);
        if ("idempotency_key" in expect) assert.equal(d.idempotencyKey, expect.idempotency_key);
        if ("arguments_sha256" in expect) assert.equal(d.argumentsSha256, expect.arguments_sha256);
        if ("normalized_arguments" in expect) assert.equal(d.normalizedArguments, expect.normalized_arguments);
        if ("conflict_key" in expect) assert.equal(d.conflictKey, expect.conflict_key);
        if (d.decision === "allow") {
          assert.equal(d.error, undefined);
        } else {
          // Every refusal carries the model-safe answer, naming the same code.
          assert.equal(JSON.parse(d.modelOutput).error.code, d.error.code);
        }
      });
    }
  } finally {
    g.close();
  }
});

// The sdk_semantics cases: each by the runner of its name, against the same
// sidecar; a case without a runner here (or a runner without its case) fails.
const semantics = JSON.parse(readFileSync(path, "utf8")).sdk_semantics.cases;
const byName = Object.fromEntries(cases.map((c) => [c.name, c]));
const TOKENS = { approver: APPROVER, requester: process.env.TOOLGATE_TEST_REQUESTER_TOKEN };

/** The named case's request, under a request id no other run uses. */
function callOf(given) {
  const r = byName[given.call].request;
  const a = r.auth;
  return {
    tool: r.tool,
    arguments: r.arguments,
    auth: { subjectId: a.subject_id, tenantId: a.tenant_id, roles: a.roles, scopes: a.scopes, agentId: a.agent_id, sessionId: a.session_id },
    requestId: fresh(r.request_id ?? "sdk"),
    entitiesJson: r.entities_json ?? "",
  };
}

async function pendingApproval(g, given) {
  const d = await g.authorize(callOf(given));
  assert.equal(d.decision, "approval_required", JSON.stringify(d));
  return d.approval.approvalId;
}

/** The error thrown, in the case's terms. */
function assertRaisedAs(want, e) {
  const got = {
    raises: e?.constructor?.name,
    code: e?.code,
    resolution: e?.resolution,
    retryable: e?.retryable,
    grpc_status: e?.grpcStatus ?? null,
  };
  for (const [k, v] of Object.entries(want)) assert.deepEqual(got[k], v, `${k}: ${JSON.stringify(got)}`);
  assert.ok(e instanceof ToolgateError);
}

const RUNNERS = {
  async refused_decision_raises({ given, expect }) {
    const g = gate();
    try {
      const id = await pendingApproval(g, given);
      const shown = await g.getApproval(id, { identityToken: TOKENS.approver });
      const answer = await g
        .decideApproval(id, "approve", shown.argumentsSha256, { identityToken: TOKENS[given.decider], reason: "conformance" })
        .then((a) => ({ returned: a }), (e) => ({ raised: e }));
      assert.ok(answer.raised, `decideApproval returned ${JSON.stringify(answer.returned)} instead of throwing`);
      assertRaisedAs(expect, answer.raised);
    } finally {
      g.close();
    }
  },
  async timed_out_wait_returns_the_pending_approval({ given, expect }) {
    const g = gate();
    try {
      const id = await pendingApproval(g, given);
      const started = Date.now();
      const got = await g.waitForApproval(id, given.wait_seconds * 1000, { identityToken: TOKENS[given.waiter] });
      const took = (Date.now() - started) / 1000;
      assert.equal(got.status, expect.status);
      assert.equal(got.approvalId, id);
      assert.ok(took >= given.wait_seconds && took < expect.within_seconds, `returned after ${took} s`);
    } finally {
      g.close();
    }
  },
  async in_progress_waits_30_seconds_by_default({ given, expect }) {
    assert.equal(DEFAULTS.inProgressWaitMs, expect.default_wait_seconds * 1000);
    const first = gate();
    const second = gate(); // its own connection, as a second executor's
    try {
      assert.equal(second.inProgressWaitMs, expect.default_wait_seconds * 1000);
      const c = callOf(given);
      let holding;
      const held = new Promise((resolve) => (holding = resolve));
      const running = first.run(c.tool, c.arguments, c.auth, c.requestId, async (args) => {
        holding();
        await new Promise((resolve) => setTimeout(resolve, given.hold_seconds * 1000));
        return { refund_id: "re_held", amount_cents: args.amount_cents };
      }, { entitiesJson: c.entitiesJson });
      await held;
      const later = await second.run(c.tool, c.arguments, c.auth, c.requestId, () => assert.fail("the tool ran twice"), {
        entitiesJson: c.entitiesJson,
      });
      const earlier = await running;
      assert.equal(earlier.status, expect.first, JSON.stringify(earlier));
      assert.equal(later.status, expect.second, JSON.stringify(later));
      assert.deepEqual(later.result, earlier.result);
    } finally {
      first.close();
      second.close();
    }
  },
  async retries_unavailable_3_times_with_backoff({ expect }) {
    const policy = JSON.parse(serviceConfig()).methodConfig[0].retryPolicy;
    const seconds = (text) => Number(text.replace(/s$/, ""));
    assert.deepEqual(
      {
        max_attempts: policy.maxAttempts,
        initial_backoff_seconds: seconds(policy.initialBackoff),
        backoff_multiplier: policy.backoffMultiplier,
        max_backoff_seconds: seconds(policy.maxBackoff),
        retryable_status_codes: policy.retryableStatusCodes,
      },
      expect,
    );
  },
  async a_failed_call_raises_the_sdk_error({ given, expect }) {
    // A loopback port that was free a moment ago: nobody listens there.
    const port = await new Promise((resolve) => {
      const probe = createServer().listen(0, "127.0.0.1", () => {
        const { port } = probe.address();
        probe.close(() => resolve(port));
      });
    });
    const g = new Gate(`127.0.0.1:${port}`);
    try {
      const c = callOf(given);
      const answer = await g.authorize(c).then((d) => ({ returned: d }), (e) => ({ raised: e }));
      assert.ok(answer.raised, `authorize answered ${JSON.stringify(answer.returned)} instead of throwing`);
      assertRaisedAs(expect, answer.raised);
    } finally {
      g.close();
    }
  },
};

test("the shared sdk_semantics cases", async (t) => {
  assert.deepEqual(semantics.map((c) => c.name).sort(), Object.keys(RUNNERS).sort());
  assert.ok(TOKENS.requester, "TOOLGATE_TEST_REQUESTER_TOKEN (tests/it/node.rs sets it)");
  for (const c of semantics) await t.test(c.name, () => RUNNERS[c.name](c));
});
