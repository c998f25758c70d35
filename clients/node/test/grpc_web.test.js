// A browser approval UI's transport: gRPC-Web over HTTP/1.1 on toolgate's
// own listener, with Connect's real gRPC-Web client. The service
// descriptors come from toolgate's descriptor set at run time (no code
// generation). Also the CORS preflight a browser sends first.
// Env: TOOLGATE_ADDR, TOOLGATE_TEST_DESCRIPTOR_SET, TOOLGATE_TEST_APPROVER_TOKEN,
// TOOLGATE_TEST_WEB_ORIGIN (the one origin the server allows).
"use strict";

const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const http = require("node:http");

const { createClient, ConnectError, Code } = require("@connectrpc/connect");
const { createGrpcWebTransport } = require("@connectrpc/connect-node");
const { createFileRegistry, fromBinary } = require("@bufbuild/protobuf");
const { FileDescriptorSetSchema } = require("@bufbuild/protobuf/wkt");

const { connect } = require("../toolgate_client");
const { authorizeRefund } = require("../refund_example");

const ADDR = process.env.TOOLGATE_ADDR;
const APPROVER = process.env.TOOLGATE_TEST_APPROVER_TOKEN;
const ORIGIN = process.env.TOOLGATE_TEST_WEB_ORIGIN;
const registry = createFileRegistry(
  fromBinary(FileDescriptorSetSchema, fs.readFileSync(process.env.TOOLGATE_TEST_DESCRIPTOR_SET)),
);
const ApprovalService = registry.getService("toolgate.v1.ApprovalService");
const ApprovalStatus = registry.getEnum("toolgate.v1.ApprovalStatus");
const Verdict = registry.getEnum("toolgate.v1.Verdict");
const status = (name) => ApprovalStatus.values.find((v) => v.name === name).number;

const web = createClient(
  ApprovalService,
  createGrpcWebTransport({ baseUrl: `http://${ADDR}`, httpVersion: "1.1" }),
);

test("an approval UI lists, reads and decides over gRPC-Web", async () => {
  // An executor (native gRPC) asks for a large refund: a pending approval.
  const { authorization } = connect(ADDR);
  const args = JSON.stringify({ order_id: "ord_1001", amount_cents: 30000, currency: "USD", reason: "late" });
  const required = await authorizeRefund(authorization, args, "web-refund-1");
  authorization.close();
  assert.equal(required.decision, "DECISION_APPROVAL_REQUIRED");
  const approvalId = required.approval.approval_id;

  const page = await web.listApprovals({ identityToken: APPROVER, status: status("APPROVAL_STATUS_PENDING") });
  const listed = page.approvals.find((a) => a.approvalId === approvalId);
  assert.ok(listed, "the pending approval is listed");
  assert.equal(listed.tool, "refund_order");
  assert.equal(listed.requesterSubjectId, "bob");

  const { approval } = await web.getApproval({ identityToken: APPROVER, approvalId });
  assert.equal(approval.argumentsSha256, required.arguments_sha256);
  assert.equal(JSON.parse(approval.displayArguments).amount_cents, 30000);

  const decided = await web.decideApproval({
    identityToken: APPROVER,
    approvalId,
    verdict: Verdict.values.find((v) => v.name === "VERDICT_APPROVE").number,
    argumentsSha256: approval.argumentsSha256,
    reason: "approved in the browser",
  });
  assert.equal(decided.error, undefined);
  assert.equal(decided.approval.status, status("APPROVAL_STATUS_APPROVED"));
  assert.equal(decided.approval.decidedBy, "dana");
});

test("gRPC-Web carries statuses: a bad token is UNAUTHENTICATED", async () => {
  await assert.rejects(
    web.listApprovals({ identityToken: "not-a-token" }),
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
