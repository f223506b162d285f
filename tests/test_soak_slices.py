"""The soak's figures over time (benchmarks.soak): each slice's latencies and cores are those of its own
stretch of the run, so a slow stretch is seen where it happened."""

from __future__ import annotations

import pytest

from benchmarks.soak import PathStats, _cores_by_slice, _latency_slices, capacity_lines


def test_latencies_fall_in_the_slice_they_were_answered_in() -> None:
    stats = PathStats()
    # Answered out of order (threads record as they finish), one exactly on an edge.
    for at, took in [(3.0, 0.3), (1.0, 0.1), (15.0, 0.15), (16.0, 0.9), (29.0, 0.2), (31.0, 5.0)]:
        stats.add(took=took, at=at, units=1)
    slices = _latency_slices(stats, [15.0, 30.0, 45.0])
    assert slices == [[0.1, 0.15, 0.3], [0.2, 0.9], [5.0]]


def test_cores_are_each_slices_own_cpu_over_its_length() -> None:
    samples = [(10.0, 0, 0, 0, 0, 0), (30.0, 0, 0, 0, 0, 0), (35.0, 0, 0, 0, 0, 0)]
    marks = [
        {"web server": 5.0, "PostgreSQL": 1.0, "Celery worker": 0.5},
        {"web server": 45.0, "PostgreSQL": 11.0, "Celery worker": 0.5, "Celery beat": 2.0},
    ]  # the third sample came after the load: no mark
    cores = _cores_by_slice(samples, marks)
    assert cores[0] == "0.50 / 0.10 / 0.00 / 0.05"
    assert cores[1] == "2.00 / 0.50 / 0.00 / 0.10"
    assert cores[2] == "-"


@pytest.mark.parametrize("edges", [[], [0.0]])
def test_no_requests_no_latencies(edges: list[float]) -> None:
    assert _latency_slices(PathStats(), edges) == [[] for _ in edges]


def test_latencies_from_sending_leave_out_the_clients_own_queue() -> None:
    stats = PathStats()
    # Due 0.5 s before it was answered, but sent 20 ms before: it waited in its client's queue.
    stats.add(took=0.5, at=2.0, units=1, answered=0.02)
    stats.add(took=0.1, at=20.0, units=1)  # no sending time: counted from when it was due
    assert _latency_slices(stats, [15.0, 30.0]) == [[0.5], [0.1]]
    assert _latency_slices(stats, [15.0, 30.0], from_sending=True) == [[0.02], [0.1]]


class _QuoteServer:
    """A real HTTP/1.1 server answering each POST after ``delay`` seconds, keeping its path and counting the
    requests in flight."""

    def __init__(self, delay: float = 0.0) -> None:
        import http.server
        import threading

        self.delay = delay
        self.paths: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                import time

                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    outer.paths.append(self.path)
                    outer.in_flight += 1
                    outer.most_in_flight = max(outer.most_in_flight, outer.in_flight)
                time.sleep(outer.delay)
                with lock:
                    outer.in_flight -= 1
                body = b'{"quotes": []}'
                self.send_response(201)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]


def test_a_quote_client_process_sends_its_quotes_and_hands_back_its_stats() -> None:
    """A quote client in a process of its own (the soak's default): it starts on the parent's clock, quotes
    a real HTTP server until the load's end and hands back what it measured, merged into the parent's."""
    import multiprocessing
    import time

    from benchmarks.soak import _quote_client

    quotes = _QuoteServer()
    server, paths = quotes.server, quotes.paths
    spawn = multiprocessing.get_context("spawn")
    mine, theirs = spawn.Pipe()
    process = spawn.Process(
        target=_quote_client,
        args=(server.server_address[1], [7, 8], "token", 50.0, 0, 2, theirs),
        daemon=True,
    )
    try:
        process.start()
        began = time.perf_counter()
        mine.send((began, time.monotonic() + 1.0))
        assert mine.poll(60), "the client sent no results"
        stats = PathStats()
        stats.add(took=0.01, at=0.5, units=1)  # the parent's own, kept
        stats.merge(mine.recv())
        mine.send(None)
        process.join(10)
    finally:
        server.shutdown()
    assert process.exitcode == 0
    assert stats.errors == []
    assert stats.units == len(paths) + 1 == len(stats.latencies) == len(stats.answered) == len(stats.done_at)
    assert len(paths) > 5
    assert set(paths) <= {"/api/v1/jobs/7/quotes", "/api/v1/jobs/8/quotes"}
    # Timed on the parent's clock: every answer within the second of load, from its start.
    assert all(0 <= at <= 2.0 for at in stats.done_at)


def test_the_capacity_lines_say_how_busy_the_machine_and_each_quote_client_were() -> None:
    stats = PathStats()
    for i in range(400):  # 400 quotes over 10 s from 2 clients, each answered 10 ms after it was sent
        stats.add(took=0.5, at=i / 40, units=1, answered=0.010)
    cpu = {
        "web server": 12.0,
        "PostgreSQL": 4.0,
        "Celery worker": 0.0,
        "load generator": 1.0,
        "quote clients": 1.0,
    }
    machine, clients = capacity_lines(cpu, load_s=10.0, cores=2, quotes=stats, clients=2, connections=2)
    assert machine == (
        "machine: 1.80 of 2 cores busy over the load: the platform 1.60 (web server 1.20, PostgreSQL 0.40), "
        "the load generators 0.20"
    )
    # 20 quotes/s each, 10 ms each, over 2 connections: each busy a tenth of the time; every quote sent
    # 490 ms after it was due.
    assert clients.startswith("quote clients: each sent 20.0 quotes/s (50.0 ms apart on average)")
    assert clients.endswith(
        "on up to 2 connection(s); mean answer from sending 10.0 ms, so its connections were busy 10% of the "
        "time; 100.0% of the quotes were sent more than 1 ms after they were due"
    )
    assert capacity_lines(cpu, load_s=10.0, cores=2, quotes=PathStats(), clients=2) == [machine]


@pytest.mark.parametrize("connections", [1, 4])
def test_a_quote_client_sends_each_quote_when_due_on_a_free_connection(connections: int) -> None:
    """40 quotes/s against a server that answers in 60 ms: one connection can carry at most ~16/s, so its
    quotes queue in the client and the times from due grow; four carry them all as they fall due."""
    import time

    from benchmarks.soak import Soak

    server = _QuoteServer(0.060)
    began = time.perf_counter()
    soak = Soak(port=server.port, stop_at=time.monotonic() + 2.0, began=began)
    try:
        soak.quotes([7], token="token", rate=40.0, thread=0, connections=connections)
    finally:
        server.server.shutdown()
    stats = soak.stats["quote"]
    assert stats.errors == []
    assert server.most_in_flight <= connections
    waits = sorted(due - sent for due, sent in zip(stats.latencies, stats.answered, strict=True))
    if connections == 1:
        assert stats.units < 40  # ~80 were due over the 2 s
        assert waits[len(waits) // 2] > 0.1  # the median quote waited behind earlier ones
    else:
        assert stats.units > 50
        assert server.most_in_flight > 1
        assert waits[len(waits) // 2] < 0.02


def test_the_lean_connection_reads_answers_by_length_and_by_chunks_and_reopens_a_closed_connection() -> None:
    import http.client
    import socket
    import threading

    from benchmarks._common import LeanConnection

    answers = [
        b'HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": "b"}\n',
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\nT: 1\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\nno",
    ]
    requests: list[bytes] = []
    accepted: list[int] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        queue = list(answers)
        while queue:
            sock, _ = listener.accept()
            accepted.append(1)
            with sock:
                data = b""
                while queue:
                    while b"\r\n\r\n" not in data:
                        data += sock.recv(65536)
                    head, _, data = data.partition(b"\r\n\r\n")
                    length = next(
                        (
                            int(line.split(b":")[1])
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-length")
                        ),
                        0,
                    )
                    while len(data) < length:
                        data += sock.recv(65536)
                    requests.append(head + b"\r\n\r\n" + data[:length])
                    data = data[length:]
                    answer = queue.pop(0)
                    # In two writes: an answer can arrive in pieces.
                    sock.sendall(answer[:7])
                    sock.sendall(answer[7:])
                    if b"Connection: close" in answer:
                        break
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    conn = LeanConnection("127.0.0.1", listener.getsockname()[1], timeout=10)
    assert conn.request("POST", "/q", body=b'{"limit": 10}', headers={"Authorization": "Bearer t"}) == (
        201,
        b'{"a": "b"}\n',
    )
    assert conn.request("GET", "/chunked") == (200, b"Wikipedia")
    assert conn.request("DELETE", "/x") == (204, b"")
    assert conn.sock is None  # closed, as the answer asked
    assert conn.request("GET", "/again") == (404, b"no")  # on a new connection
    thread.join(10)
    assert len(accepted) == 2
    assert requests[0].startswith(b"POST /q HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer t\r\n")
    assert requests[0].endswith(b'Content-Length: 13\r\n\r\n{"limit": 10}')
    # The server gone, the next request finds the stream closed before any answer.
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        conn.request("GET", "/gone")
