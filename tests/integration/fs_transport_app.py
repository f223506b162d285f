"""A Celery app on the embedded transport (config.kombu_filesystem) for the transport's load test: a worker
and beat run it as real processes. Queue folders and the results folder come from the environment."""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

from config.kombu_filesystem import transport_options

QUEUE = Path(os.environ.get("FS_TEST_QUEUE", "/tmp/fs-test-queue"))
RESULTS = Path(os.environ.get("FS_TEST_RESULTS", "/tmp/fs-test-results"))

app = Celery("fs_transport_test", broker="filesystem://")
app.conf.update(
    broker_transport=os.environ.get("FS_TEST_TRANSPORT", "config.kombu_filesystem:Transport"),
    broker_transport_options=transport_options(QUEUE, polling_interval=0.05),
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    beat_schedule={"tick": {"task": "fs_test.tick", "schedule": 0.2}},
    task_ignore_result=True,
)


@app.task(name="fs_test.record")
def record(producer: int, n: int, blob: str) -> None:
    """Mark message (producer, n) as received, once: a file per message, so a duplicate is visible too."""
    assert len(blob) == 1 << 16, "half a message"
    path = RESULTS / f"{producer}-{n}"
    with open(path, "a") as f:
        f.write("x")


@app.task(name="fs_test.tick")
def tick() -> None:
    with open(RESULTS / "ticks", "a") as f:
        f.write("x")
