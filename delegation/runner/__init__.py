"""Canopy's reference runner: a host for the ``scripted`` and ``command`` engines.

Django-free like the SDK it is built on; ``python manage.py runner`` and
``python -m delegation.runner`` start the same command line (:mod:`delegation.runner.cli`).
"""

from delegation.runner.host import Cancelled, Engine, Outcome, RunContext, RunnerHost

__all__ = ["Cancelled", "Engine", "Outcome", "RunContext", "RunnerHost"]
