"""The browser tests' fixtures: a live server, a scripted runner on it, and Chromium pages.

A module's shared server runs with the module's ``DAPHNE_ENV``; a test (or a whole module)
marked ``own_server`` gets a server of its own with the same settings. Pages time out after
the module's ``PAGE_TIMEOUT_MS`` (15 s unless it says otherwise). On failure each page is
saved as a screenshot under test-results/.
"""

from __future__ import annotations

import os

import pytest

from delegation.services import tokens
from tests.support.browser import ScriptedRunner, launch, screenshot_name


@pytest.fixture
def server(request, daphne_factory):
    """The module's server, or one of the test's own if it restarts it (``own_server``)."""
    if request.node.get_closest_marker("own_server"):
        return daphne_factory(**getattr(request.module, "DAPHNE_ENV", {}))
    return request.getfixturevalue("daphne_server")


@pytest.fixture
def runner(server):
    _runner, token = tokens.create_runner("runner-b")
    scripted = ScriptedRunner(f"ws://127.0.0.1:{server.port}/ws/runner/", token).start()
    yield scripted
    scripted.close()


@pytest.fixture
def allow_orm_from_playwright():
    # Playwright's sync API runs an event loop in this thread, and the test reads the ORM.
    # Only for these tests: elsewhere the check must keep catching ORM calls from async code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def browser(request, allow_orm_from_playwright):
    """``new_page()`` → a fresh Chromium page (its own context, a desktop viewport)."""
    from playwright.sync_api import sync_playwright

    failed_before = request.session.testsfailed
    timeout_ms = getattr(request.module, "PAGE_TIMEOUT_MS", 15000)
    with sync_playwright() as playwright:
        chromium = launch(playwright)
        pages = []

        def new_page():
            context = chromium.new_context(viewport={"width": 1440, "height": 900})
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            pages.append(page)
            return page

        yield new_page
        if request.session.testsfailed > failed_before:
            for index, page in enumerate(pages):
                path = screenshot_name(f"{request.node.nodeid}-{index}")
                try:
                    page.screenshot(path=str(path), full_page=True)
                except Exception:  # a crashed page has nothing to show
                    pass
        chromium.close()
