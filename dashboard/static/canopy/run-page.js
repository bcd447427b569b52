// The run page: identity and status, events live, the subtree, cancel confirmation that says
// how many runs will stop, and the per-descendant cancel report.
import { bindLiveState, el, formatDuration, now, startTicking } from "./common.js";
import { ToolPairs, UsageTotals, formatCost, formatCount, renderEvent } from "./events.js";
import { pageLive } from "./live.js";
import { showConclusion } from "./conclusion.js";
import { TreeView } from "./tree.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled", "lost"]);
const head = document.getElementById("run");
const runId = head.dataset.runId;
const list = document.getElementById("events");
const follow = document.getElementById("follow");
// Shared with inbox.js (the run's pending approvals), which may have created it first.
const live = pageLive();
bindLiveState(live);
startTicking();

let shown = 0;
const pairs = new ToolPairs();
const usage = new UsageTotals();
const usageCard = document.getElementById("usage");

function showUsage() {
  if (!usageCard || !usage.events) return;
  usageCard.hidden = false;
  const set = (field, value) => {
    usageCard.querySelector(`[data-usage="${field}"]`).textContent = value;
  };
  set("inputTokens", formatCount(usage.inputTokens));
  set("outputTokens", formatCount(usage.outputTokens));
  set("cacheReadTokens", formatCount(usage.cacheReadTokens));
  set("cacheWriteTokens", formatCount(usage.cacheWriteTokens));
  set("costUsd", formatCost(usage.costUsd) + (usage.unpriced ? ` + ${usage.unpriced} unpriced` : ""));
  set("costSource", [...usage.sources, ...(usage.unpriced ? ["unpriced"] : [])].join(", ") || "—");
  set("models", [...usage.models].join(", ") || "—");
  set("events", String(usage.events));
}

function appendEvents(events) {
  const empty = list.querySelector("[data-role=empty]");
  if (empty) empty.remove();
  const frag = document.createDocumentFragment();
  let counted = false;
  for (const ev of events) {
    const li = renderEvent(ev);
    if (shown) li.classList.add("fresh");
    frag.append(li);
    pairs.place(ev, li);
    counted = usage.add(ev) || counted;
    if (ev.kind === "conclusion") showConclusion(document.getElementById("conclusion"), ev.input);
  }
  list.append(frag);
  if (counted) showUsage();
  shown += events.length;
  list.dataset.after = String(events[events.length - 1].sequence);
  // Events pushed with their doorbell arrive without a fresh run frame: keep the count true.
  const count = document.querySelector("[data-role=event-count]");
  if (count && Number(count.textContent) < Number(list.dataset.after)) {
    count.textContent = list.dataset.after;
  }
  document.querySelector("[data-role=shown-count]").textContent = shown;
  if (follow.checked) list.scrollTop = list.scrollHeight;
}

function setText(selector, value) {
  const node = document.querySelector(selector);
  if (node) node.textContent = value;
}

const RESULT_WORDS = {
  running: "Still running.",
  paused: "Paused: it waits for an operator to resume it.",
  succeeded: "Finished: it succeeded.",
  failed: "Finished: it failed.",
  cancelled: "Cancelled before it finished.",
  lost: "Lost: its runner went away before it finished.",
};

function applyRun(run) {
  head.dataset.status = run.status;
  const chip = head.querySelector("[data-role=status]");
  chip.className = `chip chip-${run.status}`;
  chip.textContent = run.status;
  // A run frame may be older than the events already shown (the head alone is sent at most
  // once a second): the count never goes back.
  setText("[data-role=event-count]", Math.max(run.lastSequence, Number(list.dataset.after || 0)));
  const cancelBadge = head.querySelector("[data-role=cancel-requested]");
  cancelBadge.hidden = !run.cancelRequestedAt || TERMINAL.has(run.status);
  for (const key of ["status", "done", "cancelled", "hostInstanceId"]) {
    const dd = document.querySelector(`#identity [data-field="${key}"]`);
    const value = run[key] === true ? "yes" : run[key] === false ? "no" : String(run[key] ?? "");
    if (dd) dd.textContent = value || "—";
  }
  const summary = document.querySelector("[data-role=result-summary]");
  if (summary && summary.dataset.status !== run.status) {
    summary.dataset.status = run.status;
    summary.textContent = RESULT_WORDS[run.status] || run.status;
  }
  const out = document.querySelector("[data-role=output-block]");
  out.hidden = !run.output;
  out.querySelector("pre").textContent = run.output;
  const err = document.querySelector("[data-role=error-block]");
  err.hidden = !run.error;
  err.querySelector("pre").textContent = run.error;
  const duration = head.querySelector("[data-duration]");
  if (duration && run.finishedAt) duration.dataset.end = run.finishedAt;
  if (TERMINAL.has(run.status)) {
    for (const node of document.querySelectorAll("[data-action=cancel], [data-action=steer], #steer-message")) node.disabled = true;
  }
}

live.subscribeRun(runId, 0, { onEvents: appendEvents, onRun: applyRun });

// --- Subtree, stop count, cancel report ----------------------------------------------------------

const subtree = new TreeView(document.getElementById("subtree"), { topId: runId, mini: true });
const report = document.getElementById("cancel-report");

function refreshCounts() {
  const liveBelow = subtree.liveDescendants(runId).length;
  const self = subtree.rows.get(runId);
  const stop = liveBelow + (self && !TERMINAL.has(self.status) ? 1 : 0);
  setText("[data-role=live-descendants]", liveBelow);
  const button = document.querySelector("[data-action=cancel-subtree]");
  if (button) {
    button.dataset.count = stop;
    button.querySelector("[data-role=stop-count]").textContent = stop;
    button.disabled = stop === 0;
  }
  if (report) updateReport();
}

function updateReport() {
  const requestedAt = Number(report.dataset.requestedAt);
  for (const tr of report.querySelectorAll("[data-report-run]")) {
    const row = subtree.rows.get(tr.dataset.reportRun);
    const cell = tr.querySelector("[data-role=now]");
    if (!row) continue;
    tr.dataset.status = row.status;
    if (TERMINAL.has(row.status)) {
      const after = row.finishedAt ? ` after ${formatDuration(row.finishedAt - requestedAt)}` : "";
      cell.replaceChildren(el("span", { class: `chip chip-${row.status}` }, row.status), el("div", { class: "muted small" }, `stopped${after}`));
    } else {
      cell.replaceChildren(el("span", { class: "chip chip-running" }, "running"), el("div", { class: "small", style: "color: var(--warn)" }, `still running after ${formatDuration(now() - requestedAt)}`));
    }
  }
}
if (report) setInterval(updateReport, 1000);

subtree.addEventListener("change", () => {
  refreshCounts();
  document.dispatchEvent(new CustomEvent("canopy:subtree-change"));
});
live.subscribeTree(runId, {
  onTree: (rows, info) => subtree.load(rows, info),
  onRows: (rows) => subtree.upsert(rows),
});

// --- Steer: posted to the REST API so the page (and its live stream) stays as it is -----------

const steerForm = document.getElementById("steer-form");

function freshRequestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return "dash-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function showSteerOutcome(kind, text) {
  const outcome = document.getElementById("steer-outcome");
  outcome.dataset.outcome = kind;
  outcome.className = `steer-outcome small flash flash-${kind === "injected" ? "success" : kind === "refused" ? "error" : "warning"}`;
  outcome.textContent = text;
  outcome.hidden = false;
}

async function sendSteer(event) {
  event.preventDefault();
  const message = steerForm.querySelector("[name=message]");
  const button = steerForm.querySelector("[data-action=steer]");
  const requestId = steerForm.dataset.requestId || freshRequestId();
  button.disabled = true;
  let answer;
  let status = 0;
  try {
    const response = await fetch(steerForm.dataset.endpoint, {
      method: "POST",
      credentials: "same-origin",
      headers: {
        "Content-Type": "application/json",
        Accept: "application/json",
        "X-CSRFToken": steerForm.querySelector("[name=csrfmiddlewaretoken]").value,
      },
      body: JSON.stringify({ requestId, message: message.value }),
    });
    status = response.status;
    answer = await response.json();
  } catch (error) {
    showSteerOutcome("refused", `Steer not sent: ${error.message}. Try again.`);
    button.disabled = TERMINAL.has(head.dataset.status);
    return;
  }
  button.disabled = TERMINAL.has(head.dataset.status);
  // The server answered, so this request is settled: the next steer is a new request. (After a
  // network error the same requestId is reused, so a retry cannot inject the message twice.)
  steerForm.dataset.requestId = freshRequestId();
  if (status !== 200) {
    showSteerOutcome("refused", `Steer refused: ${answer.error?.message ?? `HTTP ${status}`}`);
    return;
  }
  if (answer.outcome === "injected") {
    message.value = "";
    showSteerOutcome("injected", "Steer injected: the message was queued for the running turn.");
  } else {
    const reason = answer.reason ? ` (${answer.reason})` : "";
    showSteerOutcome(answer.outcome, `Steer not delivered: ${answer.outcome}${reason}.`);
  }
}
if (steerForm) steerForm.addEventListener("submit", sendSteer);

// --- Confirmations ------------------------------------------------------------------------------

const dialog = document.getElementById("confirm-dialog");
for (const form of document.querySelectorAll("form[data-confirm]")) {
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const kind = form.dataset.confirm;
    const liveBelow = subtree.loaded ? subtree.liveDescendants(runId).length : null;
    let title;
    let message;
    let confirmLabel = "Confirm";
    if (kind === "cancel-subtree") {
      const stop = Number(form.querySelector("[data-count]").dataset.count);
      const below = liveBelow ?? stop;
      const selfRunning = !TERMINAL.has(head.dataset.status);
      title = "Cancel the subtree";
      message = selfRunning
        ? `This will stop ${stop} run${stop === 1 ? "" : "s"}: this run and ${below} live descendant${below === 1 ? "" : "s"}.`
        : `This will stop ${stop} live descendant${stop === 1 ? "" : "s"} (this run has already finished).`;
      message += " Each is asked to stop and the report shows which ones did.";
      confirmLabel = `Stop ${stop} run${stop === 1 ? "" : "s"}`;
    } else if (kind === "cancel") {
      title = "Cancel this run";
      confirmLabel = "Stop 1 run";
      message = `This will stop 1 run (${runId}).` + (liveBelow ? ` Its ${liveBelow} live descendant${liveBelow === 1 ? " is" : "s are"} not cancelled directly; foreground children stop when it finishes. Use "Cancel subtree" to stop them all.` : "");
    } else {
      title = "Release the lease";
      confirmLabel = "Release lease";
      message = "The lease is revoked and every child running under it is cancelled.";
    }
    dialog.querySelector("[data-role=title]").textContent = title;
    dialog.querySelector("[data-role=message]").textContent = message;
    dialog.querySelector("[data-action=confirm]").textContent = confirmLabel;
    dialog.querySelector("input[name=reason]").value = "";
    dialog.onclose = () => {
      if (dialog.returnValue !== "confirm") return;
      const reason = form.querySelector("input[name=reason]");
      if (reason) reason.value = dialog.querySelector("input[name=reason]").value;
      form.submit();
    };
    dialog.returnValue = "";
    dialog.showModal();
  });
}
live.start();

// Budget bars: widths set here, since the page's CSP allows no inline style attributes.
for (const fill of document.querySelectorAll(".budget-bar > i[data-percent]")) {
  fill.style.width = `${fill.dataset.percent}%`;
}
