// The wire's types, generated from proto/ by scripts/build.mjs (proto-loader-gen-types into
// src/generated/, not committed): the messages as @grpc/proto-loader hands them to proto.ts's
// clients (snake_case, enums as names, 64-bit integers as strings). Only wire.ts and gate.ts use
// them; the public API answers the SDK's own types (types.ts).
export type { Timestamp, Timestamp__Output } from "./generated/google/protobuf/Timestamp.js";
export type { AuthorizeRequest } from "./generated/toolgate/v1/AuthorizeRequest.js";
export type { AuthorizeResponse__Output } from "./generated/toolgate/v1/AuthorizeResponse.js";
export type { AuthContext } from "./generated/toolgate/v1/AuthContext.js";
export type { ErrorEnvelope, ErrorEnvelope__Output } from "./generated/toolgate/v1/ErrorEnvelope.js";
export type { BeginExecutionResponse__Output } from "./generated/toolgate/v1/BeginExecutionResponse.js";
export type { Approval__Output } from "./generated/toolgate/v1/Approval.js";
export type { Execution__Output } from "./generated/toolgate/v1/Execution.js";
export type { CompleteExecutionRequest } from "./generated/toolgate/v1/CompleteExecutionRequest.js";
export type { CompleteExecutionResponse__Output } from "./generated/toolgate/v1/CompleteExecutionResponse.js";
export type { ReconcileExecutionRequest } from "./generated/toolgate/v1/ReconcileExecutionRequest.js";
export type { ReconcileExecutionResponse__Output } from "./generated/toolgate/v1/ReconcileExecutionResponse.js";
export type { GetExecutionRequest } from "./generated/toolgate/v1/GetExecutionRequest.js";
export type { GetExecutionResponse__Output } from "./generated/toolgate/v1/GetExecutionResponse.js";
export type { ListApprovalsRequest } from "./generated/toolgate/v1/ListApprovalsRequest.js";
export type { ListApprovalsResponse__Output } from "./generated/toolgate/v1/ListApprovalsResponse.js";
export type { GetApprovalRequest } from "./generated/toolgate/v1/GetApprovalRequest.js";
export type { GetApprovalResponse__Output } from "./generated/toolgate/v1/GetApprovalResponse.js";
export type { DecideApprovalRequest } from "./generated/toolgate/v1/DecideApprovalRequest.js";
export type { DecideApprovalResponse__Output } from "./generated/toolgate/v1/DecideApprovalResponse.js";
export type { WatchApprovalsRequest } from "./generated/toolgate/v1/WatchApprovalsRequest.js";
export type { WatchApprovalsResponse__Output } from "./generated/toolgate/v1/WatchApprovalsResponse.js";
export type { GetPolicyStatusRequest } from "./generated/toolgate/v1/GetPolicyStatusRequest.js";
export type { GetPolicyStatusResponse__Output } from "./generated/toolgate/v1/GetPolicyStatusResponse.js";
