"""The admin's model names read as English plurals (issue 38: "Approval policys",
"Retention passs"): Django's default plural only appends an "s"."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin

from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db

# A naive "+s" plural: a consonant then "ys" (policys), or "ss"/"xs"/"chs"/"shs"/"zs" at the end.
WRONG_PLURAL = re.compile(r"([^aeiou]ys|ss|xs|chs|shs|zs)$", re.IGNORECASE)


def test_no_registered_model_has_a_naive_plural():
    names = {str(model._meta.verbose_name_plural) for model in admin.site._registry}
    assert {"approval policies", "retention passes", "SSO identities"} <= names
    wrong = sorted(name for name in names if WRONG_PLURAL.search(name))
    assert wrong == []


def test_the_admin_index_lists_the_plurals(people):
    body = signed_in(people["admin"]).get("/admin/").content.decode()
    assert "Approval policies" in body and "Retention passes" in body
    assert "policys" not in body.lower() and "passs" not in body.lower()
