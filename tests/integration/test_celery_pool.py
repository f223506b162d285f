"""A prefork Celery worker keeps its database connection pool from one task to the next (config.celery_fixup).

Celery's own Django fix-up closed the pool at every task boundary, so each task opened new PostgreSQL sessions
(~15 a second at design load). Here a real worker of the project's app (config.celery_app), with Django's pool
on the test database as production has it, runs eight tasks one after the other that each note the session
they ran on, and between them one that ends its own session (as a PostgreSQL restart would): the tasks share
the pool's two sessions (a third replaces the one ended), the sessions are still open while the worker
idles, and none is left once it has stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery import Celery
from django.db import connection

from config.kombu_filesystem import transport_options

ROOT = Path(__file__).resolve().parents[2]
TASK_TIMEOUT_SECONDS = 60

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _sessions(pids: set[int]) -> set[int]:
    with connection.cursor() as cursor:
        # The test runs in a transaction, which would otherwise see the statistics as first read in it.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [sorted(pids)])
        return {pid for (pid,) in cursor.fetchall()}


def _wait_for_lines(path: Path, count: int, worker: subprocess.Popen[str]) -> list[str]:
    deadline = time.monotonic() + TASK_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return lines
        assert worker.poll() is None, "the worker died"
        time.sleep(0.05)
    raise AssertionError(f"the worker ran {len(lines)} of {count} tasks within {TASK_TIMEOUT_SECONDS} s")


def test_a_prefork_worker_s_tasks_share_its_pooled_sessions(tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("Django's connection pool is PostgreSQL's (psycopg 3)")
    queue, results = tmp_path / "queue", tmp_path / "results"
    results.mkdir()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.integration.pool_settings",
        "POOL_TEST_DATABASE": connection.settings_dict["NAME"],
        "POOL_TEST_QUEUE": str(queue),
        "POOL_TEST_RESULTS": str(results),
        "PYTHONPATH": str(ROOT),
    }
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(  # noqa: S603
        [
            *(sys.executable, "-m", "celery", "-A", "tests.integration.pool_app", "worker"),
            *("--pool", "prefork", "--concurrency", "1", "-Q", "celery"),
            *("--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel", "INFO"),
            *("--logfile", str(log)),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        text=True,
    )
    producer = Celery("pool-test-producer", broker="filesystem://")
    producer.conf.update(
        broker_transport="config.kombu_filesystem:Transport",
        broker_transport_options=transport_options(queue, polling_interval=0.05),
    )
    pid_file = results / "pids"
    try:
        for n in range(8):
            if n == 4:
                producer.send_task("pool_test.session_end", queue="celery")
            producer.send_task("pool_test.backend_pid", args=[n], queue="celery")
            _wait_for_lines(
                pid_file, n + 1, worker
            )  # one at a time: each task finds the others' sessions idle
        pids = [int(line.split()[1]) for line in pid_file.read_text().splitlines()]
        time.sleep(0.5)  # the last task's session given back to the pool
        still_open = _sessions(set(pids))
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
    output = log.read_text() if log.exists() else ""

    assert [line.split()[0] for line in pid_file.read_text().splitlines()] == [str(n) for n in range(8)]
    # Two sessions in the pool, one of them ended after the fourth task and replaced: at most three in all
    # (Celery's own fix-up opened a new pool, so new sessions, for each task: eight).
    assert len(set(pids)) <= 3, pids
    assert len(set(pids[:4])) <= 2 and len(set(pids[4:])) <= 2, pids
    assert pids[-1] in still_open, "the pooled session was closed after its task"
    assert "terminating connection due to administrator command" in output, output[-3000:]
    deadline = time.monotonic() + 10
    while _sessions(set(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sessions(set(pids)), "a session outlived the worker"
