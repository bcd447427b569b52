"""End to end: a real daphne process on a free port, the SDK and the reference runner over real
TCP WebSockets, and the stored record checked in the test database.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from delegation import client as sdk
from delegation.client import Extension, Preset, RunnerClient, event
from delegation.models import Event, Run, RunStatus
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.runner.scripted import ScriptedConfig, ScriptedEngine
from delegation.services import run_actions, tokens
from tests.support import live_server
from tests.support.paths import AGENTS
from tests.support.paths import PROJECT as BASE_DIR
from tests.support.runners import FAST, pid_alive

# The live-server fixtures, made visible to this module's tests.

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]

AGENT = AGENTS / "echo_agent.py"


async def new_token(name: str) -> str:
    _runner, token = await sync_to_async(tokens.create_runner)(name)
    return token


@sync_to_async
def stored(run_id: str) -> list[dict]:
    return list(
        Event.objects.filter(run__run_id=run_id)
        .order_by("sequence")
        .values("sequence", "kind", "text", "error", "runner_index", "tool_name", "success")
    )


@sync_to_async
def runs_of_root(root_run_id: str) -> list[Run]:
    root = Run.objects.get(run_id=root_run_id)
    return [root] + list(Run.objects.filter(root=root).select_related("parent", "session__parent"))


async def read_until(host_or_client, parent_run_id, ext, gen, child_id, predicate, timeout=20):
    """child.read (as the parent) until ``predicate(result, events)``; returns both."""
    client = host_or_client
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    events, after = [], 0
    while True:
        result = await client.child_read(parent_run_id, ext, gen, child_id, after=after)
        events.extend(result.events)
        after = result.last_sequence or after
        if predicate(result, events):
            return result, events
        if loop.time() > deadline:
            raise AssertionError(f"timed out; events so far: {[e.raw for e in events]}")
        await asyncio.sleep(0.1)


# --- a scripted tree ----------------------------------------------------------------------


async def test_it_stores_a_scripted_tree_and_refuses_the_branch_beyond_max_depth(
    daphne_factory,
):
    server = daphne_factory(DELEGATION_MAX_DEPTH=2)
    token = await new_token("scripted-a")
    engine = ScriptedEngine(
        ScriptedConfig(seed=7, pace=0.01, steps=1, fanout=2, depth=3, tool_fail_rate=0.5, poll=0.05)
    )
    async with RunnerHost(server.ws_url, token, engine, client_options=FAST) as host:
        root = await host.open_root(engine.root_message("t1"), profile="planner")
        await host.wait(root.run_id, timeout=90)

    runs = await runs_of_root(root.run_id)
    by_depth = {level: [r for r in runs if r.depth == level] for level in range(4)}
    assert [len(by_depth[level]) for level in range(4)] == [1, 2, 4, 0]
    top = by_depth[0][0]
    assert top.parent is None and top.run_id == root.run_id
    for run in by_depth[1]:
        assert run.parent_id == top.pk and run.session.parent_id == top.session_id
    for run in by_depth[2]:
        assert run.parent in by_depth[1] and run.session.parent_id == run.parent.session_id
    assert all(r.status == RunStatus.SUCCEEDED for r in runs), [
        (r.depth, r.status, r.error) for r in runs
    ]
    tool_outcomes = set()
    for run in runs:
        events = await stored(run.run_id)
        # The server numbers every stream from 1 without gaps.
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        kinds = [e["kind"] for e in events]
        assert kinds[0] == "thinking" and kinds[-1] == "result"
        assert {"text", "tool-use", "tool-result", "usage"} <= set(kinds)
        tool_outcomes |= {e["success"] for e in events if e["kind"] == "tool-result"}
        refusals = [e for e in events if e["kind"] == "delegation-refused"]
        if run.depth == 2:
            # The cap holds: each level-2 run tried once, was refused, and did the work itself.
            assert len(refusals) == 1, kinds
            assert "level 2 may not spawn (max 2)" in refusals[0]["text"]
            assert refusals[0]["runner_index"] is None  # the server's own event
            after = events[events.index(refusals[0]) + 1 :]
            assert any(
                e["kind"] == "text" and e["text"].startswith("Delegation refused") for e in after
            )
            assert run.refused_spawns == 1
        else:
            assert refusals == []
    assert tool_outcomes == {True, False}


# --- the command engine -------------------------------------------------------------------


def command_engine(workspace: Path) -> CommandEngine:
    agent = [sys.executable, str(AGENT)]
    return CommandEngine(
        [
            # Unsandboxed: the stub's pids are checked on the host.
            CommandPreset(
                "echo", agent + ["{message}"], system_prompt="Echo things.", sandbox="none"
            ),
            CommandPreset("stubborn", agent + ["stubborn"], cancel_grace=0.5, sandbox="none"),
        ],
        str(workspace),
    )


def first_text(events, prefix):
    return next(e.text for e in events if e.kind == "text" and (e.text or "").startswith(prefix))


async def test_it_runs_command_children_with_depth_steer_cancel_and_exit_status(
    daphne_server, tmp_path, monkeypatch
):
    token = await new_token("command-a")
    monkeypatch.setenv("CANOPY_RUNNER_TOKEN", token)  # must not reach the agent
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "escape").symlink_to("/")
    engine = command_engine(tmp_path)
    host = RunnerHost(
        daphne_server.ws_url,
        token,
        engine,
        extension_id="cmd",
        workspace=str(tmp_path),
        client_options=FAST,
    )
    ext, gen = host.extension_id, host.generation
    c = host.client

    numbers = iter(range(1, 100))

    async def start(message, profile="echo", **request):
        request = {
            "requestId": f"req-{next(numbers)}",
            "profile": profile,
            "message": message,
            **request,
        }
        return await c.child_start("root-run", ext, gen, request)

    async with host:
        # The root runs at level 1, so its children run at level 2.
        root = await c.open_run("root-conv", "root-run", depth=1)
        assert root.depth == 1

        steerable = await start("steerable", cwd="sub")
        assert steerable.depth == 2
        _, events = await read_until(
            c,
            "root-run",
            ext,
            gen,
            steerable.child_id,
            lambda r, ev: any(e.kind == "tool-result" for e in ev),
        )
        hello = first_text(events, "pid=")
        pid = int(hello.split()[0].removeprefix("pid="))
        assert f"depth=2 cwd={tmp_path.resolve() / 'sub'} token=-" == hello.split(" ", 1)[1]
        assert any(e.kind == "text" and e.text == "a plain line from the agent" for e in events)
        tool = next(e for e in events if e.kind == "tool-use")
        assert (tool.tool_name, tool.tool_call_id, tool.input) == (
            "grep",
            "t1",
            {"pattern": "TODO"},
        )

        outcome = await c.child_steer(
            "root-run", ext, gen, steerable.child_id, "turn left", request_id="s1"
        )
        assert outcome.injected
        await read_until(
            c,
            "root-run",
            ext,
            gen,
            steerable.child_id,
            lambda r, ev: any(e.text == "steered: turn left" for e in ev),
        )
        await c.child_steer("root-run", ext, gen, steerable.child_id, "finish", request_id="s2")
        finished, events = await read_until(
            c, "root-run", ext, gen, steerable.child_id, lambda r, ev: r.done
        )
        assert finished.status == "succeeded" and finished.output == "all done"
        assert not pid_alive(pid)
        # The server recorded the steers in the child's stream, in order with its events.
        steers = [e.text for e in finished.events or events if e.kind == "steer"]
        all_events = (await c.child_read("root-run", ext, gen, steerable.child_id)).events
        assert [e.text for e in all_events if e.kind == "steer"] == ["turn left", "finish"]
        del steers

        # A cancel ends the process (SIGTERM), and the run ends cancelled.
        doomed = await start("steerable")
        _, events = await read_until(
            c,
            "root-run",
            ext,
            gen,
            doomed.child_id,
            lambda r, ev: any(e.kind == "tool-result" for e in ev),
        )
        pid = int(first_text(events, "pid=").split()[0].removeprefix("pid="))
        assert pid_alive(pid)
        cancel_sent = time.monotonic()
        await c.child_cancel("root-run", ext, gen, doomed.child_id)
        result, _ = await read_until(c, "root-run", ext, gen, doomed.child_id, lambda r, ev: r.done)
        assert result.cancelled and result.status == "cancelled"
        assert not pid_alive(pid)
        assert time.monotonic() - cancel_sent < 5

        # One that ignores SIGTERM is killed after the grace period.
        stubborn = await start("x", profile="stubborn")
        _, events = await read_until(
            c,
            "root-run",
            ext,
            gen,
            stubborn.child_id,
            lambda r, ev: any(e.kind == "tool-result" for e in ev),
        )
        pid = int(first_text(events, "pid=").split()[0].removeprefix("pid="))
        cancel_sent = time.monotonic()
        await c.child_cancel("root-run", ext, gen, stubborn.child_id)
        result, events = await read_until(
            c, "root-run", ext, gen, stubborn.child_id, lambda r, ev: r.done
        )
        # It got SIGTERM and lived on to say so; only the SIGKILL after the grace ended it.
        assert any(e.kind == "text" and e.text == "ignored SIGTERM" for e in events), events
        assert result.cancelled and not pid_alive(pid)
        assert time.monotonic() - cancel_sent >= 0.5  # a lower bound: load cannot break it

        # A non-zero exit becomes the run's error; stderr lines are error events.
        failing = await start("fail")
        result, events = await read_until(
            c, "root-run", ext, gen, failing.child_id, lambda r, ev: r.done
        )
        assert result.status == "failed"
        assert result.error == "exit status 3: something broke"
        assert any(e.kind == "error" and e.error == "something broke" for e in events)

        # A cwd that resolves outside the workspace through a symlink is refused by the
        # runner, so the child fails without running anything.
        escaping = await start("steerable", cwd="sub/escape")
        result, events = await read_until(
            c, "root-run", ext, gen, escaping.child_id, lambda r, ev: r.done
        )
        assert result.status == "failed" and "outside the workspace" in result.error
        assert not any(e.kind == "text" for e in events)
        await c.finish("root-run", output="ok")


# --- reconnect ----------------------------------------------------------------------------


async def test_it_reconnects_after_a_server_restart_and_stores_every_event_once_in_order(
    daphne_factory,
):
    daphne_server = daphne_factory()  # its own: this test restarts it
    token = await new_token("restart-a")
    total = 240
    client = RunnerClient(
        daphne_server.ws_url,
        token,
        host_instance_id="host-r",
        extensions=[Extension("ext", 1, [Preset("worker")])],
        depth=None,
        **FAST,
    )
    async with client:
        await client.open_run("conv-restart", "run-restart")
        stream = client.stream("run-restart")
        reached = {60: asyncio.Event(), 150: asyncio.Event()}

        async def produce():
            for i in range(total):
                await stream.emit(event("text", f"event {i}"))
                if i in reached:
                    reached[i].set()
                await asyncio.sleep(0.002)

        producing = asyncio.create_task(produce())

        async def until(index):
            # Fails with the producer's own error rather than hanging if it died.
            waiter = asyncio.create_task(reached[index].wait())
            await asyncio.wait([waiter, producing], timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if producing.done():
                producing.result()
            assert reached[index].is_set(), f"no progress to event {index}"

        await until(60)
        # A crash: no close frame, frames in flight are lost.
        await asyncio.to_thread(daphne_server.restart, True, 0.5)
        await until(150)
        # A clean stop this time.
        await asyncio.to_thread(daphne_server.restart, False, 0.5)
        await asyncio.wait_for(producing, 90)
        await stream.finish(output="done")
        assert client.connections == 3

    events = await stored("run-restart")
    assert [e["text"] for e in events] == [f"event {i}" for i in range(total)]
    assert [e["sequence"] for e in events] == list(range(1, total + 1))
    assert [e["runner_index"] for e in events] == list(range(1, total + 1))
    run = await sync_to_async(Run.objects.get)(run_id="run-restart")
    assert (run.emitted, run.status, run.output) == (total, RunStatus.SUCCEEDED, "done")


# --- ownership ----------------------------------------------------------------------------


async def test_it_keeps_a_second_runner_away_from_the_first_runners_children(daphne_server):
    token_a, token_b = await new_token("owner-a"), await new_token("intruder-b")
    extensions = [Extension("ext", 1, [Preset("worker")])]
    a = RunnerClient(daphne_server.ws_url, token_a, extensions=extensions, depth=None, **FAST)
    b = RunnerClient(daphne_server.ws_url, token_b, extensions=extensions, depth=None, **FAST)
    executed = asyncio.Event()

    @a.on("child.execute")
    async def accept(params, client):
        executed.set()  # accepted and left running, so it can be steered and cancelled
        return {}

    @a.on("run.steer")
    async def steered(params, client):
        return {"outcome": "injected"}

    async with a, b:
        await a.open_run("conv-a", "run-a")
        child = await a.child_start(
            "run-a", "ext", 1, {"requestId": "q1", "profile": "worker", "message": "stay"}
        )
        await asyncio.wait_for(executed.wait(), 10)
        await b.open_run("conv-b", "run-b")

        attempts = {
            "read": b.child_read("run-b", "ext", 1, child.child_id),
            "steer": b.child_steer("run-b", "ext", 1, child.child_id, "obey me", request_id="x"),
            "cancel": b.child_cancel("run-b", "ext", 1, child.child_id),
            "read by run id": b.child_read(
                "run-b", "ext", 1, child.child_id, child_run_id=child.run_id
            ),
        }
        for what, attempt in attempts.items():
            with pytest.raises(sdk.NotOwned) as refused:
                await attempt
            assert refused.value.code == -32003, what
        # Naming the first runner's run as its own parent is no way in either.
        with pytest.raises(sdk.NoSuchRun):
            await b.child_read("run-a", "ext", 1, child.child_id)
        with pytest.raises(sdk.NoSuchRun):
            await b.emit("run-a", event("text", "hijack"))

        # Nothing changed for the owner.
        seen = await a.child_read("run-a", "ext", 1, child.child_id)
        assert seen.status == "running" and not seen.cancelled
        assert [e.kind for e in seen.events] == []
        assert (await a.child_steer("run-a", "ext", 1, child.child_id, "hi")).injected
        await a.finish("run-a")


# --- the command line ---------------------------------------------------------------------


def run_cli(args, env, timeout=90):
    return subprocess.run(
        [sys.executable, "manage.py", "runner", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def test_it_runs_the_runner_command_line_to_a_refused_branch(daphne_factory):
    server = daphne_factory(DELEGATION_MAX_DEPTH=1)
    token = await new_token("cli-a")
    env = {**os.environ, "CANOPY_RUNNER_TOKEN": token}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    done = await asyncio.to_thread(
        run_cli,
        [
            "--url",
            server.ws_url,
            "--engine",
            "scripted",
            "--max-depth",
            "1",
            "--fanout",
            "1",
            "--pace",
            "0.01",
            "--steps",
            "1",
            "--root",
            "cli task",
            "--once",
            "--extension-id",
            "cli-ext",
        ],
        env,
    )
    assert done.returncode == 0, done.stderr
    runs = await sync_to_async(list)(
        Run.objects.order_by("depth").values_list(
            "depth", "status", "refused_spawns", "extension_id"
        )
    )
    assert runs == [(0, "succeeded", 0, "cli-ext"), (1, "succeeded", 1, "cli-ext")]
    # The root keeps the task it was opened with (--root): its name on every page.
    root = await sync_to_async(Run.objects.get)(depth=0)
    assert (root.task, root.request) == ("cli task", {"message": "cli task"})


async def test_it_exits_with_a_clear_error_on_a_bad_token(daphne_server):
    env = {**os.environ, "CANOPY_RUNNER_TOKEN": "cnr_not-a-token"}
    done = await asyncio.to_thread(run_cli, ["--url", daphne_server.ws_url], env, 60)
    assert done.returncode == 2
    assert "runner token refused" in done.stderr or "handshake refused" in done.stderr


# --- the scripted engine's steer, cancel and failure --------------------------------------


@sync_to_async
def children_of(run_id: str) -> list[tuple[str, str]]:
    return list(
        Run.objects.filter(parent__run_id=run_id)
        .order_by("created_at", "id")
        .values_list("session__conversation_id", "run_id")
    )


async def test_it_steers_and_cancels_a_long_running_scripted_child(daphne_server):
    token = await new_token("scripted-steer")
    engine = ScriptedEngine(
        ScriptedConfig(pace=0.05, steps=1, fanout=2, depth=1, long_rate=1.0, long_seconds=60)
    )
    async with RunnerHost(daphne_server.ws_url, token, engine, client_options=FAST) as host:
        c, ext, gen = host.client, host.extension_id, host.generation
        root = await host.open_root(engine.root_message("steer"), profile="planner")
        async with asyncio.timeout(20):
            while len(kids := await children_of(root.run_id)) < 2:
                await asyncio.sleep(0.1)
        (first, first_run), (second, _) = kids
        # Once it is in its long phase it says nothing for seconds unless steered, so the
        # steer's effect is the very next text of its stream.
        await read_until(
            c,
            root.run_id,
            ext,
            gen,
            first,
            lambda r, ev: any("take a while" in (e.text or "") for e in ev),
        )

        outcome = await c.child_steer(root.run_id, ext, gen, first, "focus on the parser")
        assert outcome.injected
        _, events = await read_until(
            c,
            root.run_id,
            ext,
            gen,
            first,
            lambda r, ev: any('I was told "focus on the parser"' in (e.text or "") for e in ev),
        )
        steer_at = next(i for i, e in enumerate(events) if e.kind == "steer")
        told_at = next(i for i, e in enumerate(events) if "I was told" in (e.text or ""))
        assert steer_at < told_at  # the steer event is stored, then the run's next text says it
        # ...and it is the run's next text after the steer.
        assert [e for e in events[steer_at:told_at] if e.kind == "text"] == []

        cancel_sent = time.monotonic()
        await c.child_cancel(root.run_id, ext, gen, second)
        result, _ = await read_until(
            c, root.run_id, ext, gen, second, lambda r, ev: r.done, timeout=30
        )
        assert result.cancelled and result.status == "cancelled"
        # The runner reacts at once, not when the 60 s child would end; wide for a loaded machine.
        assert time.monotonic() - cancel_sent < 30

        # Cancelling the root locally finishes it cancelled; the server then cancels its
        # still-running child, which the runner confirms.
        host.cancel(root.run_id, "operator went home")
        await host.wait(root.run_id, timeout=5)
        async with asyncio.timeout(5):
            while True:
                run = await sync_to_async(Run.objects.get)(run_id=first_run)
                if run.done:
                    break
                await asyncio.sleep(0.1)
        assert run.status == RunStatus.CANCELLED
    root_run = await sync_to_async(Run.objects.get)(run_id=root.run_id)
    assert root_run.status == RunStatus.CANCELLED and root_run.cancelled


async def test_it_fails_scripted_children_by_configuration(daphne_server):
    token = await new_token("scripted-fail")
    engine = ScriptedEngine(
        ScriptedConfig(pace=0.01, steps=1, fanout=2, depth=1, fail_rate=1.0, poll=0.05)
    )
    async with RunnerHost(daphne_server.ws_url, token, engine, client_options=FAST) as host:
        root = await host.open_root(engine.root_message("fail"), profile="planner")
        await host.wait(root.run_id, timeout=30)
    runs = await runs_of_root(root.run_id)
    children = [r for r in runs if r.depth == 1]
    assert len(children) == 2
    for child in children:
        assert child.status == RunStatus.FAILED and "simulated failure" in child.error
        kinds = [e["kind"] for e in await stored(child.run_id)]
        assert kinds[-1] == "error" and "result" not in kinds
    # The parent saw the failures and still finished its own work.
    top = runs[0]
    assert top.status == RunStatus.SUCCEEDED and "failed" in top.output
    delegate = [
        e
        for e in await stored(top.run_id)
        if e["kind"] == "tool-result" and e["tool_name"] == "delegate"
    ]
    assert [e["success"] for e in delegate] == [False]


# --- make run: the demo command -----------------------------------------------------------


def demo_env(**extra) -> dict:
    env = {**os.environ, "DATABASE_URL": live_server.database_url(), **extra}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    return env


def test_it_prepares_the_demo_operator_and_a_fresh_runner_token():
    from django.contrib.auth import authenticate

    from delegation import roles

    def prepare():
        done = subprocess.run(
            [sys.executable, "manage.py", "demo", "--no-serve", "--print-token"],
            cwd=BASE_DIR,
            env=demo_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        password = next(line.split()[2] for line in lines if "password" in line)
        return password, lines[-1].strip()

    password, token = prepare()
    user = authenticate(username="demo", password=password)
    assert user is not None and user.is_staff and roles.role_of(user) == roles.ADMIN
    assert tokens.authenticate_runner(token).name == "demo-runner"
    # Run again: a new password and a rotated token; the old ones stop working.
    password2, token2 = prepare()
    assert password2 != password and token2 != token
    assert authenticate(username="demo", password=password) is None
    assert tokens.authenticate_runner(token) is None
    assert tokens.authenticate_runner(token2).name == "demo-runner"


def test_it_serves_a_growing_demo_tree_and_stops_cleanly_on_ctrl_c():
    port = live_server.free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "demo",
            "--port",
            str(port),
            "--interval",
            "1",
            "--seed",
            "3",
        ],
        cwd=BASE_DIR,
        env=demo_env(DELEGATION_MAX_DEPTH="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            roots = Run.objects.filter(parent=None).count()
            refused = Event.objects.filter(kind="delegation-refused").count()
            if roots >= 2 and refused >= 1:
                break
            assert process.poll() is None, process.stdout.read()
            time.sleep(0.5)
        else:
            raise AssertionError("no growing tree with a refused branch within 60s")
        assert Run.objects.filter(depth=1).exists()
        process.send_signal(subprocess.signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    assert "password" in output and "Stopping the demo runner" in output
    # The sign-in block comes once the server answers, after whatever its start printed
    # (issue 38: the install's output scrolled the one-time password away).
    assert output.count("password  :") == 1
    assert output.index("Serving on") < output.index("password  :")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    # The runner stopped first and reported its runs cancelled instead of leaving them open.
    assert not Run.objects.filter(status=RunStatus.RUNNING).exists()


# --- the README's shell agent -------------------------------------------------------------


def doc_block(language: str, starts_with: str, page: str = "connect-a-cli-agent.md") -> str:
    """A code block of a how-to page (default: connecting a CLI agent), as shown there."""
    text = (BASE_DIR / "docs" / "how-to" / page).read_text()
    for block in text.split(f"```{language}\n")[1:]:
        body = block.split("```", 1)[0]
        if body.startswith(starts_with):
            return body
    raise AssertionError(f"no ```{language} block starting with {starts_with!r}")


async def test_it_connects_the_documented_shell_agent_through_the_command_engine(
    daphne_factory, tmp_path
):
    server = daphne_factory(OUTBOX_RESEND_SECONDS="0.2")
    token = await new_token("shell-runner")
    # The presets file and the agent exactly as the documentation shows them.
    config_dir, workspace = tmp_path / "config", tmp_path / "workspace"
    (config_dir / "agents").mkdir(parents=True)
    (workspace / "repos").mkdir(parents=True)
    (config_dir / "presets.json").write_text(doc_block("json", "{"))
    script = config_dir / "agents" / "review.sh"
    script.write_text(doc_block("sh", "#!/bin/sh"))
    script.chmod(0o755)
    env = {**os.environ, "CANOPY_RUNNER_TOKEN": token}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    runner = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "runner",
            "--url",
            server.ws_url,
            "--engine",
            "command",
            "--config",
            str(config_dir / "presets.json"),
            "--workspace",
            str(workspace),
            "--root",
            "PR 12",
            "--root-profile",
            "reviewer",
            "--once",
        ],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        async with asyncio.timeout(30):
            while not (run := await sync_to_async(Run.objects.filter(parent=None).first)()):
                await asyncio.sleep(0.1)
            while "looking at: PR 12" not in [e["text"] for e in await stored(run.run_id)]:
                assert runner.poll() is None, runner.stdout.read()
                await asyncio.sleep(0.1)
        # An operator steers it: the line reaches the script's stdin.
        actor = run_actions.Actor.system("test-operator")
        for number, message in enumerate(["be nice", "done"]):
            answer = await sync_to_async(run_actions.do_steer_run)(
                actor, run, request_id=f"op-{number}", message=message
            )
            assert answer == {"outcome": "injected"}
        code = await asyncio.wait_for(asyncio.to_thread(runner.wait), 30)
        output = runner.stdout.read()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert code == 0, output
    run = await sync_to_async(Run.objects.get)(pk=run.pk)
    assert (run.status, run.output, run.extension_id) == ("succeeded", "LGTM", "shell-agents")
    texts = [(e["kind"], e["text"]) for e in await stored(run.run_id)]
    assert ("thinking", "reviewing at level 0") in texts
    assert ("text", "operator says: be nice") in texts
    assert ("text", "operator says: done") in texts


async def test_it_runs_the_documented_sdk_example(daphne_server, tmp_path):
    token = await new_token("sdk-example")
    source = doc_block("python", "import asyncio", page="write-your-own-host.md")
    source = source.replace("ws://127.0.0.1:8000/ws/runner/", daphne_server.ws_url)
    source = source.replace('token="cnr_..."', f"token={token!r}")
    script = tmp_path / "example.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(BASE_DIR)}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    run = await sync_to_async(Run.objects.select_related("session").get)(run_id="run-1")
    assert (run.status, run.output) == ("succeeded", "done")
    texts = [e["text"] for e in await stored("run-1")]
    assert "child said: found 3 sources" in texts
    child = await sync_to_async(Run.objects.get)(parent=run)
    assert (child.depth, child.status, child.output) == (1, "succeeded", "found 3 sources")


async def test_it_finishes_a_scripted_tree_across_a_server_crash(daphne_factory):
    server = daphne_factory(DELEGATION_MAX_DEPTH=2)
    token = await new_token("scripted-crash")
    engine = ScriptedEngine(ScriptedConfig(seed=5, pace=0.1, steps=2, fanout=2, depth=2, poll=0.1))
    async with RunnerHost(server.ws_url, token, engine, client_options=FAST) as host:
        root = await host.open_root(engine.root_message("crash"), profile="planner")
        async with asyncio.timeout(30):
            while len(await sync_to_async(list)(Run.objects.filter(depth=2))) < 2:
                await asyncio.sleep(0.1)
        await asyncio.to_thread(server.restart, True, 0.5)
        await host.wait(root.run_id, timeout=90)
        assert host.client.connections == 2
    runs = await runs_of_root(root.run_id)
    assert sorted(r.depth for r in runs) == [0, 1, 1, 2, 2, 2, 2]
    assert all(r.status == RunStatus.SUCCEEDED for r in runs), [
        (r.depth, r.status, r.error) for r in runs
    ]
    for run in runs:
        events = await stored(run.run_id)
        indexes = [e["runner_index"] for e in events if e["runner_index"] is not None]
        assert indexes == list(range(1, len(indexes) + 1))  # every runner event once, in order
        assert events[-1]["kind"] == "result"


@pytest.mark.django_db  # in-process: the command runs in this test's transaction
def test_it_accepts_a_demo_password_that_starts_with_a_dash(monkeypatch):
    import io

    from django.contrib.auth import authenticate
    from django.core.management import call_command

    from delegation.management.commands import demo

    monkeypatch.setattr(demo.secrets, "token_urlsafe", lambda n: "-starts-with-a-dash")
    out = io.StringIO()
    call_command("demo", "--no-serve", stdout=out)
    assert "-starts-with-a-dash" in out.getvalue()
    assert authenticate(username="demo", password="-starts-with-a-dash") is not None
