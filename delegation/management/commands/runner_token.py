"""Runner tokens: create (shown once), list, revoke. Stored hashed, never recoverable."""

from django.core.management.base import BaseCommand, CommandError

from delegation.models import Runner
from delegation.services import tokens


class Command(BaseCommand):
    help = "Create, list or revoke runner tokens."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a runner (or rotate its token)")
        create.add_argument("name")
        sub.add_parser("list", help="list runners and whether they are connected")
        revoke = sub.add_parser("revoke", help="revoke a runner's token")
        revoke.add_argument("name")

    def handle(self, *args, action, **options):
        if action == "create":
            try:
                runner, token = tokens.create_runner(options["name"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(
                f"Runner {runner.name!r}: the token below is shown once; store it now."
            )
            self.stdout.write(token)
        elif action == "list":
            for runner in Runner.objects.all():
                state = (
                    "revoked"
                    if runner.revoked_at
                    else ("connected" if runner.connected else "disconnected")
                )
                self.stdout.write(
                    f"{runner.name}\t{runner.token_prefix}…\t{state}\t"
                    f"generation {runner.connection_generation}"
                )
        elif action == "revoke":
            if not tokens.revoke_runner(options["name"]):
                raise CommandError(f"no active runner named {options['name']!r}")
            self.stdout.write(f"Revoked runner {options['name']!r}.")
