"""Conclusions on the dashboard (issue 24) in a real browser: the run page's card appears live
when the run concludes, and tree rows carry a mark with the conclusion's status."""

from __future__ import annotations

import json

import pytest

from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(120),
]

CONCLUSION = {
    "status": "partial",
    "summary": "Parsed two files. <img src=x onerror=alert(1)>",
    "artifacts": [
        {"path": "out/report.md", "description": "the report"},
        {"url": "https://ci.example/build/7", "description": "the CI run"},
    ],
    "followUp": ["parse c.txt"],
    "confidence": 0.8,
}


def _block(conclusion: dict) -> str:
    return f"Done for now.\n```canopy-conclusion\n{json.dumps(conclusion)}\n```"


def test_it_shows_a_conclusion_card_live_and_a_mark_on_the_tree_row(
    server, runner, browser, operator
):
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    runner.open("root-1")
    child = runner.child("root-1", "req-0", "parse the files")["runId"]
    other = runner.child("root-1", "req-1", "fix the build")["runId"]
    page.goto(f"{server.http_url}/runs/{child}/")
    page.wait_for_selector("#live-state[data-state=live]")
    assert page.is_hidden("#conclusion")
    runner.emit(child, {"kind": "result", "text": _block(CONCLUSION)})
    page.wait_for_selector("#conclusion", state="visible")
    card = "#conclusion"
    assert page.text_content(f"{card} [data-field=conclusion-status]") == "partial"
    # Agent text is text, never markup.
    assert page.text_content(f"{card} [data-field=conclusion-summary]") == CONCLUSION["summary"]
    assert page.locator(f"{card} img").count() == 0
    link = page.locator(f'{card} a[href="https://ci.example/build/7"]')
    assert link.get_attribute("rel") == "noopener noreferrer nofollow"
    assert page.text_content(f"{card} code") == "out/report.md"
    assert "parse c.txt" in page.text_content(f"{card} [data-role=conclusion-follow-up]")
    assert page.text_content(f"{card} [data-field=conclusion-confidence]") == "80%"
    runner.finish(child, output=_block(CONCLUSION))

    # Reloaded, the server renders the same card.
    page.reload()
    page.wait_for_selector("#conclusion", state="visible")
    assert page.text_content(f"{card} [data-field=conclusion-summary]") == CONCLUSION["summary"]
    assert page.text_content(f"{card} [data-field=conclusion-confidence]") == "80%"
    assert page.locator(f"{card} img").count() == 0

    page.goto(f"{server.http_url}/trees/root-1/")
    page.wait_for_selector(f'#tree [data-run-id="{child}"] [data-conclusion="partial"]')
    assert page.locator(f'#tree [data-run-id="{other}"] [data-conclusion]').count() == 0
    # A conclusion that lands while the tree is open marks its row live.
    runner.finish(other, output=_block({"status": "blocked", "summary": "No access."}))
    page.wait_for_selector(f'#tree [data-run-id="{other}"] [data-conclusion="blocked"]')
