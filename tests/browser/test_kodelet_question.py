"""An extension's question answered in the approvals inbox, in Chromium (SPEC §15): a kodelet
extension written with kodelet's SDK, hosted by the reference runner, asks ``ui.input``; the
inbox shows one card of kind ``question`` with the extension's text, offering an answer
field and no "allow always"; the operator types the answer and allows, and the extension
gets that text back."""

from __future__ import annotations

import asyncio
import json
import sys
import threading

import pytest

from delegation.runner.host import RunnerHost
from delegation.runner.kodelet.engine import ExtensionHosting
from delegation.runner.kodelet.spec import ExtensionSpec
from delegation.services import tokens
from tests.runner.kodelet.tool_script import ToolScriptEngine
from tests.support.browser import needs_chromium, sign_in
from tests.support.paths import AGENTS
from tests.support.personas import PASSWORD
from tests.support.runners import FAST

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(150)]

PROBE = ExtensionSpec((sys.executable, str(AGENTS / "kodelet_probe.py")))


def _host(server, token, shared: dict, asked: dict) -> None:
    inner = ToolScriptEngine()
    engine = ExtensionHosting(inner, {"boss": (PROBE,)})
    script = [{"tool": "name_it", "input": asked}]

    async def drive():
        async with RunnerHost(server.ws_url, token, engine, client_options=FAST) as host:
            root = await host.open_root(json.dumps(script), profile="boss")
            shared["root"] = root.run_id
            await host.wait(root.run_id, timeout=120)
            shared["results"] = inner.results[root.run_id]

    try:
        asyncio.run(drive())
    except BaseException as exc:  # shown by the test's assertions
        shared["error"] = repr(exc)


def asked_in_the_inbox(server, browser, operator, shared: dict, asked: dict):
    """(the hosting thread, the question's card): the probe asks ``ui.input`` with ``asked``
    on a runner in a thread (its run and results go in ``shared``) and the operator, signed
    in, sees the card in the inbox."""
    _runner, token = tokens.create_runner("kodelet-question")
    thread = threading.Thread(target=_host, args=(server, token, shared, asked), daemon=True)
    thread.start()
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/approvals/")
    card = page.locator("#approvals [data-approval-id]", has_text=asked["title"])
    card.locator("[data-action=allow]").wait_for(timeout=30000)
    return thread, card


def allowed_with(card, text: str, thread, shared: dict):
    """(the tool's result, the stored approval) once the operator answered ``text``."""
    from delegation.models import Approval

    card.locator("[name=message]").fill(text)
    card.locator("[data-action=allow]").click()
    card.locator("[data-role=outcome]:has-text('allow by operator:')").wait_for()
    thread.join(60)
    assert "error" not in shared, shared
    [result] = shared["results"]
    return result, Approval.objects.get(run__run_id=shared["root"])


def test_an_operator_answers_an_extensions_question_in_the_inbox(server, browser, operator):
    shared: dict = {}
    thread, card = asked_in_the_inbox(
        server, browser, operator, shared, {"title": "Name the next release"}
    )
    assert "question" in card.locator(".approval-head").inner_text()
    assert "Name the release" in card.locator("[data-field=input]").inner_text()  # its text
    assert card.locator("[data-action=allow-always]").count() == 0
    assert card.locator("[data-action=edit]").count() == 0
    answer = card.locator("[name=message]")
    assert "answer" in (answer.get_attribute("placeholder") or "").lower()
    result, asked = allowed_with(card, "Aspen", thread, shared)
    assert result["result"]["content"] == "named=Aspen", result
    assert (asked.kind, asked.decision, asked.message) == ("question", "allow", "Aspen")


def test_an_operator_answers_a_secret_question_in_a_masked_field(server, browser, operator):
    shared: dict = {}
    thread, card = asked_in_the_inbox(
        server, browser, operator, shared, {"title": "Deploy key", "secret": True}
    )
    answer = card.locator("[name=message]")
    assert answer.get_attribute("type") == "password"
    result, stored = allowed_with(card, "s3cret-Aspen", thread, shared)
    assert result["result"]["content"].startswith("secret sha256="), result
    assert stored.message == "(secret)"
