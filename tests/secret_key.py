"""A pytest plugin loaded before Django's settings (``-p tests.secret_key`` in pyproject).

The settings refuse the development ``SECRET_KEY`` unless ``DEBUG`` is on; the suite runs
with ``DEBUG`` off like production, so it brings a random key, which the servers and runners
it starts inherit.
"""

import os
import secrets

os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
