"""Runner tokens: create (shown once), rotate, list, revoke. Stored hashed, never recoverable.

Rotating or revoking ends the old token's authority at once: open sockets made with it are
closed (4401) and refused on any further frame (``runners.fence_runner``)."""

from django.core.management.base import BaseCommand, CommandError

from delegation.models import Runner
from delegation.services import tokens


class Command(BaseCommand):
    help = "Create, list or revoke runner tokens."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a runner (or rotate its token)")
        create.add_argument("name")
        rotate = sub.add_parser(
            "rotate", help="give an existing runner a new token; the old one stops at once"
        )
        rotate.add_argument("name")
        sub.add_parser("list", help="list runners and whether they are connected")
        revoke = sub.add_parser("revoke", help="revoke a runner's token")
        revoke.add_argument("name")

    def handle(self, *args, action, **options):
        if action == "rotate":
            runner = Runner.objects.filter(name=options["name"]).first()
            if runner is None:
                raise CommandError(f"no runner named {options['name']!r}; create it first")
            token = tokens.new_runner_token()
            tokens.rotate_runner(runner, token)
            self.stdout.write(
                f"Runner {runner.name!r}: new token below, shown once; the old token and its "
                "open connections no longer work."
            )
            self.stdout.write(token)
        elif action == "create":
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
                self.stdout.write(
                    f"{runner.name}\t{runner.token_prefix}…\t{runner.state}\t"
                    f"generation {runner.connection_generation}"
                )
        elif action == "revoke":
            if not tokens.revoke_runner(options["name"]):
                raise CommandError(f"no active runner named {options['name']!r}")
            self.stdout.write(f"Revoked runner {options['name']!r}.")
