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

let lastLive = null;
async function refresh() {
  if (document.visibilityState === "visible") {
    try {
      const answer = await fetch(`/api/runs/${encodeURIComponent(card.dataset.runId)}`, { credentials: "same-origin" });
      if (answer.ok) {
        const detail = await answer.json();
        apply(detail.usage);
        card.dataset.updated = String(Date.now());
        const live = detail.usage.subtree.live;
        if (live === 0 && lastLive === 0) return; // ended and read once more: stop
        lastLive = live;
      }
    } catch {
      // The next tick tries again.
    }
  }
  setTimeout(refresh, REFRESH_MS);
}

if (card) setTimeout(refresh, REFRESH_MS);
