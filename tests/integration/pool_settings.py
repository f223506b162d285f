"""Settings for the worker of tests/integration/test_celery_pool.py: the test settings with Django's connection
pool on the test database (as production has it, config/settings/production.py) and the embedded file
transport in the test's folder, both named by the test through the environment."""

import os
from pathlib import Path

from config.kombu_filesystem import transport_options
from config.settings.test import *  # noqa: F403
from config.settings.test import DATABASES

DATABASES = {
    "default": {
        **DATABASES["default"],
        "NAME": os.environ["POOL_TEST_DATABASE"],
        "CONN_MAX_AGE": 0,
        "OPTIONS": {
            **DATABASES["default"].get("OPTIONS", {}),
            "pool": {"min_size": 2, "max_size": 2, "timeout": 10.0},
        },
    }
}
CELERY_BROKER_URL = "filesystem://"
CELERY_BROKER_TRANSPORT = "config.kombu_filesystem:Transport"
CELERY_BROKER_TRANSPORT_OPTIONS = transport_options(
    Path(os.environ["POOL_TEST_QUEUE"]), polling_interval=0.05
)
