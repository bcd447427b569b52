"""``make run`` and ``make demo-agents`` as a new user meets them (issue 38): install and
migrate print nothing unless they fail, so the demo's one-time password is not scrolled away
by them, and ``make demo-agents`` installs only the agent CLI it runs (Claude Code), not all
five. Read from ``make -n -B`` (every recipe printed, nothing run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def _recipes(target: str) -> str:
    made = subprocess.run(
        ["make", "-n", "-B", target], cwd=PROJECT, capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    return made.stdout


def test_it_installs_only_claude_code_for_make_demo_agents():
    recipes = _recipes("demo-agents")
    assert "@anthropic-ai/claude-code@" in recipes
    for other in ("@openai/codex", "@google/gemini-cli", "@github/copilot", "claude-agent-acp"):
        assert other not in recipes, other
    assert "manage.py migrate --noinput -v 0" in recipes


def test_it_keeps_make_runs_install_and_migrate_quiet_before_the_password():
    recipes = _recipes("run")
    assert "pip install --quiet" in recipes
    assert "manage.py migrate --noinput -v 0" in recipes
    assert recipes.index("manage.py demo") > recipes.index("manage.py migrate")


def test_it_points_make_demo_agents_presets_at_another_model_port():
    made = subprocess.run(
        ["make", "-n", "-B", "demo-agents", "MODEL_PORT=9100"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    copy = next(line for line in made.stdout.splitlines() if "demo-presets-9100.json" in line)
    # The copy's recipe, run on the shipped presets, names the moved port everywhere.
    shipped = (PROJECT / "deploy/presets/demo-claude.json").read_text()
    rewritten = subprocess.run(
        copy.split(" > ")[0].replace("mkdir -p var && ", ""),
        shell=True,
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "8765" in shipped and "8765" not in rewritten and rewritten.count("9100") == 2
    assert "--model-stub 9100" in made.stdout and "--presets 'var/demo-presets-9100.json'" in (
        made.stdout
    )
