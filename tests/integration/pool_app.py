"""The project's Celery app (config.celery_app, with its Django fix-up) and two tasks for
tests/integration/test_celery_pool.py: one appends the PostgreSQL session it ran on to a file, one ends its
own session, as a PostgreSQL restart or an administrator would."""

from __future__ import annotations

import os
from pathlib import Path

from django.db import connection

from config.celery_app import app

__all__ = ["app"]


@app.task(name="pool_test.backend_pid")
def backend_pid(n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with (Path(os.environ["POOL_TEST_RESULTS"]) / "pids").open("a") as f:
        f.write(f"{n} {pid}\n")


@app.task(name="pool_test.session_end")
def session_end() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
