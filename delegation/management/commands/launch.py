"""Launch a top-level run on a connected runner (SPEC §9), like the dashboard's "New run".

Prints the run's Result as JSON. ``--as USERNAME`` acts as that person (the operator role is
required and checked); without it the launch is audited as ``cli:<login name>``, since whoever
runs manage.py on the server already holds the database.
"""

import getpass
import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from delegation.errors import PermissionRefused, RpcError
from delegation.models import AuditEntry, Run
from delegation.services.forks import do_fork_run
from delegation.services.launch import Launch, do_launch_run, relaunch_of
from delegation.services.run_actions import Actor
from delegation.wire import BudgetLimits, loads_strict, parse_model


class Command(BaseCommand):
    help = "Launch a top-level run on a connected runner with one of its presets."

    def add_arguments(self, parser):
        parser.add_argument(
            "runner", nargs="?", help="the runner's name (runnerId); it must be connected"
        )
        parser.add_argument("profile", nargs="?", help="a preset the runner registered")
        parser.add_argument("message", nargs="?", help="the task")
        parser.add_argument(
            "--from",
            dest="original",
            default=None,
            metavar="RUN_ID",
            help="relaunch this run: its runner, preset, cwd and budget, and its message "
            "unless --message gives another",
        )
        parser.add_argument(
            "--fork-from",
            dest="fork_from",
            default=None,
            metavar="RUN[:SEQ]",
            help="fork this finished run's agent conversation at event SEQ (default: its "
            "end) with --message as the new instruction (SPEC §14)",
        )
        parser.add_argument(
            "--message", dest="new_message", default=None, help="with --from or --fork-from"
        )
        parser.add_argument("--extension", default=None, help="the preset's extensionId")
        parser.add_argument("--cwd", default=None, help="working directory for the run")
        parser.add_argument("--as", dest="username", default=None, help="act as this user")
        parser.add_argument(
            "--budget",
            default=None,
            help='limits on the whole tree as JSON, e.g. \'{"maxRuns": 20, "maxCostUsd": 2}\'',
        )

    def handle(self, *args, runner, profile, message, extension, cwd, username, budget, **options):
        # Long for its two forms: a new launch, or --from a run (relaunch).
        limits = None
        if budget is not None:
            try:
                limits = parse_model(BudgetLimits, loads_strict(budget), "budget")
            except RpcError as exc:
                raise CommandError(f"--budget: {exc.message}") from None
        if username is not None:
            user = get_user_model().objects.filter(username=username, is_active=True).first()
            if user is None:
                raise CommandError(f"no active user named {username!r}")
            actor = Actor.for_user(user, via=AuditEntry.Via.SYSTEM)
        else:
            actor = Actor.system(f"cli:{getpass.getuser()}")
        if options.get("fork_from"):
            self._fork(actor, options["fork_from"], options.get("new_message") or message)
            return
        if options.get("original"):
            original = (
                Run.objects.select_related("runner").filter(run_id=options["original"]).first()
            )
            if original is None:
                raise CommandError(f"no run {options['original']!r}")
            try:
                launch = relaunch_of(original, message=options.get("new_message"))
            except RpcError as exc:
                raise CommandError(f"refused ({exc.code}): {exc.message}") from None
            self._launch(actor, launch)
            return
        if not (runner and profile and message):
            raise CommandError("give RUNNER PROFILE MESSAGE, or --from RUN_ID")
        launch = Launch(
            runner=runner,
            profile=profile,
            message=message,
            extension_id=extension,
            cwd=cwd,
            budget=limits,
        )
        self._launch(actor, launch)

    def _fork(self, actor, spec: str, message: str | None):
        run_id, _, step = spec.partition(":")
        if step and not step.isdigit():
            raise CommandError(f"--fork-from: {step!r} is no event sequence (RUN[:SEQ])")
        original = Run.objects.select_related("runner").filter(run_id=run_id).first()
        if original is None:
            raise CommandError(f"--fork-from: no run {run_id!r}")
        self._launch(
            actor,
            None,
            lambda: do_fork_run(
                actor, original, message=message or "", sequence=int(step) if step else None
            ),
        )

    def _launch(self, actor, launch, start=None):
        try:
            result = start() if start else do_launch_run(actor, launch)
        except PermissionRefused as exc:
            raise CommandError(f"refused: {exc}") from None
        except RpcError as exc:
            raise CommandError(f"refused ({exc.code}): {exc.message}") from None
        self.stdout.write(json.dumps(result, indent=2))
