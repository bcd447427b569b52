// The runners page: connection state, generation, host instance and presets, live.
import { bindLiveState, el, startTicking } from "./common.js";
import { LiveClient } from "./live.js";
import { RUNNER_STATES } from "./statuses.js";

const tbody = document.querySelector("#runners-table tbody");
const live = new LiveClient();
window.canopyLive = live;
bindLiveState(live);
startTicking();

// The server derives the state (Runner.state: revoked first, then connected, lost,
// disconnected); the page only shows it.
function connection(r) {
  if (!RUNNER_STATES.includes(r.state)) throw new Error(`runners.js: unknown runner state ${r.state}`);
  return el("span", { class: `chip chip-runner-${r.state}` }, r.state);
}

live.subscribeRunners({
  onRunners: (runners) => {
    for (const r of runners) {
      const tr = tbody.querySelector(`tr[data-runner-id="${CSS.escape(r.runnerId)}"]`);
      if (!tr) continue;
      tr.dataset.connected = r.connected ? "1" : "0";
      tr.dataset.state = r.state;
      const cell = tr.querySelector("[data-role=connection]");
      cell.dataset.state = r.state;
      cell.replaceChildren(connection(r));
      tr.querySelector("[data-role=generation]").textContent = r.generation;
      tr.querySelector("[data-role=host]").textContent = r.hostInstanceId || "—";
      const seen = tr.querySelector("[data-role=last-seen]");
      if (r.lastSeenAt) seen.dataset.ts = r.lastSeenAt;
      tr.querySelector("[data-role=presets]").replaceChildren(
        ...(r.presets.length
          ? r.presets.map((p) => el("span", { class: "badge badge-profile", title: `${p.extensionId} generation ${p.generation}` }, `${p.extensionId}/${p.name}`, el("small", {}, `@${p.generation}`)))
          : [el("span", { class: "muted" }, "—")]),
      );
    }
  },
});
live.start();
