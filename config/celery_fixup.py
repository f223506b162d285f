"""Celery's Django fix-up, keeping each worker process's database connection pool from one task to the next.

Celery's own fix-up (celery.fixups.django, 5.7) closes the database connections before and after every task,
as Django closes a request's; with Django's connection pool (production, config/settings/production.py) in a
prefork worker it also *closes the pool* each time, so that every task opens a new pool: ``min_size`` new
PostgreSQL sessions (a backend forked, authenticated, its catalogue caches filled, its prepared statements
lost) and a pool thread, for a task that uses one connection for a few milliseconds. At design load, with
rating on arrival several times a second and the control queue's schedules, that was ~15 new sessions a
second on PostgreSQL (the design-load soak, issue 14). Reported upstream as celery/celery#10554 (open; the fix
proposed in celery/celery#10555 is this one).

Here the task boundaries still close the connections, which with a pool gives each one back to it (the pool
discards a broken one and opens a replacement), but the pool is closed only where it must be: in a new
child process (it was inherited from the parent across the fork: Celery's own reason for closing it), in
the main process when the worker starts (before it forks), and when a child exits. Everything else is Celery's fix-up unchanged. ``config.celery_app`` installs this one
in place of Celery's (``Celery(fixups=...)``); tests/integration/test_celery_pool.py runs a real prefork
worker and checks that its tasks reuse one PostgreSQL session.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from celery import signals
from celery.fixups.django import DjangoFixup, DjangoWorkerFixup

if TYPE_CHECKING:
    from celery import Celery


class PoolKeepingWorkerFixup(DjangoWorkerFixup):
    """Celery's worker fix-up with the pool closed at process start and exit, not at each task."""

    _pools_closing = False

    def install(self) -> PoolKeepingWorkerFixup:
        # Celery's install closes the connections of the worker's main process, which forks the children:
        # its pools too, as Celery's own fix-up does.
        self._close_with_pools(super().install)
        signals.worker_process_shutdown.connect(self.on_worker_process_shutdown)
        return self

    def on_worker_process_init(self, **kwargs: Any) -> None:
        self._close_with_pools(lambda: super(PoolKeepingWorkerFixup, self).on_worker_process_init(**kwargs))

    def on_worker_process_shutdown(self, **kwargs: Any) -> None:
        self._close_with_pools(self._close_database)

    def _close_with_pools(self, close: Any) -> None:
        self._pools_closing = True
        try:
            close()
        finally:
            self._pools_closing = False

    def _is_prefork(self) -> bool:
        # Celery's _close_database closes the pools of a prefork worker's connections whenever this is true.
        return self._pools_closing and super()._is_prefork()


class PoolKeepingDjangoFixup(DjangoFixup):
    _worker_fixup: DjangoWorkerFixup | None

    @property
    def worker_fixup(self) -> DjangoWorkerFixup:
        if self._worker_fixup is None:
            self._worker_fixup = PoolKeepingWorkerFixup(self.app)
        return self._worker_fixup

    @worker_fixup.setter
    def worker_fixup(self, value: DjangoWorkerFixup) -> None:
        self._worker_fixup = value


def fixup(app: Celery, env: str = "DJANGO_SETTINGS_MODULE") -> DjangoFixup | None:
    """celery.fixups.django.fixup with PoolKeepingDjangoFixup: installed when Django's settings are named."""
    if os.environ.get(env) and "django" not in app.loader_cls.lower():
        return PoolKeepingDjangoFixup(app).install()
    return None
