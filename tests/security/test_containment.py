"""Issue 21: agents are contained by default, and no agent reads a secret it was not given.

Every test runs the real runner command line (``manage.py runner``, as root on CI) against a
real daphne server, with agents that attack: a probe that tries to gain capabilities and
remount its read-only binds, and a hunter that scans ``/proc/*/environ``, ``/proc/*/cmdline``,
``/proc/<ppid>/mem``, ``/tmp`` and the server's data directory for the runner's token, any
other run token and the server's SECRET_KEY while sibling children hold live run tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from delegation.models import Event, Run, RunToken, hash_token
from delegation.runner.acp import AcpPreset
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.support.paths import AGENTS
from tests.support.paths import PROJECT as BASE_DIR
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_connections"),
]
# The interpreter itself, not a virtualenv's link to it (the sandbox binds its prefix).
PYTHON = os.path.realpath(sys.executable)
SYSTEM_PYTHON = "/usr/bin/python3"
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not ROOT or not os.path.exists(SYSTEM_PYTHON),
    reason="another account for the agent needs a root runner and a system python",
)


def runner_env(**extra) -> dict:
    env = {**os.environ, **extra}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    return env


def run_runner(
    server, config: Path, workspace: Path, roots: list[str], env, *extra, wrap=()
) -> str:
    args = [*wrap, sys.executable, "manage.py", "runner", "--url", server.ws_url]
    args += ["--engine", "command"]
    args += ["--config", str(config), "--workspace", str(workspace), "--once", *extra]
    for message in roots:
        args += ["--root", message]
    done = subprocess.run(args, cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


class Place:
    """A workspace, a directory outside it and a private one, under ``base``."""

    def __init__(self, base: Path, *, shared: bool):
        self.base = base
        self.workspace, self.outside, self.private = base / "ws", base / "outside", base / "private"
        for path in (self.workspace, self.outside, self.private):
            path.mkdir()
        if shared:  # another account's agent must reach the workspace and its scripts
            for path in (base, self.workspace, self.outside):
                path.chmod(0o755)
        self.private.chmod(0o700)
        self.config = base / "presets.json"

    def presets(self, *presets: dict) -> Path:
        self.config.write_text(json.dumps({"presets": list(presets)}))
        return self.config


@pytest.fixture
def place(tmp_path):
    return Place(tmp_path, shared=False)


@pytest.fixture
def shared_place():
    # Under /tmp, not pytest's owner-only directory: the agent's account must reach its files.
    base = Path(tempfile.mkdtemp(prefix="canopy-containment-"))
    try:
        yield Place(base, shared=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@sync_to_async
def finished() -> tuple[Run, list[Run]]:
    """The top-level run that did the work, and its siblings (the runs that held tokens)."""
    runs = list(Run.objects.filter(parent=None))
    for run in runs:
        assert run.status == "succeeded", (run.status, run.error)
    held = [run for run in runs if run.output == "held"]
    worker = [run for run in runs if run.output != "held"]
    assert len(worker) == 1, [(run.run_id, run.output[:100]) for run in runs]
    return worker[0], held


# --- the probe: capabilities, uid and read-only binds ------------------------------------


async def test_it_holds_a_default_preset_agent_in_a_sandbox_it_cannot_remount(daphne_server, place):
    _runner, token = await sync_to_async(tokens.create_runner)("probed")
    # readOnly under /tmp (pytest's tmp_path is there): visible inside the sandbox's own /tmp.
    ro = place.base / "ro"
    ro.mkdir()
    (ro / "victim").write_text("original\n")
    shutil.copy(AGENTS / "sandbox_probe.py", place.workspace / "probe.py")
    config = place.presets(
        {
            "name": "probe",  # no "sandbox": the default contains the agent
            "command": [PYTHON, "-I", "probe.py", str(ro), str(place.outside)],
            "readOnly": [str(ro)],
        }
    )
    await asyncio.to_thread(
        run_runner,
        daphne_server,
        config,
        place.workspace,
        ["probe"],
        runner_env(CANOPY_RUNNER_TOKEN=token),
        "--root-profile",
        "probe",
    )
    report = json.loads((await finished())[0].output)
    assert report["uid"] != 0 and report["gid"] != 0, report
    assert int(report["capEff"], 16) == 0 and int(report["capPrm"], 16) == 0, report
    assert report["noNewPrivs"] == "1", report
    assert all(result != "ok" for result in report["remount"].values()), report["remount"]
    assert report["readVictim"] and not report["wroteVictim"], report
    assert (ro / "victim").read_text() == "original\n"
    assert not (report["wroteEtc"] or report["wroteUsr"] or report["readShadow"]), report
    assert not os.path.exists("/etc/canopy-probe") and not os.path.exists("/usr/canopy-probe")
    # Its own processes only: the runner and the server are not there to read.
    assert len(report["pids"]) <= 3, report["pids"]
    assert report["wroteWorkspace"] and report["wroteHome"] and report["wroteTmp"], report
    assert not report["wroteOutside"] and not (place.outside / "planted").exists()
    assert (place.workspace / "probe.txt").exists()
    # No setuid/setgid file (it would be root's on the host) is left for a local user to run.
    assert report["setuid"] == {
        "chmod": "Operation not permitted",
        "create": "Operation not permitted",
    }
    for path in place.workspace.iterdir():
        assert not path.stat().st_mode & 0o6000, path
    # The private /tmp held nothing of the host's (the pytest directories, other children).
    assert set(report["tmp"]) <= {"probe.txt", place.base.parts[2]}, report["tmp"]


# --- the hunter ------------------------------------------------------------------------


# This server's own key (the suite's is in pyproject.toml, so any copy of that file is a find).
SERVER_KEY = secrets.token_urlsafe(50)
KEY_SHA256 = hashlib.sha256(SERVER_KEY.encode()).hexdigest()


@pytest.fixture
def server(daphne_factory):
    return daphne_factory(SECRET_KEY=SERVER_KEY)


def hunter_preset(place: Place, python: str, **extra) -> dict:
    shutil.copy(AGENTS / "token_hunter.py", place.workspace / "hunter.py")
    (place.workspace / "hunter.py").chmod(0o644)
    key = KEY_SHA256
    command = [python, "-I", str(place.workspace / "hunter.py")]
    command += [str(place.private / "runner.token"), str(place.outside)]
    command += ["--mcp-config", "{mcpConfig}", "--role", "{message}"]
    command += ["--data-dir", str(settings.DATA_DIR), "--key-sha256", key, "--memory"]
    return {"name": "hunter", "command": command, **extra}


async def hunt(server, place: Place, preset: dict, name: str, wrap=()) -> tuple[dict, dict, str]:
    """Two siblings hold live run tokens while the hunter hunts; returns the hunter's report,
    what it found (by secret) and the runner's log."""
    _runner, token = await sync_to_async(tokens.create_runner)(name)
    token_file = place.private / "runner.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    config = place.presets(preset)
    stderr = await asyncio.to_thread(
        run_runner,
        server,
        config,
        place.workspace,
        ["hold", "hold", "hunt"],
        # The token in the runner's initial environment, the way most operators pass it.
        runner_env(CANOPY_RUNNER_TOKEN=token),
        "--root-profile",
        "hunter",
        wrap=wrap,
    )
    hunter, held = await finished()
    report = json.loads(hunter.output)

    @sync_to_async
    def siblings() -> set[str]:
        return set(RunToken.objects.filter(run__in=held).values_list("token_hash", flat=True))

    sibling_hashes = await siblings()
    assert len(sibling_hashes) == 2
    key = KEY_SHA256
    hits = report["hits"]
    found = {
        "runner token": hits.get(hash_token(token), []),
        "sibling run tokens": sorted({w for h in sibling_hashes for w in hits.get(h, [])}),
        "SECRET_KEY": hits.get(key, []),
    }
    assert report["ownTokens"] == 1, report  # it did get its own token, and only that
    return report, found, stderr


async def test_it_keeps_every_secret_from_a_hunter_under_the_default_preset(server, place):
    report, found, stderr = await hunt(
        server, place, hunter_preset(place, PYTHON), "hunted-default"
    )
    assert found == {"runner token": [], "sibling run tokens": [], "SECRET_KEY": []}, found
    # Its parent is the sandbox's own init, not the runner; the runner's token file, the data
    # directory and the rest of the host are not there.
    assert report["ppid"] == 1 and report["procEntries"] <= 6, report
    assert not report["readTokenFile"] and not report["dataDirVisible"], report
    assert not report["wroteOutside"], report
    assert "without a sandbox" not in stderr


@needs_root
async def test_it_keeps_two_children_of_one_account_apart(server, shared_place):
    # Both siblings and the hunter run as one account ("user": "nobody"), in the default
    # sandbox: neither reads the other's run token.
    preset = hunter_preset(shared_place, SYSTEM_PYTHON, user="nobody")
    report, found, _ = await hunt(server, shared_place, preset, "hunted-nobody")
    assert found == {"runner token": [], "sibling run tokens": [], "SECRET_KEY": []}, found
    assert report["uid"] == 65534 and not report["dataDirVisible"], report


@needs_root
async def test_it_warns_of_an_unsandboxed_preset_whose_agent_reads_what_root_reads(server, place):
    # The hunter's positive control: run as root without a sandbox it finds every secret,
    # and the runner said so at start.
    preset = hunter_preset(place, PYTHON, sandbox="none")
    report, found, stderr = await hunt(server, place, preset, "hunted-bare")
    assert "preset 'hunter' runs its agent without a sandbox, as 'root'" in stderr, stderr
    assert stderr.count("runs its agent without a sandbox") == 1
    assert found["sibling run tokens"] and found["SECRET_KEY"], found
    assert found["runner token"] and report["readParentMemory"], found


@needs_root
async def test_it_keeps_the_server_from_an_unsandboxed_agent_of_another_account(
    server, shared_place
):
    # "sandbox": "none" as "nobody": the data directory (0700) and the root processes stay
    # closed; siblings of the same account are not separated (the runner's warning says so).
    preset = hunter_preset(shared_place, SYSTEM_PYTHON, user="nobody", sandbox="none")
    report, found, stderr = await hunt(server, shared_place, preset, "hunted-bare-nobody")
    assert found["runner token"] == [] and found["SECRET_KEY"] == [], found
    # It sees the directory (and reads nothing in it) unless the checkout itself sits under
    # a directory only its owner may enter, as a CI clone in a mkdtemp does.
    reachable = all(os.stat(p).st_mode & 0o001 for p in Path(settings.DATA_DIR).parents)
    assert report["dataDirVisible"] is reachable and report["dataFiles"] == 0, report
    assert "run tokens) of every other child running as 'nobody'" in stderr, stderr


async def test_it_hides_the_runner_memory_from_an_agent_of_its_own_account(server, place):
    # The runner and its unsandboxed agent under one account and without privileges (setpriv
    # drops root's capabilities from both), as for a runner of an ordinary account: the runner
    # is not dumpable, so its memory and environment (its token lives in memory after the
    # re-exec) are closed to the agent.
    preset = hunter_preset(place, PYTHON, sandbox="none")
    unprivileged = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"]
    report, found, _ = await hunt(server, place, preset, "hunted-same-account", wrap=unprivileged)
    assert report["readParentEnviron"] is False and report["readParentMemory"] == 0, report
    # Its account's own files stay readable to it (the token file): the warning says so.
    assert not [w for w in found["runner token"] if w.startswith("/proc/")], found


async def test_it_redacts_every_live_run_token_from_agent_output(daphne_server, place):
    # An unsandboxed agent prints every MCP configuration it can find under /tmp, its
    # siblings' included: no run token reaches an event or the run's output.
    _runner, token = await sync_to_async(tokens.create_runner)("leaky")
    leak = "sleep 3; cat /tmp/canopy-mcp-*/mcp.json"
    hold = "sleep 12; echo held"
    config = place.presets(
        {
            "name": "leaker",
            "command": ["/bin/sh", "-c", "case $1 in hold) " + hold + ";; *) " + leak + ";; esac"]
            + ["leaker", "{message}", "{mcpConfig}"],
            "sandbox": "none",
        }
    )
    await asyncio.to_thread(
        run_runner,
        daphne_server,
        config,
        place.workspace,
        ["hold", "leak"],
        runner_env(CANOPY_RUNNER_TOKEN=token),
        "--root-profile",
        "leaker",
    )
    run, _held = await finished()

    @sync_to_async
    def texts() -> list[str]:
        fields = ("text", "error", "input", "tool_output", "data")
        return [json.dumps(row) for row in Event.objects.filter(run=run).values(*fields)]

    printed = "\n".join(await texts()) + (run.output or "")
    assert printed.count("[run token]") >= 2, printed  # its own and its sibling's
    assert "cnt_" not in printed, printed


async def test_it_stops_a_sandboxed_agent_with_a_sigterm_the_agent_answers(daphne_server, place):
    # bwrap leads the agent's process group and takes its sandbox down with SIGKILL when it
    # is signalled itself: a cancel's SIGTERM must reach the agent, which may still clean up.
    _runner, token = await sync_to_async(tokens.create_runner)("polite")
    # Its clean-up takes a second: one SIGKILLed with its sandbox never says it is done.
    script = (
        "trap 'sleep 1; echo got SIGTERM; exit 0' TERM; echo ready; while :; do sleep 0.1; done"
    )
    engine = CommandEngine(
        [CommandPreset("polite", ["/bin/sh", "-c", script], cancel_grace=10.0)],
        str(place.workspace),
    )
    host = RunnerHost(
        daphne_server.ws_url, token, engine, extension_id="polite", client_options=FAST
    )

    @sync_to_async
    def texts(run_id: str) -> list[str]:
        return list(Event.objects.filter(run__run_id=run_id).values_list("text", flat=True))

    async with host:
        ctx = await host.open_root("wait for a cancel", profile="polite")
        for _ in range(200):
            if "ready" in await texts(ctx.run_id):
                break
            await asyncio.sleep(0.05)
        assert "ready" in await texts(ctx.run_id)
        started = asyncio.get_running_loop().time()
        host.cancel(ctx.run_id, "the test is done")
        await host.wait(ctx.run_id, timeout=30)
        stopped = asyncio.get_running_loop().time() - started
    assert "got SIGTERM" in await texts(ctx.run_id)
    assert stopped < 10.0  # it exited on the SIGTERM, not on the SIGKILL after the grace


def test_it_contains_both_engines_presets_unless_they_say_none():
    for preset_class in (CommandPreset, AcpPreset):
        assert preset_class.from_config({"name": "x", "command": ["a"]}).sandbox == "bwrap"
        chosen = preset_class.from_config(
            {
                "name": "x",
                "command": ["a"],
                "sandbox": "none",
                "user": "nobody",
                "readOnly": ["/opt"],
            }
        )
        assert (chosen.sandbox, chosen.user, chosen.read_only) == ("none", "nobody", ("/opt",))
        with pytest.raises(ValueError, match="'sandbox' must be one of bwrap, none"):
            preset_class.from_config({"name": "x", "command": ["a"], "sandbox": "docker"})
        with pytest.raises(ValueError, match="'network' 'none' needs a sandbox"):
            preset_class.from_config(
                {"name": "x", "command": ["a"], "sandbox": "none", "network": "none"}
            )


# --- the ACP engine's containment: the same sandbox and account --------------------------


@needs_root
@pytest.mark.parametrize(
    ("containment", "contained"), [({}, True), ({"sandbox": "none"}, False)], ids=["bwrap", "none"]
)
async def test_it_runs_an_acp_agent_as_the_presets_account(
    server, shared_place, containment, contained
):
    probe = shared_place.workspace / "acp_probe.py"
    shutil.copy(AGENTS / "acp_probe.py", probe)
    config = shared_place.presets(
        # Not "nobody": a root runner's sandbox already maps its agent to nobody's uid.
        {"name": "probe", "command": [SYSTEM_PYTHON, "-I", str(probe)], "user": "daemon"}
        | containment
    )
    _runner, token = await sync_to_async(tokens.create_runner)("acp-as-daemon")
    args = [sys.executable, "manage.py", "runner", "--url", server.ws_url, "--engine", "acp"]
    args += ["--config", str(config), "--workspace", str(shared_place.workspace)]
    args += ["--root", "who are you", "--root-profile", "probe", "--once"]
    done = await asyncio.to_thread(
        subprocess.run,
        args,
        cwd=BASE_DIR,
        env=runner_env(CANOPY_RUNNER_TOKEN=token),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run = await sync_to_async(Run.objects.get)(parent=None)
    assert run.status == "succeeded", (run.status, run.error)
    me = json.loads(run.output)
    assert me["uid"] == pwd.getpwnam("daemon").pw_uid and not me["environToken"], me
    # In the sandbox its own pid namespace; without one, a host pid and the runner's warning.
    assert (me["pid"] <= 3) is contained, me
    assert ("without a sandbox" in done.stderr) is not contained
