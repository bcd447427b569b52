"""The navigation's count of pending approvals (SPEC §11), on every page."""

from django import template

from delegation.selectors.approvals import pending_count

register = template.Library()


@register.simple_tag
def pending_approvals() -> int:
    return pending_count()
