"""Finding 1 and 9: what an agent started by the command engine can reach.

A hostile agent runs through the real runner command line against a real daphne server and
hunts for the runner's token everywhere a process of the same user can look.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.services import tokens
from tests.support.paths import AGENTS
from tests.support.paths import PROJECT as BASE_DIR

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_connections"),
]

HUNTER = AGENTS / "token_hunter.py"
# The interpreter itself, not a virtualenv's link to it: a sandbox binds only its prefix.
PYTHON = os.path.realpath(sys.executable)
SERVER_SECRETS = {
    "SECRET_KEY": "server-secret-key-" + "k" * 40,
    "DATABASE_URL": "postgres://canopy:db-password-secret@127.0.0.1:1/nowhere",
}


def setup_hunt(
    tmp_path: Path, preset_extra: dict, python: str = PYTHON
) -> tuple[Path, Path, Path, Path]:
    workspace, outside, private = tmp_path / "ws", tmp_path / "outside", tmp_path / "private"
    for path in (workspace, outside, private):
        path.mkdir()
    shutil.copy(HUNTER, workspace / "hunter.py")  # inside: a sandbox sees only the workspace
    token_file = private / "runner.token"
    preset = {
        "name": "hunter",
        "command": [python, "-I", str(workspace / "hunter.py"), str(token_file), str(outside)],
        **preset_extra,
    }
    config = tmp_path / "presets.json"
    config.write_text(json.dumps({"presets": [preset]}))
    return workspace, outside, token_file, config


def run_runner(server, config: Path, workspace: Path, extra_args, env) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", "runner", "--url", server.ws_url, "--engine", "command"]
        + ["--config", str(config), "--workspace", str(workspace)]
        + ["--root", "hunt", "--root-profile", "hunter", "--once", *extra_args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


@sync_to_async
def hunt_report() -> dict:
    run = Run.objects.get(parent=None)
    assert run.status == "succeeded", (run.status, run.error)
    return json.loads(run.output)


def runner_env(**extra) -> dict:
    env = {**os.environ, **SERVER_SECRETS, **extra}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    return env


async def test_it_keeps_the_token_and_server_secrets_from_a_hostile_agent(daphne_server, tmp_path):
    _runner, token = await sync_to_async(tokens.create_runner)("hunted")
    # Unsandboxed: what reaches an agent's environment when nothing else contains it.
    workspace, _outside, token_file, config = setup_hunt(
        tmp_path, {"env": {"STYLE": "x"}, "sandbox": "none"}
    )
    # The token in the runner's initial environment, the way most operators will pass it.
    await asyncio.to_thread(
        run_runner, daphne_server, config, workspace, [], runner_env(CANOPY_RUNNER_TOKEN=token)
    )
    report = await hunt_report()
    # The hunt really looked: the runner's own environ was readable to it.
    assert report["readParentEnviron"] and report["procEntries"] > 2, report
    # Only this runner's token counts: other tokens on a shared machine are not its to hide.
    assert token not in json.dumps(report["found"]), report["found"]
    # Only the allow-list, the preset's env and the child's identity reach an agent.
    names = set(report["envNames"])
    assert not names & {"SECRET_KEY", "DATABASE_URL", "CANOPY_RUNNER_TOKEN"}, names
    allowed = {"PATH", "HOME", "LANG", "TERM", "STYLE", "PANDO_DELEGATION_DEPTH"}
    assert {n for n in names if not n.startswith("CANOPY_")} <= allowed, names


async def test_it_confines_a_bwrap_agent_to_the_workspace_away_from_the_token_file(
    daphne_server, tmp_path
):
    _runner, token = await sync_to_async(tokens.create_runner)("hunted-sandboxed")
    workspace, outside, token_file, config = setup_hunt(
        tmp_path, {"sandbox": "bwrap", "readOnly": [sys.base_prefix]}
    )
    token_file.write_text(token)
    token_file.chmod(0o600)
    await asyncio.to_thread(
        run_runner,
        daphne_server,
        config,
        workspace,
        ["--token-file", str(token_file)],
        runner_env(),
    )
    report = await hunt_report()
    assert report["found"] == {}, report["found"]
    assert not report["readTokenFile"] and not report["wroteOutside"], report
    assert not (outside / "planted").exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
    reason="switching to another account needs a root runner and a system python",
)
async def test_it_runs_a_user_preset_agent_unable_to_read_the_runner(daphne_server, tmp_path):
    _runner, token = await sync_to_async(tokens.create_runner)("hunted-as-nobody")
    # Under /tmp, not pytest's owner-only directory: the agent's account must reach its files.
    base = Path(tempfile.mkdtemp(prefix="canopy-user-preset-"))
    try:
        base.chmod(0o755)
        workspace, outside, token_file, config = setup_hunt(
            base, {"user": "nobody", "sandbox": "none"}, python="/usr/bin/python3"
        )
        for path in (workspace, outside):
            path.chmod(0o755)
        (base / "private").chmod(0o700)
        token_file.write_text(token)
        token_file.chmod(0o600)
        await asyncio.to_thread(
            run_runner,
            daphne_server,
            config,
            workspace,
            ["--token-file", str(token_file)],
            runner_env(CANOPY_RUNNER_TOKEN=token),
        )
        report = await hunt_report()
        assert token not in json.dumps(report["found"]), report["found"]
        assert not report["readParentEnviron"] and not report["readTokenFile"], report
        assert not report["wroteOutside"], report
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_it_refuses_a_token_file_others_can_read(daphne_server, tmp_path):
    token_file = tmp_path / "runner.token"
    token_file.write_text("cnr_whatever-token")
    token_file.chmod(0o644)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "delegation.runner", "--url", daphne_server.ws_url]
        + ["--token-file", str(token_file)],
        cwd=BASE_DIR,
        env=runner_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "readable by others" in done.stderr and "chmod 600" in done.stderr, done.stderr


def test_it_passes_placeholders_inside_a_message_as_plain_text(tmp_path):
    engine = CommandEngine(
        [CommandPreset("p", ["agent", "--depth={depth}", "--", "{message}", "{cwd}"])],
        str(tmp_path),
    )

    class Ctx:
        message = "--output=x {cwd} {runId} {message}"
        run_id, conversation_id, depth, preset = "run-1", "conv-1", 2, None
        data: dict = {}  # RunContext's engine-private state ({usageFile} reads it)

    argv = engine.argv(Ctx, engine.presets_by_name["p"], "/ws/sub")
    assert argv == ["agent", "--depth=2", "--", "--output=x {cwd} {runId} {message}", "/ws/sub"]
