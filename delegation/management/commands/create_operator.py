"""Create (or update) a dashboard user with a Canopy role: viewer, operator or admin."""

import os
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from delegation import roles


class Command(BaseCommand):
    help = (
        "Create or update a dashboard user with a role (viewer reads; operator also cancels, "
        "steers and releases; admin also manages runners, tokens and users). The password "
        "comes from --password, else $CANOPY_PASSWORD, else one is generated and shown once."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", choices=roles.ROLES, default=roles.VIEWER)
        parser.add_argument("--password", default=None)
        parser.add_argument("--email", default="")

    def handle(self, *args, username, role, password, email, **options):
        if not username.strip():
            raise CommandError("username must not be blank")
        User = get_user_model()
        password = password or os.environ.get("CANOPY_PASSWORD") or None
        existing = User.objects.filter(username=username).first()
        if password is not None:
            # Checked before anything is saved: a refused password leaves no half-made account.
            try:
                validate_password(password, existing or User(username=username, email=email))
            except ValidationError as exc:
                raise CommandError("password refused: " + " ".join(exc.messages)) from None
        user, created = User.objects.get_or_create(username=username, defaults={"email": email})
        generated = False
        if password is None and created:
            password = secrets.token_urlsafe(12)
            generated = True
        if password is not None:
            user.set_password(password)
        # Staff so the Django admin opens; what it shows follows the role.
        user.is_staff = True
        user.is_active = True
        user.save()
        user.groups.remove(*Group.objects.filter(name__in=roles.ROLES))
        group, _ = Group.objects.get_or_create(name=role)
        user.groups.add(group)
        verb = "Created" if created else "Updated"
        self.stdout.write(f"{verb} {username!r} with role {role}.")
        if generated:
            self.stdout.write(f"Password (shown once): {password}")
