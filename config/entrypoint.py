"""Which settings a process runs with: production unless told otherwise.

Every entry point (WSGI, Celery, manage.py) calls ``use_settings`` before Django is set up. With
``DJANGO_SETTINGS_MODULE`` unset it chooses ``config.settings.production``, which refuses to start without
its secrets (``DJANGO_SECRET_KEY``, ``DATABASE_URL``, …): a deployment that forgets the variable fails at
start instead of running with ``DEBUG=True`` and the public development key. Development asks for its
settings explicitly (`make run` exports ``config.settings.local``; pytest reads ``config.settings.test``
from pyproject.toml).
"""

from __future__ import annotations

import os

PRODUCTION = "config.settings.production"


def use_settings() -> str:
    """Default DJANGO_SETTINGS_MODULE to production and return the module in force."""
    return os.environ.setdefault("DJANGO_SETTINGS_MODULE", PRODUCTION)
