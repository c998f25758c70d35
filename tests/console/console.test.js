// The approval console in a real headless Chromium (Debian's, driven by
// playwright-core: no browser download) against a real `toolgate serve`,
// with a real executor (@grpc/grpc-js, clients/node) and axe-core's
// accessibility check on every screen. Started by the Rust integration test
// `console::the_console_works_in_a_real_browser`, which passes:
//   TOOLGATE_CONSOLE_URL   http://127.0.0.1:PORT/console/
//   TOOLGATE_ADDR          127.0.0.1:PORT (gRPC, for the executor)
//   TOOLGATE_PROTO_DIR     proto/
//   TOOLGATE_CHROMIUM      /usr/bin/chromium
//   TOOLGATE_TEST_KEY      the test issuer's ES256 key (tests/it/fixtures/keys/ec.pem)
//   TOOLGATE_SCREENSHOTS   where each screen's screenshot is saved (docs/console/)
//   TOOLGATE_TEST_OUT      where the tokens minted here are written, for the
//                          Rust test to check the sidecar's log for them
// The tests run in order and share one browser.
"use strict";

const test = require("node:test");
const { before, after } = require("node:test");
const assert = require("node:assert/strict");
const crypto = require("node:crypto");
const fs = require("node:fs");
const path = require("node:path");

const { chromium } = require("playwright-core");
const axe = require("axe-core");
// The executor's and the checks' gRPC calls: @grpc/grpc-js with
// @grpc/proto-loader reading proto/, as installed for clients/node.
const clientRequire = require("node:module").createRequire(
  path.join(__dirname, "..", "..", "clients", "node", "package.json"),
);
const grpc = clientRequire("@grpc/grpc-js");
const protoLoader = clientRequire("@grpc/proto-loader");

/** Clients of the services on one plaintext loopback connection. */
function connect() {
  const definition = protoLoader.loadSync(
    ["toolgate/v1/authorization.proto", "toolgate/v1/approval.proto"],
    {
      includeDirs: [path.join(__dirname, "..", "..", "proto")],
      keepCase: true,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    },
  );
  const v1 = grpc.loadPackageDefinition(definition).toolgate.v1;
  const addr = process.env.TOOLGATE_ADDR || "127.0.0.1:50051";
  const credentials = grpc.credentials.createInsecure();
  return {
    authorization: new v1.AuthorizationService(addr, credentials),
    approvals: new v1.ApprovalService(addr, credentials),
  };
}

/** A unary call as a promise, with a deadline of `seconds`. */
function call(client, method, request, seconds = 5) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + seconds * 1000);
    client[method](request, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

const URL_ = process.env.TOOLGATE_CONSOLE_URL;
const SHOTS = process.env.TOOLGATE_SCREENSHOTS;
const OUT = process.env.TOOLGATE_TEST_OUT;
const KEY = fs.readFileSync(process.env.TOOLGATE_TEST_KEY, "utf8");

// ---- tokens: real ES256 JWTs from the test issuer ---------------------------

const minted = [];
const b64url = (buf) => Buffer.from(buf).toString("base64url");

/** An approver's identity token, valid for `seconds` (negative: already expired). */
function token(sub, tenant, roles, seconds = 600) {
  const header = { alg: "ES256", typ: "JWT", kid: "ec-1" };
  const claims = {
    sub,
    tenant,
    roles,
    scope: "approvals",
    iss: "https://idp.test",
    aud: "toolgate",
    exp: Math.floor(Date.now() / 1000) + seconds,
  };
  const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
  const signature = crypto.sign("sha256", Buffer.from(input), { key: KEY, dsaEncoding: "ieee-p1363" });
  const jwt = `${input}.${b64url(signature)}`;
  minted.push(jwt);
  return jwt;
}

const DANA = token("dana", "acme", ["support_admin"]);
const ERIN = token("erin", "acme", ["support_admin"]);
const SAM = token("sam", "acme", ["support_agent"]);
const BOB = token("bob", "acme", ["support_admin"]); // the requester himself
const OLGA = token("olga", "globex", ["support_admin"]);

// ---- the executor: real Authorize calls over gRPC ---------------------------

const { authorization, approvals } = connect();
const ORDER = JSON.stringify([
  {
    uid: { type: "Order", id: "ord_1001" },
    parents: [{ type: "Tenant", id: "acme" }],
    attrs: {
      tenant: { __entity: { type: "Tenant", id: "acme" } },
      owner: { __entity: { type: "User", id: "alice" } },
      status: "delivered",
      total_cents: 500000,
    },
  },
]);

/** bob's `agent` asks to refund `cents` (over 100.00 needs a human). */
function refund(cents, requestId, approvalId = "", agent = "support-bot") {
  return call(authorization, "Authorize", {
    tool: "refund_order",
    arguments: Buffer.from(
      JSON.stringify({ order_id: "ord_1001", amount_cents: cents, currency: "USD", reason: "damaged", note: "card ending 4242" }),
    ),
    auth: {
      subject_id: "bob",
      tenant_id: "acme",
      roles: ["support_agent"],
      scopes: ["orders:read", "orders:refund"],
      agent_id: agent,
      session_id: "s-42",
    },
    call_id: "call_1",
    request_id: requestId,
    approval_id: approvalId,
    entities_json: ORDER,
  });
}

/** A new PENDING approval for a refund; resolves to the Authorize answer. */
async function pendingRefund(cents, requestId) {
  const r = await refund(cents, requestId);
  assert.equal(r.decision, "DECISION_APPROVAL_REQUIRED", JSON.stringify(r.error));
  assert.ok(r.approval.approval_id);
  return r;
}

async function stored(approvalId) {
  return (await call(approvals, "GetApproval", { identity_token: DANA, approval_id: approvalId })).approval;
}

// ---- the browser --------------------------------------------------------------

let browser;
const pages = []; // every page opened, with what its console said

before(async () => {
  browser = await chromium.launch({
    executablePath: process.env.TOOLGATE_CHROMIUM,
    headless: true,
    // This machine's network is closed: no background connections.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  fs.mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  if (browser) await browser.close();
  fs.writeFileSync(path.join(OUT, "tokens.json"), JSON.stringify(minted));
});

/** A fresh browser context (no shared storage) and its page, its console recorded. */
async function newPage(viewport = { width: 1280, height: 900 }, options = {}) {
  const context = await browser.newContext({ viewport, ...options });
  const page = await context.newPage();
  const record = { page, context, console: [], errors: [], failed: [] };
  page.on("console", (m) => record.console.push({ type: m.type(), text: m.text() }));
  page.on("pageerror", (e) => record.errors.push(String(e)));
  page.on("requestfailed", (r) => record.failed.push(`${r.url()} ${r.failure() && r.failure().errorText}`));
  page.on("response", (r) => {
    if (r.status() >= 400) record.failed.push(`${r.url()} ${r.status()}`);
  });
  pages.push(record);
  return record;
}

/** Opens the console and signs in with `jwt` through the form. */
async function signedIn(jwt, viewport, options) {
  const record = await newPage(viewport, options);
  const { page } = record;
  await page.goto(URL_);
  await page.locator("#screen-signin").waitFor({ state: "visible" });
  await page.fill("#token", jwt);
  await page.click("#signin-form button[type=submit]");
  await page.locator("#screen-queue").waitFor({ state: "visible" });
  await live(page);
  return record;
}

/** Waits until the page's live queue is connected. */
async function live(page) {
  await page.locator("#live", { hasText: "Live" }).waitFor({ state: "visible", timeout: 5000 });
}

async function screenshot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
}

/** axe-core on the page as it is: no serious or critical violation. */
async function accessible(page, screen) {
  await page.evaluate(axe.source);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ["violations"] }));
  const bad = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  assert.deepEqual(
    bad.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`),
    [],
    `axe on the ${screen} screen`,
  );
}

const card = (page, id) => page.locator(`#queue-list a.card[data-approval-id="${id}"]`);
const text = (page, selector) => page.locator(selector).innerText();

/** The page has no horizontal scroll: everything fits the screen's width. */
async function fitsWidth(page, screen) {
  const { scroll, width } = await page.evaluate(() => ({ scroll: document.documentElement.scrollWidth, width: window.innerWidth }));
  assert.ok(scroll <= width, `the ${screen} screen is ${scroll}px wide on a ${width}px screen`);
}

// ---- the tests -------------------------------------------------------------------

let dana; // dana's console, open through the tests
let erin; // a second console on the same tenant
let olga; // another tenant's approver
let approved; // the first approval, approved by dana

test("without a token the console shows sign-in; a bad or expired token stays there, said in words", async () => {
  const { page, context } = await newPage();
  const response = await page.goto(URL_);
  const csp = response.headers()["content-security-policy"];
  assert.equal(
    csp,
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  );
  await page.locator("#screen-signin").waitFor({ state: "visible" });
  assert.equal(await page.title(), "Sign in · Approvals · toolgate");
  await accessible(page, "sign-in");
  await screenshot(page, "signin");

  await page.fill("#token", "not-a-token");
  await page.click("#signin-form button[type=submit]");
  await page.locator("#signin-error", { hasText: "That is not an identity token." }).waitFor();

  await page.fill("#token", token("dana", "acme", ["support_admin"], -120));
  await page.click("#signin-form button[type=submit]");
  await page.locator("#signin-error", { hasText: "That token has expired." }).waitFor();
  assert.ok(await page.locator("#screen-signin").isVisible());
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  assert.deepEqual(await context.cookies(), []);
});

test("an executor's Authorize creates a PENDING approval, and it appears in an open console within 2 s without a reload", async (t) => {
  dana = await signedIn(DANA);
  erin = await signedIn(ERIN);
  olga = await signedIn(OLGA);
  for (const { page } of [dana, erin, olga]) {
    assert.equal(await page.locator("#queue-list a.card").count(), 0);
    await page.evaluate(() => {
      window.notReloaded = true;
    });
  }
  assert.equal(await text(dana.page, "#who-name"), "dana · acme");
  assert.equal(await dana.page.title(), "Approvals · toolgate");

  approved = await pendingRefund(25000, "console-refund-1");
  const id = approved.approval.approval_id;
  const started = Date.now();
  await card(dana.page, id).waitFor({ timeout: 2000 });
  const elapsed = Date.now() - started;
  assert.ok(elapsed < 2000, `appeared after ${elapsed} ms`);
  t.diagnostic(`the approval appeared in the open console ${elapsed} ms after Authorize answered`);
  await card(erin.page, id).waitFor({ timeout: 2000 });
  for (const { page } of [dana, erin]) {
    assert.equal(await page.evaluate(() => window.notReloaded), true);
    assert.equal(await page.title(), "(1) Approvals · toolgate");
  }
  assert.match(await card(dana.page, id).innerText(), /refund_order\s+financial[\s\S]*requested by bob via support-bot/i);
  await accessible(dana.page, "queue");
  await screenshot(dana.page, "queue");

  // Filters: by risk, tool and requester.
  await dana.page.selectOption("#filter-risk", "destructive");
  assert.equal(await card(dana.page, id).count(), 0);
  assert.equal(await text(dana.page, "#queue-empty"), "No pending approval matches these filters.");
  await dana.page.selectOption("#filter-risk", "financial");
  assert.equal(await card(dana.page, id).count(), 1);
  await dana.page.selectOption("#filter-tool", "refund_order");
  await dana.page.fill("#filter-requester", "zed");
  assert.equal(await card(dana.page, id).count(), 0);
  await dana.page.fill("#filter-requester", "bo");
  assert.equal(await card(dana.page, id).count(), 1);
  await dana.page.fill("#filter-requester", "");
  await dana.page.selectOption("#filter-tool", "");
  await dana.page.selectOption("#filter-risk", "");
});

test("the approval shows the exact call; the approver approves with the hash shown; the retry is allowed once; a second console sees it live", async () => {
  const id = approved.approval.approval_id;
  await card(dana.page, id).click();
  await dana.page.locator("#screen-approval").waitFor({ state: "visible" });
  assert.equal(await text(dana.page, "#approval-title"), "refund_order (version 1.2.0)");
  const fields = (await text(dana.page, "#approval-fields")).toLowerCase();
  for (const shown of ["financial", "bob", "support-bot", "console-refund-1", id]) assert.ok(fields.includes(shown), `${shown} in ${fields}`);
  assert.match(fields, /\d+:\d\d left|\d+ h \d+ min left/);
  assert.equal(await text(dana.page, "#approval-hash"), approved.arguments_sha256);
  const args = await text(dana.page, "#approval-args");
  assert.equal(
    args,
    '{\n  "amount_cents": 25000,\n  "currency": "USD",\n  "note": "[REDACTED]",\n  "order_id": "ord_1001",\n  "reason": "damaged"\n}',
  );
  assert.equal(await dana.page.locator("#approval-args mark.redacted").count(), 1);
  await accessible(dana.page, "approval");
  await screenshot(dana.page, "approval");

  // The executor waits: its retry before the decision is pending.
  assert.equal((await refund(25000, "console-refund-1", id)).error.code, "approval_pending");

  // erin has the same approval open.
  await card(erin.page, id).click();
  await erin.page.locator("#approval-state", { hasText: "Waiting for a decision." }).waitFor();

  const decision = dana.page.waitForResponse((r) => r.url().endsWith(`/approvals/${id}/decision`));
  await dana.page.fill("#reason", "confirmed with the customer");
  await dana.page.click("#approve");
  const sent = (await decision).request().postDataJSON();
  assert.deepEqual(sent, { verdict: "approve", arguments_sha256: approved.arguments_sha256, reason: "confirmed with the customer" });
  await dana.page.locator("#approval-outcome", { hasText: "Approved. The executor's retry of this exact call will be allowed once." }).waitFor();
  assert.ok(await dana.page.locator("#decide-form").isHidden());

  // erin sees it live: the decision, and the queue emptied.
  await erin.page.locator("#approval-state", { hasText: "Approved by dana" }).waitFor({ timeout: 2000 });
  assert.ok(await erin.page.locator("#decide-form").isHidden());
  assert.equal(await erin.page.title(), "Approvals · toolgate");

  const s = await stored(id);
  assert.equal(s.status, "APPROVAL_STATUS_APPROVED");
  assert.equal(s.decided_by, "dana");

  const allowed = await refund(25000, "console-refund-1", id);
  assert.equal(allowed.decision, "DECISION_ALLOW", JSON.stringify(allowed.error));
  // Another operation cannot ride on it: it was bound to this one.
  const other = await refund(25000, "console-refund-other", id);
  assert.equal(other.decision, "DECISION_DENY");
  assert.equal(other.error.code, "approval_mismatch");

  await dana.page.click("#nav-history");
  const entry = dana.page.locator(`#history-list li[data-approval-id="${id}"]`);
  await entry.waitFor();
  const shown = await entry.textContent();
  for (const part of ["refund_order", "Approved", "dana", "confirmed with the customer", "bob"]) assert.ok(shown.includes(part), `${part} in ${shown}`);
  await accessible(dana.page, "history");
  await screenshot(dana.page, "history");
});

test("reject needs a reason; with one, the executor's retry gets approval_rejected", async () => {
  await dana.page.click("#nav-queue");
  const r = await pendingRefund(30000, "console-refund-2");
  const id = r.approval.approval_id;
  await card(dana.page, id).waitFor({ timeout: 2000 });
  await card(dana.page, id).click();
  await dana.page.click("#reject");
  await dana.page.locator("#decide-error", { hasText: "Give a reason to reject" }).waitFor();
  assert.equal((await stored(id)).status, "APPROVAL_STATUS_PENDING");

  await dana.page.fill("#reason", "the customer was already refunded by the bank");
  await dana.page.click("#reject");
  await dana.page.locator("#approval-outcome", { hasText: "Rejected." }).waitFor();
  const s = await stored(id);
  assert.equal(s.status, "APPROVAL_STATUS_REJECTED");
  assert.equal(s.reason, "the customer was already refunded by the bank");

  const retry = await refund(30000, "console-refund-2", id);
  assert.equal(retry.decision, "DECISION_DENY");
  assert.equal(retry.error.code, "approval_rejected");
});

test("self-approval, an approver without the role and a second decision are refusals in words that change nothing", async () => {
  await dana.page.click("#nav-queue");
  const r = await pendingRefund(40000, "console-refund-3");
  const id = r.approval.approval_id;
  await card(dana.page, id).waitFor({ timeout: 2000 });

  // bob asked for it: he may see it, not approve it.
  const bob = await signedIn(BOB);
  await card(bob.page, id).click();
  await bob.page.click("#approve");
  await bob.page.locator("#approval-outcome", { hasText: "Refused: you may not decide this approval (nobody may approve their own request). Nothing was changed." }).waitFor();
  await accessible(bob.page, "refusal");
  await screenshot(bob.page, "refusal");

  // sam may view approvals, but his role may not decide them.
  const sam = await signedIn(SAM);
  await card(sam.page, id).click();
  await sam.page.click("#approve");
  await sam.page.locator("#approval-outcome", { hasText: "Refused: you may not decide this approval (this approver may not decide this approval). Nothing was changed." }).waitFor();

  let s = await stored(id);
  assert.equal(s.status, "APPROVAL_STATUS_PENDING");
  assert.equal(s.decided_by, "");

  // A console that has not heard of dana's decision yet (its live stream
  // held back by the test) decides second.
  const late = await newPage();
  await late.page.route("**/console/api/events", () => {}); // never answered
  await late.page.goto(URL_);
  await late.page.fill("#token", ERIN);
  await late.page.click("#signin-form button[type=submit]");
  await card(late.page, id).click();

  await card(dana.page, id).click();
  await dana.page.click("#approve");
  await dana.page.locator("#approval-outcome", { hasText: "Approved." }).waitFor();

  await late.page.click("#reject");
  await late.page.locator("#decide-error", { hasText: "Give a reason to reject" }).waitFor();
  await late.page.fill("#reason", "not this one");
  await late.page.click("#reject");
  await late.page.locator("#approval-outcome", {
    hasText: "Refused: this approval was already decided (approved) by someone else. Your decision was not recorded.",
  }).waitFor();
  s = await stored(id);
  assert.equal(s.status, "APPROVAL_STATUS_APPROVED");
  assert.equal(s.decided_by, "dana");
  assert.equal(s.reason, "");
  await late.page.unrouteAll({ behavior: "ignoreErrors" });
  await late.context.close();
});

test("an approver of another tenant never sees the approval", async () => {
  const r = await pendingRefund(50000, "console-refund-4");
  const id = r.approval.approval_id;
  await dana.page.click("#nav-queue");
  await erin.page.click("#nav-queue");
  await card(dana.page, id).waitFor({ timeout: 2000 });
  await card(erin.page, id).waitFor({ timeout: 2000 });
  // By now the event went out to every watcher: olga's had nothing of it.
  assert.equal(await olga.page.locator("#queue-list a.card").count(), 0);
  assert.equal(await olga.page.title(), "Approvals · toolgate");
  await olga.page.reload();
  await live(olga.page);
  assert.equal(await olga.page.locator("#queue-list a.card").count(), 0);
  await olga.page.click("#nav-history");
  assert.equal(await olga.page.locator("#history-list li").count(), 0);
  await olga.page.goto(`${URL_}#/approval/${id}`);
  await olga.page.locator("#approval-title", { hasText: "No such approval" }).waitFor();
});

test("a broken live stream reconnects and lists again", async () => {
  const record = await newPage();
  const { page } = record;
  // The first stream is held, then ends without a word: as a connection
  // that breaks while an approval is created.
  let release;
  const held = new Promise((resolve) => {
    release = resolve;
  });
  await page.route(
    "**/console/api/events",
    async (route) => {
      await held;
      await route.fulfill({ status: 200, contentType: "text/event-stream", body: "" });
    },
    { times: 1 },
  );
  const listed = page.waitForResponse((r) => r.url().endsWith("/api/approvals?view=pending"));
  await page.goto(URL_);
  await page.fill("#token", DANA);
  await page.click("#signin-form button[type=submit]");
  await listed;
  assert.ok(await page.locator("#live").isHidden());
  const r = await pendingRefund(45000, "console-refund-broken");
  const id = r.approval.approval_id;
  await page.waitForTimeout(500);
  assert.equal(await card(page, id).count(), 0, "not live yet, not listed yet");
  release();
  await card(page, id).waitFor({ timeout: 5000 });
  await live(page);
  assert.ok(await page.locator("#connection").isHidden());
});

test("usable by keyboard alone: sign in, open an approval, approve", async () => {
  const r = await pendingRefund(60000, "console-refund-5");
  const id = r.approval.approval_id;
  const { page } = await newPage();
  await page.goto(URL_);
  await page.locator("#screen-signin").waitFor({ state: "visible" });
  const focusOn = async (predicate, what, arg) => {
    for (let i = 0; i < 60; i += 1) {
      if (await page.evaluate(predicate, arg)) return;
      await page.keyboard.press("Tab");
    }
    assert.fail(`Tab never reached ${what}`);
  };
  await focusOn(() => document.activeElement.id === "token", "the token field");
  await page.keyboard.insertText(ERIN);
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement.textContent), "Sign in");
  await page.keyboard.press("Enter");
  await page.locator("#screen-queue").waitFor({ state: "visible" });
  await card(page, id).waitFor();
  await focusOn((approvalId) => document.activeElement.getAttribute("data-approval-id") === approvalId, "the approval", id);
  await page.keyboard.press("Enter");
  await page.locator("#screen-approval").waitFor({ state: "visible" });
  await focusOn(() => document.activeElement.id === "approve", "Approve");
  await page.keyboard.press("Enter");
  await page.locator("#approval-outcome", { hasText: "Approved." }).waitFor();
  assert.equal((await stored(id)).decided_by, "erin");
});

test("readable on a phone-width screen", async () => {
  const r = await pendingRefund(70000, "console-refund-6");
  const id = r.approval.approval_id;
  const phone = await signedIn(DANA, { width: 390, height: 844 }, { isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
  const { page } = phone;
  await card(page, id).waitFor();
  // Newest first: this one heads a queue of several.
  const ids = await page.locator("#queue-list a.card").evaluateAll((nodes) => nodes.map((n) => n.getAttribute("data-approval-id")));
  assert.ok(ids.length >= 2, `${ids.length} pending`);
  assert.equal(ids[0], id);
  await fitsWidth(page, "queue");
  await accessible(page, "phone queue");
  await screenshot(page, "phone-queue");
  await card(page, id).click();
  await page.locator("#screen-approval").waitFor({ state: "visible" });
  await fitsWidth(page, "approval");
  await accessible(page, "phone approval");
  await screenshot(page, "phone-approval");
  await page.click("#nav-history");
  await fitsWidth(page, "history");
});

test("an approval opened by a budget shows it: the call brings the agent's day past 500.00", async () => {
  // refunds_daily: 500.00 a day per agent. budget-bot's five refunds of
  // 100.00 need nobody; a sixth of 20.00 would make 520.00.
  for (let i = 1; i <= 5; i += 1) {
    const r = await refund(10000, `console-budget-${i}`, "", "budget-bot");
    assert.equal(r.decision, "DECISION_ALLOW", JSON.stringify(r.error));
  }
  const r = await refund(2000, "console-budget-6", "", "budget-bot");
  assert.equal(r.decision, "DECISION_APPROVAL_REQUIRED", JSON.stringify(r.error));
  const id = r.approval.approval_id;
  assert.deepEqual((await stored(id)).why, {
    reason: "the agent's refunds today would exceed 500.00",
    budgets: [{ name: "refunds_daily", used: "50000", this_call: "2000", limit: "50000", decimals: 2, window_seconds: "86400" }],
  });

  await dana.page.click("#nav-queue");
  await card(dana.page, id).click();
  await dana.page.locator("#screen-approval").waitFor({ state: "visible" });
  assert.equal(await text(dana.page, "#why-title"), "Why a human is asked");
  assert.equal(await text(dana.page, "#approval-reason"), "Policy: the agent's refunds today would exceed 500.00");
  assert.equal(
    await text(dana.page, '#approval-budgets li[data-budget="refunds_daily"]'),
    "This call brings the total of refunds_daily over the last 24 hours to 520.00 of 500.00 (500.00 before it, 20.00 this call).",
  );
  assert.equal(await dana.page.locator("#approval-budgets li").count(), 1);
  await accessible(dana.page, "approval over budget");
  await screenshot(dana.page, "approval-budget");

  // Approved, the call is allowed and charged: the next one sees 520.00 used.
  await dana.page.fill("#reason", "a goodwill refund, agreed with the team lead");
  await dana.page.click("#approve");
  await dana.page.locator("#approval-outcome", { hasText: "Approved." }).waitFor();
  const allowed = await refund(2000, "console-budget-6", id, "budget-bot");
  assert.equal(allowed.decision, "DECISION_ALLOW", JSON.stringify(allowed.error));
  const next = await refund(1000, "console-budget-7", "", "budget-bot");
  assert.equal(next.decision, "DECISION_APPROVAL_REQUIRED", JSON.stringify(next.error));
  assert.deepEqual((await stored(next.approval.approval_id)).why.budgets.map((b) => [b.used, b.this_call]), [["52000", "1000"]]);

  // A refund under the budget that waits for a human shows only the policy's reason.
  const large = await refund(15000, "console-budget-large", "", "other-bot");
  assert.equal(large.decision, "DECISION_APPROVAL_REQUIRED", JSON.stringify(large.error));
  assert.deepEqual((await stored(large.approval.approval_id)).why, { reason: "refunds over 100.00 need a human approval", budgets: [] });
  await dana.page.click("#nav-queue");
  await card(dana.page, large.approval.approval_id).click();
  await dana.page.locator("#approval-reason", { hasText: "Policy: refunds over 100.00 need a human approval" }).waitFor();
  assert.equal(await dana.page.locator("#approval-budgets li").count(), 0);
});

test("an expired token returns the approver to sign-in", async () => {
  const { page } = await signedIn(token("dana", "acme", ["support_admin"], 4));
  await page.locator("#signin-notice", { hasText: "Your sign-in has expired." }).waitFor({ timeout: 10000 });
  assert.ok(await page.locator("#screen-signin").isVisible());
  assert.ok(await page.locator("#nav").isHidden());
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
});

test("no token in a URL, a cookie or the page's log; no error in any browser console", async () => {
  for (const record of pages) {
    if (record.page.isClosed()) continue;
    const url = record.page.url();
    const cookies = await record.context.cookies();
    assert.deepEqual(cookies, [], url);
    assert.equal(await record.page.evaluate(() => document.cookie), "");
    for (const jwt of minted) {
      assert.ok(!url.includes(jwt), "a token in the URL");
      for (const line of record.console) assert.ok(!line.text.includes(jwt), `a token in the console log: ${line.text}`);
    }
  }
  for (const record of pages) {
    assert.deepEqual(record.errors, [], "uncaught errors in the page");
    assert.deepEqual(record.console.filter((m) => m.type === "error" || m.type === "warning"), [], "the browser console");
    assert.deepEqual(record.failed.filter((f) => !f.includes("/console/api/events")), [], "failed requests");
  }
});
