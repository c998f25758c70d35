// A browser approval UI's transport: @toolgate/client/web, ApprovalService
// over gRPC-Web with Connect's browser transport (fetch), on toolgate's own
// listener, its descriptors generated from proto/ when the package was
// built. And the CORS preflight a browser sends first.
// Env: TOOLGATE_ADDR, TOOLGATE_TEST_APPROVER_TOKEN, TOOLGATE_TEST_WEB_ORIGIN
// (the one origin the server allows).
import test from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import { ConnectError, Code } from "@connectrpc/connect";
import { createWebApprovals } from "@toolgate/client/web";

import { BOB, ENTITIES } from "../examples/refund.js";
import { ADDR, APPROVER, fresh, gate, refundArgs } from "./support.js";

const ORIGIN = process.env.TOOLGATE_TEST_WEB_ORIGIN;
const web = createWebApprovals(`http://${ADDR}`, { identityToken: APPROVER });

test("an approval UI lists, reads, watches and decides over gRPC-Web", async () => {
  const controller = new AbortController();
  const events = [];
  // The UI watches its tenant's approvals as they happen.
  const watching = (async () => {
    try {
      for await (const event of web.watchApprovals(controller.signal)) {
        events.push(event);
        if (event.kind === "decided") break;
      }
    } catch (e) {
      if (!controller.signal.aborted) throw e;
    }
  })();
  await new Promise((resolve) => setTimeout(resolve, 300));

  // An executor (native gRPC) asks for a large refund: a pending approval.
  const executor = gate();
  const required = await executor.authorize({
    tool: "refund_order",
    arguments: refundArgs(30000),
    auth: BOB,
    requestId: fresh("web-refund"),
    entitiesJson: ENTITIES,
  });
  executor.close();
  assert.equal(required.decision, "approval_required");
  const approvalId = required.approval.approvalId;

  const page = await web.listApprovals({ status: "pending" });
  const listed = page.approvals.find((a) => a.approvalId === approvalId);
  assert.ok(listed, "the pending approval is listed");
  assert.equal(listed.tool, "refund_order");
  assert.equal(listed.requesterSubjectId, "bob");
  assert.equal(listed.risk, "financial");

  const approval = await web.getApproval(approvalId);
  assert.equal(approval.argumentsSha256, required.argumentsSha256);
  assert.equal(JSON.parse(approval.displayArguments).amount_cents, 30000);
  assert.ok(approval.expiresAt > new Date());

  const decided = await web.decideApproval(approvalId, "approve", approval.argumentsSha256, "approved in the browser");
  assert.equal(decided.status, "approved");
  assert.equal(decided.decidedBy, "dana");

  await Promise.race([watching, new Promise((_, reject) => setTimeout(() => reject(new Error("no decided event")), 5000))]);
  controller.abort();
  const ours = events.filter((e) => e.approval.approvalId === approvalId).map((e) => e.kind);
  assert.deepEqual(ours, ["created", "decided"]);
});

test("gRPC-Web carries statuses: a bad token is UNAUTHENTICATED", async () => {
  const stranger = createWebApprovals(`http://${ADDR}`, { identityToken: "not-a-token" });
  await assert.rejects(
    stranger.listApprovals(),
    (e) => e instanceof ConnectError && e.code === Code.Unauthenticated,
  );
});

/** One HTTP/1.1 request to ListApprovals, as a browser would send it. */
function send(method, headers, body) {
  return new Promise((resolve, reject) => {
    const [host, port] = ADDR.split(":");
    const req = http.request(
      { host, port, method, path: "/toolgate.v1.ApprovalService/ListApprovals", headers },
      (res) => {
        res.resume();
        res.on("end", () => resolve(res));
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

const preflight = (origin) =>
  send("OPTIONS", {
    Origin: origin,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type,x-grpc-web",
  });

test("CORS: the configured origin is allowed, any other is not", async () => {
  const allowed = await preflight(ORIGIN);
  assert.equal(allowed.headers["access-control-allow-origin"], ORIGIN);
  assert.match(allowed.headers["access-control-allow-headers"], /x-grpc-web/);
  const other = await preflight("https://evil.example");
  assert.equal(other.headers["access-control-allow-origin"], undefined);
  // The call itself (an empty request frame): the browser may read grpc-status.
  const answer = await send(
    "POST",
    { Origin: ORIGIN, "Content-Type": "application/grpc-web+proto", "X-Grpc-Web": "1" },
    Buffer.from([0, 0, 0, 0, 0]),
  );
  assert.equal(answer.statusCode, 200);
  assert.equal(answer.headers["access-control-allow-origin"], ORIGIN);
  assert.match(answer.headers["access-control-expose-headers"], /grpc-status/);
});
