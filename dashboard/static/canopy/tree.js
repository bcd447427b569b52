// A delegation tree as virtualised rows: the whole tree is kept in memory (one small object per
// run) and flattened in depth-first order, but only the rows in the scrolled window (plus a few
// above and below) exist in the DOM, so a 100,000-run tree scrolls like a 40-run one. Each row
// element has [data-run-id], [data-status] and [data-depth]. Filters (status, depth, text) keep
// the ancestors of every match visible; search and jump reveal, scroll to and select a run.
import { el, formatDuration, formatTTL, now } from "./common.js";
import { TERMINAL as TERMINAL_LIST } from "./statuses.js";

const ROW_HEIGHT = 28;
const OVERSCAN = 12;
const CONCLUSION_MARKS = { done: "✓", partial: "◐", blocked: "⏸", failed: "✗" };
const TERMINAL = new Set(TERMINAL_LIST);

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
    this.byPk = new Map(); // pk -> runId (compact frames name parents by pk)
    this.kids = new Map(); // runId -> [runId] in creation order
    this.collapsed = new Set(); // everything is expanded unless collapsed: rows are virtual
    this.statusCounts = {};
    this.deepest = 0;
    this.loaded = false;
    this.structureDirty = true;
    this.flat = []; // visible runIds in display order
    this.index = new Map(); // runId -> position in flat
    this.filter = { statuses: null, maxDepth: null, text: "" };
    this.matches = null; // Set of matching runIds while a filter is on
    this.elements = new Map(); // runId -> element, only for rows in the window
    this.pool = [];
    this.fresh = new Set();
    this.selected = null;
    this.scheduled = false;
    this.applied = 0; // rows applied from the live socket, for the bench and tests
    this.body.classList.add("tree-virtual");
    this.spacer = el("div", { class: "tree-spacer" });
    this.windowEl = el("div", { class: "tree-window" });
    this.spacer.append(this.windowEl);
    this.body.append(this.spacer);
    this.body.addEventListener("scroll", () => this.schedule(), { passive: true });
    this.body.addEventListener("click", (e) => this.onClick(e));
    (keyTarget || container).addEventListener("keydown", (e) => this.onKey(e));
  }

  // --- data ---------------------------------------------------------------------------------

  load(rows, { first, more }) {
    if (first && this.loaded) this.reset();
    this.upsert(rows, { quiet: !this.loaded });
    // The snapshot comes parents first: paint what is there while the rest streams in.
    if (!this.loaded) {
      this.painting = true;
      this.schedule();
    }
    if (!more && !this.loaded) {
      this.loaded = true;
      if (this.focusId && this.rows.has(this.focusId)) this.reveal(this.focusId);
      this.structureDirty = true;
      this.schedule();
      this.dispatchEvent(new CustomEvent("loaded"));
    }
  }

  reset() {
    // A resubscribe after a reconnect sends the whole tree again; keep what the user chose.
    this.loaded = false;
  }

  upsert(rows, { quiet = false } = {}) {
    for (const row of rows) {
      if (row.parentRunId == null) row.parentRunId = row.parentPk != null ? this.byPk.get(row.parentPk) || "" : "";
      const old = this.rows.get(row.runId);
      this.rows.set(row.runId, row);
      this.byPk.set(row.pk, row.runId);
      if (row.depth > this.deepest) this.deepest = row.depth;
      this.statusCounts[row.status] = (this.statusCounts[row.status] || 0) + 1;
      if (!old) {
        if (row.parentRunId && row.runId !== this.topId) {
          if (!this.kids.has(row.parentRunId)) this.kids.set(row.parentRunId, []);
          const siblings = this.kids.get(row.parentRunId);
          siblings.push(row.runId);
          if (siblings.length > 1 && this.rows.get(siblings[siblings.length - 2])?.pk > row.pk) {
            siblings.sort((a, b) => this.rows.get(a).pk - this.rows.get(b).pk);
          }
        }
        if (!quiet) this.fresh.add(row.runId);
        this.structureDirty = true;
      } else {
        this.statusCounts[old.status] -= 1;
        if (old.status !== row.status && this.matches) this.structureDirty = true;
      }
    }
    if (!quiet) this.applied += rows.length;
    if (this.loaded) this.schedule();
    this.dispatchEvent(new CustomEvent("change"));
  }

  relDepth(row) {
    const top = this.rows.get(this.topId);
    return row.depth - (top ? top.depth : 0);
  }

  descendants(runId) {
    const out = [];
    const stack = [...(this.kids.get(runId) || [])];
    while (stack.length) {
      const id = stack.pop();
      out.push(id);
      const kids = this.kids.get(id);
      if (kids) for (const k of kids) stack.push(k);
    }
    return out;
  }

  liveDescendants(runId) {
    return this.descendants(runId).filter((id) => !TERMINAL.has(this.rows.get(id).status));
  }

  counts() {
    const counts = {};
    for (const [status, n] of Object.entries(this.statusCounts)) if (n > 0) counts[status] = n;
    return { counts, deepest: this.deepest, total: this.rows.size };
  }

  // --- filters and search ---------------------------------------------------------------------

  setFilter({ statuses = this.filter.statuses, maxDepth = this.filter.maxDepth, text = this.filter.text } = {}) {
    this.filter = { statuses: statuses && statuses.size ? statuses : null, maxDepth: maxDepth ?? null, text: (text || "").trim().toLowerCase() };
    this.structureDirty = true;
    this.schedule();
  }

  rowMatches(row) {
    const { statuses, maxDepth, text } = this.filter;
    if (statuses && !statuses.has(row.status)) return false;
    if (maxDepth != null && this.relDepth(row) > maxDepth) return false;
    if (text && !this.textMatches(row, text)) return false;
    return true;
  }

  textMatches(row, text) {
    return row.runId.toLowerCase().includes(text) || (row.task || "").toLowerCase().includes(text) || (row.activity || "").toLowerCase().includes(text) || (row.profile || "").toLowerCase().includes(text);
  }

  // The next run after the selection whose id, task, activity or profile contains ``text``.
  find(text, from = this.selected) {
    const needle = text.trim().toLowerCase();
    if (!needle) return null;
    if (this.rows.has(text.trim())) return text.trim();
    const order = this.allIds();
    const start = from ? order.indexOf(from) + 1 : 0;
    for (let i = 0; i < order.length; i++) {
      const id = order[(start + i) % order.length];
      if (this.textMatches(this.rows.get(id), needle)) return id;
    }
    return null;
  }

  jumpTo(runId) {
    if (!this.rows.has(runId)) return false;
    this.reveal(runId);
    this.rebuild();
    if (!this.index.has(runId)) {
      // Hidden by a filter: a jump wins over the filter.
      this.setFilter({ statuses: null, maxDepth: null, text: "" });
      this.dispatchEvent(new CustomEvent("filtercleared"));
      this.rebuild();
    }
    const at = this.index.get(runId);
    const view = this.body.clientHeight;
    this.body.scrollTop = Math.max(0, at * ROW_HEIGHT - view / 2 + ROW_HEIGHT / 2);
    this.render();
    this.select(runId, false);
    return true;
  }

  // --- layout ---------------------------------------------------------------------------------

  allIds() {
    const out = [];
    if (!this.rows.has(this.topId)) return out;
    const stack = [this.topId];
    while (stack.length) {
      const id = stack.pop();
      out.push(id);
      const kids = this.kids.get(id);
      if (kids) for (let i = kids.length - 1; i >= 0; i--) stack.push(kids[i]);
    }
    return out;
  }

  rebuild() {
    this.structureDirty = false;
    const filtering = this.filter.statuses || this.filter.maxDepth != null || this.filter.text;
    let keep = null;
    if (filtering) {
      // A match keeps every ancestor, so it is always seen in place.
      keep = new Set();
      this.matches = new Set();
      for (const row of this.rows.values()) {
        if (!this.rowMatches(row)) continue;
        this.matches.add(row.runId);
        let id = row.runId;
        while (id && !keep.has(id)) {
          keep.add(id);
          if (id === this.topId) break;
          id = this.rows.get(id)?.parentRunId;
        }
      }
    } else {
      this.matches = null;
    }
    const flat = [];
    if (this.rows.has(this.topId) && (!keep || keep.has(this.topId))) {
      const stack = [this.topId];
      while (stack.length) {
        const id = stack.pop();
        flat.push(id);
        if (this.collapsed.has(id) && !keep) continue;
        const kids = this.kids.get(id);
        if (!kids) continue;
        for (let i = kids.length - 1; i >= 0; i--) if (!keep || keep.has(kids[i])) stack.push(kids[i]);
      }
    }
    this.flat = flat;
    this.index = new Map();
    for (let i = 0; i < flat.length; i++) this.index.set(flat[i], i);
    this.spacer.style.height = `${flat.length * ROW_HEIGHT}px`;
    for (const node of this.elements.values()) node.dataset.stale = "1";
  }

  visibleIds() {
    if (this.structureDirty) this.rebuild();
    return this.flat;
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

  windowRange() {
    const top = this.body.scrollTop;
    const height = this.body.clientHeight || 600;
    const start = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const end = Math.min(this.flat.length, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    return [start, end];
  }

  render() {
    if (!this.loaded && !this.painting) return;
    const loading = this.body.querySelector(".tree-loading");
    if (loading) loading.remove();
    if (this.structureDirty) this.rebuild();
    const [start, end] = this.windowRange();
    const wanted = new Set(this.flat.slice(start, end));
    for (const [id, node] of this.elements) {
      if (!wanted.has(id)) {
        node.remove();
        this.pool.push(node);
        this.elements.delete(id);
      }
    }
    this.windowEl.style.transform = `translateY(${start * ROW_HEIGHT}px)`;
    let cursor = this.windowEl.firstElementChild;
    for (let i = start; i < end; i++) {
      const id = this.flat[i];
      let node = this.elements.get(id);
      if (!node) {
        node = this.pool.pop() || el("div", { class: "trow", role: "treeitem" });
        this.elements.set(id, node);
        this.fillRow(node, id);
      } else if (node.dataset.stale || node.dataset.version !== String(this.version(id))) {
        this.fillRow(node, id);
      }
      if (node !== cursor) this.windowEl.insertBefore(node, cursor);
      else cursor = cursor.nextElementSibling;
    }
    for (const id of this.fresh) {
      const node = this.elements.get(id);
      if (node) {
        node.classList.remove("fresh");
        void node.offsetWidth;
        node.classList.add("fresh");
      }
    }
    this.fresh.clear();
    const target = this.focusId || this.topId;
    if (!this.selected && this.rows.has(target) && (this.loaded || !this.focusId)) {
      this.selected = target;
      if (this.focusId && this.index.has(target)) this.jumpTo(target);
      else this.select(target, false);
    }
    this.tickRows();
    this.dispatchEvent(new CustomEvent("rendered"));
  }

  // A row's element is refilled only when the row object was replaced or its shape changed.
  version(id) {
    const row = this.rows.get(id);
    if (!row.__v) row.__v = ++TreeView.versions;
    return `${row.__v}:${this.collapsed.has(id) ? 1 : 0}:${(this.kids.get(id) || []).length}:${this.selected === id ? 1 : 0}`;
  }

  fillRow(node, id) {
    const row = this.rows.get(id);
    const kids = this.kids.get(id) || [];
    const open = !this.collapsed.has(id) || (this.matches !== null);
    const rel = this.relDepth(row);
    delete node.dataset.stale;
    node.dataset.version = String(this.version(id));
    node.dataset.runId = row.runId;
    node.dataset.status = row.status;
    node.dataset.depth = row.depth;
    node.className = "trow";
    if (this.matches && !this.matches.has(id)) node.classList.add("t-context");
    node.setAttribute("aria-level", rel + 1);
    if (kids.length) node.setAttribute("aria-expanded", open ? "true" : "false");
    else node.removeAttribute("aria-expanded");
    if (this.selected === id) {
      node.classList.add("selected");
      node.setAttribute("aria-selected", "true");
    } else node.removeAttribute("aria-selected");
    const name = el(
      "span",
      { class: "t-name" },
      el("span", { class: "t-indent" }),
      el("button", { class: `t-caret${kids.length ? "" : " leaf"}`, type: "button", "aria-expanded": open ? "true" : "false", title: open ? "Collapse (x)" : "Expand (x)", "data-toggle": "1", tabindex: "-1" }, "▶"),
      el("span", { class: "t-dot", title: row.status }),
      // Issue 38: the task is the row's name and takes the space; the id is a short second
      // mark (whole in its tooltip), so siblings read apart by what they do.
      el("span", { class: "t-task", "data-role": "task", title: row.task || row.runId }, row.task || row.runId),
      this.linkRuns
        ? el("a", { class: "t-link", "data-role": "run-id", href: `/runs/${encodeURIComponent(row.runId)}/`, title: row.runId, tabindex: "-1" }, row.runId)
        : el("span", { class: "t-link", "data-role": "run-id", title: row.runId }, row.runId),
      el("span", { class: "t-depth", title: "depth" }, `d${row.depth}`),
    );
    name.querySelector(".t-indent").style.width = `${rel * 18}px`;
    if (kids.length && !open) {
      const hidden = this.descendants(id);
      const running = hidden.filter((k) => this.rows.get(k).status === "running").length;
      name.append(el("span", { class: "t-hidden", title: `${hidden.length} runs hidden` }, `+${hidden.length}${running ? ` · ${running} running` : ""}`));
    }
    const status = el("span", {}, el("span", { class: `chip chip-${row.status}` }, row.status));
    const duration = el("span", { class: "num mono t-duration", "data-role": "duration", "data-start": row.createdAt, "data-end": row.finishedAt || "" });
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
    // SPEC §11: approvals waiting on this run, and below it (the subtree count includes its own).
    if (row.subPendingApprovals) markers.append(approvalMarker(row));
    // Issue 24: what the run concluded (SPEC §9 Conclusions).
    if (row.conclusionStatus) markers.append(el("span", { class: `mark mark-conclusion conclusion-${row.conclusionStatus}`, title: `concluded: ${row.conclusionStatus}`, "data-conclusion": row.conclusionStatus }, `${CONCLUSION_MARKS[row.conclusionStatus] || "•"} ${row.conclusionStatus}`));
    // Cost and markers right after the status: with the side pane open they stay on screen.
    node.replaceChildren(
      name,
      status,
      el("span", { class: "num mono t-cost", "data-role": "cost", title: `${(row.usage || {}).tokens || 0} tokens in the subtree` }, `$${((row.usage || {}).costUsd || 0).toFixed(4)}`),
      markers,
      el("span", { class: "t-activity muted", "data-role": "activity", title: row.activity || "" }, row.activity || ""),
      el("span", { class: "num mono t-events", "data-role": "events" }, row.events),
      duration,
      el("span", { class: "muted t-agent", title: `${row.profile || "—"} on ${row.runner}` }, row.profile || "—", el("span", { class: "mono" }, ` · ${row.runner}`)),
    );
  }

  tickRows() {
    const t = now();
    for (const node of this.windowEl.querySelectorAll("[data-role=duration]")) {
      const start = Number(node.dataset.start);
      const end = node.dataset.end ? Number(node.dataset.end) : t;
      node.textContent = formatDuration(end - start);
    }
    for (const node of this.windowEl.querySelectorAll("[data-ttl]")) node.textContent = formatTTL(Number(node.dataset.ttl) - t);
  }

  // --- interaction ------------------------------------------------------------------------------

  toggle(id, open = this.collapsed.has(id)) {
    if (!(this.kids.get(id) || []).length) return;
    if (open) this.collapsed.delete(id);
    else this.collapsed.add(id);
    this.structureDirty = true;
    this.render();
  }

  expandAll() {
    this.collapsed.clear();
    this.structureDirty = true;
    this.render();
  }

  collapseAll() {
    this.collapsed = new Set(this.kids.get(this.topId) || []);
    this.structureDirty = true;
    this.body.scrollTop = 0;
    this.render();
  }

  reveal(id) {
    let parent = this.rows.get(id)?.parentRunId;
    while (parent && this.rows.has(parent)) {
      this.collapsed.delete(parent);
      if (parent === this.topId) break;
      parent = this.rows.get(parent).parentRunId;
    }
    this.structureDirty = true;
  }

  select(id, scroll = true) {
    const previous = this.selected;
    this.selected = id;
    for (const key of [previous, id]) {
      const node = key && this.elements.get(key);
      if (node) this.fillRow(node, key);
    }
    if (scroll && this.index.has(id)) {
      const top = this.index.get(id) * ROW_HEIGHT;
      const view = this.body.clientHeight;
      // The header row sits inside the scroller: keep the selection below it.
      if (top < this.body.scrollTop) this.body.scrollTop = top;
      else if (top + ROW_HEIGHT > this.body.scrollTop + view) this.body.scrollTop = top + ROW_HEIGHT - view;
      this.render();
    }
    this.dispatchEvent(new CustomEvent("select", { detail: id }));
  }

  move(step) {
    const ids = this.visibleIds();
    let index = this.index.has(this.selected) ? this.index.get(this.selected) : -1;
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

// The row's approvals marker: the subtree's waiting count, and for the run's own a way to decide
// the oldest one (tree-approvals.js posts it; the buttons exist only for operators, and the
// server refuses a viewer anyway).
function approvalMarker(row) {
  const own = row.pendingApprovals || 0;
  const sub = row.subPendingApprovals || 0;
  const title = `${own} approval${own === 1 ? "" : "s"} waiting on this run, ${sub} in its subtree`;
  const mark = el("span", { class: "mark mark-approval", "data-role": "approvals", "data-pending": own, "data-sub-pending": sub, title }, `⏸ ${sub} waiting`);
  if (own && document.body.dataset.canAct === "1") {
    for (const [action, label] of [["allow", "Allow"], ["deny", "Deny…"]]) {
      mark.append(el("button", { class: `btn btn-xs${action === "deny" ? " btn-danger" : ""}`, type: "button", tabindex: "-1", "data-approval-action": action, "data-run-id": row.runId }, label));
    }
  }
  return mark;
}

TreeView.versions = 0;
