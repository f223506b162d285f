"""The integration tests' fixtures: ``task_watcher`` (tests/celery_watch.py)."""

from tests.celery_watch import task_watcher  # noqa: F401  # fixture
