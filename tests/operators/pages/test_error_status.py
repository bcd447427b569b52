"""One refusal, one HTTP status: the run page's form and the REST API map a service's error
through the same table (``delegation.errors.http_status``)."""

import json

import pytest

from delegation.models import Budget
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("persona", "form", "expected"),
    [
        # parse_model refuses a negative limit with -32602: invalid input on either door.
        ("operator", {"maxRuns": "-1"}, 422),
        # A viewer may not set budgets: the service's PermissionRefused.
        ("viewer", {"maxRuns": "100"}, 403),
    ],
)
def test_it_gives_the_page_and_rest_the_same_status_for_one_refusal(
    as_, world, people, persona, form, expected
):
    page = signed_in(people[persona]).post("/runs/root-1/budget/", form)
    api = as_(persona, "token")
    body = {name: int(value) for name, value in form.items()}
    rest = api.client.generic(
        "PUT",
        "/api/runs/root-1/budget",
        json.dumps(body),
        content_type="application/json",
        headers=api.headers,
    )
    assert (page.status_code, rest.status_code) == (expected, expected)
    assert not Budget.objects.filter(run__run_id="root-1").exists()
