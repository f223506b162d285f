"""config.uvicorn_worker: each response's writes reach the socket as one, and nothing is lost, reordered
or left behind when a connection closes."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from config.uvicorn_worker import CardhourUvicornWorker, CoalescingHttpToolsProtocol, _CoalescingTransport
from config.wsgi_bridge import WsgiOnThreads


class _Recording:
    """A transport that records what it is asked to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", b""))
        self.closing = True

    def write_eof(self) -> None:
        self.calls.append(("eof", b""))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_the_writes_of_one_turn_go_out_as_one_and_before_a_close() -> None:
    async def scenario() -> list[tuple[str, bytes]]:
        inner = _Recording()
        transport = _CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(memoryview(b"body"))
        transport.write(b"")
        assert inner.calls == []  # nothing yet, in this turn
        assert transport.get_write_buffer_size() == 7 + 23
        assert transport.get_extra_info("peername") == "info:peername"
        await asyncio.sleep(0)
        transport.writelines([b"chunk-1", b"chunk-2"])  # a later turn: a write of its own
        await asyncio.sleep(0)
        transport.write(b"last")
        transport.close()  # pending writes first
        await asyncio.sleep(0)
        return inner.calls

    assert asyncio.run(scenario()) == [
        ("write", b"HTTP/1.1 200 OK\r\n\r\nbody"),
        ("write", b"chunk-1chunk-2"),
        ("write", b"last"),
        ("close", b""),
    ]


def test_an_abort_drops_what_is_pending_and_write_eof_follows_it() -> None:
    async def scenario() -> list[tuple[str, bytes]]:
        inner = _Recording()
        transport = _CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"a")
        transport.write_eof()
        transport.write(b"gone")
        transport.abort()
        await asyncio.sleep(0)
        return inner.calls

    assert asyncio.run(scenario()) == [("write", b"a"), ("eof", b""), ("abort", b"")]


def _app(environ: dict[str, Any], start_response: Any) -> Any:
    path = environ["PATH_INFO"]
    if path == "/stream":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"one,", b"two,", b"three"])
    body = f"answer to {path}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])

    class Joined(list):  # Django's HttpResponse: not streaming, sent whole by the bridge
        streaming = False

    return Joined([body])


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_real_server_answers_kept_alive_streamed_and_closing_requests() -> None:
    """uvicorn with the protocol, as the worker class configures it: pipelined requests on one kept-alive
    connection, a streamed (chunked) answer and a ``Connection: close`` all arrive whole and in order."""
    assert CardhourUvicornWorker.CONFIG_KWARGS["http"] is CoalescingHttpToolsProtocol
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bridge = WsgiOnThreads(_app, workers=2)
    config = uvicorn.Config(
        bridge,
        host="127.0.0.1",
        port=port,
        http=CoalescingHttpToolsProtocol,
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(
                b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            received = _read_all(client)  # the server closes after the third
        first, rest = received.split(b"answer to /a", 1)
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        streamed, last = rest.split(b"HTTP/1.1 200 OK\r\n", 2)[1:]
        assert b"transfer-encoding: chunked" in streamed
        assert b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n" in streamed
        assert b"connection: close" in last
        assert last.endswith(b"\r\n\r\nanswer to /b")
    finally:
        server.should_exit = True
        thread.join(10)
        bridge.executor.shutdown()
