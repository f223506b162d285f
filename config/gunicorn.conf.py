"""gunicorn settings for the production server: ``gunicorn -c config/gunicorn.conf.py config.asgi:application``.

uvicorn workers (an event loop each) serve config.asgi: long-polls wait on the loop, every other request runs
on the worker's pool of CARDHOUR_WSGI_THREADS threads. Everything here comes from the environment.
"""

import os
import shutil
import tempfile

# Keep-alive connections spread over the workers: the shared counts are allocated here, in the master,
# before any worker forks.
from config import connection_balance
from core.allocator import malloc_tune

# The C allocator keeps a quote's short-lived arrays on mapped pages instead of faulting them in afresh for
# every request (core/allocator.py); set here, in the master, and inherited by every worker it forks.
malloc_tune()

# Metrics from every worker process are aggregated on scrape (prometheus_client's multiprocess mode): each
# worker writes its samples under this directory, emptied when the server starts.
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="cardhour-metrics-")

bind = os.environ.get("GUNICORN_BIND", f"0.0.0.0:{os.environ.get('PORT', '8000')}")
# One worker more than there are cores. Threads overlap the database waits and the event loop the
# long-polls, but a worker's request threads share one interpreter lock: under the design-load soak (issue
# 14, 2 cores) two workers served 131 quotes/s at 8.7 ms of web CPU per request, three 154 at 8.1, four 150
# at 8.5 (most likely fewer threads waiting on each lock, less CPU lost handing it over: not measured
# directly). Later soaks (4 minutes, heartbeats in batches of 50, the same code; quote p50 / p99 ms):
# 3 workers × 8 threads (the defaults) 33–40 / 440–541; 3 × 4 threads 32 / 1,752 (steady stretches no
# better, failover's worse); 3 × 2 threads 51 / 1,394 (a slow request holds up the few threads of its
# worker); 6 × 4 threads 167 / 2,011 (more processes time-sliced on 2 cores, and 5.77 against 5.34 ms of
# web CPU per request). Those soaks had no lane for the operator agents' batches, which then held up the
# few threads of a worker; with the lane (config.wsgi_bridge) the threads default to 3 + 1 for batches.
# Each worker holds its own catalogue and hold book (~350 MB at 10k clusters and 100k leases).
# benchmarks.prodserver.PRODUCTION_WORKERS repeats this default (a gunicorn config file is not importable).
workers = int(os.environ.get("WEB_CONCURRENCY") or (os.cpu_count() or 1) + 1)
worker_class = "config.uvicorn_worker.CardhourUvicornWorker"
# A worker that answers nothing for this long (its loop stuck) is restarted; long-polls are far shorter.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "60"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "40"))  # > the longest long-poll (30 s)
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "5"))
# Recycle workers now and then (memory), at staggered moments so they never all restart at once.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "20000"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "2000"))
accesslog = os.environ.get("GUNICORN_ACCESSLOG", "-") or None  # empty: no access log
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto; the addresses it is trusted from.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def pre_fork(server: object, worker: object) -> None:
    connection_balance.assign(worker)
    # The broker's market loaded (or brought up to date) here, in the master, so that every worker starts
    # with it instead of loading its own (config/prefork.py; CARDHOUR_PRELOAD_MARKET=0 turns it off).
    from config import prefork

    prefork.before_fork()


def post_fork(server: object, worker: object) -> None:
    connection_balance.adopt(worker)


def on_starting(server: object) -> None:
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, exist_ok=True)


def post_worker_init(worker: object) -> None:
    # The app is loaded (Django is set up). Where the master did not load the matcher's catalogue and hold
    # book before forking (config/prefork.py: turned off, or it failed), load them in the background now,
    # so that a new worker's first quote (at start, and after every max_requests recycle) does not.
    from broker.catalog import market
    from core.warmup import request_path_warm, startup_objects_freeze

    market.warm_in_background()
    # And kept fresh from then on, quotes or not: the first quote after a quiet spell does not reload it.
    market.keep_fresh()
    # And the first request's imports (the URLconf, the cache client): ~0.4 s of CPU that the worker's first
    # request would pay, here, before the worker serves. Then what is loaded so far is left out of the
    # garbage collector's full collections.
    request_path_warm()
    startup_objects_freeze()


def child_exit(server: object, worker: object) -> None:
    from prometheus_client import multiprocess

    connection_balance.release(worker)
    multiprocess.mark_process_dead(worker.pid)  # type: ignore[attr-defined]
