"""API tokens for scripts: create (shown once, alone on the last line), list, revoke.

A token acts with its user's role (viewer, operator, admin), or only reads with
``--read-only``; ``--expires-in DAYS`` ends it on its own. It is stored hashed and can never be
shown again. Revoke it by the prefix ``list`` prints.
"""

import argparse
import math
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from delegation import roles
from delegation.models import ApiToken
from delegation.services import tokens

# A hundred years: far enough for "never" in practice, near enough that the expiry date is
# representable (``timedelta`` and ``datetime`` overflow well before ``float`` does).
MAX_EXPIRY_DAYS = 36525


def expiry_days(text: str) -> float:
    """``--expires-in``: a finite number of days, more than 0 and at most MAX_EXPIRY_DAYS."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not (math.isfinite(days) and 0 < days <= MAX_EXPIRY_DAYS):
        # argparse names the option in front of this message.
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of days more than 0 and at most {MAX_EXPIRY_DAYS}"
        )
    return days


class Command(BaseCommand):
    help = "Create, list or revoke REST API tokens."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a token for a user (shown once)")
        create.add_argument("username")
        create.add_argument("--name", default="", help="a label, e.g. the script using it")
        create.add_argument(
            "--expires-in",
            type=expiry_days,
            default=None,
            metavar="DAYS",
            help=f"refuse the token after this many days, at most {MAX_EXPIRY_DAYS} "
            "(default: valid until revoked)",
        )
        create.add_argument(
            "--read-only",
            action="store_true",
            help="the token reads like a viewer whatever the user's role; it never acts",
        )
        listing = sub.add_parser("list", help="list tokens (prefix, user, name, state)")
        listing.add_argument("--user", default=None, help="only this user's tokens")
        revoke = sub.add_parser("revoke", help="revoke every active token with this prefix")
        revoke.add_argument("prefix")

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    def _create(self, username, name, expires_in=None, read_only=False, **_):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive; its tokens would not work")
        expires_at = None
        if expires_in is not None:
            expires_at = timezone.now() + timedelta(days=expires_in)
        api_token, token = tokens.create_api_token(
            user, name, expires_at=expires_at, read_only=read_only
        )
        role = roles.role_of(user)
        scope = "read-only, " if read_only and role else ""
        until = f", expires {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""
        self.stdout.write(
            f"API token {api_token.token_prefix} for {username!r} ({scope}"
            f"role {role or 'none: it will be refused with 403 until the user has one'}"
            f"{until})."
        )
        self.stdout.write("It is shown once and stored hashed; keep it now:")
        self.stdout.write(token)

    def _list(self, user=None, **_):
        listed = ApiToken.objects.select_related("user").order_by("created_at", "id")
        if user is not None:
            listed = listed.filter(user__username=user)
        for api_token in listed:
            if api_token.revoked_at:
                state = f"revoked {api_token.revoked_at:%Y-%m-%d %H:%M}"
            elif api_token.expires_at and api_token.expires_at <= timezone.now():
                state = f"expired {api_token.expires_at:%Y-%m-%d %H:%M}"
            elif api_token.expires_at:
                state = f"active until {api_token.expires_at:%Y-%m-%d %H:%M}"
            else:
                state = "active"
            if api_token.read_only:
                state += ", read-only"
            used = (
                f"last used {api_token.last_used_at:%Y-%m-%d %H:%M}"
                if api_token.last_used_at
                else "never used"
            )
            self.stdout.write(
                f"{api_token.token_prefix}\t{api_token.user.get_username()}\t"
                f"{api_token.name or '-'}\t{state}\t{used}"
            )

    def _revoke(self, prefix, **_):
        count = tokens.revoke_api_token(prefix)
        if not count:
            raise CommandError(f"no active API token with prefix {prefix!r}")
        self.stdout.write(f"Revoked {count} API token{'s' if count != 1 else ''} ({prefix}).")
