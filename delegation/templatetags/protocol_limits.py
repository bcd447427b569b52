"""Protocol limits for templates, so a form's bound comes from ``delegation.protocol``."""

from django import template

from delegation.protocol import MAX_STEER_BYTES

register = template.Library()


@register.simple_tag
def max_steer_bytes() -> int:
    # A browser's maxlength counts characters, so this only stops the obvious; the service
    # refuses by bytes.
    return MAX_STEER_BYTES
