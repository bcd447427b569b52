// The scripts' one list of statuses (issue 34): base.html renders it from the models' choices
// (templatetags/vocabulary_tags.py), so no script keeps a copy of its own.
const node = document.getElementById("canopy-vocabulary");
if (!node) throw new Error("statuses.js: the page has no #canopy-vocabulary (base.html renders it)");
const vocabulary = JSON.parse(node.textContent);

// Run statuses in the models' order: running, paused, then the terminal ones.
export const STATUSES = Object.freeze(vocabulary.runStatuses);
export const TERMINAL = Object.freeze(vocabulary.terminalStatuses);
// Live (not terminal): running and paused.
export const LIVE = Object.freeze(STATUSES.filter((s) => !TERMINAL.includes(s)));
// A runner's state as the server derives it (Runner.state): connected, disconnected, lost, revoked.
export const RUNNER_STATES = Object.freeze(vocabulary.runnerStates);

export function isTerminal(status) {
  return TERMINAL.includes(status);
}
