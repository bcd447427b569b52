// The tree page: the whole tree, live, as virtualised rows or a timeline, with search, jump,
// filters that keep ancestors visible, and keyboard navigation.
import { bindLiveState, el, startTicking } from "./common.js";
import { LiveClient } from "./live.js";
import { Timeline } from "./timeline.js";
import { STATUSES } from "./statuses.js";
import { TreeView } from "./tree.js";

const panel = document.getElementById("tree");
const treeId = panel.dataset.treeId;
const live = new LiveClient();
window.canopyLive = live;
bindLiveState(live);
startTicking();

const view = new TreeView(panel, { topId: treeId, focusId: panel.dataset.focus, keyTarget: document });
window.canopyTree = view;
const timelinePanel = document.getElementById("timeline");
const timeline = new Timeline(document.getElementById("timeline-canvas"), view);
window.canopyTimeline = timeline;

let headerScheduled = false;
function refreshHeader() {
  headerScheduled = false;
  const { counts, deepest, total } = view.counts();
  document.querySelector("#tree-stats [data-role=total]").textContent = total;
  document.querySelector("#tree-stats [data-role=depth]").textContent = deepest;
  const box = document.getElementById("tree-counts");
  box.replaceChildren(
    ...STATUSES
      .filter((s) => counts[s])
      .map((s) => el("span", { class: `count count-${s}`, title: s }, el("i"), `${counts[s]} ${s}`)),
  );
  const root = view.rows.get(treeId);
  if (root) {
    const chip = document.getElementById("root-status");
    chip.className = `chip chip-${root.status}`;
    chip.textContent = root.status;
  }
}
// Many rows a second may arrive: the header follows at most once a frame.
view.addEventListener("change", () => {
  if (headerScheduled) return;
  headerScheduled = true;
  requestAnimationFrame(refreshHeader);
});

live.subscribeTree(
  treeId,
  {
    onTree: (rows, info) => view.load(rows, info),
    onRows: (rows) => view.upsert(rows),
  },
  { compact: true },
);
live.start();

// --- tabs --------------------------------------------------------------------------------------

function showTab(name) {
  for (const tab of document.querySelectorAll("[data-tab]")) tab.setAttribute("aria-selected", tab.dataset.tab === name ? "true" : "false");
  const timelineOn = name === "timeline";
  panel.hidden = timelineOn;
  timelinePanel.hidden = !timelineOn;
  timeline.show(timelineOn);
  if (timelineOn && view.selected) timeline.reveal(view.selected);
  if (!timelineOn) view.schedule();
  history.replaceState(null, "", timelineOn ? "#timeline" : location.pathname + location.search);
}
for (const tab of document.querySelectorAll("[data-tab]")) tab.addEventListener("click", () => showTab(tab.dataset.tab));
if (location.hash === "#timeline") showTab("timeline");
window.addEventListener("hashchange", () => showTab(location.hash === "#timeline" ? "timeline" : "tree"));
for (const button of document.querySelectorAll("[data-zoom]")) {
  button.addEventListener("click", () => {
    if (button.dataset.zoom === "fit") timeline.fit();
    else timeline.zoom(button.dataset.zoom === "in" ? 1.5 : 1 / 1.5);
  });
}

// --- search, jump and filters ------------------------------------------------------------------

const query = document.getElementById("tree-q");
const onlyMatches = document.getElementById("tree-q-filter");
const found = document.getElementById("tree-found");

function applyFilters() {
  const statuses = new Set([...document.querySelectorAll("#status-filter input:checked")].map((i) => i.value));
  const depth = document.getElementById("depth-filter").value;
  view.setFilter({ statuses, maxDepth: depth === "" ? null : Number(depth), text: onlyMatches.checked ? query.value : "" });
}
for (const input of document.querySelectorAll("#status-filter input, #depth-filter, #tree-q-filter")) input.addEventListener("change", applyFilters);
query.addEventListener("input", () => {
  if (onlyMatches.checked) applyFilters();
});
view.addEventListener("filtercleared", () => {
  for (const input of document.querySelectorAll("#status-filter input")) input.checked = false;
  document.getElementById("depth-filter").value = "";
  onlyMatches.checked = false;
});

document.getElementById("tree-search").addEventListener("submit", (event) => {
  event.preventDefault();
  const id = view.find(query.value);
  if (!id) {
    found.textContent = query.value.trim() ? "no match" : "";
    return;
  }
  view.jumpTo(id);
  found.textContent = `at ${id}`;
  if (!timelinePanel.hidden) timeline.reveal(id);
});

document.querySelector("[data-tree-action=expand-all]").addEventListener("click", () => view.expandAll());
document.querySelector("[data-tree-action=collapse-all]").addEventListener("click", () => view.collapseAll());
panel.focus();
