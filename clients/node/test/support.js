// What the tests share: the sidecar's address and tokens from the Rust
// driver (tests/it/node.rs), and fresh request ids.
import { randomUUID } from "node:crypto";

import { Gate } from "@toolgate/client";

export const ADDR = process.env.TOOLGATE_ADDR;
export const APPROVER = process.env.TOOLGATE_TEST_APPROVER_TOKEN;
if (!ADDR || !APPROVER) throw new Error("set TOOLGATE_ADDR and TOOLGATE_TEST_APPROVER_TOKEN (tests/it/node.rs does)");

/** A request id no other test uses. */
export const fresh = (prefix) => `${prefix}-${randomUUID()}`;

export const gate = (options = {}) => new Gate(ADDR, options);

export const refundArgs = (amount) =>
  JSON.stringify({ order_id: "ord_1001", amount_cents: amount, currency: "USD", reason: "late" });
