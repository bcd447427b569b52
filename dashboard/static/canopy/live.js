// The live socket client (protocol: dashboard/live.py). Keeps the last sequence of every
// subscribed run, drops duplicates, resubscribes on a gap, and after a dropped socket or a
// server restart reconnects and resubscribes from where it stopped. No polling: the server
// pushes changes and a heartbeat; silence longer than a few heartbeats means the socket is
// dead and it is replaced.
import { setServerTime } from "./common.js";

function defaultUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${document.body.dataset.liveUrl || "/ws/live/"}`;
}

export class LiveClient extends EventTarget {
  constructor(url = defaultUrl()) {
    super();
    this.url = url;
    this.ws = null;
    this.state = "connecting";
    this.attempt = 0;
    this.heartbeatSeconds = 10;
    this.lastFrameAt = Date.now();
    this.runs = new Map(); // runId -> {last, onEvents, onRun}
    this.trees = new Map(); // treeId -> {onTree, onRows, fresh}
    this.roots = null; // {ids: Set, newTrees, onSummary, onNewTree}
    this.runners = null;
    this.approvals = null;
    this.hello = null;
    this.stopped = false;
    this.connects = 0;
  }

  start() {
    // Idempotent: the page's script and the approvals list share one socket (pageLive).
    if (this.started) return this;
    this.started = true;
    this.connect();
    this.watchdog = setInterval(() => this.checkAlive(), 1000);
    return this;
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.dispatchEvent(new CustomEvent("state", { detail: state }));
  }

  connect() {
    if (this.stopped) return;
    const ws = new WebSocket(this.url);
    this.ws = ws;
    this.connects += 1;
    this.lastFrameAt = Date.now();
    ws.onmessage = (message) => {
      if (ws !== this.ws) return;
      this.lastFrameAt = Date.now();
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      this.handle(frame);
    };
    ws.onclose = (event) => {
      if (ws !== this.ws) return;
      this.ws = null;
      if (event.code === 4401) {
        this.setState("forbidden");
        location.href = `/login/?next=${encodeURIComponent(location.pathname + location.search)}`;
        return;
      }
      if (event.code === 4403) {
        this.setState("forbidden");
        return;
      }
      this.setState("reconnecting");
      const delay = Math.min(500 * 2 ** this.attempt, 5000) + Math.random() * 250;
      this.attempt += 1;
      setTimeout(() => this.connect(), delay);
    };
    ws.onerror = () => {};
  }

  // Used by tests and by the watchdog: drop the socket as a network failure would.
  drop() {
    if (this.ws) this.ws.close();
  }

  checkAlive() {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    const silent = Date.now() - this.lastFrameAt;
    if (silent > (this.heartbeatSeconds * 2.5 + 2) * 1000) this.drop();
  }

  send(frame) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN && this.hello) {
      this.ws.send(JSON.stringify(frame));
    }
  }

  resubscribeAll() {
    for (const [runId, sub] of this.runs) this.send({ type: "subscribe", runId, after: sub.last });
    for (const [treeId, sub] of this.trees) {
      sub.fresh = true;
      this.send(sub.compact ? { type: "subscribe", treeId, compact: true } : { type: "subscribe", treeId });
    }
    if (this.roots && (this.roots.ids.size || this.roots.newTrees)) {
      this.send({ type: "subscribe", roots: [...this.roots.ids], newTrees: this.roots.newTrees });
    }
    if (this.runners) this.send({ type: "subscribe", runners: true });
    if (this.approvals) this.send({ type: "subscribe", approvals: true });
  }

  subscribeRun(runId, after, handlers) {
    this.runs.set(runId, { last: after, ...handlers });
    this.send({ type: "subscribe", runId, after });
  }

  lastSequence(runId) {
    const sub = this.runs.get(runId);
    return sub ? sub.last : null;
  }

  // With ``compact`` the snapshot comes as column arrays ("treeCols"), decoded here into the
  // same row objects as "tree" frames.
  subscribeTree(treeId, handlers, { compact = false } = {}) {
    this.trees.set(treeId, { ...handlers, fresh: true, compact });
    this.send(compact ? { type: "subscribe", treeId, compact: true } : { type: "subscribe", treeId });
  }

  subscribeRoots(ids, newTrees, handlers) {
    if (!this.roots) this.roots = { ids: new Set(), newTrees, ...handlers };
    for (const id of ids) this.roots.ids.add(id);
    this.roots.newTrees = this.roots.newTrees || newTrees;
    if (ids.length || newTrees) this.send({ type: "subscribe", roots: ids, newTrees: this.roots.newTrees });
  }

  subscribeRunners(handlers) {
    this.runners = handlers;
    this.send({ type: "subscribe", runners: true });
  }

  // The approvals doorbell: onApprovals(pending) now and after every request or decision.
  subscribeApprovals(handlers) {
    this.approvals = handlers;
    this.send({ type: "subscribe", approvals: true });
  }

  handle(frame) {
    switch (frame.type) {
      case "hello":
        this.hello = frame;
        this.heartbeatSeconds = frame.heartbeatSeconds;
        setServerTime(frame.serverTime);
        this.attempt = 0;
        this.setState("live");
        this.dispatchEvent(new CustomEvent("hello", { detail: frame }));
        this.resubscribeAll();
        break;
      case "events":
        this.onEvents(frame);
        break;
      case "run": {
        const sub = this.runs.get(frame.run.runId);
        if (sub && sub.onRun) sub.onRun(frame.run);
        break;
      }
      case "tree": {
        const sub = this.trees.get(frame.treeId);
        if (!sub) break;
        const first = sub.fresh;
        sub.fresh = false;
        if (sub.onTree) sub.onTree(frame.runs, { first, more: frame.more });
        break;
      }
      case "treeCols": {
        const sub = this.trees.get(frame.treeId);
        if (!sub) break;
        const first = sub.fresh;
        sub.fresh = false;
        if (sub.onTree) sub.onTree(decodeColumns(frame), { first, more: frame.more });
        break;
      }
      case "rows": {
        const sub = this.trees.get(frame.treeId);
        if (sub && sub.onRows) sub.onRows(frame.runs);
        break;
      }
      case "summary":
        if (this.roots && this.roots.onSummary) this.roots.onSummary(frame);
        break;
      case "newTree":
        if (this.roots && this.roots.onNewTree) this.roots.onNewTree(frame.treeId);
        break;
      case "runners":
        if (this.runners && this.runners.onRunners) this.runners.onRunners(frame.runners);
        break;
      case "approvals":
        if (this.approvals && this.approvals.onApprovals) this.approvals.onApprovals(frame.pending);
        break;
      case "heartbeat":
        for (const [runId, head] of Object.entries(frame.runs)) {
          const sub = this.runs.get(runId);
          // The server has sent up to `head`; having less means frames went missing.
          if (sub && sub.last < head) this.send({ type: "subscribe", runId, after: sub.last });
        }
        this.dispatchEvent(new CustomEvent("heartbeat", { detail: frame }));
        break;
      case "error":
        console.warn("live:", frame.message);
        this.dispatchEvent(new CustomEvent("liveerror", { detail: frame }));
        break;
      default:
        break;
    }
  }

  onEvents(frame) {
    const sub = this.runs.get(frame.runId);
    if (!sub) return;
    const fresh = [];
    for (const event of frame.events) {
      const expected = sub.last + fresh.length + 1;
      if (event.sequence < expected) continue; // a duplicate: already shown
      if (event.sequence > expected) {
        // A gap can only mean lost frames; ask again from the last one we have.
        this.send({ type: "subscribe", runId: frame.runId, after: sub.last + fresh.length });
        break;
      }
      fresh.push(event);
    }
    if (!fresh.length) return;
    sub.last = fresh[fresh.length - 1].sequence;
    if (sub.onEvents) sub.onEvents(fresh);
  }
}

// The page's one live socket, shared by its scripts (each socket counts against the user's
// LIVE_MAX_SOCKETS_PER_USER); started by whoever first needs it.
export function pageLive() {
  if (!window.canopyLive) window.canopyLive = new LiveClient();
  return window.canopyLive;
}

export function decodeColumns(frame) {
  const cols = frame.columns;
  const names = Object.keys(cols);
  const n = cols.pk ? cols.pk.length : 0;
  const rows = new Array(n);
  for (let i = 0; i < n; i++) {
    const row = {};
    for (const name of names) row[name] = cols[name][i];
    row.leases = frame.leases[row.pk] || [];
    const [own, sub] = (frame.approvals || {})[row.pk] || [0, 0];
    row.pendingApprovals = own;
    row.subPendingApprovals = sub;
    rows[i] = row;
  }
  return rows;
}
