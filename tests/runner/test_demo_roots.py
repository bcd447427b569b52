"""``runner --demo --demo-roots N`` (issue 25): once its N demo roots end, the runner keeps
serving the runs operators launched on it, and exits only when none is live."""

from __future__ import annotations

import asyncio
import types

from delegation.runner import cli
from delegation.runner.scripted import ScriptedEngine


class Host:
    """The part of RunnerHost the demo loop uses: ``runs`` (what executes here) and
    ``open_root``, whose demo root ends at once."""

    generation = 1

    def __init__(self):
        self.runs: dict[str, object] = {"launched-by-an-operator": object()}
        self.opened: list[str] = []

    async def open_root(self, message, profile, budget=None):
        run_id = f"demo-{len(self.opened)}"
        self.opened.append(run_id)
        return types.SimpleNamespace(run_id=run_id)  # not in ``runs``: it ended already


async def test_it_keeps_serving_launched_runs_after_its_demo_roots_end():
    host = Host()
    args = types.SimpleNamespace(demo_roots=1, demo_max_live=1, demo_interval=0.01)
    loop = asyncio.create_task(cli.demo(host, ScriptedEngine(), args))
    await asyncio.sleep(1.2)
    assert host.opened == ["demo-0"]
    assert not loop.done(), "the runner stopped (cancelling a launched run) while it lived"
    host.runs.clear()  # the launched run ends
    await asyncio.wait_for(loop, 5)
