"""The ``canopy`` command of an installed Canopy: every ``manage.py`` command, plus ``serve``.

``canopy migrate``, ``canopy create_operator ...``, ``canopy runner_token create NAME`` work as
``python manage.py ...`` does in a checkout; ``canopy serve [--host H] [--port P]`` replaces
this process with daphne serving Canopy (what ``make serve`` runs after migrating).
"""

from __future__ import annotations

import argparse
import os
import sys


def serve(argv: list[str]) -> None:
    from canopy.serving import daphne_command

    parser = argparse.ArgumentParser(prog="canopy serve", description="serve Canopy with daphne")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    command = daphne_command(args.host, args.port)
    os.execv(command[0], command)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "canopy.settings")
    if argv[1:2] == ["serve"]:
        serve(argv[2:])
        return
    from django.core.management import execute_from_command_line

    execute_from_command_line(["canopy", *argv[1:]])


if __name__ == "__main__":
    main()
