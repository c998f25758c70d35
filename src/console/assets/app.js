// The toolgate approval console: one ES module, no dependencies.
//
// The approver's token comes from the authenticating proxy (the page never
// sees it) or from the sign-in form, kept in this tab's sessionStorage and
// sent only as `Authorization: Bearer` to the console's own API. It is never
// put in a URL, a cookie or the console log. Every text the server sends is
// set as textContent: nothing is parsed as HTML.

const TOKEN_KEY = "toolgate.console.token";
const TITLE = "Approvals · toolgate";

const state = {
  token: null, // the pasted token, when not behind a proxy
  session: null,
  pending: new Map(), // approval_id -> approval
  history: new Map(),
  historyComplete: true,
  current: null, // the approval shown on the approval screen
  stream: null, // AbortController of the live stream
  expiryTimer: null,
  retry: 0,
};

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function headers(extra = {}) {
  const h = { Accept: "application/json", ...extra };
  if (state.token) h.Authorization = `Bearer ${state.token}`;
  return h;
}

async function api(path, options = {}) {
  const response = await fetch(`api/${path}`, {
    ...options,
    headers: headers(options.headers),
    credentials: "same-origin",
    cache: "no-store",
  });
  if (!response.ok) throw new Error(`the console API answered ${response.status}`);
  return response.json();
}

function announce(text) {
  $("announce").textContent = text;
}

// ---- screens and routing -------------------------------------------------

function show(screen) {
  for (const s of document.querySelectorAll(".screen")) s.hidden = s.id !== `screen-${screen}`;
  for (const [id, name] of [["nav-queue", "queue"], ["nav-history", "history"]]) {
    if (name === screen) $(id).setAttribute("aria-current", "page");
    else $(id).removeAttribute("aria-current");
  }
}

function route() {
  if (!state.session) return;
  const hash = location.hash || "#/queue";
  const match = /^#\/approval\/(.+)$/.exec(hash);
  if (match) {
    openApproval(decodeURIComponent(match[1]));
  } else if (hash === "#/history") {
    state.current = null;
    renderHistory();
    show("history");
  } else {
    state.current = null;
    renderQueue();
    show("queue");
  }
}

// ---- sign-in ---------------------------------------------------------------

const SIGN_IN_WORDS = {
  expired: "That token has expired. Get a fresh one and sign in again.",
  not_yet_valid: "That token is not valid yet.",
  bad_signature: "That token's signature does not verify against toolgate's key set.",
  unknown_key: "That token was signed by a key toolgate does not know.",
  wrong_issuer: "That token was issued by an identity provider toolgate does not trust.",
  wrong_audience: "That token is not meant for toolgate (wrong audience).",
  malformed: "That is not an identity token.",
  missing_claim: "That token lacks a claim toolgate needs (subject or tenant).",
};

function signInWords(error) {
  const reason = error && error.details && error.details.reason;
  return SIGN_IN_WORDS[reason] || `That token is not accepted (${reason || error.code}).`;
}

function showSignIn(notice) {
  stopStream();
  clearTimeout(state.expiryTimer);
  state.session = null;
  state.pending.clear();
  state.history.clear();
  state.current = null;
  $("nav").hidden = true;
  $("who").hidden = true;
  $("connection").hidden = true;
  document.title = `Sign in · ${TITLE}`;
  $("signin-notice").hidden = !notice;
  $("signin-notice").textContent = notice || "";
  $("signin-error").hidden = true;
  show("signin");
}

function forgetToken() {
  state.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
}

/** The token expired, or was refused mid-session: back to sign-in. */
function expired() {
  forgetToken();
  showSignIn("Your sign-in has expired. Sign in again to go on deciding approvals.");
  $("token").focus();
}

async function signIn(event) {
  event.preventDefault();
  const field = $("token");
  const token = field.value.trim();
  const error = $("signin-error");
  if (!token) {
    error.textContent = "Paste an identity token first.";
    error.hidden = false;
    field.focus();
    return;
  }
  state.token = token;
  let answer;
  try {
    answer = await api("session");
  } catch (e) {
    state.token = null;
    error.textContent = "toolgate could not be reached. Try again.";
    error.hidden = false;
    return;
  }
  if (!answer.signed_in) {
    state.token = null;
    error.textContent = signInWords(answer.error);
    error.hidden = false;
    field.focus();
    return;
  }
  field.value = "";
  sessionStorage.setItem(TOKEN_KEY, token);
  start(answer);
}

function signOut() {
  forgetToken();
  showSignIn(state.session && state.session.from_proxy ? "Signed out of this page; your sign-in proxy still holds your session." : "Signed out.");
}

function start(session) {
  state.session = session;
  state.retry = 0;
  $("nav").hidden = false;
  $("who").hidden = false;
  $("who-name").textContent = `${session.subject} · ${session.tenant}`;
  $("signin-notice").hidden = true;
  clearTimeout(state.expiryTimer);
  // A token is good until its exp: then back to sign-in, live stream or not.
  state.expiryTimer = setTimeout(expired, Math.min(session.expires_in_ms, 2 ** 31 - 1));
  if (!location.hash) history.replaceState(null, "", "#/queue");
  route();
  relist();
  watch();
  $("main").focus();
}

// ---- the queue and the history --------------------------------------------

async function relist() {
  let pending;
  let past;
  try {
    [pending, past] = await Promise.all([api("approvals?view=pending"), api("approvals?view=history")]);
  } catch (e) {
    setConnection("toolgate could not be reached; retrying.");
    return;
  }
  for (const answer of [pending, past]) {
    if (answer.error) {
      if (answer.error.code === "unauthorized") expired();
      else setConnection(`The approvals could not be listed: ${answer.error.message}.`);
      return;
    }
  }
  state.pending = new Map(pending.approvals.map((a) => [a.approval_id, a]));
  state.history = new Map(past.approvals.map((a) => [a.approval_id, a]));
  state.historyComplete = past.complete;
  refresh();
}

function refresh() {
  const n = state.pending.size;
  document.title = n > 0 ? `(${n}) ${TITLE}` : TITLE;
  $("queue-count").textContent = n > 0 ? `(${n})` : "";
  renderQueue();
  renderHistory();
  if (state.current) renderApproval();
}

function newestFirst(a, b) {
  return b.created_at - a.created_at;
}

function riskBadge(risk) {
  return el("span", { class: `risk risk-${risk}`, text: risk });
}

function timeLeft(expiresAt) {
  const s = Math.floor((expiresAt - Date.now()) / 1000);
  if (s <= 0) return "expired";
  const m = Math.floor(s / 60);
  if (m >= 60) return `${Math.floor(m / 60)} h ${m % 60} min left`;
  return `${m}:${String(s % 60).padStart(2, "0")} left`;
}

/** A text that says how long is left before `expiresAt`, kept current by `tick`. */
function countdown(cls, expiresAt, prefix, suffix) {
  return el("span", { class: cls, "data-expires-at": String(expiresAt), "data-prefix": prefix, "data-suffix": suffix, text: `${prefix}${timeLeft(expiresAt)}${suffix}` });
}

function when(ms) {
  return new Date(ms).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

function renderFilters() {
  const select = $("filter-tool");
  const chosen = select.value;
  const tools = [...new Set([...state.pending.values()].map((a) => a.tool))].sort();
  select.replaceChildren(el("option", { value: "", text: "All tools" }), ...tools.map((t) => el("option", { value: t, text: t })));
  select.value = tools.includes(chosen) ? chosen : "";
}

function renderQueue() {
  renderFilters();
  const tool = $("filter-tool").value;
  const risk = $("filter-risk").value;
  const requester = $("filter-requester").value.trim().toLowerCase();
  const shown = [...state.pending.values()]
    .filter((a) => (!tool || a.tool === tool) && (!risk || a.risk === risk) && (!requester || a.requester.toLowerCase().includes(requester)))
    .sort(newestFirst);
  const list = $("queue-list");
  list.replaceChildren(
    ...shown.map((a) =>
      el(
        "li",
        {},
        el(
          "a",
          { href: `#/approval/${encodeURIComponent(a.approval_id)}`, class: "card", "data-approval-id": a.approval_id },
          el("span", { class: "card-title" }, el("span", { class: "tool", text: a.tool }), " ", riskBadge(a.risk)),
          el("span", { class: "card-line", text: `requested by ${a.requester} via ${a.agent || "an unnamed agent"}` }),
          countdown("card-line muted", a.expires_at, `received ${when(a.created_at)} · `, ""),
        ),
      ),
    ),
  );
  const filtered = shown.length < state.pending.size;
  $("queue-empty").hidden = shown.length > 0;
  $("queue-empty").textContent = filtered ? "No pending approval matches these filters." : "No pending approvals.";
}

const VERDICT = { APPROVED: "Approved", REJECTED: "Rejected", EXPIRED: "Expired", PENDING: "Pending" };

function renderHistory() {
  const items = [...state.history.values()].sort((a, b) => (b.decided_at || b.expires_at) - (a.decided_at || a.expires_at));
  $("history-list").replaceChildren(
    ...items.map((a) => {
      const fields = el("dl", { class: "fields compact" });
      const add = (k, v) => fields.append(el("dt", { text: k }), el("dd", { text: v }));
      if (a.status === "EXPIRED") {
        add("Expired", when(a.expires_at));
      } else {
        add("By", a.decided_by || "—");
        add("When", a.decided_at ? when(a.decided_at) : "—");
        add("Reason", a.reason || "—");
      }
      add("Requested by", a.requester);
      if (a.consumed) add("Used", "the executor's call ran with it");
      return el(
        "li",
        { class: "card static", "data-approval-id": a.approval_id },
        el("span", { class: "card-title" }, el("span", { class: "tool", text: a.tool }), " ", riskBadge(a.risk), " ", el("span", { class: `verdict verdict-${a.status.toLowerCase()}`, text: VERDICT[a.status] || a.status })),
        fields,
      );
    }),
  );
  $("history-empty").hidden = items.length > 0;
  $("history-partial").hidden = state.historyComplete;
}

// ---- one approval -----------------------------------------------------------

async function openApproval(id) {
  const known = state.pending.get(id) || state.history.get(id);
  state.current = known || null;
  resetDecision();
  if (known) {
    renderApproval();
    show("approval");
    $("approval-title").focus();
    return;
  }
  show("approval");
  $("approval-title").textContent = "Loading…";
  $("approval-fields").replaceChildren();
  $("approval-args").replaceChildren();
  $("approval-hash").textContent = "";
  $("decide-form").hidden = true;
  let answer;
  try {
    answer = await api(`approvals/${encodeURIComponent(id)}`);
  } catch (e) {
    $("approval-title").textContent = "toolgate could not be reached";
    return;
  }
  if (answer.error) {
    if (answer.error.code === "unauthorized") return expired();
    $("approval-title").textContent = answer.error.code === "approval_not_found" ? "No such approval" : "This approval cannot be shown";
    $("approval-state").textContent = answer.error.code === "approval_not_found" ? "There is no approval with this id in your tenant." : `You may not view it: ${answer.error.message}.`;
    return;
  }
  state.current = answer.approval;
  renderApproval();
}

function resetDecision() {
  $("reason").value = "";
  $("decide-error").hidden = true;
  $("approval-outcome").hidden = true;
  $("approval-outcome").className = "outcome";
}

/** The display arguments, pretty-printed, each redacted value marked. */
function renderJson(value, marker, indent = "") {
  const inner = `${indent}  `;
  if (Array.isArray(value)) {
    if (value.length === 0) return ["[]"];
    const out = ["[\n"];
    value.forEach((v, i) => out.push(inner, ...renderJson(v, marker, inner), i + 1 < value.length ? ",\n" : "\n"));
    out.push(`${indent}]`);
    return out;
  }
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value);
    if (keys.length === 0) return ["{}"];
    const out = ["{\n"];
    keys.forEach((k, i) => {
      out.push(inner, el("span", { class: "key", text: JSON.stringify(k) }), ": ", ...renderJson(value[k], marker, inner), i + 1 < keys.length ? ",\n" : "\n");
    });
    out.push(`${indent}}`);
    return out;
  }
  if (value === marker) {
    return [el("mark", { class: "redacted", title: "redacted by the tool's contract", text: JSON.stringify(value) })];
  }
  return [el("span", { class: typeof value === "string" ? "string" : "literal", text: JSON.stringify(value) })];
}

/** A budget's window in words: 86400 is "24 hours". */
function windowWords(seconds) {
  const units = [[86400 * 7, "week"], [86400, "day"], [3600, "hour"], [60, "minute"], [1, "second"]];
  if (seconds === 86400) return "24 hours";
  for (const [size, name] of units) {
    if (seconds >= size && seconds % size === 0) {
      const n = seconds / size;
      return n === 1 ? `1 ${name}` : `${n} ${name}s`;
    }
  }
  return `${seconds} seconds`;
}

/** Why the call needs a human: the policy's reason, the budgets it would exceed. */
function renderWhy(a) {
  const why = a.why || { reason: null, budgets: [] };
  $("approval-reason").textContent = why.reason ? `Policy: ${why.reason}` : "";
  $("approval-reason").hidden = !why.reason;
  $("approval-budgets").replaceChildren(
    ...why.budgets.map((b) =>
      el(
        "li",
        { "data-budget": b.name },
        `This call brings the total of `,
        el("code", { text: b.name }),
        ` over the last ${windowWords(b.window_seconds)} to `,
        el("strong", { text: `${b.total} of ${b.limit}` }),
        ` (${b.used} before it, ${b.this_call} this call).`,
      ),
    ),
  );
  $("approval-why").hidden = !why.reason && why.budgets.length === 0;
}

function renderApproval() {
  const a = state.current;
  if (!a) return;
  $("approval-title").textContent = `${a.tool} (version ${a.tool_version})`;
  $("approval-title").setAttribute("tabindex", "-1");
  const fields = $("approval-fields");
  fields.replaceChildren();
  const add = (k, v) => fields.append(el("dt", { text: k }), el("dd", {}, v));
  add("Risk", riskBadge(a.risk));
  add("Requester", a.requester);
  add("Agent", a.agent || "—");
  add("Request id", el("code", { text: a.request_id }));
  add("Approval id", el("code", { text: a.approval_id }));
  add("Received", when(a.created_at));
  add("Expires", countdown("", a.expires_at, `${when(a.expires_at)} (`, ")"));
  renderWhy(a);
  $("approval-args").replaceChildren(...renderJson(a.display_arguments, a.redacted_marker));
  $("approval-hash").textContent = a.arguments_sha256;
  const open = a.status === "PENDING" && a.expires_at > Date.now();
  $("decide-form").hidden = !open;
  const stateText = {
    PENDING: open ? "Waiting for a decision." : "This approval has expired.",
    APPROVED: `Approved by ${a.decided_by}${a.decided_at ? ` on ${when(a.decided_at)}` : ""}.`,
    REJECTED: `Rejected by ${a.decided_by}${a.decided_at ? ` on ${when(a.decided_at)}` : ""}: ${a.reason || "no reason given"}.`,
    EXPIRED: "This approval expired before anyone decided it.",
  }[a.status];
  $("approval-state").textContent = stateText + (a.consumed ? " The executor's call has run with it." : "");
}

/** A refusal, in words: the server's reason is the policy's own. */
function refusalWords(error) {
  switch (error.code) {
    case "forbidden":
      return `Refused: you may not decide this approval (${error.message}). Nothing was changed.`;
    case "approval_already_decided": {
      const status = error.details && error.details.status;
      return `Refused: this approval was already decided${status ? ` (${status.toLowerCase()})` : ""} by someone else. Your decision was not recorded.`;
    }
    case "approval_expired":
      return "Refused: this approval has expired. Your decision was not recorded.";
    case "approval_mismatch":
      return "Refused: the arguments are not the ones you were shown. Your decision was not recorded; open the approval again.";
    case "approval_not_found":
      return "Refused: there is no such approval in your tenant.";
    case "policy_error":
      return "Refused: a policy could not be evaluated, so toolgate refused to be safe. Nothing was changed.";
    case "invalid_arguments":
      return `Refused: ${error.message}.`;
    default:
      return `The decision failed (${error.code}): ${error.message}. Nothing was changed.`;
  }
}

async function decide(approve) {
  const a = state.current;
  if (!a) return;
  const reason = $("reason").value.trim();
  const error = $("decide-error");
  error.hidden = true;
  if (!approve && !reason) {
    error.textContent = "Give a reason to reject: the requester and the agent read it.";
    error.hidden = false;
    $("reason").focus();
    return;
  }
  const outcome = $("approval-outcome");
  for (const b of [$("approve"), $("reject")]) b.disabled = true;
  let answer;
  try {
    answer = await api(`approvals/${encodeURIComponent(a.approval_id)}/decision`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      // The hash this approver was shown: the decision is bound to it.
      body: JSON.stringify({ verdict: approve ? "approve" : "reject", arguments_sha256: a.arguments_sha256, reason }),
    });
  } catch (e) {
    answer = { error: { code: "unavailable", message: "toolgate could not be reached" } };
  } finally {
    for (const b of [$("approve"), $("reject")]) b.disabled = false;
  }
  outcome.hidden = false;
  if (answer.error) {
    if (answer.error.code === "unauthorized") return expired();
    outcome.className = "outcome refused";
    outcome.textContent = refusalWords(answer.error);
    return;
  }
  const decided = answer.approval;
  state.pending.delete(decided.approval_id);
  state.history.set(decided.approval_id, decided);
  state.current = decided;
  refresh();
  outcome.className = "outcome done";
  outcome.textContent = decided.status === "APPROVED" ? "Approved. The executor's retry of this exact call will be allowed once." : "Rejected. The executor's retry will be refused with your reason.";
  announce(outcome.textContent);
}

// ---- the live stream --------------------------------------------------------

function setConnection(text) {
  $("connection").hidden = !text;
  $("connection").textContent = text || "";
}

/** Whether the live queue is connected, shown in the header. */
function setLive(on) {
  $("live").hidden = !on;
}

function stopStream() {
  if (state.stream) state.stream.abort();
  state.stream = null;
  setLive(false);
}

function apply(event) {
  const a = event.approval;
  if (event.kind === "created") {
    if (a.status === "PENDING") {
      const fresh = !state.pending.has(a.approval_id);
      state.pending.set(a.approval_id, a);
      if (fresh) announce(`New approval: ${a.tool}, requested by ${a.requester}.`);
    }
  } else {
    state.pending.delete(a.approval_id);
    state.history.set(a.approval_id, a);
    if (state.current && state.current.approval_id === a.approval_id) {
      state.current = a;
      if (event.kind !== "consumed") announce(`This approval was ${a.status.toLowerCase()}${a.decided_by ? ` by ${a.decided_by}` : ""}.`);
    }
  }
  refresh();
}

async function watch() {
  stopStream();
  const controller = new AbortController();
  state.stream = controller;
  let ended = null;
  try {
    const response = await fetch("api/events", { headers: headers({ Accept: "text/event-stream" }), signal: controller.signal, cache: "no-store" });
    if (!response.ok || !response.body) throw new Error(`the live stream answered ${response.status}`);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let name = "message";
        let data = "";
        for (const line of frame.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (name === "ready") {
          state.retry = 0;
          setConnection(null);
          setLive(true);
          // Subscribed first, listed second: nothing falls in between.
          relist();
        } else if (name === "approval") {
          apply(JSON.parse(data));
        } else if (name === "end") {
          ended = JSON.parse(data);
        }
      }
    }
  } catch (e) {
    if (controller.signal.aborted) return;
  }
  if (state.stream !== controller || controller.signal.aborted) return;
  setLive(false);
  if (ended && ended.code === "unauthorized") return expired();
  // A broken stream reconnects, and the reconnection lists again.
  state.retry = Math.min(state.retry + 1, 5);
  setConnection("The live queue was interrupted; reconnecting…");
  setTimeout(() => {
    if (state.stream === controller) watch();
  }, 500 * 2 ** (state.retry - 1));
}

// ---- clock, boot ------------------------------------------------------------

function tick() {
  for (const node of document.querySelectorAll("[data-expires-at]")) {
    const at = Number(node.getAttribute("data-expires-at"));
    node.textContent = `${node.getAttribute("data-prefix")}${timeLeft(at)}${node.getAttribute("data-suffix")}`;
  }
  const a = state.current;
  if (a && a.status === "PENDING" && a.expires_at <= Date.now() && !$("decide-form").hidden) renderApproval();
}

async function boot() {
  $("signin-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("approve").addEventListener("click", () => decide(true));
  $("reject").addEventListener("click", () => decide(false));
  $("decide-form").addEventListener("submit", (e) => e.preventDefault());
  for (const id of ["filter-tool", "filter-risk", "filter-requester"]) $(id).addEventListener("input", renderQueue);
  window.addEventListener("hashchange", route);
  setInterval(tick, 1000);
  state.token = sessionStorage.getItem(TOKEN_KEY);
  let answer;
  try {
    answer = await api("session");
  } catch (e) {
    showSignIn("toolgate could not be reached. Reload to try again.");
    return;
  }
  if (answer.signed_in) return start(answer);
  const hadToken = state.token !== null;
  forgetToken();
  showSignIn(hadToken ? "Your sign-in has expired. Sign in again to go on deciding approvals." : null);
}

boot();
