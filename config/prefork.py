"""The production server's master makes the broker's market ready before it forks each worker.

Without this, every worker read the island catalogue and the hold book itself once it had started (in the
background, config/gunicorn.conf.py ``post_worker_init``), and a quote that reached it first waited for
that: at design load (10,000 clusters, 100,000 islands, 100,000 leases) a quote sent as the three workers
were replaced was answered after 4.9–7.0 s, and each replacement cost 3.0–4.1 s of CPU; ``max_requests``
recycling replaces a worker every ~21,000 requests (about every 40 s at 200 quotes/s beside 10,000 clusters
heartbeating one request each). Preloaded: 0.6–0.8 s (the workers' start) and 0.22–0.26 s.

Here the master loads the market once, in its only thread, before it forks its first worker; each worker
starts with it (copy-on-write pages: the numpy arrays are shared until written) and catches up from it as
it would from its own load — the hold book from the last lease change it saw, the catalogue by the rows
written since its snapshot (broker.catalog). Before a later fork (a recycled or crashed worker) the
master brings its copy up to date again if it is older than the catalogue's TTL, so a new worker never
starts from an old market. The master also imports the URLconf (every view module) once for all workers,
and leaves what it holds out of the garbage collector's full collections (``gc.freeze``), which keeps a
worker's collections from touching, and so copying, the pages it shares with the master.

What it costs and saves (``python -m benchmarks.first_quote``, design load, 3 workers, alternating with it
off in the same run; the README has the figures):
- **Start-up.** The server answers nothing until its first worker is forked, so the load moves from
  "after ``/healthz`` answers" to "before": a readiness probe waits for it, a quote never does. The start
  itself was shorter and took half the CPU: Django is imported once, not in every worker.
- **Memory.** The master keeps its copy of the market for the next fork, and each worker's copy becomes
  its own as it refreshes; but the modules and what the workers never write stay shared: the processes'
  proportional set size after a catalogue refresh was 478–505 MiB, against 738–756 without.
- **Code upgrades** need a restart of the master (its imports are inherited): ``kill -HUP`` starts
  workers with the master's code, as with gunicorn's ``preload_app``.

``CARDHOUR_PRELOAD_MARKET=0`` turns it off (the master then imports nothing of Django). A failed load
(the database unreachable at start) is logged and not retried for ``RETRY_SECONDS``; the workers then load
for themselves, as without it. The master's database connections, and Django's connection pool with its
threads, are closed before every fork: a child must never share a socket or a lock with its parent.
"""

from __future__ import annotations

import gc
import logging
import os
import time

logger = logging.getLogger("cardhour.prefork")

RETRY_SECONDS = 60.0
_OFF = {"0", "false", "no", "off"}

_failed_at: float | None = None


def enabled() -> bool:
    return os.environ.get("CARDHOUR_PRELOAD_MARKET", "1").strip().lower() not in _OFF


def before_fork() -> None:
    """gunicorn's ``pre_fork`` hook (in the master, before every worker it forks): the market loaded or
    brought up to date, the master's database connections closed. Never raises: a worker is forked
    whatever happens here."""
    global _failed_at
    if not enabled():
        return
    if _failed_at is not None and time.monotonic() - _failed_at < RETRY_SECONDS:
        return
    try:
        _setup_django()
    except Exception:
        _failed_at = time.monotonic()
        logger.exception("setting Django up in the server's master failed; each worker loads its own market")
        return

    from django.urls import get_resolver

    from broker.catalog import market

    began, cpu = time.monotonic(), time.process_time()
    prepared = market.prepared_at
    try:
        get_resolver().url_patterns  # noqa: B018  # the URLconf and every module it names, imported once
        market.prepare_for_fork()
    except Exception:
        _failed_at = time.monotonic()
        logger.exception("loading the broker market in the server's master failed; each worker loads its own")
    else:
        _failed_at = None
        if market.prepared_at != prepared:
            catalogue = market.catalogue
            logger.info(
                "broker market ready for the workers: %d clusters, %d islands, %d holds in %.2f s (%.2f s CPU)",
                0 if catalogue is None else len(catalogue.cluster_id),
                0 if catalogue is None else len(catalogue.island_id),
                market.holds._size,
                time.monotonic() - began,
                time.process_time() - cpu,
            )
    finally:
        close_connections()
    gc.collect()
    gc.freeze()


def _setup_django() -> None:
    import django
    from django.apps import apps

    from config.entrypoint import use_settings

    if not apps.ready:
        use_settings()
        django.setup()


def close_connections() -> None:
    """Close this process's database connections and Django's connection pools (psycopg's pool runs
    threads of its own and keeps sockets open): nothing of them may reach a forked child."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        connection.close()
        close_pool = getattr(connection, "close_pool", None)  # PostgreSQL's backend only
        if close_pool is not None:
            close_pool()
