"""Long-polling API views that wait without a thread or a database connection.

A DRF view stays an ordinary synchronous view: it authenticates, throttles, validates and answers. When it
has nothing to answer yet and the caller asked to wait, it returns its "nothing yet" response with a
:class:`LongPoll` attached (``response.long_poll``) instead of sleeping. :func:`long_poll_view` turns the
view into an async view: it runs the synchronous view in a thread, and on a ``long_poll`` gives the thread
and the database connection back, subscribes to the view's wake-up keys (core.wakeups), re-checks once
if a notification may have arrived since the view's check (so a change that committed before the
subscription is not missed; core.wakeups.mark), then waits on the event loop — a future,
no thread, no connection — and re-checks only when woken. The response object, already negotiated,
authenticated and throttled, is answered with the re-check's data, or as it was when the wait runs out.

Under the ASGI server every middleware is async-capable, so a waiting request holds only its socket and a
future. Under WSGI (``runserver``, the test client) the same view runs via ``async_to_sync`` and holds its
thread while it waits — correct, only not cheap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections, connection
from django.http import HttpRequest, HttpResponseBase
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


def long_poll_view(api_cls: type[APIView]) -> Callable[..., Any]:
    """An async view for ``api_cls`` that waits on wake-ups when the view attaches a ``LongPoll``.

    The returned callable keeps ``cls`` and ``initkwargs`` like DRF's ``as_view`` so the schema generator
    and the URL resolver see the DRF view.
    """
    sync_view = api_cls.as_view()

    def run_sync(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = sync_view(request, *args, **kwargs)
        if getattr(response, "long_poll", None) is not None:
            _release_connection()
        return response

    async def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        in_thread = _runner(request)
        marked = wakeups.mark()
        response: HttpResponseBase = await in_thread(run_sync)(request, *args, **kwargs)
        poll: LongPoll | None = getattr(response, "long_poll", None)
        if poll is None:
            return response
        async with wakeups.subscribe(topic=poll.topic, keys=poll.keys) as subscription:
            # The view checked after the mark: re-check only if a notification may have slipped in before
            # the subscription (the first poll on a process, or any notification meanwhile).
            data = await in_thread(_recheck)(poll) if subscription.missed_since(marked) else None
            while data is None:
                remaining = poll.deadline - time.monotonic()
                if remaining <= 0 or not await subscription.wait(remaining):
                    break
                data = await in_thread(_recheck)(poll)
        if data is not None:
            response.data = data  # type: ignore[attr-defined]  # a DRF Response, rendered after this
        return response

    view.cls = api_cls  # type: ignore[attr-defined]
    view.initkwargs = {}  # type: ignore[attr-defined]
    view.csrf_exempt = True  # type: ignore[attr-defined]
    return view
