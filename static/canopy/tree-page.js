// The tree page: the whole tree, live, with keyboard navigation.
import { bindLiveState, el, startTicking } from "./common.js";
import { LiveClient } from "./live.js";
import { TreeView } from "./tree.js";

const panel = document.getElementById("tree");
const treeId = panel.dataset.treeId;
const live = new LiveClient();
window.canopyLive = live;
bindLiveState(live);
startTicking();

const view = new TreeView(panel, { topId: treeId, focusId: panel.dataset.focus, keyTarget: document });
window.canopyTree = view;

function refreshHeader() {
  const { counts, deepest, total } = view.counts();
  document.querySelector("#tree-stats [data-role=total]").textContent = total;
  document.querySelector("#tree-stats [data-role=depth]").textContent = deepest;
  const box = document.getElementById("tree-counts");
  box.replaceChildren(
    ...["running", "succeeded", "failed", "cancelled", "lost"]
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
view.addEventListener("change", refreshHeader);

live.subscribeTree(treeId, {
  onTree: (rows, info) => view.load(rows, info),
  onRows: (rows) => view.upsert(rows),
});
live.start();

document.querySelector("[data-tree-action=expand-all]").addEventListener("click", () => view.expandAll());
document.querySelector("[data-tree-action=collapse-all]").addEventListener("click", () => view.collapseAll());
panel.focus();
