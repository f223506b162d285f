"""The embedded Celery transport survives load: a real worker and beat on it while several processes send
messages as fast as they can; every message arrives exactly once, whole, and no process dies.

Also the ordering that makes it so, checked directly: a message file appears under its final name only
when it is complete (kombu's own filesystem transport creates the file first and writes it after)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config import kombu_filesystem

ROOT = Path(__file__).resolve().parents[2]
PRODUCERS = 4
PER_PRODUCER = 150
BLOB = 1 << 16


def _produce(producer: int, queue: str, results: str) -> None:
    os.environ["FS_TEST_QUEUE"], os.environ["FS_TEST_RESULTS"] = queue, results
    from tests.integration.fs_transport_app import record

    blob = "m" * BLOB  # large, so that writing one takes long enough for a reader to catch it half done
    for n in range(PER_PRODUCER):
        record.delay(producer, n, blob)


def _waiting(queue: Path) -> list[str]:
    """The messages in the queue's folder that no consumer has taken (a temporary name is not one yet)."""
    return [n for n in os.listdir(queue / "out") if not n.startswith(kombu_filesystem.TEMP_PREFIX)]


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    queue, results = tmp_path / "queue", tmp_path / "results"
    for sub in ("out", "processed", "control"):
        (queue / sub).mkdir(parents=True)
    results.mkdir()
    return queue, results


@pytest.mark.integration
def test_worker_and_beat_on_the_embedded_transport_lose_and_tear_nothing_under_load(tmp_path: Path) -> None:
    queue, results = _folders(tmp_path)
    env = {
        **os.environ,
        "FS_TEST_QUEUE": str(queue),
        "FS_TEST_RESULTS": str(results),
        "PYTHONPATH": str(ROOT),
    }
    celery = [sys.executable, "-m", "celery", "-A", "tests.integration.fs_transport_app"]
    worker = subprocess.Popen(  # noqa: S603
        [
            *celery,
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            "2",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            "--loglevel",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    beat = subprocess.Popen(  # noqa: S603
        [
            *celery,
            "beat",
            "--loglevel",
            "WARNING",
            "--schedule",
            str(tmp_path / "beat-schedule"),
            "--pidfile",
            str(tmp_path / "beat.pid"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    outputs: dict[subprocess.Popen[str], str] = {}
    try:
        producers = [
            multiprocessing.get_context("spawn").Process(target=_produce, args=(p, str(queue), str(results)))
            for p in range(PRODUCERS)
        ]
        for process in producers:
            process.start()
        for process in producers:
            process.join(timeout=120)
            assert process.exitcode == 0
        expected = {f"{p}-{n}" for p in range(PRODUCERS) for n in range(PER_PRODUCER)}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            arrived = {path.name for path in results.iterdir()} - {"ticks"}
            if arrived >= expected:
                break
            assert worker.poll() is None, "the worker died"
            time.sleep(0.2)
        time.sleep(1)  # anything sent twice would land by now
        assert worker.poll() is None and beat.poll() is None, "a process exited"
        # Beat stops first, so that it sends nothing more; the worker then takes what beat sent last (on a
        # loaded machine it can be a few ticks behind) before it stops too.
        beat.terminate()
        outputs[beat] = beat.communicate(timeout=30)[0]
        deadline = time.monotonic() + 60
        while _waiting(queue) and time.monotonic() < deadline:
            assert worker.poll() is None, "the worker died"
            time.sleep(0.2)
    finally:
        for process in (worker, beat):
            if process not in outputs:
                process.terminate()
                outputs[process] = process.communicate(timeout=30)[0]
    output = "".join(outputs.values())

    arrived = {path.name: path.read_text() for path in results.iterdir()}
    ticks = arrived.pop("ticks", "")
    assert set(arrived) == expected, f"{len(expected - set(arrived))} lost\n{output[-3000:]}"
    assert set(arrived.values()) == {"x"}, "a message was delivered twice"
    assert len(ticks) >= 3, "beat's periodic task did not arrive"
    assert "Unrecoverable" not in output and "JSONDecodeError" not in output, output[-3000:]
    assert not _waiting(queue), "a message was left in the queue"


def test_a_message_file_appears_under_its_final_name_only_when_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, _ = _folders(tmp_path)
    seen: list[tuple[bool, dict]] = []
    real_replace = os.replace

    def checked_replace(source: str, target: str | Path) -> None:
        # At the moment of the rename the final name does not exist yet and the source is the whole message.
        if not str(target).endswith(".msg"):  # an exchange table, replaced whole too
            real_replace(source, target)
            return
        seen.append((os.path.exists(target), json.loads(Path(source).read_bytes())))
        real_replace(source, target)

    monkeypatch.setattr(kombu_filesystem.os, "replace", checked_replace)
    from kombu import Connection

    options = {
        "data_folder_in": str(queue / "out"),
        "data_folder_out": str(queue / "out"),
        "processed_folder": str(queue / "processed"),
        "control_folder": str(queue / "control"),
    }
    with Connection("filesystem://", transport=kombu_filesystem.Transport, transport_options=options) as conn:
        simple = conn.SimpleQueue("q")
        simple.put({"n": 1})
        message = simple.get(timeout=2)
        assert message.payload == {"n": 1}
        message.ack()
        simple.close()

    assert len(seen) == 1 and seen[0][0] is False
    assert seen[0][1]["body"]


def _bind_many(control: str, worker: int, start: float) -> None:
    from kombu import Connection

    options = {"data_folder_in": control, "data_folder_out": control, "control_folder": control}
    with Connection("filesystem://", transport=kombu_filesystem.Transport, transport_options=options) as conn:
        channel = conn.default_channel
        while time.time() < start:  # every process binds at the same moment
            time.sleep(0.001)
        for n in range(40):
            channel._queue_bind("celery", f"key-{worker}-{n}", "", f"queue-{worker}-{n}")
            assert channel.get_table("celery"), "a reader saw an empty or torn table"


def test_processes_binding_one_exchange_at_once_keep_every_binding(tmp_path: Path) -> None:
    """Kombu's own binding created the table file, then locked it: a second binder could lock the new, still
    empty file first and die on it (JSONDecodeError), or truncate a table another had just written."""
    control = tmp_path / "control"
    control.mkdir()
    start = time.time() + 2
    context = multiprocessing.get_context("spawn")
    binders = [context.Process(target=_bind_many, args=(str(control), w, start)) for w in range(6)]
    for process in binders:
        process.start()
    for process in binders:
        process.join(timeout=60)
    assert [process.exitcode for process in binders] == [0] * 6
    table = json.loads((control / "celery.exchange").read_bytes())
    assert sorted(q[2] for q in table) == sorted(f"queue-{w}-{n}" for w in range(6) for n in range(40))
    assert not [n for n in os.listdir(control) if n.startswith(kombu_filesystem.TEMP_PREFIX)]
