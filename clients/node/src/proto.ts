// The toolgate.v1 services, loaded at run time from the .proto files with
// @grpc/proto-loader: no generated code to keep in step with proto/.
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const here = dirname(fileURLToPath(import.meta.url));

/**
 * Where the .proto files are: `TOOLGATE_PROTO_DIR`, else the `proto/` the
 * package ships (copied from the repository's `proto/` when it is packed),
 * else the repository's own `proto/` (a checkout of clients/node).
 */
export function protoDir(): string {
  const fromEnv = process.env.TOOLGATE_PROTO_DIR;
  if (fromEnv) return fromEnv;
  for (const candidate of [join(here, "..", "proto"), join(here, "..", "..", "..", "proto")]) {
    if (existsSync(join(candidate, "toolgate", "v1", "authorization.proto"))) return candidate;
  }
  throw new Error("toolgate: no proto/ folder found: set TOOLGATE_PROTO_DIR to the folder holding toolgate/v1/*.proto");
}

/** A loaded service client constructor. */
export type ServiceClientConstructor = grpc.ServiceClientConstructor;

/** The four services an executor or an approval UI calls. */
export interface Services {
  AuthorizationService: ServiceClientConstructor;
  ApprovalService: ServiceClientConstructor;
  LedgerService: ServiceClientConstructor;
  PolicyService: ServiceClientConstructor;
}

const cache = new Map<string, Services>();

/**
 * The toolgate.v1 package: field names as in the proto (snake_case), enums
 * as their names, 64-bit integers as strings (a fencing token keeps every
 * digit), defaults filled in.
 */
export function loadServices(dir: string = protoDir()): Services {
  const cached = cache.get(dir);
  if (cached) return cached;
  const definition = protoLoader.loadSync(
    [
      "toolgate/v1/authorization.proto",
      "toolgate/v1/approval.proto",
      "toolgate/v1/ledger.proto",
      "toolgate/v1/policy.proto",
    ],
    { includeDirs: [dir], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true },
  );
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const v1 = (grpc.loadPackageDefinition(definition) as any).toolgate.v1;
  const services: Services = {
    AuthorizationService: v1.AuthorizationService,
    ApprovalService: v1.ApprovalService,
    LedgerService: v1.LedgerService,
    PolicyService: v1.PolicyService,
  };
  cache.set(dir, services);
  return services;
}
