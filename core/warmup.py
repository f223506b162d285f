"""What a new server process pays once, paid before it serves (config/gunicorn.conf.py post_worker_init).

- **The first request's imports.** Django imports the URLconf, and with it every view module, DRF,
  drf-spectacular and pydantic, on the first request a process resolves; Django's Redis cache client
  imports ``redis`` on its first use (the API's throttles count every request there). At design size that
  is ~0.4 s of CPU, paid by whichever request came first after a worker started, at boot and again after
  every ``max_requests`` recycle: a quote that normally costs ~10 ms took ~450 ms, and the requests queued
  behind it in that worker waited too.
- **Full garbage collections.** What the process holds once set up lives as long as the process, yet every
  full collection walked it (see ``startup_objects_freeze``).
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)


def request_path_warm() -> None:
    """Import the URLconf (every view) and open the default cache's client, so that a new process's first
    request costs what any other does. A cache that cannot be reached is logged, not raised: the process
    still starts, and its requests meet the cache as they would have without this."""
    from django.core.cache import cache
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  # imports the URLconf and every module it names
    try:
        cache.get("cardhour:warmup")
    except Exception:
        logger.warning("warming the cache client failed; the first request will try again", exc_info=True)


def startup_objects_freeze() -> None:
    """Leave the objects a process holds once it is set up (modules, classes, the URLconf: ~190,000 at
    design size) out of the cyclic garbage collector's full collections (``gc.freeze``). They live as long
    as the process, yet each full collection walked them all: ~90 ms with every thread of the process
    stopped, about once every thousand quotes, which is a quote's p99. Objects made later are collected as
    before, and frozen ones are still freed when nothing refers to them."""
    gc.collect()
    gc.freeze()
