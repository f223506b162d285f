"""Long-polling API views that wait without a thread or a database connection.

A DRF view stays an ordinary synchronous view: it authenticates, throttles, validates and answers. When it
has nothing to answer yet and the caller asked to wait, it returns its "nothing yet" response with a
:class:`LongPoll` attached (``response.long_poll``) instead of sleeping.

Under the production server the long-poll paths are served by :class:`LongPollASGIHandler` (config.asgi):
the whole synchronous middleware chain and the view run in **one** hop to a long-poll thread, as a WSGI
server would run them; the response comes back with its ``long_poll``, the thread and the database connection
are given back, and only then does the request wait — on the event loop, a future, no thread, no connection —
for the view's wake-up keys (core.wakeups). When something arrives, the same response (its headers already
set by the middleware) gets the re-check's data as its body; when the wait runs out it goes as it was.
(Django's own ASGI handler runs each synchronous middleware hook through its own thread hop — about a dozen
per request here — which made a waiting poll cost eight times a ``/healthz``.)

Under WSGI (``runserver``, the test client) the view waits itself, holding its thread: correct, only not
cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.db import close_old_connections, connection
from django.http import HttpRequest, HttpResponseBase
from django.urls import set_script_prefix
from rest_framework.views import APIView

from core import wakeups


@dataclass
class LongPoll:
    """What a view waits for: wake-up keys of a topic, until a monotonic deadline, and how to re-check
    (``recheck`` runs in a thread with database access; it returns the response data when something is
    there, None when not)."""

    topic: str
    keys: list[str]
    deadline: float
    recheck: Callable[[], Any | None]


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _long_poll_executor() -> ThreadPoolExecutor:
    """The process's few threads for long-polls' database work (``CARDHOUR_LONG_POLL_THREADS``).

    Not one thread per request, as Django's thread-sensitive default would start: 400 agents re-polling
    together (their waits run out at about the same time) would be 400 threads contending with the WSGI
    threads for the GIL and the connection pool, and heartbeats and quotes would wait behind them. Here they
    queue as futures on the event loop and run a few at a time; an agent's answer may come a little later,
    nobody else's does."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=settings.CARDHOUR_LONG_POLL_THREADS, thread_name_prefix="cardhour-long-poll"
            )
        return _executor


def _runner(request: HttpRequest) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """How the view's synchronous parts run: on the long-poll threads under the ASGI server; elsewhere
    (``runserver``, the test client: the view under ``async_to_sync``) back on the request's own thread,
    Django's thread-sensitive default, so they see that thread's connection and open transaction."""
    if isinstance(request, ASGIRequest):
        executor = _long_poll_executor()
        return lambda func: sync_to_async(func, thread_sensitive=False, executor=executor)
    return sync_to_async


def _release_connection() -> None:
    """Give the request's database connection back (to the pool, or close it) before a wait."""
    if not connection.in_atomic_block:
        connection.close()
    else:  # pragma: no cover - a view that waits inside a transaction answered at once instead
        close_old_connections()


def _recheck(poll: LongPoll) -> Any | None:
    try:
        return poll.recheck()
    finally:
        _release_connection()


ASYNC_WAIT_KEY = "cardhour.long_poll.handler_waits"  # request.META: the handler waits, not the view


async def _wait_for_data(
    poll: LongPoll,
    *,
    marked: wakeups.Mark | None,
    in_thread: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> Any | None:
    """Subscribe to the poll's keys, re-check once unless nothing can have been missed since ``marked``
    (core.wakeups.mark; None: always), then wait and re-check on each wake-up until the deadline."""
    async with wakeups.subscribe(topic=poll.topic, keys=poll.keys) as subscription:
        missed = marked is None or subscription.missed_since(marked)
        data = await in_thread(_recheck)(poll) if missed else None
        while data is None:
            remaining = poll.deadline - time.monotonic()
            if remaining <= 0 or not await subscription.wait(remaining):
                break
            data = await in_thread(_recheck)(poll)
    return data


def long_poll_view(api_cls: type[APIView]) -> Callable[..., Any]:
    """A view for ``api_cls`` that waits when the view attaches a ``LongPoll``: under
    :class:`LongPollASGIHandler` it returns at once and the handler waits on the event loop; elsewhere it
    waits itself, holding its thread.

    The returned callable keeps ``cls`` and ``initkwargs`` like DRF's ``as_view`` so the schema generator
    and the URL resolver see the DRF view.
    """
    sync_view = api_cls.as_view()

    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response: HttpResponseBase = sync_view(request, *args, **kwargs)
        poll: LongPoll | None = getattr(response, "long_poll", None)
        if poll is None or request.META.get(ASYNC_WAIT_KEY):
            return response
        _release_connection()
        # Re-checks run back on this thread (sync_to_async's default), with its connection.
        data = async_to_sync(_wait_for_data)(poll, marked=None, in_thread=sync_to_async)
        if data is not None:
            response.data = data  # type: ignore[attr-defined]  # a DRF Response, rendered after this
        return response

    view.cls = api_cls  # type: ignore[attr-defined]
    view.initkwargs = {}  # type: ignore[attr-defined]
    view.csrf_exempt = True  # type: ignore[attr-defined]
    return view


def _refresh(response: HttpResponseBase, data: Any) -> None:
    """Give an answered (rendered, middleware-processed) DRF response new data as its body."""
    response.data = data  # type: ignore[attr-defined]
    response.content = response.rendered_content  # type: ignore[attr-defined]
    if response.has_header("Content-Length"):
        response["Content-Length"] = str(len(response.content))  # type: ignore[attr-defined]


class LongPollASGIHandler(ASGIHandler):
    """Django's ASGI handler for the long-poll paths, lean: a request costs one hop to a long-poll thread (two
    when a wait ends with data), and its wait is done here on the event loop (see the module docstring).

    Django's own ``ASGIHandler.handle`` opens a ``ThreadSensitiveContext`` per request — a new thread,
    started and joined, for the ``request_started`` signal's synchronous receivers — and makes further hops
    for the signal and for ``response.close()``. Here the signal, the middleware chain, the view and
    ``response.close()`` (which sends ``request_finished``) all run in the one hop, as a WSGI server runs
    them on its thread. Closing before the body is sent is safe for what this handler serves: DRF responses,
    rendered by then, never streaming."""

    def __init__(self) -> None:
        super().__init__()
        self.load_middleware(is_async=False)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        try:
            if request is None:
                assert error_response is not None  # create_request returns one or the other
                await self.send_response(error_response, send)
                return
            # The wait listens for the client going away (an agent restarted): its future is dropped then
            # instead of being held to the deadline.
            gone = asyncio.ensure_future(self.listen_for_disconnect(receive))
            answer = asyncio.ensure_future(self._answer(request, scope))
            await asyncio.wait([gone, answer], return_when=asyncio.FIRST_COMPLETED)
            for task in (gone, answer):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                        await task
            if answer.cancelled():  # the client went away first: nobody to answer
                return
            await self.send_response(answer.result(), send)
        finally:
            body_file.close()

    async def _answer(self, request: HttpRequest, scope: dict[str, Any]) -> HttpResponseBase:
        request.META[ASYNC_WAIT_KEY] = True
        in_thread = _runner(request)
        marked = wakeups.mark()
        response: HttpResponseBase = await in_thread(self._respond)(request, scope)
        poll: LongPoll | None = getattr(response, "long_poll", None)
        if poll is not None:
            data = await _wait_for_data(poll, marked=marked, in_thread=in_thread)
            if data is not None:
                await in_thread(_refresh)(response, data)
        return response

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # Not reached through ``handle`` above; kept so a caller of Django's async API gets the same answer.
        return await self._answer(request, {})

    def _respond(self, request: HttpRequest, scope: dict[str, Any]) -> HttpResponseBase:
        signals.request_started.send(sender=self.__class__, scope=scope)
        try:
            response = self.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]
            response.close()  # request_finished: the same thread and connection as the view's
            return response
        finally:
            _release_connection()
