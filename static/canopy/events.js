// One run's events, each rendered for a person according to its kind.
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
    case "thinking":
    case "result":
      if (text) parts.push(text);
      break;
    case "tool-use":
      parts.push(el("div", { class: "ev-tool" }, ev.toolName || "tool", ev.toolCallId ? el("span", { class: "muted small" }, `  ${ev.toolCallId}`) : null));
      if (ev.input != null) parts.push(el("pre", { class: "ev-io" }, pretty(ev.input)));
      if (text) parts.push(text);
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
      parts.push(el("pre", { class: "ev-io" }, pretty(ev.input ?? ev.toolOutput ?? ev.text)));
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

export function renderEvent(ev) {
  const kindClass = `ev-kind-${String(ev.kind).replace(/[^a-z0-9-]/gi, "_")}`;
  const li = el(
    "li",
    { class: `ev ${kindClass}${ev.kind === "text-delta" ? " ev-delta" : ""}${ev.kind === "thinking" ? " ev-thinking" : ""}`, "data-sequence": ev.sequence, "data-kind": ev.kind },
    el("span", { class: "ev-seq" }, `#${ev.sequence}`),
    el("span", { class: "ev-kind" }, ev.kind),
    el("div", { class: "ev-body" }, ...body(ev)),
    el("time", { class: "ev-time", title: ev.createdAt ? new Date(ev.createdAt).toISOString() : "" }, formatClock(ev.createdAt)),
  );
  if (ev.actor) li.dataset.actor = ev.actor;
  return li;
}
