"""A preset's ``extensions`` field (SPEC §15): read strictly when the presets file loads, and
a runner whose presets list extensions hosts them."""

from __future__ import annotations

import pytest

from delegation.runner.command import CommandEngine
from delegation.runner.kodelet.engine import ExtensionHosting, host_extensions
from delegation.runner.kodelet.spec import ExtensionSpec


def engine(tmp_path, **preset) -> CommandEngine:
    raw = {"name": "coder", "command": ["true"], "sandbox": "none", **preset}
    return CommandEngine.from_config({"presets": [raw]}, workspace=str(tmp_path))


def test_it_reads_a_presets_extensions_and_hosts_them(tmp_path):
    wrapped = host_extensions(
        engine(
            tmp_path,
            extensions=[
                {
                    "command": "kodelet-extension-subagent --quiet",
                    "config": {"a": 1},
                    "childProfile": "worker",
                }
            ],
        )
    )
    assert isinstance(wrapped, ExtensionHosting)
    assert wrapped.extensions == {
        "coder": (ExtensionSpec(("kodelet-extension-subagent", "--quiet"), {"a": 1}, "worker"),)
    }
    assert wrapped.extensions["coder"][0].extension_id == "kodelet-extension-subagent"


def test_it_leaves_an_engine_without_extensions_as_it_is(tmp_path):
    plain = engine(tmp_path)
    assert host_extensions(plain) is plain


@pytest.mark.parametrize(
    ("extensions", "message"),
    [
        ({"command": ["x"]}, "'extensions' must be a list"),
        (["x"], r"extensions\[0\] must be an object"),
        ([{"command": []}], "'command' must be a non-empty list"),
        ([{"command": ["x"], "config": []}], "'config' must be an object"),
        ([{"command": ["x"], "env": {}}], "unknown field"),
        ([{"command": ["x"], "childProfile": 3}], "'childProfile' must be a preset name"),
    ],
)
def test_it_refuses_a_bad_extensions_field(tmp_path, extensions, message):
    with pytest.raises(ValueError, match=message):
        engine(tmp_path, extensions=extensions)
