"""A new server's first quote, and a replaced worker's, at design load (issue 14: within 1 s).

    python -m benchmarks.first_quote --database-url postgres://…/soak_base [--rounds 3]

Needs a market a previous run left in the database (``benchmarks.broker --keep`` or ``benchmarks.soak
--database-url``: 10,000 clusters, 100,000 islands, 100,000 leases). For each round it starts the
production server (benchmarks.prodserver: gunicorn, production settings, ``--workers`` workers) twice: with
the market loaded in the master before it forks (config/prefork.py, the default) and with
``CARDHOUR_PRELOAD_MARKET=0`` (each worker loads its own, in the background, once it has started),
alternating, in the same run. For each server:

1. **Start:** from launching gunicorn to ``/healthz`` answering 200 (what a readiness probe waits for), and
   the CPU the master and the workers spent by then.
2. **First quote:** one ``POST /api/v1/jobs/<id>/quotes`` sent as soon as ``/healthz`` answers; then
   ``/healthz`` itself (median of 20), the same-run baseline.
3. **Replaced workers** (what a crash, an out-of-memory kill or gunicorn's timeout kill does, and what
   ``max_requests`` recycling does to one worker): once the master's market is older than the catalogue
   TTL, every worker is sent SIGKILL and a quote is sent at once; it waits in the listening socket's queue
   for a new worker. Its latency from the signal, then the same with ``/healthz`` instead of a quote (the
   workers' replacement alone, the baseline; a TTL later, so that the master refreshes again), and the CPU
   one worker's replacement cost: the master's and the new workers' over ``--settle-seconds`` from the
   signal (their start and, without preloading, their own loads of the market), per worker. With
   ``GUNICORN_MAX_REQUESTS`` recycling (20,000 ± 2,000 requests per worker by default) this is paid every
   ~21,000 requests the server answers: about every 40 s at 200 quotes/s beside 10,000 clusters
   heartbeating one request each (~530 requests/s).

Memory: the master's and the workers' proportional set size together (shared pages counted once), after
2 × 100 quotes from 4 clients more than a TTL apart (every worker has refreshed its catalogue by then).

Target: each first quote within 1 s (PASS/MISS). Exits non-zero only on an error.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks._common import (
    BenchDatabase,
    JsonClient,
    django_setup,
    machine_description,
    print_table,
    process_cpu_seconds,
    run_closed_loop,
    run_on_database,
)
from benchmarks.prodserver import PRODUCTION_WORKERS, ProductionServers

TARGET_S = 1.0
MODES = {"preloaded": "1", "off": "0"}


@dataclass
class Round:
    mode: str
    ready_s: float
    ready_cpu_s: float
    first_quote_s: float
    healthz_s: float
    replaced_quote_s: float
    replaced_healthz_s: float
    replace_cpu_s: float
    pss_mb: float


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.first_quote", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--database-url", required=True, help="a database holding a previous run's market")
    parser.add_argument("--rounds", type=int, default=3, help="servers per mode, alternating")
    parser.add_argument(
        "--catalog-ttl", type=float, default=5.0, help="the servers' catalogue TTL (production 5)"
    )
    parser.add_argument("--port", type=int, help="the servers' port (else a free one)")
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=12.0,
        help="how long after killing the workers their replacements' CPU is counted (longer than a market load)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=PRODUCTION_WORKERS,
        help=f"web server processes (default {PRODUCTION_WORKERS}, the production default)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    print("Cardhour first-quote benchmark")
    print(f"command: python -m benchmarks.first_quote {' '.join(argv)}".rstrip())
    print(f"machine: {machine_description()}")
    return run_on_database(BenchDatabase.existing(args.database_url), lambda db: run(args, db), keep=True)


def pss_mb(pids: Sequence[int]) -> float:
    """The processes' proportional set size together (``/proc/<pid>/smaps_rollup``): pages shared between
    the master and its workers counted once, unlike their resident sizes."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                total += next(int(line.split()[1]) for line in handle if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def worker_pids(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in out.split()]


def run(args: argparse.Namespace, database: BenchDatabase) -> list[str]:
    from benchmarks.broker import create_jobs, quote_requests, quoted, reused_market

    print(f"database: {database.url} (PostgreSQL {database.server_version()})")
    django_setup(database_url=database.url, conn_max_age=600, migrate=False)
    market = reused_market()
    errors: list[str] = []
    rounds: list[Round] = []
    job_ids: list[int] = []
    auth = {"Authorization": f"Bearer {market.quote_buyer_token}"}
    quote_body = {"limit": 10}

    def quote(server: object, job: int) -> float:
        began = time.perf_counter()
        status, _, raw = server.request(
            "POST", f"/api/v1/jobs/{job}/quotes", body=quote_body, headers=auth, timeout=120
        )  # type: ignore[attr-defined]
        took = time.perf_counter() - began
        if status != 201 or not json.loads(raw).get("quotes"):
            errors.append(f"quote of job {job}: HTTP {status} {raw[:200]!r}")
        return took

    def healthz(server: object) -> float:
        began = time.perf_counter()
        status, _, _ = server.request("GET", "/healthz", timeout=120)  # type: ignore[attr-defined]
        if status != 200:
            errors.append(f"/healthz: HTTP {status}")
        return time.perf_counter() - began

    def after_replacing(servers: ProductionServers, call: object) -> tuple[float, float]:
        """SIGKILL to every worker, then ``call`` at once: its latency from the signal, and the CPU the
        replacement cost per worker: the master's and the new workers' over ``--settle-seconds`` from the
        signal (their start and, without preloading, their own loads of the market)."""
        master = servers.server.process.pid
        workers = worker_pids(master)
        cpu = process_cpu_seconds(master) or 0.0
        began = time.perf_counter()
        for worker in workers:
            os.kill(worker, signal.SIGKILL)
        call()  # type: ignore[operator]
        took = time.perf_counter() - began
        time.sleep(max(0.0, began + args.settle_seconds - time.perf_counter()))
        spent = (process_cpu_seconds(master) or 0.0) - cpu
        spent += sum(process_cpu_seconds(pid) or 0.0 for pid in worker_pids(master))
        return took, spent / len(workers)

    order = [mode for _ in range(args.rounds) for mode in MODES]
    for n, mode in enumerate(order):
        began = time.perf_counter()
        servers = ProductionServers(
            workers=args.workers,
            database_url=database.url,
            port=args.port,
            extra={
                "CARDHOUR_PRELOAD_MARKET": MODES[mode],
                "CARDHOUR_BROKER_CATALOG_TTL_SECONDS": str(args.catalog_ttl),
            },
        )
        ready_s = time.perf_counter() - began
        try:
            pids = [servers.server.process.pid, *worker_pids(servers.server.process.pid)]
            ready_cpu = sum(process_cpu_seconds(pid) or 0.0 for pid in pids)
            if not job_ids:
                client = JsonClient(host=servers.host, ports=servers.ports)
                job_ids = create_jobs(
                    client, token=market.quote_buyer_token, n=8 * len(order), duration_hours=4, seed=7
                )
            jobs = iter(job_ids[8 * n : 8 * n + 8])
            first = quote(servers.server, next(jobs))
            base = statistics.median(healthz(servers.server) for _ in range(20))
            # Quotes from 4 clients for more than a TTL, so that every worker refreshes its catalogue, then
            # the memory: what stays shared with the master by then.
            for _ in range(2):
                load = run_closed_loop(
                    requests=quote_requests(job_ids, 100, market.quote_buyer_token),
                    host=servers.host,
                    ports=servers.ports,
                    concurrency=4,
                    check=quoted,
                )
                errors += load.errors
                time.sleep(args.catalog_ttl + 1)  # and the master's market is older than the TTL
            memory = pss_mb([servers.server.process.pid, *worker_pids(servers.server.process.pid)])
            job = next(jobs)
            replaced_quote, replace_cpu = after_replacing(
                servers, functools.partial(quote, servers.server, job)
            )
            replaced_healthz, _ = after_replacing(servers, functools.partial(healthz, servers.server))
        finally:
            servers.stop()
        rounds.append(
            Round(
                mode, ready_s, ready_cpu, first, base, replaced_quote, replaced_healthz, replace_cpu, memory
            )
        )
        print(
            f"{mode:>9}: ready {ready_s:.2f} s ({ready_cpu:.2f} s CPU), first quote {first * 1000:,.0f} ms, "
            f"/healthz {base * 1000:.1f} ms; replaced worker: quote {replaced_quote * 1000:,.0f} ms, "
            f"/healthz {replaced_healthz * 1000:,.0f} ms, CPU per worker replaced {replace_cpu:.2f} s; memory {memory:,.0f} MiB",
            flush=True,
        )

    table = []
    for mode in MODES:
        mine = [r for r in rounds if r.mode == mode]
        worst_first = max(r.first_quote_s for r in mine)
        worst_replaced = max(r.replaced_quote_s for r in mine)

        def span(values: list[float], scale: float = 1000.0, digits: int = 0) -> str:
            return " / ".join(f"{v * scale:,.{digits}f}" for v in values)

        table.append(
            [
                mode,
                span([r.ready_s for r in mine], 1, 2),
                span([r.ready_cpu_s for r in mine], 1, 2),
                span([r.first_quote_s for r in mine]),
                span([r.healthz_s for r in mine], digits=1),
                span([r.replaced_quote_s for r in mine]),
                span([r.replaced_healthz_s for r in mine]),
                span([r.replace_cpu_s for r in mine], 1, 2),
                span([r.pss_mb for r in mine], 1),
                "PASS" if max(worst_first, worst_replaced) <= TARGET_S else "MISS",
            ]
        )
    print_table(
        "First quotes per round (ms from /healthz answering, or from the workers' SIGKILL)",
        [
            "market",
            "start→ready s",
            "CPU by then s",
            "first quote ms",
            "/healthz ms",
            "replaced: quote ms",
            "replaced: /healthz ms",
            "CPU s per worker replaced",
            "memory MiB (PSS)",
            f"≤ {TARGET_S:.0f} s",
        ],
        table,
    )
    return errors


if __name__ == "__main__":
    raise SystemExit(main())
