"""``manage.py api_token create --expires-in``: a number of days that makes an expiry date,
or a clear refusal naming the option (``inf`` crashed with an OverflowError)."""

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from delegation.models import ApiToken

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("days", ["inf", "-inf", "nan", "1e12", "0", "-1", "ten"])
def test_it_refuses_an_expiry_that_is_not_a_usable_number_of_days(viewer, days):
    with pytest.raises(CommandError, match="--expires-in"):
        call_command("api_token", "create", viewer.username, "--expires-in", days)
    assert not ApiToken.objects.exists()


def test_it_accepts_the_longest_expiry_it_allows(viewer):
    call_command("api_token", "create", viewer.username, "--expires-in", "36525")
    expires_at = ApiToken.objects.get().expires_at
    assert expires_at - timezone.now() > timedelta(days=36524)
