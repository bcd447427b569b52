// The approvals inbox and the run page's pending approvals (SPEC §11): follows
// /api/approvals (oldest first) and decides through POST /api/approvals/{id}/decision with the
// session's CSRF token. Every list on the page marked [data-approvals] is kept current: the
// live socket's approvals doorbell (on every request, decision or expiry, and on every
// (re)subscription) triggers a refetch; REST stays the record, so a reconnect catches up.
import { bindLiveState } from "./common.js";
import { pageLive } from "./live.js";

// Only a safety net for a doorbell lost with its socket (a test may set it longer).
const SAFETY_POLL_MS = Number(window.canopyApprovalsPollMs) || 30000;
const csrf = () => document.querySelector("[name=csrfmiddlewaretoken]")?.value ?? "";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function age(iso) {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds}s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m ago`;
  return `${Math.round(seconds / 3600)}h ago`;
}

// The input as a person reads it: a command as a command, an edit as a diff, else JSON.
function renderInput(input) {
  const pre = el("pre", { class: "output approval-input", "data-field": "input" });
  if (input && typeof input.command === "string") {
    pre.textContent = `$ ${input.command}`;
  } else if (input && typeof input.old_string === "string" && typeof input.new_string === "string") {
    pre.append(el("div", { class: "muted", text: input.file_path ?? "" }));
    for (const line of input.old_string.split("\n")) pre.append(el("div", { class: "diff-del", text: `- ${line}` }));
    for (const line of input.new_string.split("\n")) pre.append(el("div", { class: "diff-add", text: `+ ${line}` }));
  } else {
    pre.textContent = JSON.stringify(input, null, 2);
  }
  return pre;
}

// What the agent said the command does (Claude Code's Bash ``description``), else its title.
function describe(a) {
  const said = a.input && typeof a.input.description === "string" ? a.input.description : "";
  return said || (a.title && a.title !== a.toolName ? a.title : "");
}

function card(a, canAct) {
  // Names before ids (issue 38): the run's task heads the card, the tree by its name; the
  // ids are the small print.
  const head = el(
    "div",
    { class: "approval-head" },
    el("span", { class: "badge mono", "data-field": "toolName", text: a.toolName }),
    a.kind ? el("span", { class: "badge", text: a.kind }) : null,
    el("a", { class: "approval-task", "data-field": "task", href: `/runs/${encodeURIComponent(a.runId)}/`, title: a.runId, text: a.task || a.runId }),
  );
  const where = el(
    "p",
    { class: "muted small approval-where" },
    "in ",
    el("a", { "data-field": "rootTask", href: `/trees/${encodeURIComponent(a.rootRunId)}/`, title: a.rootRunId, text: a.rootTask || a.rootRunId }),
    ` · depth ${a.depth} · ${a.profile || "—"} on ${a.runner} · asked `,
    el("time", { "data-iso": a.requestedAt, "data-role": "age", text: age(a.requestedAt) }),
    " · ",
    el("span", { class: "mono", text: a.runId }),
  );
  const node = el("article", { class: "card approval", "data-approval-id": a.approvalId, tabindex: "0" }, head, where);
  const said = describe(a);
  if (said) node.append(el("p", { class: "approval-description", "data-field": "description", text: said }));
  node.append(renderInput(a.input));
  if (!canAct) {
    node.append(el("p", { class: "muted small", text: "Viewers see approvals; operators decide them." }));
    return node;
  }
  // An extension's question (kodelet's ui.input/select/confirm): the message is the answer,
  // and "allow always" would answer every later question with nothing.
  const question = a.kind === "question";
  const placeholder = question ? "Your answer (the text, or one of the options), then Allow" : "Why (shown to the agent on deny)";
  // A secret input (kodelet's ui.input with secret: true) is masked; Canopy stores "(secret)".
  const secret = question && a.input?.secret === true;
  const message = el("input", { type: secret ? "password" : "text", name: "message", placeholder, "aria-label": question ? "Answer" : "Message", maxlength: "10000" });
  if (secret) message.setAttribute("autocomplete", "off");
  // "Edit, then allow" only where the door runs the edit (an ACP agent takes an option id
  // only): the server refuses an edit there anyway, so the card does not offer one.
  const canEdit = a.canEdit !== false;
  const editor = canEdit ? el("textarea", { name: "updatedInput", rows: "4", hidden: "" }) : null;
  if (editor) editor.value = JSON.stringify(a.input, null, 2);
  const status = el("p", { class: "small", role: "status", "data-role": "outcome" });
  const button = (label, action, cls) => el("button", { class: `btn btn-sm ${cls}`, type: "button", "data-action": action, text: label });
  const actions = el(
    "div",
    { class: "actions" },
    button("Allow once", "allow", "btn-primary"),
    question ? null : button("Allow always (run)", "allow-always", ""),
    question ? null : button("Allow always (tree)", "allow-always-root", ""),
    canEdit ? button("Edit, then allow", "edit", "") : null,
    button("Deny", "deny", "btn-danger"),
  );
  const noEdit = canEdit
    ? null
    : el("p", {
        class: "muted small",
        "data-role": "no-edit",
        text: question
          ? "An extension's question: type the answer and allow (a confirm: allow is yes); deny leaves it unanswered."
          : "This agent's door (ACP) answers with an option only: allow or deny the input as asked; it cannot run an edit.",
      });
  node.append(...[editor, noEdit].filter(Boolean), el("div", { class: "approval-decide" }, message, actions), status);
  node.addEventListener("click", (event) => {
    const action = event.target?.dataset?.action;
    if (action) act(node, a, action);
  });
  return node;
}

async function act(node, a, action) {
  const editor = node.querySelector("[name=updatedInput]");
  const message = node.querySelector("[name=message]").value.trim();
  const body = { decision: action === "deny" ? "deny" : "allow" };
  if (action === "edit" && editor) {
    if (editor.hidden) {
      editor.hidden = false;
      editor.focus();
      node.querySelector("[data-action=edit]").textContent = "Allow as edited";
      return;
    }
    try {
      body.updatedInput = JSON.parse(editor.value);
    } catch (error) {
      node.querySelector("[data-role=outcome]").textContent = `The edited input is not JSON: ${error.message}`;
      return;
    }
  }
  if (action === "allow-always" || action === "allow-always-root") body.scope = "always";
  if (action === "allow-always-root") body.scopeRun = "root";
  if (message) body.message = message;
  for (const b of node.querySelectorAll("button")) b.disabled = true;
  // A disabled button loses focus: without this mark the next poll (which no longer lists the
  // approval) removed the card before its outcome could show.
  node.dataset.deciding = "1";
  const response = await fetch(`/api/approvals/${encodeURIComponent(a.approvalId)}/decision`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf() },
    body: JSON.stringify(body),
  });
  const answer = await response.json();
  const outcome = node.querySelector("[data-role=outcome]");
  if (response.ok) {
    outcome.textContent = `${answer.decision} by ${answer.decidedBy}`;
    node.dataset.decided = answer.decision;
    // What was allowed is what the card shows: the edited input, not the one asked for.
    if (answer.updatedInput !== null && answer.updatedInput !== undefined) {
      const shown = renderInput(answer.updatedInput);
      shown.dataset.edited = "1";
      node.querySelector("[data-field=input]").replaceWith(shown);
      if (editor) editor.hidden = true;
    }
    leaveSoon(node);
  } else {
    outcome.textContent = `Refused: ${answer.error?.message ?? response.status}`;
    for (const b of node.querySelectorAll("button")) b.disabled = false;
    delete node.dataset.deciding;
  }
  refreshAll();
}

async function refresh(list) {
  const canAct = list.dataset.canAct === "1";
  let page;
  try {
    const response = await fetch(`${list.dataset.endpoint}?${list.dataset.query}`, { credentials: "same-origin" });
    if (!response.ok) return;
    page = await response.json();
  } catch {
    return;
  }
  const seen = new Set(page.items.map((a) => a.approvalId));
  for (const node of list.querySelectorAll("[data-approval-id]")) {
    // A card decided here leaves after its outcome showed (leaveSoon); one decided
    // elsewhere goes now, unless its editor is open with the operator's typing (issue 38:
    // a merely focused card used to linger).
    if (seen.has(node.dataset.approvalId) || node.dataset.deciding || node.dataset.decided) continue;
    const editing = node.querySelector("[name=updatedInput]:not([hidden])");
    if (!editing) node.remove();
  }
  for (const a of page.items) {
    const existing = list.querySelector(`[data-approval-id="${CSS.escape(a.approvalId)}"]`);
    // The server's first rendering has no buttons: replaced by a live card once.
    if (existing && existing.dataset.live) continue;
    const fresh = card(a, canAct);
    fresh.dataset.live = "1";
    if (existing) existing.replaceWith(fresh);
    else list.append(fresh);
  }
  const empty = list.querySelector("[data-role=empty]");
  const any = list.querySelector("[data-approval-id]");
  if (empty) empty.hidden = Boolean(any);
  else if (!any) list.append(el("p", { class: "muted empty", "data-role": "empty", text: "Nothing waiting for a decision." }));
  if (list.dataset.query === "status=pending") {
    const count = document.querySelector("[data-role=approvals-count]");
    if (count) count.textContent = String(page.items.length);
    showCount(page.items.length);
    notifyNew(page.items);
  }
}

// --- The tab title's count and opt-in desktop notifications (issue 38) ------------------------
const baseTitle = document.title.replace(/^\(\d+\) /, "");
function showCount(pending) {
  document.title = pending ? `(${pending}) ${baseTitle}` : baseTitle;
}

// Opt-in per user (this browser remembers it), only while a page with the inbox is open.
const who = document.querySelector(".who .mono")?.textContent?.trim() || "";
const OPT_IN = `canopy.notify.${who}`;
const notified = new Set();
let primed = false;
function notifyNew(items) {
  const wanted = localStorage.getItem(OPT_IN) === "1" && "Notification" in window && Notification.permission === "granted";
  for (const a of items) {
    if (notified.has(a.approvalId)) continue;
    notified.add(a.approvalId);
    // What was pending when the page opened is on screen already: only newcomers ring.
    if (!primed || !wanted) continue;
    const said = describe(a);
    const what = a.input && typeof a.input.command === "string" ? `$ ${a.input.command}` : a.toolName;
    const note = new Notification(`Approval: ${a.toolName} in ${a.task || a.runId}`, { body: said ? `${said}\n${what}` : what, tag: a.approvalId });
    note.onclick = () => { window.focus(); location.href = "/approvals/"; };
  }
  primed = true;
}

const notifyButton = document.querySelector("[data-action=notify]");
function showOptIn() {
  if (!notifyButton) return;
  const on = localStorage.getItem(OPT_IN) === "1" && "Notification" in window && Notification.permission === "granted";
  notifyButton.textContent = on ? "Notifications on" : "Notify me of new approvals";
  notifyButton.dataset.on = on ? "1" : "0";
  notifyButton.hidden = !("Notification" in window);
}
notifyButton?.addEventListener("click", async () => {
  if (localStorage.getItem(OPT_IN) === "1" && Notification.permission === "granted") {
    localStorage.removeItem(OPT_IN);
  } else if ((await Notification.requestPermission()) === "granted") {
    localStorage.setItem(OPT_IN, "1");
  }
  showOptIn();
});
showOptIn();

// A card decided here shows its outcome for a moment, then leaves the list.
const DECIDED_LINGER_MS = Number(window.canopyDecidedLingerMs) || 4000;
function leaveSoon(node) {
  setTimeout(() => {
    const list = node.closest("[data-approvals]");
    node.remove();
    if (list && !list.querySelector("[data-approval-id]")) refreshAll();
  }, DECIDED_LINGER_MS);
}

// The cards' ages tick, since a card may wait for minutes.
function tickAges() {
  for (const node of document.querySelectorAll("[data-approvals] time[data-iso]")) node.textContent = age(node.dataset.iso);
}

// Coalesced: at most one refetch in flight and one more queued, however many doorbells ring.
let inFlight = null;
let queued = false;

function refreshAll() {
  if (inFlight) {
    queued = true;
    return;
  }
  const lists = [...document.querySelectorAll("[data-approvals]")];
  inFlight = Promise.all(lists.map(refresh)).finally(() => {
    inFlight = null;
    if (queued) {
      queued = false;
      refreshAll();
    }
  });
}

// Keyboard: the focused (or first) approval card.
document.addEventListener("keydown", (event) => {
  if (event.target.closest?.("input, textarea")) return;
  const cards = [...document.querySelectorAll("[data-approvals] [data-approval-id]:not([data-decided])")];
  if (!cards.length) return;
  const current = cards.find((c) => c.contains(document.activeElement)) ?? cards[0];
  const index = cards.indexOf(current);
  const press = (action) => current.querySelector(`[data-action=${action}]`)?.click();
  const keys = {
    a: () => press("allow"),
    A: () => press("allow-always"),
    d: () => press("deny"),
    e: () => press("edit"),
    j: () => cards[Math.min(index + 1, cards.length - 1)].focus(),
    k: () => cards[Math.max(index - 1, 0)].focus(),
  };
  if (keys[event.key]) {
    event.preventDefault();
    keys[event.key]();
  }
});

// The run page's policy editor: PUT /api/runs/{runId}/approval-policy (audited).
const policyForm = document.getElementById("policy-form");
if (policyForm) {
  policyForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const outcome = policyForm.querySelector("[data-role=policy-outcome]");
    let body;
    const text = policyForm.querySelector("[name=policy]").value.trim();
    // Issue 38: an empty box is a mistake, not a policy to save ("Policy saved." lied).
    if (!text || text === "{}") {
      outcome.textContent = 'The policy is empty: write one, e.g. {"rules": [], "default": "ask"}.';
      outcome.dataset.ok = "0";
      return;
    }
    try {
      body = JSON.parse(text);
    } catch (error) {
      outcome.textContent = `Not JSON: ${error.message}`;
      outcome.dataset.ok = "0";
      return;
    }
    const response = await fetch(policyForm.dataset.endpoint, {
      method: "PUT",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf() },
      body: JSON.stringify(body),
    });
    const answer = await response.json();
    outcome.textContent = response.ok ? "Policy saved." : `Refused: ${answer.error?.message ?? response.status}`;
    outcome.dataset.ok = response.ok ? "1" : "0";
    refreshAll();
  });
}

if (document.querySelector("[data-approvals]")) {
  // At once: the server's rendering has no buttons, and the socket may be slow to open.
  refreshAll();
  const live = pageLive();
  live.subscribeApprovals({
    onApprovals(pending) {
      const count = document.querySelector("[data-role=approvals-count]");
      if (count) count.textContent = String(pending);
      showCount(pending);
      refreshAll();
    },
  });
  bindLiveState(live);
  live.start();
  setInterval(refreshAll, SAFETY_POLL_MS);
  tickAges();
  setInterval(tickAges, 1000);
}
