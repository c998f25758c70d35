// For approval UIs in a browser: ApprovalService over gRPC-Web (Connect's
// transport), on toolgate's own listener. No Node.js module is imported
// here. The service's descriptors are generated from proto/ when the
// package is built.
import { createFileRegistry, fromBinary, toJson, type DescMessage, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { createClient, type Transport } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";

import { DESCRIPTOR_SET_BASE64 } from "./descriptors.generated.js";
import type { Approval, ApprovalStatus, ErrorEnvelope } from "./types.js";
import { ToolgateError } from "./errors.js";
import type * as pb from "./pb.js";
import * as wire from "./wire.js";

function decodeBase64(text: string): Uint8Array {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** The toolgate.v1 descriptors (services, messages, enums). */
export const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, decodeBase64(DESCRIPTOR_SET_BASE64)));

/** toolgate.v1.ApprovalService, for Connect's `createClient`. */
export const ApprovalService: DescService = registry.getService("toolgate.v1.ApprovalService")!;

function enumNumber(name: string, value: string): number {
  const e = registry.getEnum(name)!;
  const found = e.values.find((v) => v.name === value);
  if (!found) throw new Error(`toolgate: no ${value} in ${name}`);
  return found.number;
}

const ApprovalSchema = registry.getMessage("toolgate.v1.Approval")!;
const ErrorEnvelopeSchema = registry.getMessage("toolgate.v1.ErrorEnvelope")!;
const ApprovalEventKindSchema = registry.getEnum("toolgate.v1.ApprovalEventKind")!;

/* eslint-disable @typescript-eslint/no-explicit-any */
/** A message as proto3 JSON with the proto's field names: the shape `wire` reads. */
const plain = (schema: DescMessage, message: any) =>
  toJson(schema, message, { useProtoFieldName: true, alwaysEmitImplicit: true });
// proto3 JSON with the proto's field names and enum names is proto-loader's
// shape but for timestamps (RFC 3339 text), which wire.timestamp reads too.
const approval = (a: any): Approval => wire.approval(plain(ApprovalSchema, a) as unknown as pb.Approval__Output);
const envelope = (e: any): ErrorEnvelope | undefined =>
  e ? wire.envelope(plain(ErrorEnvelopeSchema, e) as unknown as pb.ErrorEnvelope__Output) : undefined;

export interface WebApprovalsOptions {
  /** Connect transport of your own (default: gRPC-Web over fetch to `baseUrl`). */
  transport?: Transport;
  /** The approver's identity token (a verified token of the approval's tenant). */
  identityToken: string;
}

/** An approval event of the watch. */
export interface ApprovalEvent {
  kind: "created" | "decided" | "expired" | "consumed" | "unspecified";
  approval: Approval;
}

/**
 * The approval UI's calls over gRPC-Web: list, get, decide, watch.
 * `baseUrl` is toolgate's listener (`https://toolgate.example:50051`), whose
 * `[grpc_web] allowed_origins` names the UI's origin.
 */
export function createWebApprovals(baseUrl: string, options: WebApprovalsOptions) {
  const transport = options.transport ?? createGrpcWebTransport({ baseUrl });
  const client = createClient(ApprovalService, transport) as unknown as Record<string, (...args: any[]) => any>;
  const token = options.identityToken;
  return {
    /** The raw Connect client (messages in protobuf-es form). */
    client,
    async listApprovals(
      query: { status?: ApprovalStatus; pageSize?: number; pageToken?: string } = {},
    ): Promise<{ approvals: Approval[]; nextPageToken: string }> {
      const r = await client.listApprovals({
        identityToken: token,
        status: enumNumber("toolgate.v1.ApprovalStatus", `APPROVAL_STATUS_${(query.status ?? "unspecified").toUpperCase()}`),
        pageSize: query.pageSize ?? 0,
        pageToken: query.pageToken ?? "",
      });
      return { approvals: r.approvals.map(approval), nextPageToken: r.nextPageToken };
    },
    async getApproval(approvalId: string): Promise<Approval> {
      const r = await client.getApproval({ identityToken: token, approvalId });
      return approval(r.approval);
    },
    async decideApproval(
      approvalId: string,
      verdict: "approve" | "reject",
      argumentsSha256: string,
      reason = "",
    ): Promise<Approval> {
      const r = await client.decideApproval({
        identityToken: token,
        approvalId,
        verdict: enumNumber("toolgate.v1.Verdict", verdict === "approve" ? "VERDICT_APPROVE" : "VERDICT_REJECT"),
        argumentsSha256,
        reason,
      });
      // As Gate.decideApproval: a refusal throws ToolgateError with toolgate's envelope.
      const refused = envelope(r.error);
      if (refused) throw new ToolgateError(refused);
      return approval(r.approval);
    },
    /** The tenant's approval events as they happen; stop with `signal`. */
    async *watchApprovals(signal?: AbortSignal): AsyncGenerator<ApprovalEvent> {
      for await (const r of client.watchApprovals({ identityToken: token }, { signal }) as AsyncIterable<any>) {
        if (!r.event) continue;
        yield {
          kind: (ApprovalEventKindSchema.value[r.event.kind]?.name.slice("APPROVAL_EVENT_KIND_".length).toLowerCase() ??
            "unspecified") as ApprovalEvent["kind"],
          approval: approval(r.event.approval),
        };
      }
    },
  };
}

export type WebApprovals = ReturnType<typeof createWebApprovals>;
