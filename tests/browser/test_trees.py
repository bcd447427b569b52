"""Big trees in a real browser: a 100,000-run tree seeded with bulk SQL, virtualised rows,
search and jump, filters, live changes far below the fold, the timeline, and rows that say what
each run was asked and is doing. Debian's chromium through Playwright against daphne.
"""

from __future__ import annotations

import os
import time

import pytest
from django.utils import timezone

from bench.tree_seed import seed_tree
from delegation import notify
from delegation.models import Run, Runner
from tests.support.browser import CHROMIUM, sign_in
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium package"),
    pytest.mark.timeout(180),
]

ROWS = "#tree .trow"


def _open_tree(page, server, operator, root: str):
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runners/")  # sign-in may land on this very tree
    started = time.perf_counter()
    page.goto(f"{server.http_url}/trees/{root}/")
    page.wait_for_selector(f'#tree [data-run-id="{root}"]', state="visible", timeout=30000)
    return (time.perf_counter() - started) * 1000


def wait_js(page, expression: str, timeout: float = 15000):
    """Poll ``expression`` with page.evaluate until it is truthy: the page's CSP refuses the
    eval that page.wait_for_function needs."""
    deadline = time.monotonic() + timeout / 1000
    while True:
        value = page.evaluate(f"() => {expression}")
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout} ms: {expression}")
        time.sleep(0.05)


# Every control of the filter bar as [what, top, height, centre] and every label's centre
# against its own control's centre: rows of controls must share one top and one height.
_FILTER_BAR_BOXES = """() => {
  const box = (e) => e.getBoundingClientRect();
  const controls = [...document.querySelectorAll(
    '#tree-tools .btn, #tree-tools input[type=search], #tree-tools input[type=number]')]
    .map((e) => { const r = box(e); return [e.id || e.textContent.trim(), r.top, r.height]; });
  const labels = [...document.querySelectorAll('#tree-tools label')].map((l) => {
    const r = box(l), i = box(l.querySelector('input'));
    return [l.textContent.trim(), r.top + r.height / 2, i.top + i.height / 2];
  });
  return { controls, labels };
}"""


def assert_filter_bar_aligned(page):
    found = page.evaluate(_FILTER_BAR_BOXES)
    controls = found["controls"]
    assert len(controls) >= 4, controls
    heights = {round(height) for _, _, height in controls}
    assert max(heights) - min(heights) <= 1, f"filter bar controls differ in height: {controls}"
    rows = []
    for name, top, height in sorted(controls, key=lambda c: c[1]):
        if rows and abs(top - rows[-1][0]) <= 1:
            continue
        # A control not on the row above starts a clean new row below it, never half-way.
        assert not rows or top >= rows[-1][0] + height, f"{name} overlaps a row: {controls}"
        rows.append((top, name))
    for text, label_mid, input_mid in found["labels"]:
        assert abs(label_mid - input_mid) <= 2, f"label {text!r} is off its control's line"


def _millis(value) -> int:
    return int(value.timestamp() * 1000)


def test_it_opens_scrolls_and_jumps_through_a_tree_of_100k_runs(server, runner, browser, operator):
    started = time.perf_counter()
    tree = seed_tree(Runner.objects.get(name="runner-b"), 100_000)
    print(f"seeded 100k runs in {(time.perf_counter() - started) * 1000:.0f} ms")
    page = browser()
    painted_ms = _open_tree(page, server, operator, tree["root"])
    wait_js(page, "window.canopyTree.rows.size === 100000", timeout=30000)
    print(f"all 100k rows in the page after {(time.perf_counter() - started) * 1000:.0f} ms")
    assert page.text_content("#tree-stats [data-role=total]") == "100000"
    # Virtualised: a window of rows in the DOM, the scroller as tall as every row.
    assert 10 <= page.locator(ROWS).count() <= 150
    assert page.evaluate("document.querySelector('#tree .tree-body').scrollHeight") >= 100_000 * 28
    assert page.text_content('#tree [data-run-id="big-1"] [data-role=task]') == "task 1"

    # Scrolling to the very end paints the last run in depth-first order.
    page.evaluate("(b => b.scrollTop = b.scrollHeight)(document.querySelector('#tree .tree-body'))")
    page.wait_for_selector(f'#tree [data-run-id="{tree["last"]}"]', state="visible")
    assert page.locator(ROWS).count() <= 150

    # Jump to a deep run by id from the search box.
    deep = "big-55555"
    assert Run.objects.get(run_id=deep).depth == tree["depth"]
    page.fill("#tree-q", deep)
    page.press("#tree-q", "Enter")
    page.wait_for_selector(f'#tree .trow.selected[data-run-id="{deep}"]', state="visible")

    # A live change to a run far below the fold reaches its row.
    far = "big-88888"
    assert page.locator(f'#tree [data-run-id="{far}"]').count() == 0
    Run.objects.filter(run_id=far).update(
        status="failed", finished_at=timezone.now(), updated_at=timezone.now()
    )
    notify.run_changed(Run.objects.get(run_id=far))
    wait_js(page, f"window.canopyTree.rows.get('{far}').status === 'failed'", timeout=15000)
    page.fill("#tree-q", far)
    page.press("#tree-q", "Enter")
    page.wait_for_selector(f'#tree .trow.selected[data-run-id="{far}"][data-status="failed"]')
    print(f"first paint of the 100k tree: {painted_ms:.0f} ms")
    assert painted_ms < 15000, painted_ms


def test_it_filters_by_status_and_depth_and_keeps_ancestors(server, runner, browser, operator):
    tree = seed_tree(Runner.objects.get(name="runner-b"), 1111)  # depths 0..3, 1000 leaves
    Run.objects.filter(run_id="big-500").update(status="failed")
    chain = []
    index = 500
    while index is not None:
        chain.append(f"big-{index}")
        index = tree["parents"][index]
    page = browser()
    _open_tree(page, server, operator, tree["root"])
    # The filter bar is one aligned row, and wraps cleanly where it must.
    for width in (1024, 1440):
        page.set_viewport_size({"width": width, "height": 800})
        assert_filter_bar_aligned(page)
    page.check('#status-filter input[value="failed"]')
    wait_js(page, f"document.querySelectorAll('{ROWS}').length === {len(chain)}")
    shown = page.eval_on_selector_all(ROWS, "els => els.map(e => e.dataset.runId)")
    assert shown == list(reversed(chain))
    # Ancestors are context, the match is not.
    assert page.locator(f'{ROWS}.t-context[data-run-id="big-0"]').count() == 1
    assert page.locator(f'{ROWS}.t-context[data-run-id="big-500"]').count() == 0
    page.uncheck('#status-filter input[value="failed"]')
    page.fill("#depth-filter", "1")
    page.dispatch_event("#depth-filter", "change")
    wait_js(page, f"document.querySelectorAll('{ROWS}').length === 11")
    # Text search filter: only matches, with ancestors.
    page.fill("#depth-filter", "")
    page.dispatch_event("#depth-filter", "change")
    page.check("#tree-q-filter")
    page.fill("#tree-q", "task 1110")
    wait_js(page, f"document.querySelectorAll('{ROWS}').length === 4")


def test_it_draws_every_run_once_on_the_timeline_with_bars_at_their_times(
    server, runner, browser, operator
):
    tree = seed_tree(Runner.objects.get(name="runner-b"), 400, step_ms=50)
    page = browser()
    _open_tree(page, server, operator, tree["root"])
    page.click("[data-tab=timeline]")
    wait_js(page, "window.canopyTimeline.frames > 0")
    # Scroll through every lane; each frame draws each of its runs once.
    for _ in range(80):
        done = page.evaluate(
            """() => { const t = window.canopyTimeline; t.draw();
                 const all = t.drawn.size === t.view.rows.size;
                 t.scrollY += t.canvas.clientHeight - 40; return all; }"""
        )
        if done:
            break
    state = page.evaluate(
        """() => { const t = window.canopyTimeline;
             return {drawn: t.drawn.size, dup: t.duplicates, t0: t.t0, mpp: t.msPerPx,
                     lanes: Number(t.canvas.dataset.lanes)}; }"""
    )
    assert state["drawn"] == 400 and state["lanes"] == 400 and state["dup"] == 0
    # Bars start and end where the runs did (finished runs; running ones end at now).
    page.evaluate("window.canopyTimeline.scrollY = 0; window.canopyTimeline.draw()")
    bars = page.evaluate("Object.fromEntries(window.canopyTimeline.bars)")
    checked = 0
    for run_id, bar in bars.items():
        created, finished = tree["times"][run_id]
        x0 = 180 + (_millis(created) - state["t0"]) / state["mpp"]
        assert abs(bar["x"] - x0) < 0.6, (run_id, bar, x0)
        if finished is not None:
            x1 = 180 + (_millis(finished) - state["t0"]) / state["mpp"]
            assert abs(bar["x"] + bar["w"] - x1) < 0.6, (run_id, bar, x1)
            checked += 1
    assert checked >= 10
    # A live change recolours without a reload; a click on a bar opens its run.
    target = next(r for r in bars if tree["times"][r][1] is not None and r != "big-0")
    bar = bars[target]
    box = page.locator("#timeline-canvas").bounding_box()
    page.mouse.click(box["x"] + bar["x"] + max(1, bar["w"]) / 2, box["y"] + bar["y"] + 8)
    page.wait_for_url(f"**/runs/{target}/")


def test_it_opens_the_timeline_of_a_100k_tree_quickly(server, runner, browser, operator):
    tree = seed_tree(Runner.objects.get(name="runner-b"), 100_000)
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runners/")  # sign-in may land on this very tree
    started = time.perf_counter()
    page.goto(f"{server.http_url}/trees/{tree['root']}/#timeline")
    wait_js(page, "window.canopyTimeline.frames > 0", timeout=30000)
    usable_ms = (time.perf_counter() - started) * 1000
    drawn = page.evaluate("window.canopyTimeline.bars.size")
    assert 10 <= drawn <= 200, drawn  # only the lanes in view
    print(f"timeline of the 100k tree usable in {usable_ms:.0f} ms")


def test_it_updates_task_and_latest_activity_live(server, runner, browser, operator):
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    runner.open("root-1")
    page.goto(f"{server.http_url}/trees/root-1/")
    page.wait_for_selector('#tree [data-run-id="root-1"]')
    child = runner.child("root-1", "req-1", "Port the lexer to Rust\nkeep the tests green")["runId"]
    row = f'#tree [data-run-id="{child}"]'
    page.wait_for_selector(f"{row} [data-role=task]:text-is('Port the lexer to Rust')")
    # The scripted runner says "started: ..." when it takes the child.
    page.wait_for_selector(f"{row} [data-role=activity]:has-text('started: Port the lexer')")
    runner.emit(
        child,
        {"kind": "tool-use", "toolName": "Edit", "toolCallId": "t1", "input": {"path": "lex.rs"}},
    )
    page.wait_for_selector(f"{row} [data-role=activity]:text-is('Edit: lex.rs')")
    runner.text(child, "Tests pass")
    page.wait_for_selector(f"{row} [data-role=activity]:text-is('Tests pass')")
    assert page.text_content(f"{row} [data-role=events]") == "3"
