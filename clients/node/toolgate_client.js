// toolgate over gRPC from Node.js: @grpc/grpc-js with @grpc/proto-loader
// reading proto/ directly — no code generation step.
"use strict";

const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

/** The proto/ folder of this repository, or TOOLGATE_PROTO_DIR. */
function protoDir() {
  return process.env.TOOLGATE_PROTO_DIR || path.join(__dirname, "..", "..", "proto");
}

/** The address of the sidecar: TOOLGATE_ADDR, else the default listener. */
function defaultAddr() {
  return process.env.TOOLGATE_ADDR || "127.0.0.1:50051";
}

/**
 * The toolgate.v1 package, loaded from the .proto files. Enums as their
 * names ("DECISION_ALLOW"), 64-bit integers as strings, field names as in
 * the proto (snake_case).
 */
function loadPackage(dir = protoDir()) {
  const definition = protoLoader.loadSync(
    ["toolgate/v1/authorization.proto", "toolgate/v1/approval.proto", "toolgate/v1/ledger.proto"],
    { includeDirs: [dir], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true },
  );
  return grpc.loadPackageDefinition(definition).toolgate.v1;
}

/** Clients of the three services on one plaintext (loopback) connection. */
function connect(addr = defaultAddr(), credentials = grpc.credentials.createInsecure()) {
  const v1 = loadPackage();
  return {
    authorization: new v1.AuthorizationService(addr, credentials),
    approvals: new v1.ApprovalService(addr, credentials),
    ledger: new v1.LedgerService(addr, credentials),
  };
}

/** A unary call as a promise, with a deadline of `seconds`. */
function call(client, method, request, seconds = 5) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + seconds * 1000);
    client[method](request, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

module.exports = { protoDir, defaultAddr, loadPackage, connect, call, grpc };
