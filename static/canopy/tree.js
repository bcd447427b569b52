// A delegation tree as rows: one element per visible run, in depth-first order, with
// [data-run-id] and [data-status]. Large trees stay usable: only expanded branches are in the
// DOM, and on first load branches below the depth that fits VISIBLE_BUDGET rows start
// collapsed (a collapsed run shows how many runs it hides and how many of them are running).
import { el, formatDuration, formatTTL, now } from "./common.js";

const VISIBLE_BUDGET = 400;
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "lost"]);

export class TreeView extends EventTarget {
  constructor(container, { topId, mini = false, linkRuns = true, focusId = "", keyTarget = null }) {
    super();
    this.container = container;
    this.body = container.querySelector("[data-role=rows]");
    this.topId = topId;
    this.mini = mini;
    this.linkRuns = linkRuns;
    this.focusId = focusId;
    this.rows = new Map(); // runId -> row
    this.kids = new Map(); // runId -> [runId] in creation order
    this.expanded = new Set();
    this.elements = new Map(); // runId -> element
    this.autoDepth = Infinity; // runs at relative depth < autoDepth start expanded
    this.loaded = false;
    this.structureDirty = false;
    this.dirty = new Set();
    this.fresh = new Set();
    this.selected = null;
    this.scheduled = false;
    this.body.addEventListener("click", (e) => this.onClick(e));
    (keyTarget || container).addEventListener("keydown", (e) => this.onKey(e));
  }

  // --- data ---------------------------------------------------------------------------------

  load(rows, { first, more }) {
    this.upsert(rows, { quiet: !this.loaded });
    if (!more && !this.loaded) {
      this.loaded = true;
      this.chooseAutoDepth();
      for (const row of this.rows.values()) if (this.relDepth(row) < this.autoDepth) this.expanded.add(row.runId);
      if (this.focusId && this.rows.has(this.focusId)) this.reveal(this.focusId);
      this.structureDirty = true;
      this.schedule();
    }
  }

  upsert(rows, { quiet = false } = {}) {
    for (const row of rows) {
      const old = this.rows.get(row.runId);
      this.rows.set(row.runId, row);
      if (!old) {
        if (row.parentRunId && row.runId !== this.topId) {
          if (!this.kids.has(row.parentRunId)) this.kids.set(row.parentRunId, []);
          const siblings = this.kids.get(row.parentRunId);
          siblings.push(row.runId);
          if (siblings.length > 1 && this.rows.get(siblings[siblings.length - 2])?.pk > row.pk) {
            siblings.sort((a, b) => this.rows.get(a).pk - this.rows.get(b).pk);
          }
        }
        if (this.loaded && this.relDepth(row) < this.autoDepth) this.expanded.add(row.runId);
        if (!quiet) this.fresh.add(row.runId);
        this.structureDirty = true;
        // The parent's "hidden" badge changes too.
        this.markAncestors(row.parentRunId);
      } else {
        this.dirty.add(row.runId);
        if (old.status !== row.status) this.markAncestors(row.parentRunId);
      }
    }
    if (this.loaded) this.schedule();
    this.dispatchEvent(new CustomEvent("change"));
  }

  markAncestors(runId) {
    let id = runId;
    let guard = 0;
    while (id && this.rows.has(id) && guard++ < 10000) {
      this.dirty.add(id);
      if (id === this.topId) break;
      id = this.rows.get(id).parentRunId;
    }
  }

  relDepth(row) {
    const top = this.rows.get(this.topId);
    return row.depth - (top ? top.depth : 0);
  }

  chooseAutoDepth() {
    const perDepth = new Map();
    for (const row of this.rows.values()) {
      const d = this.relDepth(row);
      perDepth.set(d, (perDepth.get(d) || 0) + 1);
    }
    let visible = 0;
    const depths = [...perDepth.keys()].sort((a, b) => a - b);
    this.autoDepth = Infinity;
    for (const d of depths) {
      visible += perDepth.get(d);
      if (visible > VISIBLE_BUDGET && d > 0) {
        // Runs at depth d-1 stay collapsed: depth d would not fit.
        this.autoDepth = Math.max(1, d - 1);
        return;
      }
    }
  }

  descendants(runId) {
    const out = [];
    const stack = [...(this.kids.get(runId) || [])];
    while (stack.length) {
      const id = stack.pop();
      out.push(id);
      for (const k of this.kids.get(id) || []) stack.push(k);
    }
    return out;
  }

  liveDescendants(runId) {
    return this.descendants(runId).filter((id) => !TERMINAL.has(this.rows.get(id).status));
  }

  counts() {
    const counts = {};
    let deepest = 0;
    for (const row of this.rows.values()) {
      counts[row.status] = (counts[row.status] || 0) + 1;
      deepest = Math.max(deepest, row.depth);
    }
    return { counts, deepest, total: this.rows.size };
  }

  // --- rendering ------------------------------------------------------------------------------

  schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this.render();
    });
  }

  visibleIds() {
    const out = [];
    if (!this.rows.has(this.topId)) return out;
    const stack = [this.topId];
    while (stack.length) {
      const id = stack.pop();
      out.push(id);
      if (this.expanded.has(id)) {
        const kids = this.kids.get(id) || [];
        for (let i = kids.length - 1; i >= 0; i--) stack.push(kids[i]);
      }
    }
    return out;
  }

  render() {
    if (!this.loaded) return;
    if (this.structureDirty) {
      this.structureDirty = false;
      const ids = this.visibleIds();
      const keep = new Set(ids);
      for (const [id, node] of this.elements) {
        if (!keep.has(id)) {
          node.remove();
          this.elements.delete(id);
        }
      }
      const loading = this.body.querySelector(".tree-loading");
      if (loading) loading.remove();
      let cursor = this.body.firstElementChild;
      for (const id of ids) {
        let node = this.elements.get(id);
        if (!node) {
          node = this.buildRow(id);
          this.elements.set(id, node);
          this.dirty.delete(id);
        } else if (this.dirty.has(id)) {
          this.fillRow(node, id);
          this.dirty.delete(id);
        }
        if (node !== cursor) this.body.insertBefore(node, cursor);
        else cursor = cursor.nextElementSibling;
      }
    }
    for (const id of this.dirty) {
      const node = this.elements.get(id);
      if (node) this.fillRow(node, id);
    }
    this.dirty.clear();
    for (const id of this.fresh) {
      const node = this.elements.get(id);
      if (node) {
        node.classList.remove("fresh");
        void node.offsetWidth;
        node.classList.add("fresh");
      }
    }
    this.fresh.clear();
    if (!this.selected && this.elements.has(this.focusId || this.topId)) this.select(this.focusId || this.topId, false);
    this.tickRows();
    this.dispatchEvent(new CustomEvent("rendered"));
  }

  buildRow(id) {
    const node = el("div", { class: "trow", role: "treeitem" });
    this.fillRow(node, id);
    return node;
  }

  fillRow(node, id) {
    const row = this.rows.get(id);
    const kids = this.kids.get(id) || [];
    const open = this.expanded.has(id);
    const rel = this.relDepth(row);
    node.dataset.runId = row.runId;
    node.dataset.status = row.status;
    node.dataset.depth = row.depth;
    node.setAttribute("aria-level", rel + 1);
    if (kids.length) node.setAttribute("aria-expanded", open ? "true" : "false");
    else node.removeAttribute("aria-expanded");
    if (this.selected === id) node.classList.add("selected");
    const name = el(
      "span",
      { class: "t-name" },
      el("span", { class: "t-indent" }),
      el("button", { class: `t-caret${kids.length ? "" : " leaf"}`, type: "button", "aria-expanded": open ? "true" : "false", title: open ? "Collapse (x)" : "Expand (x)", "data-toggle": "1", tabindex: "-1" }, "▶"),
      el("span", { class: "t-dot", title: row.status }),
      this.linkRuns ? el("a", { class: "t-link", href: `/runs/${encodeURIComponent(row.runId)}/`, title: row.runId, tabindex: "-1" }, row.runId) : el("span", { class: "t-link" }, row.runId),
      el("span", { class: "t-depth", title: "depth" }, `d${row.depth}`),
    );
    name.querySelector(".t-indent").style.width = `${rel * 18}px`;
    if (kids.length && !open) {
      const hidden = this.descendants(id);
      const running = hidden.filter((k) => this.rows.get(k).status === "running").length;
      name.append(el("span", { class: "t-hidden", title: `${hidden.length} runs hidden` }, `+${hidden.length}${running ? ` · ${running} running` : ""}`));
    }
    const status = el("span", {}, el("span", { class: `chip chip-${row.status}` }, row.status));
    const duration = el("span", { class: "num mono", "data-duration": "1", "data-start": row.createdAt, "data-end": row.finishedAt || "" });
    if (this.mini) {
      node.replaceChildren(name, status, duration);
      return;
    }
    const markers = el("span", { class: "t-markers" });
    for (const lease of row.leases || []) {
      markers.append(el("span", { class: "mark mark-lease", title: `holds lease ${lease.leaseId}` }, "lease ", el("span", { "data-ttl": lease.expiresAt }, formatTTL(lease.expiresAt - now()))));
    }
    if (row.underLease) markers.append(el("span", { class: "mark", title: "runs under a lease" }, "leased"));
    if (row.via === "mcp") markers.append(el("span", { class: "mark mark-via", title: "started by its parent agent's MCP delegate tool", "data-via": "mcp" }, "via mcp"));
    if (row.via === "launch") markers.append(el("span", { class: "mark mark-via", title: "launched by an operator", "data-via": "launch" }, "launched"));
    if (row.refusedSpawns) markers.append(el("span", { class: "mark mark-refused", title: "spawns refused by the depth cap", "data-refused": row.refusedSpawns }, `⊘ ${row.refusedSpawns} refused`));
    if (row.cancelRequested && !TERMINAL.has(row.status)) markers.append(el("span", { class: "mark mark-cancel" }, "cancelling"));
    if (row.budget) markers.append(budgetMarker(row));
    node.replaceChildren(
      name,
      status,
      el("span", { class: "muted" }, row.profile || "—"),
      el("span", { class: "mono muted" }, row.runner),
      el("span", { class: "num mono", "data-role": "events" }, row.events),
      el("span", { class: "num mono", "data-role": "cost", title: `${(row.usage || {}).tokens || 0} tokens in the subtree` }, `$${((row.usage || {}).costUsd || 0).toFixed(4)}`),
      duration,
      markers,
    );
  }

  tickRows() {
    const t = now();
    for (const node of this.body.querySelectorAll("[data-duration]")) {
      const start = Number(node.dataset.start);
      const end = node.dataset.end ? Number(node.dataset.end) : t;
      node.textContent = formatDuration(end - start);
    }
    for (const node of this.body.querySelectorAll("[data-ttl]")) node.textContent = formatTTL(Number(node.dataset.ttl) - t);
  }

  // --- interaction ------------------------------------------------------------------------------

  toggle(id, open = !this.expanded.has(id)) {
    if (!(this.kids.get(id) || []).length) return;
    if (open) this.expanded.add(id);
    else this.expanded.delete(id);
    this.dirty.add(id);
    this.structureDirty = true;
    this.render();
  }

  expandAll() {
    for (const id of this.kids.keys()) this.expanded.add(id);
    this.structureDirty = true;
    for (const id of this.elements.keys()) this.dirty.add(id);
    this.render();
  }

  collapseAll() {
    this.expanded.clear();
    this.expanded.add(this.topId);
    this.structureDirty = true;
    for (const id of this.elements.keys()) this.dirty.add(id);
    this.render();
  }

  reveal(id) {
    let parent = this.rows.get(id)?.parentRunId;
    while (parent && this.rows.has(parent)) {
      this.expanded.add(parent);
      if (parent === this.topId) break;
      parent = this.rows.get(parent).parentRunId;
    }
    this.structureDirty = true;
  }

  select(id, scroll = true) {
    if (this.selected && this.elements.has(this.selected)) {
      const old = this.elements.get(this.selected);
      old.classList.remove("selected");
      old.removeAttribute("aria-selected");
    }
    this.selected = id;
    const node = this.elements.get(id);
    if (node) {
      node.classList.add("selected");
      node.setAttribute("aria-selected", "true");
      if (scroll) node.scrollIntoView({ block: "nearest" });
    }
  }

  move(step) {
    const ids = this.visibleIds();
    let index = ids.indexOf(this.selected);
    index = index < 0 ? 0 : Math.min(ids.length - 1, Math.max(0, index + step));
    this.select(ids[index]);
  }

  onClick(event) {
    const node = event.target.closest(".trow");
    if (!node) return;
    const id = node.dataset.runId;
    if (event.target.closest("[data-toggle]")) {
      this.toggle(id);
      this.select(id, false);
      return;
    }
    if (!event.target.closest("a")) this.select(id, false);
  }

  onKey(event) {
    if (event.target.closest("input, textarea, select")) return;
    if (event.metaKey || event.ctrlKey || event.altKey) return;
    const key = event.key;
    if (key === "j" || key === "ArrowDown") this.move(1);
    else if (key === "k" || key === "ArrowUp") this.move(-1);
    else if (key === "x") this.selected && this.toggle(this.selected);
    else if (key === "ArrowRight") this.selected && this.toggle(this.selected, true);
    else if (key === "ArrowLeft") this.selected && this.toggle(this.selected, false);
    else if (key === "Enter") {
      if (this.selected) location.href = `/runs/${encodeURIComponent(this.selected)}/`;
    } else return;
    event.preventDefault();
  }
}

// The most-used limit of a run's budget, as a fraction (time counts while the run is live).
export function budgetFraction(row, at = Date.now()) {
  const limits = row.budget.limits;
  const usage = row.usage || {};
  const self = row.status === "running" ? 1 : 0;
  const used = {
    maxRuns: (usage.runs || 1) - 1,
    maxLive: (usage.live || 0) - self,
    maxTokens: usage.tokens || 0,
    maxCostUsd: usage.costUsd || 0,
    maxSeconds: ((row.finishedAt || at) - row.createdAt) / 1000,
  };
  let worst = 0;
  let name = "";
  for (const [limit, cap] of Object.entries(limits)) {
    const fraction = cap ? used[limit] / cap : 1;
    if (fraction >= worst) [worst, name] = [fraction, limit];
  }
  return { fraction: worst, limit: name };
}

function budgetMarker(row) {
  const { fraction, limit } = budgetFraction(row);
  const stopped = row.budget.exceededReason;
  const level = stopped || fraction >= 1 ? "over" : fraction >= 0.8 ? "warn" : "ok";
  const bar = el("span", { class: "budget-bar", "data-level": level }, el("i"));
  bar.firstChild.style.width = `${Math.min(100, Math.round(fraction * 100))}%`;
  const text = stopped ? "stopped" : `${Math.round(fraction * 100)}%`;
  return el(
    "span",
    { class: `mark${stopped ? " mark-budget" : ""}`, "data-role": "budget", "data-level": level, title: stopped || `budget: ${Math.round(fraction * 100)}% of ${limit}` },
    bar,
    ` ${text}`,
  );
}
