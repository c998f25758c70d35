// The shared cases (clients/conformance/cases.json), the same file the
// Python SDK's tests run: each request through Gate.authorize against the
// real sidecar, every expected field asserted exactly.
import test from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { gate } from "./support.js";

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
