"""One lock order for runners, runs, commands and budgets (issue 20): a ``child.start`` and a
cancel of its parent from another connection never deadlock, whatever the interleaving.

``child.start`` locks the runner row, then the parent run; a cancel locks the run, then
inserts its ``run.cancel`` command, whose foreign key takes a key-share lock on the runner
row. With the runner row locked ``FOR UPDATE`` the two wait on each other (PostgreSQL's
40P01); the interleaving below forces that order every time.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from delegation.models import Command, Run
from delegation.runner_socket import methods
from delegation.services import run_actions
from delegation.services.children import start as children
from delegation.services.identity import Actor
from delegation.services.run_actions import do_cancel_run
from tests.support.concurrency import parallel_writers, service_connection, start_params

pytestmark = pytest.mark.django_db(transaction=True)


def _in_thread(function, outcomes: dict, name: str) -> threading.Thread:
    def run():
        try:
            outcomes[name] = function()
        except Exception as exc:  # the outcome under test: nothing may escape
            outcomes[name] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


@parallel_writers
def test_it_neither_deadlocks_nor_fails_a_child_start_racing_a_cancel_of_its_parent(
    monkeypatch,
):
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    root = Run.objects.get(run_id="root")
    runner_locked = threading.Event()
    cancel_waiting = threading.Event()
    lock_parent = children.lock_run

    def lock_parent_after_the_cancel(pk):
        # child.start holds the runner row by now; let the cancel lock the run and queue
        # its command first, then take the parent run as child.start always does.
        runner_locked.set()
        cancel_waiting.wait(5)
        return lock_parent(pk)

    monkeypatch.setattr(children, "lock_run", lock_parent_after_the_cancel)

    def cancel():
        runner_locked.wait(5)
        timer = threading.Timer(0.5, cancel_waiting.set)  # long enough to block, if it can
        timer.start()
        try:
            return do_cancel_run(Actor.system("operator"), root, reason="stop")
        finally:
            timer.cancel()
            cancel_waiting.set()

    outcomes: dict = {}
    threads = [
        _in_thread(lambda: methods.child_start(conn, start_params()), outcomes, "start"),
        _in_thread(cancel, outcomes, "cancel"),
    ]
    for thread in threads:
        thread.join(30)
    assert not isinstance(outcomes["cancel"], Exception), outcomes["cancel"]
    assert not isinstance(outcomes["start"], Exception), outcomes["start"]
    assert outcomes["cancel"]["outcome"] == "requested"
    assert outcomes["start"]["parentRunId"] == "root"
    assert Command.objects.filter(method="run.cancel", run=root).count() == 1
    assert Command.objects.filter(method="child.execute").count() == 1


def _conflict_once(monkeypatch, module, name: str, sqlstate: str) -> list:
    """Make ``module.name`` abort its transaction once with a real PostgreSQL ``sqlstate``."""
    original = getattr(module, name)
    raised: list = []

    def conflicting(*args, **kwargs):
        if not raised:
            raised.append(sqlstate)
            with connections["default"].cursor() as cursor:
                cursor.execute(
                    "DO $$ BEGIN RAISE EXCEPTION 'forced by the test' "
                    f"USING ERRCODE = '{sqlstate}'; END $$"
                )
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, conflicting)
    return raised


@parallel_writers
@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
async def test_it_retries_a_deadlocked_child_start_instead_of_answering_an_error(
    runner, monkeypatch, sqlstate
):
    await runner.open("root-1")
    raised = _conflict_once(monkeypatch, children, "lock_run", sqlstate)
    answer = await runner.call("child.start", runner.child_params())
    assert raised == [sqlstate]
    assert "error" not in answer, answer
    assert answer["result"]["parentRunId"] == "root-1"
    await runner.wait_command("child.execute")


@parallel_writers
def test_it_retries_a_deadlocked_cancel_instead_of_failing_the_operator(monkeypatch):
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    root = Run.objects.get(run_id="root")
    raised = _conflict_once(monkeypatch, run_actions, "request_cancel", "40P01")
    report = do_cancel_run(Actor.system("operator"), root, reason="stop")
    assert raised == ["40P01"] and report["outcome"] == "requested"
    assert Command.objects.filter(method="run.cancel", run=root).count() == 1
