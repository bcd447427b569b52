// The trees overview: live counts by status and deepest depth for the listed roots, and new
// trees as they open (inserted at the top on the unfiltered first page, else announced).
import { bindLiveState, el, startTicking } from "./common.js";
import { LiveClient } from "./live.js";
import { STATUSES, isTerminal } from "./statuses.js";

const table = document.getElementById("trees-table");
const tbody = table.querySelector("tbody");
const roots = JSON.parse(document.getElementById("live-roots").textContent);
const insertNew = table.dataset.filtered === "0" && table.dataset.page === "1";
const banner = document.getElementById("new-trees");
let announced = 0;
const live = new LiveClient();
window.canopyLive = live;
bindLiveState(live);
startTicking();

function rowFor(treeId) {
  return tbody.querySelector(`tr[data-tree-id="${CSS.escape(treeId)}"]`);
}

function newRow(treeId) {
  const empty = tbody.querySelector("tr.empty");
  if (empty) empty.remove();
  // As _run_name.html: the task (filled in by the first summary) over the copyable id.
  const name = el(
    "span",
    { class: "run-name", "data-role": "name" },
    el("a", { class: "name", href: `/trees/${encodeURIComponent(treeId)}/`, title: treeId, "data-role": "task" }, treeId),
    el(
      "span",
      { class: "id-line" },
      el("code", { class: "mono", "data-role": "run-id", title: treeId }, treeId),
      el("button", { type: "button", class: "copy-id", "data-copy": treeId, title: "Copy the run id", "aria-label": "Copy the run id" }, "copy"),
    ),
  );
  const tr = el(
    "tr",
    { "data-run-id": treeId, "data-tree-id": treeId, "data-status": "running", class: "fresh" },
    el("td", { class: "name-cell" }, name, el("div", { class: "sub mono", "data-role": "conversation" })),
    el("td", {}, el("span", { class: "chip chip-running", "data-role": "status" }, "running")),
    el("td", { "data-role": "profile" }, "—"),
    el("td", { class: "mono", "data-role": "runner" }, ""),
    el("td", { class: "counts", "data-role": "counts" }),
    el("td", { class: "num", "data-role": "depth" }, "0"),
    el("td", { class: "num", "data-role": "total" }, "1"),
    el("td", { class: "num mono", "data-role": "tokens" }, "0"),
    el("td", { class: "num mono", "data-role": "cost" }, "$0.0000"),
    el("td", {}, el("time", { "data-ts": Date.now(), "data-relative": "1" }, "just now")),
    el("td", { class: "num mono", "data-duration": "1", "data-start": Date.now() }),
  );
  tbody.prepend(tr);
  // The count above the table counts the rows it shows, live ones included.
  const count = document.querySelector("[data-role=tree-count]");
  if (count) {
    const n = Number(count.dataset.count || 0) + 1;
    count.dataset.count = String(n);
    count.textContent = `${n} tree${n === 1 ? "" : "s"}`;
  }
  return tr;
}

function applySummary(frame) {
  const tr = rowFor(frame.treeId);
  if (!tr) return;
  tr.dataset.status = frame.status;
  const chip = tr.querySelector("[data-role=status]");
  chip.className = `chip chip-${frame.status}`;
  chip.textContent = frame.status;
  tr.querySelector("[data-role=profile]").textContent = frame.profile || "—";
  tr.querySelector("[data-role=runner]").textContent = frame.runnerId;
  const task = tr.querySelector("[data-role=task]");
  if (task && frame.task) {
    task.textContent = frame.task;
    task.title = frame.task;
  }
  const sub = tr.querySelector("[data-role=conversation]");
  if (sub) sub.textContent = frame.conversationId;
  tr.querySelector("[data-role=depth]").textContent = frame.maxDepth;
  tr.querySelector("[data-role=total]").textContent = frame.runs;
  tr.querySelector("[data-role=counts]").replaceChildren(
    ...STATUSES.filter((s) => frame.counts[s]).map((s) =>
      el("span", { class: `count count-${s}`, "data-count": s, title: s }, el("i"), String(frame.counts[s])),
    ),
  );
  tr.querySelector("[data-role=tokens]").textContent = String(frame.tokens ?? 0);
  const cost = tr.querySelector("[data-role=cost]");
  cost.replaceChildren(`$${(frame.costUsd ?? 0).toFixed(4)}`);
  if (frame.budgetStopped) {
    cost.title = frame.budgetStopped;
    cost.append(" ", el("span", { class: "mark mark-budget", "data-role": "budget-stopped" }, "stopped"));
  }
  const duration = tr.querySelector("[data-duration]");
  if (duration && isTerminal(frame.status) && !duration.dataset.end) duration.dataset.end = String(Date.now());
}

live.subscribeRoots(roots, insertNew || true, {
  onSummary: applySummary,
  onNewTree: (treeId) => {
    if (rowFor(treeId)) return;
    if (insertNew) {
      newRow(treeId);
      live.subscribeRoots([treeId], true, {});
    } else {
      announced += 1;
      banner.hidden = false;
      banner.querySelector("span").textContent = `${announced} new tree${announced === 1 ? "" : "s"} opened since this page loaded.`;
    }
  },
});
live.start();
