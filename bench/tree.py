"""Trees in the browser: the page of a 10,000-run tree, and a 100,000-run tree's page,
timeline, live rows under churn and REST subtree."""

from __future__ import annotations

import json
import statistics
import time

from bench.browser import chromium, poll
from bench.servers import Database, Server
from bench.table import results

TREE_RUNS = 10_000


def _tree_page_usable_ms(server: Server, seed: dict) -> float:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page()
        page.goto(f"{server.http}/login/")
        page.fill("input[name=username]", seed["username"])
        page.fill("input[name=password]", seed["password"])
        page.click("button[type=submit], input[type=submit]")
        page.wait_for_load_state()
        samples = []
        for _ in range(3):
            started = time.perf_counter()
            page.goto(f"{server.http}/trees/{seed['root']}/")
            # Usable: the root and its first level are on screen and answer a click.
            page.wait_for_selector(f"[data-run-id='{seed['root']}']", state="visible")
            poll(page, "document.querySelectorAll('[data-run-id]').length > 10")
            samples.append((time.perf_counter() - started) * 1000)
        browser.close()
    return statistics.median(samples)


def tree():
    db = Database("sqlite")
    try:
        seed = json.loads(db.python("bench.seed", "tree", "--runs", str(TREE_RUNS)))
        results.update(json.loads(db.python("bench.seed", "subtree", "--run", seed["root"])))
        server = Server(db)
        try:
            results["tree_page_usable_ms"] = round(_tree_page_usable_ms(server, seed), 1)
        finally:
            server.stop()
    finally:
        db.close()


TREE_100K = 100_000
CHURN_RATE = 200
CHURN_SECONDS = 10.0


_SCROLLED_ROW = """(() => {
  const body = document.querySelector('#tree .tree-body');
  if (!body || body.scrollTop === 0) return false;
  const box = body.getBoundingClientRect();
  const hit = document.elementFromPoint(box.left + 60, box.top + box.height / 2);
  return Boolean(hit && hit.closest('.trow'));
})()"""


def _tree_100k_browser(server: Server, db: Database, seed: dict):
    from playwright.sync_api import sync_playwright

    root = seed["root"]
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{server.http}/login/")
        page.fill("input[name=username]", seed["username"])
        page.fill("input[name=password]", seed["password"])
        page.click("button[type=submit], input[type=submit]")
        page.wait_for_load_state()
        tree_samples, timeline_samples = [], []
        for _ in range(3):
            page.goto(f"{server.http}/runners/")
            started = time.perf_counter()
            page.goto(f"{server.http}/trees/{root}/")
            # Usable: the first rows painted, and a scroll answered with rows where it landed.
            page.wait_for_selector(f"#tree [data-run-id='{root}']", state="visible")
            page.evaluate(
                "() => { const b = document.querySelector('#tree .tree-body');"
                " b.scrollTop = b.scrollHeight / 2; }"
            )
            poll(page, _SCROLLED_ROW)
            tree_samples.append((time.perf_counter() - started) * 1000)

            page.goto(f"{server.http}/runners/")
            started = time.perf_counter()
            page.goto(f"{server.http}/trees/{root}/#timeline")
            poll(page, "window.canopyTimeline && window.canopyTimeline.bars.size > 10")
            timeline_samples.append((time.perf_counter() - started) * 1000)
        results["tree_page_usable_ms_100k"] = round(statistics.median(tree_samples), 1)
        results["timeline_usable_ms_100k"] = round(statistics.median(timeline_samples), 1)

        # Live: the whole tree loaded, then 200 runs a second change for ten seconds.
        page.goto(f"{server.http}/runners/")
        started = time.perf_counter()
        page.goto(f"{server.http}/trees/{root}/")
        poll(page, f"window.canopyTree && window.canopyTree.rows.size === {TREE_100K}", 180)
        results["tree_loaded_ms_100k"] = round((time.perf_counter() - started) * 1000, 1)
        page.evaluate(
            """() => { window.__gaps = []; let last = performance.now();
                 const f = (t) => { window.__gaps.push(t - last); last = t;
                   if (!window.__stop) requestAnimationFrame(f); };
                 requestAnimationFrame(f); window.__applied0 = window.canopyTree.applied; }"""
        )
        churn = json.loads(
            db.python(
                "bench.seed",
                "churn",
                "--run",
                root,
                "--rate",
                str(CHURN_RATE),
                "--seconds",
                str(CHURN_SECONDS),
            )
        )
        time.sleep(2.5)  # the heartbeat after the last change
        applied, gaps = page.evaluate(
            "() => { window.__stop = true;"
            " return [window.canopyTree.applied - window.__applied0, window.__gaps]; }"
        )
        gaps = sorted(gaps[1:]) or [0]
        results["tree_live_rows_per_s_100k"] = round(applied / churn["seconds"], 1)
        results["tree_live_changed_per_s_100k"] = round(churn["changed"] / churn["seconds"], 1)
        # Every change made is a row the page must apply: this is the share it did.
        results["tree_live_applied_ratio_100k"] = round(applied / max(1, churn["changed"]), 3)
        results["tree_live_frame_p99_ms_100k"] = round(gaps[int(len(gaps) * 0.99) - 1], 1)
        browser.close()


def tree100k():
    db = Database("sqlite")
    try:
        seed = json.loads(db.python("bench.seed", "tree-bulk", "--runs", str(TREE_100K)))
        results.update(
            json.loads(
                db.python(
                    "bench.seed", "subtree-big", "--run", seed["root"], "--runs", str(TREE_100K)
                )
            )
        )
        server = Server(db, LIVE_HEARTBEAT_SECONDS="1")
        try:
            _tree_100k_browser(server, db, seed)
        finally:
            server.stop()
    finally:
        db.close()
