// The overview's headline numbers and charts (_overview_stats.html): drawn from the page's
// JSON, then refreshed from GET /api/overview every few seconds while the page is visible.
import { STATUSES } from "./statuses.js";

const SVG = "http://www.w3.org/2000/svg";
const root = document.getElementById("overview-stats");
const REFRESH_MS = 5000;

function money(value) {
  return `$${Number(value || 0).toFixed(4)}`;
}

function drawCost(data) {
  const svg = root.querySelector("#cost-chart svg");
  const hours = data.costByHour;
  const top = Math.max(...hours.map((h) => h.costUsd), 0);
  const width = 240 / hours.length;
  svg.replaceChildren();
  hours.forEach((h, i) => {
    const height = top ? Math.max((h.costUsd / top) * 56, h.costUsd ? 1 : 0) : 0;
    const bar = document.createElementNS(SVG, "rect");
    bar.setAttribute("x", String(i * width + 0.5));
    bar.setAttribute("width", String(width - 1));
    bar.setAttribute("y", String(60 - height));
    bar.setAttribute("height", String(height));
    bar.setAttribute("class", "bar-cost");
    bar.dataset.hour = String(i);
    const title = document.createElementNS(SVG, "title");
    const when = new Date(typeof h.hourStart === "number" ? h.hourStart : Date.parse(h.hourStart));
    title.textContent = `${when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })}: ${money(h.costUsd)}`;
    bar.append(title);
    svg.append(bar);
  });
}

function drawStatus(data) {
  const bar = root.querySelector("#status-chart .status-bar");
  const total = STATUSES.reduce((n, s) => n + (data.runsByStatus[s] || 0), 0);
  bar.replaceChildren(
    ...STATUSES.filter((s) => data.runsByStatus[s]).map((s) => {
      const part = document.createElement("span");
      part.className = `seg sw-${s}`;
      part.style.flexGrow = String(data.runsByStatus[s]);
      part.title = `${s}: ${data.runsByStatus[s]} of ${total}`;
      part.dataset.status = s;
      return part;
    }),
  );
  for (const item of root.querySelectorAll("[data-role=status-legend] [data-status]")) {
    item.querySelector("b").textContent = String(data.runsByStatus[item.dataset.status] || 0);
  }
}

function apply(data) {
  for (const card of root.querySelectorAll("[data-stat]")) {
    const name = card.dataset.stat;
    const value = card.querySelector("[data-role=value]");
    value.textContent = name.startsWith("cost") ? money(data[name]) : String(data[name]);
    if (name.startsWith("failed") || name === "pendingApprovals") value.classList.toggle("stat-bad", data[name] > 0);
  }
  const roots = root.querySelector("[data-role=liveRoots]");
  if (roots) roots.textContent = String(data.liveRoots);
  drawCost(data);
  drawStatus(data);
  root.dataset.updated = String(Date.now());
}

async function refresh() {
  if (document.visibilityState !== "visible") return;
  try {
    const answer = await fetch("/api/overview", { credentials: "same-origin" });
    if (answer.ok) apply(await answer.json());
  } catch {
    // The next tick tries again; the live pill says when the server is away.
  }
}

if (root) {
  apply(JSON.parse(document.getElementById("overview-data").textContent));
  setInterval(refresh, REFRESH_MS);
}
