"""Django's WSGI handler served from an ASGI event loop on a fixed pool of threads, with one hop per request.

a2wsgi's WSGIMiddleware (which this replaces for config.asgi) hands every message across between the
request's thread and the event loop and waits for it there: the request body, the response's start, each
chunk of its body and the empty last one — four or five round trips for a JSON answer, each a wake-up
of the loop and of the thread. Under load, with the matcher's numpy work holding the GIL in the other
threads, those waits cost more CPU than the middleware chain does (py-spy of the production server, issue
14). Here a request whose body arrived in one message (every API request but a large upload) is read on
the loop before its thread starts, and a response that is not streaming (``HttpResponse``, what every API
view and page answers) is joined in the thread and sent from the loop after the thread returns: one hop
there and one back. A streaming response (``StreamingHttpResponse``, ``FileResponse``: static files,
exports) is sent chunk by chunk as it is produced, as a2wsgi sends it, so it is never held whole in
memory; a body that comes in several messages is read the same way, from the thread, as it is needed.

The response is closed (Django's ``request_finished``: the thread's database connection goes back to the
pool) in its thread, before the answer is sent, as a threaded WSGI server would close it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from a2wsgi.wsgi import Body, build_environ

from config import connection_balance

_StartResponse = tuple[int, list[tuple[bytes, bytes]]]


class _ReceivedBody(Body):
    """a2wsgi's request body, starting from the first message, already received on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, receive: Any, first: dict[str, Any]) -> None:
        super().__init__(loop, receive)
        self.buffer.extend(first.get("body", b""))
        self._has_more = bool(first.get("more_body", False))


class _Exchange:
    """One request's WSGI side, run in a pool thread: ``run`` returns the whole answer of a response that
    is not streaming, or sends a streaming one itself and returns None."""

    __slots__ = ("loop", "send", "start", "written")

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Any) -> None:
        self.loop = loop
        self.send = send
        self.start: _StartResponse | None = None
        self.written: list[bytes] = []

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        # Nothing is sent before the application returns, so a second call (with exc_info, from an error
        # handler) simply replaces the first, as PEP 3333 allows before the body starts.
        code = int(status.split(" ", 1)[0])
        self.start = (
            code,
            [
                (name.strip().encode("latin1").lower(), value.strip().encode("latin1"))
                for name, value in headers
            ],
        )
        return self.written.append

    def _send_now(self, message: dict[str, Any]) -> None:
        asyncio.run_coroutine_threadsafe(self.send(message), self.loop).result()

    def run(self, app: Any, environ: Any) -> tuple[_StartResponse, bytes] | None:
        iterable = app(environ, self.start_response)
        try:
            if getattr(iterable, "streaming", True) is False:  # Django's HttpResponse: join it here
                body = b"".join([*self.written, *iterable])
                if self.start is None:
                    raise RuntimeError("the WSGI application returned without calling start_response")
                return self.start, body
            chunks = iter(iterable)
            first = next(chunks, b"")  # start_response may come with the first chunk (PEP 3333)
            if self.start is None:
                raise RuntimeError("the WSGI application returned without calling start_response")
            code, headers = self.start
            self._send_now({"type": "http.response.start", "status": code, "headers": headers})
            for chunk in [*self.written, first]:
                if chunk:
                    self._send_now({"type": "http.response.body", "body": chunk, "more_body": True})
            for chunk in chunks:
                if chunk:
                    self._send_now({"type": "http.response.body", "body": chunk, "more_body": True})
            self._send_now({"type": "http.response.body", "body": b""})
            return None
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()


class WsgiOnThreads:
    """An ASGI application serving HTTP requests with a WSGI application on ``workers`` threads; the
    requests for ``bulk_paths`` (exact paths) on ``bulk_workers`` threads of their own when that is above
    zero.

    Two lanes, because a worker's request threads share one interpreter lock. An operator agent's batch
    (a thousand usage records, fifty heartbeats) holds it for tens of milliseconds; a buyer's quote in
    the same worker that comes back from each of its database round trips waits for it, up to the 5 ms
    switch interval each time, and more threads running at once add more of those hand-overs (issue 14:
    at 16 quotes in flight, 2 or 3 threads a worker cost less server CPU a quote than 8 in all five
    comparisons of three interleaved rounds, 6.4–8.4 ms against 7.5–8.7; at 4 in flight, no difference).
    With a lane of its own, batches queue behind batches, never in front of an interactive request, and a
    worker runs at most ``workers + bulk_workers`` requests at once however many arrive; the others wait
    their turn in the lane's queue, holding nothing but their socket."""

    def __init__(
        self, app: Any, *, workers: int, bulk_workers: int = 0, bulk_paths: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="WSGI")
        self.bulk_paths = frozenset(bulk_paths) if bulk_workers > 0 else frozenset()
        self.bulk_executor = (
            ThreadPoolExecutor(max_workers=bulk_workers, thread_name_prefix="WSGI-bulk")
            if self.bulk_paths
            else self.executor
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise RuntimeError(f"WsgiOnThreads serves HTTP only, not {scope['type']!r}")
        loop = asyncio.get_running_loop()
        first = await receive()
        if first["type"] == "http.disconnect":
            return
        environ = build_environ(scope, _ReceivedBody(loop, receive, first))  # type: ignore[arg-type]
        exchange = _Exchange(loop, send)
        context = contextvars.copy_context()
        executor = self.bulk_executor if scope["path"] in self.bulk_paths else self.executor
        answer = await loop.run_in_executor(
            executor, functools.partial(context.run, exchange.run, self.app, environ)
        )
        if answer is None:  # streamed from the thread
            return
        (code, headers), body = answer
        move = connection_balance.over_share()  # this worker holds more than its share: move the client
        if move:
            headers = [*headers, (b"connection", b"close")]
        await send({"type": "http.response.start", "status": code, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if move:
            # After the writes of this turn reach the socket (they are flushed by a callback queued first).
            loop.call_soon(connection_balance.pause)
