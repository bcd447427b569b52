// The timeline of a tree: one bar per run from its start to its end (now, while it runs) on a
// shared time axis, coloured by status, one lane per run in the tree's depth-first order (the
// same order, collapse and filters as the tree tab), indented by depth in the label gutter.
// A canvas, and only the lanes in view are drawn, so 100,000 runs cost what 60 do.
import { formatDuration, now } from "./common.js";

const LANE = 16;
const BAR = 10;
const AXIS = 22;
const GUTTER = 180;

export class Timeline {
  constructor(canvas, view) {
    this.canvas = canvas;
    this.view = view;
    this.ctx = canvas.getContext("2d");
    this.t0 = 0;
    this.msPerPx = 1;
    this.scrollY = 0;
    this.fitted = false;
    this.active = false;
    this.scheduled = false;
    // What the last frame drew, for tests and the bench: runId -> {x, w, y}; every run at most
    // once per frame (``duplicates`` counts any drawn twice).
    this.bars = new Map();
    this.drawn = new Set(); // every run drawn by any frame since the last fit
    this.duplicates = 0;
    this.frames = 0;
    this.colors = {};
    this.drag = null;
    view.addEventListener("change", () => this.schedule());
    view.addEventListener("rendered", () => this.schedule());
    // Drawn while the snapshot streams in; once it is whole, fit the axis to every run unless
    // the user has zoomed or panned meanwhile.
    view.addEventListener("loaded", () => {
      if (!this.moved) this.fit();
    });
    this.moved = false;
    canvas.addEventListener("wheel", (e) => this.onWheel(e), { passive: false });
    canvas.addEventListener("pointerdown", (e) => this.onDown(e));
    canvas.addEventListener("pointermove", (e) => this.onMove(e));
    canvas.addEventListener("pointerup", (e) => this.onUp(e));
    canvas.addEventListener("keydown", (e) => this.onKey(e));
    canvas.tabIndex = 0;
    window.addEventListener("resize", () => this.schedule());
    setInterval(() => {
      if (this.active && this.view.counts().counts.running) this.schedule();
    }, 1000);
  }

  show(on) {
    this.active = on;
    if (on) {
      this.readColors();
      this.schedule();
    }
  }

  readColors() {
    const style = getComputedStyle(document.documentElement);
    const pick = (name, fallback) => style.getPropertyValue(name).trim() || fallback;
    this.colors = {
      running: pick("--run", "#3b82f6"),
      succeeded: pick("--ok", "#16a34a"),
      failed: pick("--fail", "#dc2626"),
      cancelled: pick("--cancel", "#a3a3a3"),
      lost: pick("--lost", "#9333ea"),
      paused: pick("--warn", "#b54708"),
      text: pick("--muted", "#666"),
      line: pick("--line", "#ddd"),
    };
  }

  span() {
    let start = Infinity;
    let end = -Infinity;
    const t = now();
    for (const row of this.view.rows.values()) {
      if (row.createdAt < start) start = row.createdAt;
      const finish = row.finishedAt || t;
      if (finish > end) end = finish;
    }
    if (!isFinite(start)) return [t - 1000, t];
    return [start, Math.max(end, start + 1)];
  }

  fit() {
    const [start, end] = this.span();
    const width = Math.max(50, this.plotWidth());
    this.t0 = start - (end - start) * 0.01;
    this.msPerPx = ((end - start) * 1.02) / width;
    this.fitted = true;
    this.drawn.clear();
    this.schedule();
  }

  plotWidth() {
    return (this.canvas.clientWidth || 800) - GUTTER - 8;
  }

  xOf(ms) {
    return GUTTER + (ms - this.t0) / this.msPerPx;
  }

  zoom(factor, atX = GUTTER + this.plotWidth() / 2) {
    this.moved = true;
    const atMs = this.t0 + (atX - GUTTER) * this.msPerPx;
    this.msPerPx = Math.max(0.001, this.msPerPx / factor);
    this.t0 = atMs - (atX - GUTTER) * this.msPerPx;
    this.schedule();
  }

  schedule() {
    if (!this.active || this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this.draw();
    });
  }

  draw() {
    if (!this.active || !(this.view.loaded || this.view.painting)) return;
    if (!this.fitted) this.fit();
    const dpr = window.devicePixelRatio || 1;
    const width = this.canvas.clientWidth;
    const height = this.canvas.clientHeight;
    if (this.canvas.width !== Math.round(width * dpr) || this.canvas.height !== Math.round(height * dpr)) {
      this.canvas.width = Math.round(width * dpr);
      this.canvas.height = Math.round(height * dpr);
    }
    const ctx = this.ctx;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const lanes = this.view.visibleIds();
    const maxScroll = Math.max(0, lanes.length * LANE - (height - AXIS));
    this.scrollY = Math.min(Math.max(0, this.scrollY), maxScroll);
    const first = Math.floor(this.scrollY / LANE);
    const last = Math.min(lanes.length, Math.ceil((this.scrollY + height - AXIS) / LANE));
    const t = now();
    const top = this.view.rows.get(this.view.topId);
    const baseDepth = top ? top.depth : 0;
    this.bars = new Map();
    ctx.font = "11px ui-monospace, monospace";
    ctx.textBaseline = "middle";
    for (let i = first; i < last; i++) {
      const id = lanes[i];
      const row = this.view.rows.get(id);
      if (!row) continue;
      const y = AXIS + i * LANE - this.scrollY;
      const x0 = this.xOf(row.createdAt);
      const x1 = this.xOf(row.finishedAt || t);
      const left = Math.max(GUTTER, x0);
      const right = Math.min(width, Math.max(x1, x0 + 1));
      if (this.bars.has(id)) this.duplicates += 1;
      this.bars.set(id, { x: x0, w: x1 - x0, y });
      this.drawn.add(id);
      if (right > left) {
        ctx.fillStyle = this.colors[row.status] || this.colors.text;
        ctx.fillRect(left, y + (LANE - BAR) / 2, Math.max(1, right - left), BAR);
      }
      ctx.fillStyle = this.colors.text;
      const indent = Math.min(GUTTER - 60, (row.depth - baseDepth) * 8);
      // The lane is named by the run's task (its id when it has none); the bar is labelled
      // with its profile and status when there is room after it. The tooltip has it all.
      const name = row.task || id;
      ctx.fillText(name.length > 26 ? `${name.slice(0, 25)}…` : name, 4 + indent, y + LANE / 2, GUTTER - 8 - indent);
      const label = `${row.profile || ""} · ${row.status}`;
      if (right + 8 < width - 40) ctx.fillText(label, right + 4, y + LANE / 2, width - right - 8);
    }
    this.drawAxis(width);
    this.frames += 1;
    this.canvas.dataset.lanes = String(lanes.length);
    this.canvas.dataset.drawn = String(this.bars.size);
  }

  drawAxis(width) {
    const ctx = this.ctx;
    ctx.fillStyle = getComputedStyle(this.canvas).backgroundColor || "#fff";
    ctx.clearRect(0, 0, width, AXIS);
    ctx.strokeStyle = this.colors.line;
    ctx.fillStyle = this.colors.text;
    ctx.beginPath();
    ctx.moveTo(GUTTER, AXIS - 0.5);
    ctx.lineTo(width, AXIS - 0.5);
    ctx.stroke();
    const [start] = this.span();
    const step = niceStep(this.msPerPx * 100);
    const firstTick = Math.ceil(this.t0 / step) * step;
    for (let ms = firstTick; this.xOf(ms) < width; ms += step) {
      const x = this.xOf(ms);
      if (x < GUTTER) continue;
      ctx.fillRect(x, AXIS - 5, 1, 5);
      ctx.fillText(`+${formatDuration(ms - start)}`, x + 3, AXIS / 2);
    }
  }

  runAt(x, y) {
    if (y < AXIS) return null;
    const lanes = this.view.visibleIds();
    const i = Math.floor((y - AXIS + this.scrollY) / LANE);
    const id = lanes[i];
    if (!id) return null;
    const bar = this.bars.get(id);
    if (x < GUTTER) return id;
    return bar && x >= bar.x - 3 && x <= bar.x + Math.max(bar.w, 1) + 3 ? id : null;
  }

  onWheel(event) {
    event.preventDefault();
    this.moved = true;
    if (event.ctrlKey || event.metaKey) {
      this.zoom(event.deltaY < 0 ? 1.25 : 0.8, event.offsetX);
      return;
    }
    if (event.shiftKey) this.t0 += event.deltaY * this.msPerPx;
    else {
      this.scrollY += event.deltaY;
      this.t0 += event.deltaX * this.msPerPx;
    }
    this.schedule();
  }

  onDown(event) {
    this.drag = { x: event.clientX, y: event.clientY, t0: this.t0, scrollY: this.scrollY, moved: false };
    this.canvas.setPointerCapture?.(event.pointerId);
    this.canvas.classList.add("dragging");
  }

  onMove(event) {
    if (!this.drag) {
      this.hover(event);
      return;
    }
    const dx = event.clientX - this.drag.x;
    const dy = event.clientY - this.drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) this.drag.moved = this.moved = true;
    this.t0 = this.drag.t0 - dx * this.msPerPx;
    this.scrollY = this.drag.scrollY - dy;
    this.schedule();
  }

  // The tooltip: the lane under the pointer, named in full (task, id, profile, status, time).
  hover(event) {
    const box = this.canvas.getBoundingClientRect();
    const y = event.clientY - box.top;
    const lanes = this.view.visibleIds();
    const index = Math.floor((y - AXIS + this.scrollY) / LANE);
    const id = y > AXIS && index >= 0 && index < lanes.length ? lanes[index] : null;
    const row = id && this.view.rows.get(id);
    if (!row) {
      this.canvas.title = "";
      delete this.canvas.dataset.hover;
      return;
    }
    const took = formatDuration((row.finishedAt || now()) - row.createdAt);
    this.canvas.title = `${row.task || id}\n${id} · ${row.profile || "no profile"} · ${row.status} · ${took}`;
    this.canvas.dataset.hover = id;
  }

  onUp(event) {
    const drag = this.drag;
    this.drag = null;
    this.canvas.classList.remove("dragging");
    if (drag && !drag.moved) {
      const id = this.runAt(event.offsetX, event.offsetY);
      if (id) location.href = `/runs/${encodeURIComponent(id)}/`;
    }
  }

  onKey(event) {
    if (event.key === "+" || event.key === "=") this.zoom(1.5);
    else if (event.key === "-") this.zoom(1 / 1.5);
    else if (event.key === "0") this.fit();
    else if (event.key === "ArrowDown") this.scrollY += LANE * 3;
    else if (event.key === "ArrowUp") this.scrollY -= LANE * 3;
    else if (event.key === "ArrowRight") this.t0 += 50 * this.msPerPx;
    else if (event.key === "ArrowLeft") this.t0 -= 50 * this.msPerPx;
    else return;
    event.preventDefault();
    this.schedule();
  }

  // Scroll so ``runId``'s lane is in view (the tree's selection follows into the timeline).
  reveal(runId) {
    const lanes = this.view.visibleIds();
    const i = this.view.index.get(runId);
    if (i == null || !lanes.length) return;
    const height = this.canvas.clientHeight - AXIS;
    if (i * LANE < this.scrollY || (i + 1) * LANE > this.scrollY + height) this.scrollY = i * LANE - height / 2;
    this.schedule();
  }
}

function niceStep(ms) {
  const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 15000, 30000, 60000, 120000, 300000, 600000, 900000, 1800000, 3600000, 7200000, 21600000, 43200000, 86400000];
  for (const step of steps) if (step >= ms) return step;
  return steps[steps.length - 1];
}
