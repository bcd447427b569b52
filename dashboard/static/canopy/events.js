// One run's events, each rendered for a person according to its kind. A tool call shows its
// input and, once it arrives, its result side by side (paired by toolCallId); thinking is
// collapsed; usage events add up to the run's usage.
import { el, formatClock } from "./common.js";

function pretty(value) {
  if (value == null) return "";
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

function outcome(success) {
  if (success === true) return el("span", { class: "outcome outcome-ok" }, "success");
  if (success === false) return el("span", { class: "outcome outcome-fail" }, "failure");
  return el("span", { class: "outcome outcome-unknown" }, "unknown");
}

function actorLine(verb, actor) {
  return el("div", { class: "ev-actor" }, `${verb} by `, el("b", {}, actor || "unknown"));
}

function body(ev) {
  const parts = [];
  const text = ev.text != null ? el("div", { class: "ev-text" }, ev.text) : null;
  switch (ev.kind) {
    case "text":
    case "text-delta":
    case "result":
      if (text) parts.push(text);
      break;
    case "thinking": {
      const full = ev.text ?? "";
      const firstLine = full.split("\n", 1)[0];
      const preview = firstLine.length > 90 ? `${firstLine.slice(0, 90)}…` : firstLine;
      parts.push(el("details", { class: "ev-thinking-box" }, el("summary", { class: "ev-thinking-summary" }, preview || "thinking"), el("div", { class: "ev-text" }, full)));
      break;
    }
    case "tool-use":
      parts.push(el("div", { class: "ev-tool" }, ev.toolName || "tool", ev.toolCallId ? el("span", { class: "muted small" }, `  ${ev.toolCallId}`) : null));
      if (text) parts.push(text);
      parts.push(
        el(
          "div",
          { class: "ev-pair" },
          el("div", { class: "ev-pair-col", "data-role": "tool-input" }, el("div", { class: "section-label" }, "input"), el("pre", { class: "ev-io" }, ev.input != null ? pretty(ev.input) : "(none)")),
          el("div", { class: "ev-pair-col", "data-role": "tool-output", "data-state": "pending" }, el("div", { class: "section-label" }, "result"), el("div", { class: "muted small" }, "waiting for the result…")),
        ),
      );
      break;
    case "tool-update":
      parts.push(el("div", { class: "ev-tool" }, ev.toolName || "tool"));
      if (text) parts.push(text);
      if (ev.toolOutput != null) parts.push(el("pre", { class: "ev-io" }, pretty(ev.toolOutput)));
      break;
    case "tool-result":
      parts.push(el("div", { class: "ev-tool" }, ev.toolName || "tool", outcome(ev.success)));
      if (ev.toolOutput != null) parts.push(el("pre", { class: "ev-io" }, pretty(ev.toolOutput)));
      if (text) parts.push(text);
      break;
    case "steer":
      parts.push(actorLine("Steered", ev.actor));
      if (text) parts.push(text);
      break;
    case "cancel-requested":
      parts.push(actorLine("Cancel requested", ev.actor));
      if (text) parts.push(text);
      break;
    case "lease-released":
      parts.push(actorLine("Lease released", ev.actor));
      if (text) parts.push(text);
      break;
    case "delegation-refused":
      parts.push(el("div", { class: "ev-text" }, ev.error || ev.text || "delegation refused"));
      if (ev.data && ev.data.profile) parts.push(el("div", { class: "muted small" }, `requested profile ${ev.data.profile}`));
      break;
    case "error":
      parts.push(el("div", { class: "ev-text" }, ev.error || ev.text || "error"));
      break;
    case "usage":
      if (ev.input && typeof ev.input === "object") parts.push(el("div", { class: "ev-text" }, usageLine(ev.input)));
      else parts.push(el("pre", { class: "ev-io" }, pretty(ev.input ?? ev.toolOutput ?? ev.text)));
      break;
    case "done":
      parts.push(el("span", { class: "muted" }, ev.text || "run finished"));
      break;
    default:
      if (text) parts.push(text);
      if (ev.toolName) parts.push(el("div", { class: "ev-tool" }, ev.toolName));
      if (ev.input != null) parts.push(el("pre", { class: "ev-io" }, pretty(ev.input)));
      if (ev.toolOutput != null) parts.push(el("pre", { class: "ev-io" }, pretty(ev.toolOutput)));
  }
  if (ev.error && !["error", "delegation-refused"].includes(ev.kind)) parts.push(el("div", { class: "ev-text", style: "color: var(--fail)" }, ev.error));
  if (ev.truncated) parts.push(el("span", { class: "ev-trunc" }, "truncated at 32 KiB"));
  return parts;
}

function usageLine(u) {
  const parts = [`${formatCount(u.inputTokens)} in`, `${formatCount(u.outputTokens)} out`];
  if (u.cacheReadTokens) parts.push(`${formatCount(u.cacheReadTokens)} cache read`);
  if (u.cacheWriteTokens) parts.push(`${formatCount(u.cacheWriteTokens)} cache write`);
  // costSource (set by the server): the agent's own cost, the price table's, or none known.
  if (u.costSource === "unpriced") parts.push("unpriced");
  else if (u.costUsd != null) parts.push(formatCost(u.costUsd) + (u.costSource ? ` (${u.costSource})` : ""));
  if (u.model) parts.push(u.model);
  return parts.join(" · ");
}

export function formatCount(n) {
  return Number(n || 0).toLocaleString("en-US");
}

export function formatCost(usd) {
  const value = Number(usd || 0);
  return `$${value.toFixed(value < 1 ? 4 : 2)}`;
}

// Pairs each tool call's result with its use: the use's row gets the result beside its input,
// and the result's own row folds away (it stays in the stream, numbered, for the record).
export class ToolPairs {
  constructor() {
    this.uses = new Map(); // toolCallId -> the tool-use <li>
  }

  place(ev, li) {
    if (!ev.toolCallId) return;
    if (ev.kind === "tool-use") {
      this.uses.set(ev.toolCallId, li);
      return;
    }
    if (ev.kind !== "tool-result" && ev.kind !== "tool-update") return;
    const use = this.uses.get(ev.toolCallId);
    if (!use) return;
    const cell = use.querySelector("[data-role=tool-output]");
    const value = ev.toolOutput != null ? pretty(ev.toolOutput) : ev.text ?? ev.error ?? "";
    const final = ev.kind === "tool-result";
    if (!final && cell.dataset.state === "done") return; // a late update never hides the result
    cell.dataset.state = final ? "done" : "running";
    cell.replaceChildren(
      el("div", { class: "section-label" }, final ? "result " : "update ", final ? outcome(ev.success) : null, el("a", { href: `#ev-${ev.sequence}`, class: "muted small" }, ` #${ev.sequence}`)),
      el("pre", { class: `ev-io${ev.success === false ? " ev-io-fail" : ""}` }, value || "(empty)"),
    );
    if (final) {
      use.dataset.paired = String(ev.sequence);
      li.classList.add("ev-paired");
      const body = li.querySelector(".ev-body");
      body.replaceChildren(el("span", { class: "muted small" }, "result of "), el("a", { href: `#ev-${use.dataset.sequence}`, class: "mono small" }, `#${use.dataset.sequence}`), " ", outcome(ev.success));
    }
  }
}

// Running totals of a run's usage events (SPEC §10 keys).
export class UsageTotals {
  constructor() {
    this.reset();
  }

  reset() {
    this.events = 0;
    this.inputTokens = 0;
    this.outputTokens = 0;
    this.cacheReadTokens = 0;
    this.cacheWriteTokens = 0;
    this.costUsd = 0;
    this.unpriced = 0;
    this.sources = new Set();
    this.models = new Set();
  }

  add(ev) {
    if (ev.kind !== "usage" || !ev.input || typeof ev.input !== "object") return false;
    const u = ev.input;
    this.events += 1;
    this.inputTokens += Number(u.inputTokens) || 0;
    this.outputTokens += Number(u.outputTokens) || 0;
    this.cacheReadTokens += Number(u.cacheReadTokens) || 0;
    this.cacheWriteTokens += Number(u.cacheWriteTokens) || 0;
    this.costUsd += Number(u.costUsd) || 0;
    if (u.costSource === "unpriced") this.unpriced += 1;
    else if (u.costSource) this.sources.add(u.costSource);
    if (u.model) this.models.add(u.model);
    return true;
  }
}

export function renderEvent(ev) {
  const kindClass = `ev-kind-${String(ev.kind).replace(/[^a-z0-9-]/gi, "_")}`;
  const li = el(
    "li",
    { class: `ev ${kindClass}${ev.kind === "text-delta" ? " ev-delta" : ""}${ev.kind === "thinking" ? " ev-thinking" : ""}`, id: `ev-${ev.sequence}`, "data-sequence": ev.sequence, "data-kind": ev.kind, "data-tool-call-id": ev.toolCallId || null },
    el("span", { class: "ev-seq" }, `#${ev.sequence}`),
    el("span", { class: "ev-kind" }, ev.kind),
    el("div", { class: "ev-body" }, ...body(ev)),
    el("time", { class: "ev-time", title: ev.createdAt ? new Date(ev.createdAt).toISOString() : "" }, formatClock(ev.createdAt)),
  );
  if (ev.actor) li.dataset.actor = ev.actor;
  return li;
}
