"""config.connection_balance: a worker holding more than its share of keep-alive connections asks clients
to reconnect, so a few long-lived connections end up spread over the production server's workers."""

from __future__ import annotations

import collections
import http.client
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.prodserver import free_port, production_env, production_server
from config import connection_balance
from tests.core.test_wsgi_bridge import _serve


@pytest.fixture
def slots() -> Iterator[None]:
    """The module's shared state as a fresh master would have it, restored after."""
    saved = (connection_balance._open[:], connection_balance._live[:], connection_balance._slot)
    pids = connection_balance._pid[:]
    times = (connection_balance._moved_at, connection_balance._load_moved_at, connection_balance._busy_at)
    connection_balance._open[:] = [0] * len(saved[0])
    connection_balance._live[:] = [0] * len(saved[1])
    connection_balance._pid[:] = [0] * len(pids)
    connection_balance._readings.clear()
    connection_balance._loads.clear()
    yield
    connection_balance._open[:], connection_balance._live[:] = saved[0], saved[1]
    connection_balance._pid[:] = pids
    connection_balance._slot = saved[2]
    connection_balance._moved_at, connection_balance._load_moved_at, connection_balance._busy_at = times
    connection_balance._readings.clear()
    connection_balance._loads.clear()


def test_a_worker_moves_a_connection_only_when_it_holds_more_than_its_share(
    slots: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_balance, "MOVE_INTERVAL_SECONDS", 0.0)
    first, second, third = SimpleNamespace(), SimpleNamespace(), SimpleNamespace()
    for worker in (first, second, third):
        connection_balance.assign(worker)
    assert (first.balance_slot, second.balance_slot, third.balance_slot) == (0, 1, 2)
    connection_balance.adopt(first)

    def counts(mine: int, *others: int) -> None:
        connection_balance._open[0] = mine
        for slot, count in enumerate(others, start=1):
            connection_balance._open[slot] = count

    counts(3, 1, 2)
    assert connection_balance.over_share()  # 3 > 1 + 1
    counts(2, 1, 1)
    assert not connection_balance.over_share()  # within one of the least: no flapping
    counts(1, 0, 0)
    assert not connection_balance.over_share()
    counts(4, 0, 4)
    assert connection_balance.over_share()
    counts(88, 80, 90)
    assert not connection_balance.over_share()  # many connections: an eighth of the least is within
    counts(91, 80, 90)
    assert connection_balance.over_share()
    # A worker that exited frees its slot: it is neither counted nor the least loaded any more.
    counts(4, 0, 4)
    connection_balance.release(second)
    assert connection_balance._live[1] == 0
    assert not connection_balance.over_share()  # 4 against the third's 4
    replacement = SimpleNamespace()
    connection_balance.assign(replacement)
    assert replacement.balance_slot == 1
    assert connection_balance._open[1] == 0
    assert connection_balance.over_share()  # 4 against the new worker's 0
    # Counting follows this worker's connections.
    connection_balance.opened()
    connection_balance.closed()
    connection_balance.closed()
    assert connection_balance._open[0] == 3


def test_a_worker_moves_at_most_one_connection_per_interval(
    slots: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However unbalanced, one move per MOVE_INTERVAL_SECONDS: the pauses that go with moves stay a small
    share of a worker's event loop."""
    clock = [1000.0]
    monkeypatch.setattr(connection_balance.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(connection_balance, "_moved_at", -1.0)
    mine, other = SimpleNamespace(), SimpleNamespace()
    connection_balance.assign(mine)
    connection_balance.assign(other)
    connection_balance.adopt(mine)
    connection_balance._open[0] = 10
    assert connection_balance.over_share()
    assert not connection_balance.over_share()
    clock[0] += connection_balance.MOVE_INTERVAL_SECONDS * 0.9
    assert not connection_balance.over_share()
    clock[0] += connection_balance.MOVE_INTERVAL_SECONDS * 0.2
    assert connection_balance.over_share()


class _Cpu:
    """Fake workers' CPU: each pid's CPU seconds grow by its load (in cores) as the fake clock advances."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        self.used: dict[int, float] = {}
        self.load: dict[int, float] = {}
        monkeypatch.setattr(connection_balance.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(connection_balance, "_cpu_seconds", lambda pid: self.used.get(pid))

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for pid, cores in self.load.items():
            self.used[pid] = self.used.get(pid, 0.0) + cores * seconds


def _two_workers(cpu: _Cpu, mine: float, other: float, counts: tuple[int, int]) -> None:
    first, second = SimpleNamespace(), SimpleNamespace()
    connection_balance.assign(first)
    connection_balance.assign(second)
    connection_balance.adopt(first)
    connection_balance._pid[0], connection_balance._pid[1] = 101, 102
    connection_balance._open[0], connection_balance._open[1] = counts
    cpu.load = {101: mine, 102: other}
    cpu.used = {101: 0.0, 102: 0.0}


def test_a_busy_worker_moves_a_connection_to_an_idle_one_whatever_the_counts(
    slots: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The design-load soak's case: connections 23 : 21 (balanced by count), CPU 0.94 : 0.07 of a core (all
    the quote clients on one worker). The busy worker moves one, then waits for the loads to be measured
    again before it moves another."""
    cpu = _Cpu(monkeypatch)
    _two_workers(cpu, mine=0.94, other=0.07, counts=(23, 21))
    assert not connection_balance.over_share()  # the first reading: no load measured yet
    cpu.advance(connection_balance.LOAD_WINDOW_SECONDS)
    assert connection_balance.over_share()
    cpu.advance(connection_balance.LOAD_WINDOW_SECONDS)
    assert not connection_balance.over_share()  # measuring again after the move
    cpu.advance(connection_balance.LOAD_WINDOW_SECONDS)
    assert not connection_balance.over_share()  # one move per LOAD_MOVE_INTERVAL_SECONDS
    cpu.advance(connection_balance.LOAD_MOVE_INTERVAL_SECONDS)
    assert connection_balance.over_share()  # still unbalanced: the next move


@pytest.mark.parametrize(
    ("mine", "other", "counts"),
    [
        (0.46, 0.46, (25, 19)),  # busy and balanced by load: the counts move nothing
        (0.46, 0.23, (22, 22)),  # three busy clients on two workers, 2 : 1: moving one would only swap
        (0.90, 0.70, (22, 22)),  # both busy, within the margin
        (0.10, 0.00, (22, 22)),  # not busy, counts balanced
    ],
)
def test_balanced_or_lightly_loaded_workers_move_nothing_by_load(
    slots: None, monkeypatch: pytest.MonkeyPatch, mine: float, other: float, counts: tuple[int, int]
) -> None:
    cpu = _Cpu(monkeypatch)
    _two_workers(cpu, mine=mine, other=other, counts=counts)
    connection_balance.over_share()  # the first reading (counts decide until a window is measured)
    connection_balance._moved_at = -1.0
    for _ in range(5):
        cpu.advance(connection_balance.LOAD_WINDOW_SECONDS)
        assert not connection_balance.over_share()


def test_an_idle_server_balances_by_count_and_a_busy_one_a_moment_ago_does_not(
    slots: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = _Cpu(monkeypatch)
    _two_workers(cpu, mine=0.02, other=0.01, counts=(6, 2))
    connection_balance.over_share()
    cpu.advance(connection_balance.LOAD_WINDOW_SECONDS)
    assert connection_balance.over_share()  # idle: 6 > 2 + 1 by count, as before

    cpu.load = {101: 0.5, 102: 0.45}  # busy now, balanced by load
    cpu.advance(connection_balance.LOAD_WINDOW_SECONDS)
    assert not connection_balance.over_share()
    cpu.load = {101: 0.02, 102: 0.01}  # idle again: counts decide once the busy moment is past
    cpu.advance(connection_balance.LOAD_WINDOW_SECONDS)
    assert not connection_balance.over_share()
    cpu.advance(connection_balance.LOAD_MOVE_INTERVAL_SECONDS)
    assert connection_balance.over_share()


def test_a_worker_whose_cpu_cannot_be_read_is_balanced_by_count(
    slots: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = _Cpu(monkeypatch)
    _two_workers(cpu, mine=0.9, other=0.0, counts=(3, 1))
    del cpu.used[102]  # gone from /proc (or no /proc at all)
    cpu.load.pop(102)
    assert connection_balance.over_share()  # 3 > 1 + 1 by count


def test_a_workers_cpu_is_read_from_proc() -> None:
    import os

    seconds = connection_balance._cpu_seconds(os.getpid())
    assert seconds is not None
    busy_until = time.process_time() + 0.05
    while time.process_time() < busy_until:
        pass
    later = connection_balance._cpu_seconds(os.getpid())
    assert later is not None and later >= seconds + 0.03
    assert connection_balance._cpu_seconds(0) is None
    assert connection_balance._cpu_seconds(2**22 + 12345) is None  # no such process


def test_outside_gunicorn_nothing_is_counted_or_moved(slots: None) -> None:
    connection_balance._slot = -1
    connection_balance.opened()
    assert connection_balance._open[:] == [0] * len(connection_balance._open)
    assert not connection_balance.over_share()


def _answer(app: Any) -> list[tuple[bytes, bytes]]:
    sent = _serve(app, messages=[{"type": "http.request", "body": b"", "more_body": False}], method="GET")
    return list(sent[0]["headers"])


def test_the_bridge_closes_the_connection_of_a_worker_over_its_share(
    slots: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Joined(list):
        streaming = False

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Joined([b"ok"])

    assert (b"connection", b"close") not in _answer(app)
    monkeypatch.setattr(connection_balance, "over_share", lambda: True)
    assert _answer(app)[-1] == (b"connection", b"close")


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to see the server's sockets")
def test_four_keep_alive_clients_end_two_on_each_of_two_workers() -> None:
    """Four clients open their connections at once (the accept race puts them 2 : 2, 3 : 1 or 4 : 0) and
    keep sending over them, reconnecting when answered ``Connection: close``, as http.client does: after
    a few rounds each worker holds two, and the responses stop asking anyone to move."""
    port = free_port()
    env = production_env(
        database_url="postgres://127.0.0.1:1/none",  # /livez reads no database
        port=port,
        extra={"WEB_CONCURRENCY": "2", "GUNICORN_ACCESSLOG": ""},
    )
    with production_server(env, ready_path="/livez") as server:
        barrier = threading.Barrier(4)
        connections: list[http.client.HTTPConnection] = []
        lock = threading.Lock()

        def client() -> None:
            barrier.wait()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", "/livez")
            connection.getresponse().read()
            with lock:
                connections.append(connection)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        def round_() -> int:
            moved = 0
            for connection in connections:
                connection.request("GET", "/livez")
                response = connection.getresponse()
                response.read()
                assert response.status == 200
                moved += response.getheader("connection") == "close"
            return moved

        def per_worker() -> list[int]:
            sockets = subprocess.run(  # noqa: S603 - a fixed command
                ["/usr/bin/env", "ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            counts = collections.Counter(
                part.split("pid=")[1].split(",")[0] for part in sockets.split() if "pid=" in part
            )
            return sorted(counts.values())

        # A worker moves at most one connection per MOVE_INTERVAL_SECONDS and each move re-draws one
        # connection: rounds spread over a few seconds give it dozens of moves, far more than it takes.
        for _ in range(300):
            if round_() == 0 and per_worker() == [2, 2]:
                break
            time.sleep(0.02)
        assert per_worker() == [2, 2]
        assert round_() == 0  # balanced: nothing moves any more
        assert server.process.poll() is None
        for connection in connections:
            connection.close()
