// The tree page's split pane (_tree_detail.html): the selected run's detail beside the tree,
// its row actions (cancel, steer, pause and resume of its subtree), and the selection named in the URL (?run=<runId>), so a
// link or a reload opens the same run. Keyboard: the tree's own j/k/arrows move the
// selection; this pane follows.
import { isTerminal } from "./statuses.js";

const pane = document.getElementById("run-detail");
const REFRESH_MS = 2000;
let current = null;
let timer = null;

function money(value) {
  return `$${Number(value || 0).toFixed(4)}`;
}

function csrf() {
  return pane.querySelector("input[name=csrfmiddlewaretoken]")?.value || "";
}

function show(detail) {
  const q = (role) => pane.querySelector(`[data-role=${role}]`);
  q("empty").hidden = true;
  q("body").hidden = false;
  q("task").textContent = detail.task || detail.runId;
  q("task").title = detail.task || detail.runId;
  q("run-id").textContent = detail.runId;
  q("copy").dataset.copy = detail.runId;
  q("profile").textContent = detail.profile || "—";
  q("runner").textContent = detail.runnerId;
  q("depth").textContent = String(detail.depth);
  q("events").textContent = String(detail.lastSequence);
  q("cost").textContent = `${money(detail.usage.own.costUsd)} own · ${money(detail.usage.subtree.costUsd)} subtree`;
  q("tokens").textContent = `${detail.usage.own.inputTokens + detail.usage.own.outputTokens} own`;
  const kids = detail.childCounts || {};
  q("children").textContent = Object.entries(kids).filter(([, n]) => n).map(([s, n]) => `${n} ${s}`).join(", ") || "none";
  const outcome = q("outcome");
  outcome.hidden = !(detail.error || detail.output);
  outcome.textContent = detail.error || detail.output || "";
  const open = q("open");
  open.hidden = false;
  open.href = `/runs/${encodeURIComponent(detail.runId)}/`;
  showStatus(detail.status);
  pane.dataset.runId = detail.runId;
}

// Issue 38: a finished run offers no actions (they were only greyed out, and shown until the
// next read). A live one offers those its status allows: Steer and Pause while running,
// Resume while paused (data-when), Cancel either way.
function showStatus(status) {
  const chip = pane.querySelector("[data-role=status]");
  chip.className = `chip chip-${status}`;
  chip.textContent = status;
  const actions = pane.querySelector("[data-role=actions]");
  if (actions) {
    const terminal = isTerminal(status);
    actions.hidden = terminal;
    for (const control of actions.querySelectorAll("button, textarea")) control.disabled = terminal;
    for (const part of actions.querySelectorAll("[data-when]")) {
      part.hidden = part.dataset.when !== status;
      for (const control of [part, ...part.querySelectorAll("button, textarea")]) {
        if ("disabled" in control) control.disabled = terminal || part.hidden;
      }
    }
  }
  pane.dataset.status = status;
}

async function load(runId) {
  clearTimeout(timer);
  if (!runId) return;
  try {
    const answer = await fetch(`/api/runs/${encodeURIComponent(runId)}`, { credentials: "same-origin" });
    if (answer.ok && runId === current) {
      const detail = await answer.json();
      // The tree's live row may be newer than this read (a finish that committed meanwhile).
      const row = window.canopyTree?.rows?.get(runId);
      if (row && isTerminal(row.status)) detail.status = row.status;
      show(detail);
    }
  } catch {
    // Retried on the next tick.
  }
  if (runId === current) timer = setTimeout(() => load(runId), REFRESH_MS);
}

function select(runId) {
  if (!runId || runId === current) return;
  current = runId;
  const url = new URL(location.href);
  url.searchParams.set("run", runId);
  url.searchParams.delete("focus");
  history.replaceState(null, "", url.pathname + url.search + url.hash);
  pane.querySelector("[data-role=action-outcome]")?.replaceChildren();
  load(runId);
}

async function act(path, body) {
  const out = pane.querySelector("[data-role=action-outcome]");
  const answer = await fetch(`/api/runs/${encodeURIComponent(current)}/${path}`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrf() },
    body: JSON.stringify(body),
  });
  const data = await answer.json().catch(() => ({}));
  out.textContent = answer.ok
    ? path === "steer" ? `Steer ${data.outcome}${data.reason ? ` (${data.reason})` : ""}.` : `${path[0].toUpperCase()}${path.slice(1)} ${data.outcome}.`
    : data.error?.message || `refused (${answer.status})`;
  out.dataset.ok = answer.ok ? "1" : "0";
  load(current);
}

if (pane) {
  const view = window.canopyTree;
  view?.addEventListener("select", (event) => select(event.detail));
  // The live socket's rows ring before the next read: a finish shows at once, then the
  // detail (output, usage) is read again.
  view?.addEventListener("change", () => {
    const row = current && view.rows.get(current);
    if (row && pane.dataset.runId === current && row.status !== pane.dataset.status) {
      showStatus(row.status);
      load(current);
    }
  });
  const wanted = new URL(location.href).searchParams.get("run");
  if (wanted && view) {
    const pick = () => {
      if (view.rows.has(wanted)) view.jumpTo ? view.jumpTo(wanted) : view.select(wanted);
      select(wanted);
    };
    if (view.rows.has(wanted)) pick();
    else view.addEventListener("loaded", pick, { once: true });
  }
  pane.querySelector("[data-action=row-cancel]")?.addEventListener("click", () => {
    if (current && confirm(`Cancel ${current}?`)) act("cancel", { reason: "cancelled from the tree page" });
  });
  pane.querySelector("[data-action=row-pause]")?.addEventListener("click", () => {
    if (current) act("pause", { subtree: true, reason: "paused from the tree page" });
  });
  pane.querySelector("[data-action=row-resume]")?.addEventListener("click", () => {
    if (current) act("resume", { subtree: true, reason: "resumed from the tree page" });
  });
  pane.querySelector("[data-role=steer-form]")?.addEventListener("submit", (event) => {
    event.preventDefault();
    const box = event.target.querySelector("textarea");
    act("steer", { requestId: `tree-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`, message: box.value });
    box.value = "";
  });
}
