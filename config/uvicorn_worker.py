"""The gunicorn worker class for the production server: uvicorn's, without the ASGI lifespan protocol
(Django does not implement it; uvicorn would log that it "appears unsupported" at every start), and with
each response's writes coalesced into one.

uvicorn's HTTP protocol writes a response's status line and headers to the socket as soon as the
application sends ``http.response.start``, and the body with the next message: two ``send`` system calls
per response, two TCP segments (the socket has ``TCP_NODELAY``), and two wake-ups of the client. With the
event loop in C (uvloop), each call runs holding the GIL, so the request threads wait on it too. Profiled
under quotes (py-spy, GIL samples only) the two writes were ~6 % of a worker's CPU, the header write
alone ~4.6 %. ``CoalescingHttpToolsProtocol`` gives uvicorn a transport that collects the writes made in
one turn of the event loop and passes them on in one call at the end of that turn. config.wsgi_bridge
sends a whole response's start and body in one turn, so a response is one write; a streamed response's
chunks still go out as they come, one turn at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

from config import connection_balance


class _CoalescingTransport:
    """A transport that hands the writes of one event-loop turn to ``transport`` as one write, at the end
    of the turn (``call_soon``), or before anything that must follow them (closing, ``write_eof``).
    Everything else is the transport's own; an abort drops what is pending, as it drops its buffer."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._pending is None:
            self._pending = [bytes(data)]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def get_write_buffer_size(self) -> int:
        pending = sum(len(data) for data in self._pending) if self._pending else 0
        return self._transport.get_write_buffer_size() + pending

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a ``_CoalescingTransport``, counting its worker's open connections
    (config.connection_balance)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        connection_balance.opened()
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        connection_balance.closed()
        super().connection_lost(exc)


class CardhourUvicornWorker(UvicornWorker):
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "lifespan": "off", "http": CoalescingHttpToolsProtocol}
