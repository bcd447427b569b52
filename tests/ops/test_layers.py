"""Issue 34: every first-level module of the three apps has its place in an import-linter
contract (``make lint`` then keeps it in its layer): a module left out of every contract could
import anything, and nothing would say so."""

from __future__ import annotations

import tomllib

from tests.support.paths import PROJECT

APPS = ("canopy", "delegation", "dashboard")


def first_level_modules() -> set[str]:
    out = set()
    for app in APPS:
        for path in (PROJECT / app).iterdir():
            if path.name.startswith("__") or path.name == "static":
                continue
            if path.suffix == ".py":
                out.add(f"{app}.{path.stem}")
            elif path.is_dir() and (path / "__init__.py").exists():
                out.add(f"{app}.{path.name}")
    return out


def named_in_contracts() -> set[str]:
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    names = set()
    for contract in config["tool"]["importlinter"]["contracts"]:
        containers = contract.get("containers", [])
        fields = [*contract.get("layers", []), *contract.get("source_modules", [])]
        for entry in fields:
            for part in entry.replace("|", ":").split(":"):
                part = part.strip()
                names |= {f"{c}.{part}" for c in containers} if containers else {part}
    return names


def test_it_names_every_first_level_module_in_a_contract():
    missing = sorted(first_level_modules() - named_in_contracts())
    assert missing == [], f"put these in a layer of pyproject.toml's [tool.importlinter]: {missing}"


def test_it_keeps_the_runner_and_the_sdk_free_of_the_server_statically():
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    forbidden = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "forbidden"]
    assert any(
        {"delegation.runner", "delegation.client"} <= set(c["source_modules"])
        and {"django", "channels", "delegation.models"} <= set(c["forbidden_modules"])
        for c in forbidden
    )
