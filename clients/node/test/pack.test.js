// The package as a user gets it: the tarball `npm pack` made
// (TOOLGATE_TEST_PACKAGE; tests/it/node.rs packs it first) is installed
// into a fresh project, its example runs there against the sidecar, and a
// TypeScript consumer type-checks against its declarations.
import test from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, writeFileSync, copyFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { ADDR, fresh } from "./support.js";

const TARBALL = process.env.TOOLGATE_TEST_PACKAGE;
const NPM = process.env.TOOLGATE_NPM || "npm";

test("npm pack's tarball installs into a fresh project, where the example runs and the types check", async () => {
  assert.ok(TARBALL, "TOOLGATE_TEST_PACKAGE names the tarball");
  const listing = execFileSync("tar", ["-tzf", TARBALL], { encoding: "utf8" }).split("\n");
  for (const file of [
    "package/dist/index.js",
    "package/dist/index.d.ts",
    "package/dist/web.js",
    "package/dist/adapters/ai.js",
    "package/dist/adapters/openai_agents.js",
    "package/proto/toolgate/v1/authorization.proto",
    "package/proto/toolgate/v1/ledger.proto",
    "package/examples/refund.js",
    "package/README.md",
  ]) {
    assert.ok(listing.includes(file), `${file} is in the tarball`);
  }
  assert.ok(!listing.some((f) => f.startsWith("package/test/") || f.startsWith("package/src/")), "no tests or sources");

  const project = mkdtempSync(join(tmpdir(), "toolgate-fresh-"));
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "fresh", private: true, type: "module" }));
  execFileSync(NPM, ["install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error", TARBALL], {
    cwd: project,
    stdio: "pipe",
  });
  const installed = join(project, "node_modules", "@toolgate", "client");
  assert.ok(readdirSync(join(installed, "dist")).includes("gate.js"));

  // The example, copied out of the package, imports @toolgate/client from the project.
  copyFileSync(join(installed, "examples", "refund.js"), join(project, "refund.js"));
  const id = fresh("packed");
  const env = { ...process.env, TOOLGATE_ADDR: ADDR, TOOLGATE_PROTO_DIR: "" };
  const run = () => execFileSync(process.execPath, ["refund.js", "2500", id], { cwd: project, env, encoding: "utf8" }).trim();
  assert.equal(run(), 'succeeded: {"refund_id":"re_1","amount_cents":2500}');
  assert.equal(run(), 'completed: {"refund_id":"re_1","amount_cents":2500}');

  // A TypeScript consumer of the installed package's declarations.
  writeFileSync(
    join(project, "consumer.ts"),
    `import { Gate, type Decision, type RunResult } from "@toolgate/client";
import { createWebApprovals } from "@toolgate/client/web";
import { guardTools } from "@toolgate/client/ai";
export async function f(gate: Gate): Promise<string> {
  const d: Decision = await gate.authorize({ tool: "t", arguments: "{}", auth: { subjectId: "s", tenantId: "t" } });
  if (d.decision === "approval_required") return d.approval.approvalId;
  const r: RunResult = await gate.run("t", "{}", { subjectId: "s", tenantId: "t" }, "r", (args, key, deadline) => key);
  void createWebApprovals; void guardTools;
  return r.status === "succeeded" ? String(r.result) : d.modelOutput;
}
`,
  );
  const require = createRequire(import.meta.url);
  const tsc = require.resolve("typescript/bin/tsc");
  const types = join(require.resolve("@types/node/package.json"), "..", "..");
  execFileSync(
    process.execPath,
    [tsc, "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022",
      "--skipLibCheck", "--typeRoots", types, "--types", "node", "consumer.ts"],
    { cwd: project, stdio: "pipe" },
  );
});
