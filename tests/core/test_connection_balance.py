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
    moved_at = connection_balance._moved_at
    connection_balance._open[:] = [0] * len(saved[0])
    connection_balance._live[:] = [0] * len(saved[1])
    yield
    connection_balance._open[:], connection_balance._live[:] = saved[0], saved[1]
    connection_balance._slot = saved[2]
    connection_balance._moved_at = moved_at


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
