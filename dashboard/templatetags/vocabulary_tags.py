"""The statuses the page's scripts know, read from the models' choices (issue 34): rendered
once in ``base.html`` as JSON, so ``statuses.js`` is the scripts' only list and a status added
to a model reaches every chart, count and colour without a second edit."""

from django import template

from delegation.models import TERMINAL_STATUSES, RunnerState, RunStatus

register = template.Library()


@register.simple_tag
def canopy_vocabulary() -> dict:
    return {
        "runStatuses": list(RunStatus.values),
        "terminalStatuses": [str(s) for s in TERMINAL_STATUSES],
        "runnerStates": list(RunnerState.values),
    }
