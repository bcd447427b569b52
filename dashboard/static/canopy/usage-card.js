// The run page's "own · subtree" usage card (#usage-rollup): the rollups as they commit.
// Descendants' usage never reaches this page's event stream, so the card reads the run's
// REST detail: every few seconds while anything in the subtree is live, and once more after
// it ends (the last usage may commit with the finish).
const card = document.getElementById("usage-rollup");
const REFRESH_MS = 2000;

function money(value) {
  return `$${Number(value || 0).toFixed(4)}`;
}

function apply(usage) {
  const set = (field, text) => {
    const cell = card.querySelector(`[data-field="${field}"]`);
    if (cell && cell.textContent !== text) cell.textContent = text;
  };
  set("tokens-in", `${usage.own.inputTokens} · ${usage.subtree.inputTokens}`);
  set("tokens-out", `${usage.own.outputTokens} · ${usage.subtree.outputTokens}`);
  set("cost", `${money(usage.own.costUsd)} · ${money(usage.subtree.costUsd)}`);
  set("runs", `${usage.subtree.runs.total} in the subtree, ${usage.subtree.live} live`);
  set("wall", `${Number(usage.subtree.wallSeconds).toFixed(1)} s`);
}

// The budget card's bars and stop line follow the same read (issue 38: "N live" and the
// stop stayed as loaded until a reload).
function applyBudget(budget) {
  const box = document.getElementById("budget");
  if (!box || !budget) return;
  for (const row of box.querySelectorAll(".budget-row[data-limit]")) {
    const limit = budget.limits[row.dataset.limit];
    if (!limit) continue;
    const percent = Math.min(100, Math.round(limit.fraction * 100));
    const level = limit.fraction >= 1 ? "over" : limit.fraction >= 0.8 ? "warn" : "ok";
    row.dataset.level = level;
    const bar = row.querySelector(".budget-bar");
    bar.dataset.level = level;
    bar.setAttribute("aria-valuenow", String(percent));
    const fill = bar.querySelector("i");
    fill.dataset.percent = String(percent);
    fill.style.width = `${percent}%`;
    const round = (n) => String(Number(Number(n).toFixed(4)));
    row.querySelector("[data-role=budget-used]").textContent = `${round(limit.used)} / ${round(limit.limit)}`;
  }
  if (budget.exceededReason) {
    let stop = box.querySelector("[data-role=budget-stop]");
    if (!stop) {
      stop = document.createElement("p");
      stop.className = "budget-stop";
      stop.dataset.role = "budget-stop";
      box.querySelector(".card-head").after(stop);
    }
    stop.textContent = `Subtree stopped: ${budget.exceededReason}`;
  }
}

let lastLive = null;
let timer = null;
let busy = false; // one read at a time: a ring during a read asks for one more after it
let again = false;
async function refresh() {
  clearTimeout(timer);
  timer = null;
  if (busy) {
    again = true;
    return;
  }
  busy = true;
  try {
    if (await readOnce() === "stop" && !again) return;
  } finally {
    busy = false;
  }
  const more = again;
  again = false;
  if (more) lastLive = null;
  clearTimeout(timer);
  timer = setTimeout(refresh, more ? 0 : REFRESH_MS);
}

async function readOnce() {
  if (document.visibilityState === "visible") {
    try {
      const answer = await fetch(`/api/runs/${encodeURIComponent(card.dataset.runId)}`, { credentials: "same-origin" });
      if (answer.ok) {
        const detail = await answer.json();
        apply(detail.usage);
        applyBudget(detail.budget);
        card.dataset.updated = String(Date.now());
        const live = detail.usage.subtree.live;
        if (live === 0 && lastLive === 0) return "stop"; // ended and read once more
        lastLive = live;
      }
    } catch {
      // The next tick tries again.
    }
  }
  return "go";
}

if (card) {
  timer = setTimeout(refresh, REFRESH_MS);
  // A run of the subtree changed (run-page.js, from the live socket): read now, not at the
  // next tick, and start again if the loop had stopped.
  // Throttled, not debounced: a busy subtree rings all the time and must still be read.
  let soon = null;
  document.addEventListener("canopy:subtree-change", () => {
    lastLive = null;
    if (soon) return;
    soon = setTimeout(() => {
      soon = null;
      refresh();
    }, 200);
  });
}
