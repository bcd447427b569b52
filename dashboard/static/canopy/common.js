// Shared helpers: time formatting, ticking durations and TTLs, the live-state pill.
export let serverOffset = 0; // server clock minus ours, from the live socket's hello

export function setServerTime(serverMs) {
  serverOffset = serverMs - Date.now();
}

export function now() {
  return Date.now() + serverOffset;
}

export function formatDuration(ms) {
  if (ms == null || !isFinite(ms)) return "";
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)}s`;
  const m = Math.floor(s / 60);
  const rs = Math.floor(s % 60);
  if (m < 60) return `${m}m ${String(rs).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  return `${h}h ${String(m % 60).padStart(2, "0")}m`;
}

export function formatTTL(ms) {
  if (ms <= 0) return "expired";
  const s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  return h ? `${h}h ${String(m).padStart(2, "0")}m` : `${m}:${String(r).padStart(2, "0")}`;
}

export function formatClock(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

export function formatRelative(ms) {
  if (!ms) return "never";
  const d = now() - ms;
  if (d < 5000) return "just now";
  if (d < 60000) return `${Math.floor(d / 1000)}s ago`;
  if (d < 3600000) return `${Math.floor(d / 60000)}m ago`;
  if (d < 86400000) return `${Math.floor(d / 3600000)}h ago`;
  return new Date(ms).toLocaleString();
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("data-") || key.startsWith("aria-") || key === "role" || key === "title" || key === "href" || key === "type" || key === "tabindex") node.setAttribute(key, value === true ? "" : value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child == null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Durations ([data-duration] with data-start/data-end), TTLs ([data-ttl]) and relative times
// tick locally once a second: the server only pushes when something changes.
export function tick(root = document) {
  const t = now();
  for (const node of root.querySelectorAll("[data-duration]")) {
    const start = Number(node.dataset.start);
    if (!start) continue;
    const end = node.dataset.end ? Number(node.dataset.end) : t;
    node.textContent = formatDuration(end - start);
  }
  for (const node of root.querySelectorAll("[data-ttl]")) {
    node.textContent = formatTTL(Number(node.dataset.ttl) - t);
  }
  for (const node of root.querySelectorAll("time[data-relative]")) {
    const ts = Number(node.dataset.ts);
    if (ts) node.textContent = formatRelative(ts);
  }
}

export function startTicking() {
  tick();
  setInterval(() => tick(), 1000);
}

export function bindLiveState(live) {
  const pill = document.getElementById("live-state");
  if (!pill) return;
  const labels = { connecting: "Connecting…", live: "Live", reconnecting: "Reconnecting…", forbidden: "No access", idle: "Static" };
  const show = (state) => {
    pill.dataset.state = state;
    pill.querySelector(".live-label").textContent = labels[state] || state;
    document.body.dataset.live = state;
  };
  show(live.state);
  live.addEventListener("state", (e) => show(e.detail));
}

if (document.body && document.body.dataset.page === "audit") startTicking();

// "copy" beside a run id (_run_name.html): one listener for every page that loads this module.
document.addEventListener("click", (event) => {
  const button = event.target.closest?.("[data-copy]");
  if (!button) return;
  event.preventDefault();
  const done = () => {
    button.dataset.copied = "1";
    button.textContent = "copied";
    setTimeout(() => { delete button.dataset.copied; button.textContent = "copy"; }, 1500);
  };
  if (navigator.clipboard?.writeText) navigator.clipboard.writeText(button.dataset.copy).then(done, done);
  else done();
});
