"""The ASGI application the production server runs (gunicorn with uvicorn workers, config/gunicorn.conf.py).

Two paths in one process:

- **Waiting requests** (the paths in ``CARDHOUR_ASYNC_PATHS``: the operators' lease feed long-poll) go to
  core.api.longpoll.LongPollASGIHandler: the middleware chain and the view run in one hop to a thread, then
  the request waits on the event loop for a PostgreSQL NOTIFY holding neither a thread nor a database
  connection. Hundreds of agents can wait at once at the cost of a socket and a future each.
- **Everything else** goes to Django's WSGI handler on a fixed pool of ``CARDHOUR_WSGI_THREADS`` threads
  (config.wsgi_bridge): ordinary requests keep the cost they have under a threaded WSGI server — one thread
  hop there and back, and a database connection from the pool per request — instead of paying a thread hop
  per middleware, which Django's async stack costs a synchronous view, or one per response message, which
  a2wsgi's bridge costs. A waiting request never takes one of these threads, so long-polls
  cannot starve heartbeats, quotes or ``/healthz``.
"""

from __future__ import annotations

from typing import Any

from django.core.wsgi import get_wsgi_application

from config.entrypoint import use_settings
from config.wsgi_bridge import WsgiOnThreads

use_settings()  # production unless DJANGO_SETTINGS_MODULE says otherwise (config/entrypoint.py)

_wsgi_app = get_wsgi_application()  # django.setup()

from core.api.longpoll import LongPollASGIHandler  # noqa: E402  (after setup)

_async_app = LongPollASGIHandler()

from django.conf import settings  # noqa: E402  (after setup)

_threaded_app = WsgiOnThreads(
    _wsgi_app,
    workers=settings.CARDHOUR_WSGI_THREADS,
    bulk_workers=settings.CARDHOUR_WSGI_BULK_THREADS,
    bulk_paths=settings.CARDHOUR_BULK_PATHS,
)
_async_paths = frozenset(settings.CARDHOUR_ASYNC_PATHS)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] in _async_paths:
        await _async_app(scope, receive, send)
    elif scope["type"] == "http":
        await _threaded_app(scope, receive, send)
    else:  # lifespan and anything else: Django's handler answers (it refuses what it does not serve)
        await _async_app(scope, receive, send)
