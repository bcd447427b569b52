"""``python manage.py runner``: the reference runner (flags: ``--help``).

The runner itself is Django-free (``delegation.runner``); this command only makes it reachable
the same way as the rest of Canopy's tooling.
"""

import asyncio
import sys

from django.core.management.base import BaseCommand

from delegation.runner import cli


class Command(BaseCommand):
    help = "Connect the reference runner (scripted or command engine) to a Canopy server."
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        cli.build_parser(parser)

    def handle(self, *args, **options):
        import argparse

        if sys.argv[1:2] == ["runner"]:  # started as `manage.py runner`, not call_command
            cli.hide_token(list(sys.orig_argv))

        namespace = argparse.Namespace(**options)
        cli.configure_logging(namespace.log_level)
        code = asyncio.run(cli.run(namespace))
        if code:
            raise SystemExit(code)
