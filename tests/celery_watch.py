"""What the tests that run a real Celery worker share (tests/integration, tests/browser): a watcher of the
tasks the worker finished, and the pool a test's embedded worker runs its tasks in.

Results are disabled (the platform runs without a result backend), so a test learns that a task ran, what it
returned and when it finished from the worker's ``task_postrun`` signal."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery.signals import task_postrun
from django.db import connections

from config.celery_app import app as celery_app


@dataclass(frozen=True)
class FinishedTask:
    id: str
    name: str
    kwargs: dict[str, Any]
    retval: Any
    finished_at: float  # time.monotonic() when the worker finished it


class TaskWatcher:
    """The tasks the worker has finished, in order, and a way to wait for the ones a test needs."""

    def __init__(self) -> None:
        self.finished: list[FinishedTask] = []
        self._changed = threading.Condition()

    def on_postrun(
        self,
        sender: Any = None,
        task_id: str | None = None,
        kwargs: dict[str, Any] | None = None,
        retval: Any = None,
        **_: Any,
    ) -> None:
        # Runs in the worker's thread: close its connections, so the test's flush does not wait on them.
        connections.close_all()
        task = FinishedTask(
            id=str(task_id),
            name=getattr(sender, "name", ""),
            kwargs=dict(kwargs or {}),
            retval=retval,
            finished_at=time.monotonic(),
        )
        with self._changed:
            self.finished.append(task)
            self._changed.notify_all()

    def wait_until(self, done: Callable[[list[FinishedTask]], bool], timeout: float) -> bool:
        """Whether ``done(finished tasks)`` became true within ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: done(self.finished), timeout)

    def wait(self, task_id: str, timeout: float) -> bool:
        """Whether the task with this id finished within ``timeout`` seconds."""
        return self.wait_until(lambda tasks: any(t.id == task_id for t in tasks), timeout)

    def wait_named(self, name: str, count: int, timeout: float) -> bool:
        """Whether ``count`` runs of the task called ``name`` finished within ``timeout`` seconds."""
        return self.wait_until(lambda tasks: sum(t.name == name for t in tasks) >= count, timeout)

    def get(self, task_id: str) -> FinishedTask:
        with self._changed:
            return next(t for t in self.finished if t.id == task_id)

    def named(self, name: str) -> list[FinishedTask]:
        with self._changed:
            return [t for t in self.finished if t.name == name]

    def names(self) -> list[str]:
        with self._changed:
            return [t.name for t in self.finished]


@pytest.fixture
def task_watcher() -> Iterator[TaskWatcher]:
    """Watches the tasks an embedded worker finishes, and keeps that worker from taking over the root logger
    for the rest of the test session."""
    watcher = TaskWatcher()
    task_postrun.connect(watcher.on_postrun, weak=False)
    previous = celery_app.conf.worker_hijack_root_logger
    celery_app.conf.worker_hijack_root_logger = False
    try:
        yield watcher
    finally:
        celery_app.conf.worker_hijack_root_logger = previous
        task_postrun.disconnect(watcher.on_postrun)


def worker_pool() -> str:
    """One task at a time either way. On RabbitMQ (py-amqp) the solo pool, hosted in the test's thread, took
    a message only when the next one arrived (each run 5 s late; a real worker process does not), so there the
    worker runs its single task in a pool thread; elsewhere the solo pool (SQLite's in-memory database is
    shared with the worker's own thread only)."""
    return "threads" if str(celery_app.conf.broker_url).startswith(("amqp", "pyamqp")) else "solo"
