"""The documentation holds together: every relative link and anchor in ``README.md`` and
``docs/`` resolves inside the repository, and every environment variable the code reads is
in its reference page (a setting added without its documentation fails here)."""

from __future__ import annotations

import ast
import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# What reads the environment, and the page that must name every variable it reads.
READERS = [
    (["canopy/settings.py", "canopy/sso_settings.py"], "docs/reference/settings.md"),
    (["delegation/runner"], "docs/reference/runner-cli.md"),
    (["delegation/management/commands"], "docs/reference/manage-commands.md"),
]

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?"
)
AUTOLINK = re.compile(r"<(https?://[^>\s]+)>")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
LOOPBACK = {"127.0.0.1", "localhost", "[::1]", "::1"}


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def prose_lines(text: str, *, keep_code: bool = False):
    """(line number, line) outside fenced code blocks, with inline code removed unless
    ``keep_code`` (a heading's code is part of its anchor)."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(2)[0] * len(opened.group(2))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
            continue
        yield number, line if keep_code else INLINE_CODE.sub("", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped,
    spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)
    text = "".join(ch for ch in text.lower() if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text(encoding="utf-8"), keep_code=True):
        found.update(HTML_ID.findall(line))
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(files: list[Path], root: Path) -> list[str]:
    """Every link of ``files`` that does not resolve, as ``file:line: target (why)``."""
    problems: list[str] = []
    anchor_cache: dict[Path, set[str]] = {}
    for path in files:
        for number, line in prose_lines(path.read_text(encoding="utf-8")):
            targets = LINK.findall(line) + AUTOLINK.findall(line)
            for target in targets:
                where = f"{path.relative_to(root)}:{number}: {target}"
                parts = urlsplit(target)
                if parts.scheme in ("http", "https"):
                    if parts.hostname not in LOOPBACK and parts.netloc not in LOOPBACK:
                        problems.append(f"{where} (points outside the repository)")
                    continue
                if parts.scheme or target.startswith("/"):
                    problems.append(f"{where} (not a relative link)")
                    continue
                file = path if not parts.path else (path.parent / unquote(parts.path)).resolve()
                if not file.is_relative_to(root):
                    problems.append(f"{where} (leaves the repository)")
                    continue
                if not file.exists():
                    problems.append(f"{where} (no such file)")
                    continue
                if parts.fragment:
                    if file.suffix != ".md":
                        problems.append(f"{where} (anchor into a file that is not Markdown)")
                        continue
                    if file not in anchor_cache:
                        anchor_cache[file] = anchors_of(file)
                    if unquote(parts.fragment) not in anchor_cache[file]:
                        problems.append(f"{where} (no such heading)")
    return problems


def _constants(trees: list[ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = "text"`` of the scanned modules, so ``os.environ.get(TOKEN_ENV)``
    resolves to the variable's real name."""
    found = {}
    for tree in trees:
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node.value.value
    return found


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _is_read(node: ast.AST) -> ast.AST | None:
    """The expression naming the variable ``node`` reads from the environment, if it is a
    read: ``os.environ.get(X)``, ``os.getenv(X)``, ``os.environ[X]`` or ``X in os.environ``."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
        func = node.func
        if (_is_environ(func.value) and func.attr in ("get", "pop", "setdefault")) or (
            func.attr == "getenv" and getattr(func.value, "id", "") == "os"
        ):
            return node.args[0]
    elif isinstance(node, ast.Subscript) and _is_environ(node.value):
        return node.slice
    elif (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.In | ast.NotIn)
        and _is_environ(node.comparators[0])
    ):
        return node.left
    return None


def _helpers(tree: ast.Module) -> dict[str, int]:
    """Functions of the module that read the variable one of their parameters names
    (``env_int(name, ...)``, ``secret_from_file(name)``): name -> that parameter's position."""
    found = {}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        params = [arg.arg for arg in function.args.args]
        for node in ast.walk(function):
            read = _is_read(node)
            if isinstance(read, ast.Name) and read.id in params:
                found[function.name] = params.index(read.id)
    return found


def _read_names(tree: ast.Module) -> list[ast.AST]:
    """The expressions naming a variable read: the direct reads, and the first argument of a
    call to a helper that reads the variable it is given (every ``env_*`` helper included)."""
    helpers = _helpers(tree)
    names = []
    for node in ast.walk(tree):
        read = _is_read(node)
        if read is not None:
            names.append(read)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            position = helpers.get(name, 0 if name.startswith("env_") else None)
            if position is not None and len(node.args) > position:
                names.append(node.args[position])
    return names


def environment_read(paths: list[Path]) -> set[str]:
    """Names of the environment variables the code under ``paths`` reads (a name held in a
    loop variable, such as the allow-list copied into an agent's environment, is not a read
    of a setting and is skipped)."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.py")))]
    trees = [ast.parse(f.read_text(encoding="utf-8"), str(f)) for f in files]
    constants = _constants(trees)
    found = set()
    for tree in trees:
        for expr in _read_names(tree):
            if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
                found.add(expr.value)
            elif isinstance(expr, ast.Name) and expr.id in constants:
                found.add(constants[expr.id])
            elif isinstance(expr, ast.Attribute) and expr.attr in constants:
                found.add(constants[expr.attr])
    return found


def undocumented(names: set[str], page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return sorted(name for name in names if f"`{name}`" not in text)


# --- the repository's documentation -----------------------------------------------------------


def test_it_resolves_every_relative_link_and_anchor_in_the_docs():
    files = markdown_files()
    assert len(files) > 10, "docs/ is missing"
    assert broken_links(files, ROOT) == []


@pytest.mark.parametrize(("sources", "page"), READERS, ids=[page for _, page in READERS])
def test_it_documents_every_environment_variable_the_code_reads(sources, page):
    names = environment_read([ROOT / s for s in sources])
    assert names, f"found no environment reads in {sources}: the scan is broken"
    assert undocumented(names, ROOT / page) == [], f"add them to {page}"


def test_it_keeps_the_readme_short_and_its_picture_small():
    assert (ROOT / "README.md").stat().st_size < 8 * 1024
    assert (DOCS / "images" / "live-tree.png").stat().st_size < 300 * 1024


# --- the checks themselves can fail ------------------------------------------------------------


def test_it_reports_a_setting_missing_from_its_reference(tmp_path):
    (tmp_path / "settings.py").write_text(
        'import os\nTOKEN_ENV = "TOKEN_NAME"\nA = env_int("DOCUMENTED", 1)\n'
        'B = env_float("FORGOTTEN", 2.0)\nC = os.environ.get(TOKEN_ENV)\n'
        'D = os.environ["SUBSCRIPTED"]\nfor k in ("PATH",):\n    E = os.environ[k]\n'
        "def from_file(label, name):\n    return open(os.environ.get(name, '')).read()\n"
        'F = from_file("key", "KEY_FILE")\n',
        encoding="utf-8",
    )
    page = tmp_path / "settings.md"
    page.write_text("| `DOCUMENTED` | 1 |\n| `SUBSCRIPTED` | |\n", encoding="utf-8")
    names = environment_read([tmp_path / "settings.py"])
    assert names == {"DOCUMENTED", "FORGOTTEN", "TOKEN_NAME", "SUBSCRIPTED", "KEY_FILE"}
    assert undocumented(names, page) == ["FORGOTTEN", "KEY_FILE", "TOKEN_NAME"]


def test_it_reports_broken_links_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# A page\n\n## Run `make test` (twice)\n\n## Run `make test` (twice)\n", encoding="utf-8"
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/page.md#run-make-test-twice) [ok](docs/page.md#run-make-test-twice-1)\n"
        "[gone](docs/missing.md) [bad anchor](docs/page.md#nope) [up](../SPEC.md)\n"
        "[web](https://example.com/) <http://127.0.0.1:8000/> `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links([readme], tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "docs/missing.md (no such file)",
        "docs/page.md#nope (no such heading)",
        "../SPEC.md (leaves the repository)",
        "https://example.com/ (points outside the repository)",
    ]
