"""Cluster heartbeats at design size over HTTP against the production server, on PostgreSQL.

    python -m benchmarks.heartbeat --endpoint-ip <public IP>          # 10,000 clusters × 10 islands
    python -m benchmarks.heartbeat --clusters 500 --endpoint-ip ...   # a quick check
    python -m benchmarks.heartbeat --database-url postgres://…/db --server-root ../other-worktree
                                                                      # the same kept fleet, another checkout

The target comes from the design-load soak (benchmarks.soak): 10,000 clusters each beating every 30 s is
**333 heartbeats/s**, on the same 2 cores as 200 quotes/s and 1,667 usage records/s. At **≤ 3 ms of CPU per
heartbeat (web server + PostgreSQL)** that rate takes one core (333/s × 3 ms), leaving the other to quotes and
usage; and the server must keep up with 333/s paced.

What it does, in order:

1. Creates a throwaway database (``--database-name``; or uses ``--database-url``), migrates it, creates
   ``--operators`` operators, and registers ``--clusters`` clusters of ``--islands-per-cluster`` islands
   over HTTP (benchmarks.federation's fleet, same seed). A ``--database-url`` that already holds that fleet
   (kept by an earlier run with ``--keep``) is reused as it is: two checkouts compared on the same data.
2. Starts the production server (benchmarks.prodserver: gunicorn, uvicorn workers, production settings) of
   this checkout or of ``--server-root``.
3. Closed loop, ``--rounds`` times (after ``--warmup`` beats): every cluster (or ``--beats`` of them)
   beats once, shuffled, ``--concurrency`` client threads on
   keep-alive connections; each beat names all of the cluster's islands with new available and unhealthy
   cards. Checks every answer (200, ``applied: true``) and, after each round, the database (every cluster's
   ``last_heartbeat_sent_at`` and ``available_cards`` as sent).
4. Paced: ``--rate`` beats/s (default 333) for ``--paced-seconds``, open loop (each beat has its due time;
   latency counted from it, so queueing shows).
5. Baseline on the same server in the same run: ``GET /healthz`` with the same clients.
6. ``--profile N``: N heartbeats in this process through Django's test client under cProfile (CPU time),
   as benchmarks.quote_profile does for quotes.

Prints heartbeats/s, p50/p99, CPU per heartbeat (web workers, PostgreSQL backends), and PASS/MISS. Exits
non-zero only on errors (a failed request, a wrong answer, rows not as sent), never on a missed target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks._common import (
    DEFAULT_SERVER_URL,
    SUMMARY_MS_HEADERS,
    BenchDatabase,
    CpuSampler,
    HttpRequest,
    Summary,
    django_setup,
    machine_description,
    ms,
    print_table,
    run_closed_loop,
    run_on_database,
    spread,
)
from benchmarks.federation import ClusterPlan, build_fleet
from benchmarks.prodserver import ROOT, ProductionServers

DESIGN_CLUSTERS = 10_000
HEARTBEAT_INTERVAL_S = 30
TARGET_PER_S = DESIGN_CLUSTERS / HEARTBEAT_INTERVAL_S  # 333/s, the soak's design rate
# 333/s × 3 ms = one of the 2 cores: the other stays for quotes (200/s) and usage (1,667 records/s).
TARGET_CPU_S = 0.003
# The paced run kept up: it delivered this share of the rate, and its p99 (from each beat's due time) is
# within this; a server that falls behind shows a growing queue here long before the monitor's 90 s.
PACED_KEPT_UP = 0.97
PACED_P99_S = 1.0


@dataclass
class Round:
    n: int
    wall_s: float
    latency_s: list[float]
    cpu: CpuSampler

    @property
    def per_s(self) -> float:
        return self.n / self.wall_s

    def cpu_ms(self, group: str) -> float:
        return self.cpu.seconds(group) / self.n * 1000


def beat_body(plan: ClusterPlan, *, sent_at: datetime, rng: random.Random) -> tuple[bytes, int]:
    """A heartbeat naming every island of ``plan`` with new counts; returns the body and the cluster's
    available cards it reports."""
    lines = []
    total = 0
    for name, cards, _ in plan.islands:
        unhealthy = rng.choice((0, 0, 0, 1))
        available = rng.randint(0, cards - unhealthy)
        total += available
        lines.append({"name": name, "available_cards": available, "unhealthy_cards": unhealthy})
    body = {
        "sent_at": sent_at.isoformat(),
        "health": rng.choice(("ok", "ok", "ok", "degraded")),
        "islands": lines,
    }
    return json.dumps(body).encode(), total


def build_round(
    fleet: Sequence[ClusterPlan], tokens: dict[str, str], *, seed: int, sent_at: datetime
) -> tuple[list[HttpRequest], dict[str, int]]:
    """One beat per cluster in a shuffled order, all stamped ``sent_at`` (newer than any earlier round's)."""
    rng = random.Random(seed)
    order = list(range(len(fleet)))
    rng.shuffle(order)
    requests, expected = [], {}
    for i in order:
        plan = fleet[i]
        body, total = beat_body(plan, sent_at=sent_at, rng=rng)
        expected[plan.cpi] = total
        requests.append(
            HttpRequest(
                "POST",
                f"/api/v1/clusters/{plan.cpi}/heartbeats",
                {"Authorization": f"Bearer {tokens[plan.operator]}", "Content-Type": "application/json"},
                body,
            )
        )
    return requests, expected


def batched(requests: Sequence[HttpRequest], size: int) -> list[HttpRequest]:
    """The single beats of ``requests`` sent as batches (``POST /api/v1/heartbeats``) of at most ``size`` beats,
    each batch one operator's (its token), in a shuffled order; ``size`` 1 leaves them single."""
    if size <= 1:
        return list(requests)
    by_token: dict[str, list[HttpRequest]] = {}
    for request in requests:
        by_token.setdefault(request.headers["Authorization"], []).append(request)
    out = []
    for chunk_of in by_token.values():
        for k in range(0, len(chunk_of), size):
            chunk = chunk_of[k : k + size]
            beats = [{"cpi": r.path.split("/")[4], **json.loads(r.body)} for r in chunk]
            out.append(
                HttpRequest(
                    "POST",
                    "/api/v1/heartbeats",
                    dict(chunk[0].headers),
                    json.dumps({"beats": beats}).encode(),
                )
            )
    random.Random(len(out)).shuffle(out)
    return out


def applied(requests: Sequence[HttpRequest]) -> Callable[[int, int, bytes], str | None]:
    """A check for run_closed_loop: 200 and ``applied: true``."""

    def check(index: int, status: int, body: bytes) -> str | None:
        if status != 200:
            return f"{requests[index].path}: HTTP {status} {body[:300]!r}"
        answer = json.loads(body)
        results = answer.get("results", [answer])  # a batch answers one result per beat
        if not results or any(result.get("applied") is not True for result in results):
            return f"{requests[index].path}: not applied: {body[:300]!r}"
        return None

    return check


def check_database(database_url: str, *, sent_at: datetime, expected: dict[str, int]) -> list[str]:
    """Every cluster carries this round's beat: its ``last_heartbeat_sent_at`` and the cards it reported."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT c.cpi, c.last_heartbeat_sent_at, c.available_cards, "
            "(SELECT sum(i.available_cards) FROM federation_island i WHERE i.cluster_id = c.id), "
            "(SELECT count(*) FROM federation_island i WHERE i.cluster_id = c.id AND i.reported_at = %s) "
            "FROM federation_cluster c",
            (sent_at,),
        ).fetchall()
    errors = []
    for cpi, at, available, island_sum, reported in rows:
        if cpi not in expected:
            continue
        if at != sent_at or available != expected[cpi] or island_sum != available or reported == 0:
            errors.append(
                f"{cpi}: sent_at {at}, available {available} (islands {island_sum}, {reported} reported), "
                f"expected {sent_at} and {expected[cpi]}"
            )
    return errors[:20]


def paced(
    *, requests: Sequence[HttpRequest], host: str, port: int, rate: float, threads: int
) -> tuple[list[float], float, list[str]]:
    """Open loop: request k is due at ``k / rate`` s; each of ``threads`` threads sends its share on one
    keep-alive connection. Latency is from the due time to the whole answer (queueing included)."""
    import http.client

    latency = [math.nan] * len(requests)
    errors: list[str] = []
    lock = threading.Lock()
    check = applied(requests)
    began = time.perf_counter() + 0.2

    def worker(t: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        try:
            for k in range(t, len(requests), threads):
                due = began + k / rate
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                req = requests[k]
                try:
                    conn.request(req.method, req.path, body=req.body, headers=req.headers)
                    response = conn.getresponse()
                    code, body = response.status, response.read()
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    code, body = 0, repr(exc).encode()
                latency[k] = time.perf_counter() - due
                message = check(k, code, body)
                if message is not None:
                    with lock:
                        errors.append(message)
        finally:
            conn.close()

    pool = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return latency, time.perf_counter() - began, errors


_PARTS: dict[str, tuple[object, str, object]] = {}


def _timed_parts() -> dict[str, float]:
    """Wrap the parts of a heartbeat request whose CPU is reported on their own (thread CPU, summed):
    token authentication and throttles (every API request has them), the plain body check, the service."""
    from rest_framework.views import APIView

    from federation import services
    from federation.api import views

    spent: dict[str, float] = {}
    targets = {
        "authentication": (APIView, "perform_authentication"),
        "throttles": (APIView, "check_throttles"),
        "body check": (views, "_heartbeat_plain"),
        "service (lock + write, 2 round trips + commit)": (services, "heartbeat_record_for_operator"),
    }
    for name, (owner, attr) in targets.items():
        original = getattr(owner, attr)
        spent[name] = 0.0

        def timed(*args: object, _original: Any = original, _name: str = name, **kwargs: object) -> Any:
            t0 = time.thread_time()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_name] += time.thread_time() - t0

        _PARTS[name] = (owner, attr, original)
        setattr(owner, attr, timed)
    return spent


def _untimed_parts() -> None:
    for owner, attr, original in _PARTS.values():
        setattr(owner, attr, original)
    _PARTS.clear()


def profile_in_process(*, fleet: Sequence[ClusterPlan], tokens: dict[str, str], n: int, top: int) -> None:
    """cProfile (process CPU time) of ``n`` heartbeats through Django's test client in this process."""
    import cProfile
    import io
    import pstats

    from django.test import Client

    clients = {
        op: Client(HTTP_AUTHORIZATION=f"Bearer {tok}", HTTP_HOST="127.0.0.1") for op, tok in tokens.items()
    }
    sent_at = datetime.now(UTC)

    def beats(count: int, offset_s: int) -> list[HttpRequest]:
        at = sent_at + timedelta(seconds=offset_s)
        return build_round(fleet[:count], tokens, seed=offset_s, sent_at=at)[0]

    def run(requests: Sequence[HttpRequest]) -> None:
        for req in requests:
            operator = req.path.split(":")[1]
            response = clients[operator].post(req.path, req.body, content_type="application/json")
            if response.status_code != 200:
                raise RuntimeError(f"{req.path}: HTTP {response.status_code} {response.content[:300]!r}")

    run(beats(min(50, n), 1))  # warm-up
    measured, profiled = beats(n, 2), beats(n, 3)
    spent = _timed_parts()
    started = time.process_time()
    try:
        run(measured)
    finally:
        _untimed_parts()
    whole = (time.process_time() - started) / n * 1e3
    print(
        f"\nin-process, unprofiled: {whole:.2f} ms CPU per heartbeat (this process; PostgreSQL's share not in it)"
    )
    print(
        "  of which (thread CPU per beat): "
        + ", ".join(f"{name} {seconds / n * 1e3:.2f} ms" for name, seconds in spent.items())
        + f"; the rest (middleware, DRF, routing, the answer) {whole - sum(spent.values()) / n * 1e3:.2f} ms"
    )
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    run(profiled)
    profiler.disable()
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(top)
        print(f"\n--- top {top} by {order} ---")
        print(out.getvalue().split("\n", 4)[-1])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.heartbeat", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--clusters", type=int, default=DESIGN_CLUSTERS)
    parser.add_argument("--islands-per-cluster", type=int, default=10)
    parser.add_argument("--operators", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="web server processes")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="heartbeat clients (closed loop and paced)"
    )
    parser.add_argument("--register-concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="closed-loop rounds")
    parser.add_argument(
        "--beats",
        type=int,
        help="beats per closed-loop round, each on another cluster (default: every cluster)",
    )
    parser.add_argument("--warmup", type=int, default=1_000, help="beats before measuring, not counted")
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="beats per request: N > 1 sends each operator's beats as batches of N (POST /api/v1/heartbeats); "
        "rates and CPU are then per beat",
    )
    parser.add_argument("--rate", type=float, default=TARGET_PER_S, help="beats/s of the paced run")
    parser.add_argument("--paced-seconds", type=float, default=20.0, help="0 skips the paced run")
    parser.add_argument("--healthz", type=int, default=3_000)
    parser.add_argument("--profile", type=int, default=0, help="heartbeats profiled in-process (0: none)")
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument(
        "--database-url", help="use this database as it is (reuse a kept fleet); never dropped"
    )
    parser.add_argument(
        "--database-name",
        default="cardhour_bench_heartbeat",
        help=f"the throwaway database created on {DEFAULT_SERVER_URL.rsplit('/', 1)[0]} otherwise",
    )
    parser.add_argument("--keep", action="store_true", help="do not drop the database created for the run")
    parser.add_argument("--port", type=int, help="the server's port (default: a free one)")
    parser.add_argument(
        "--server-root",
        type=Path,
        default=ROOT,
        help="the checkout whose code the server runs (default: this one)",
    )
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--endpoint-ip",
        default="",
        help="endpoint URLs on this public IP literal (see benchmarks.federation: slow DNS paces registration)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    warnings.filterwarnings("ignore", message="No directory at")
    print("Cardhour heartbeat benchmark")
    print(
        f"command: python -m benchmarks.heartbeat {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip()
    )
    print(f"machine: {machine_description()}")
    database = (
        BenchDatabase.existing(args.database_url)
        if args.database_url
        else BenchDatabase.create(name=args.database_name)
    )
    return run_on_database(database, lambda db: run(args, db), keep=args.keep)


def run(args: argparse.Namespace, database: BenchDatabase) -> list[str]:
    errors: list[str] = []
    print(f"database: {database.url} (PostgreSQL {database.server_version()})")
    django_setup(database_url=database.url, conn_max_age=60)
    from core.models import Organisation
    from core.services import api_token_create, organisation_create
    from federation.models import Cluster

    slugs = [f"op{i:02d}" for i in range(args.operators)]
    fleet = build_fleet(
        clusters=args.clusters,
        islands_per_cluster=args.islands_per_cluster,
        operators=slugs,
        seed=args.seed,
        endpoint_ip=args.endpoint_ip,
    )
    registered = Cluster.objects.count()
    tokens = {}
    for slug in slugs:
        organisation = Organisation.objects.filter(slug=slug).first() or organisation_create(
            slug=slug, name=f"Benchmark operator {slug}", is_operator=True
        )
        tokens[slug] = api_token_create(organisation=organisation, name="heartbeat benchmark")[1]
    if registered not in (0, len(fleet)) or (
        registered
        and Cluster.objects.filter(cpi__in=[p.cpi for p in fleet[:100]]).count() != min(100, len(fleet))
    ):
        return [
            f"{database.url} holds {registered} clusters, not this fleet: use an empty database or a kept one"
        ]

    servers = ProductionServers(
        workers=args.workers,
        database_url=database.url,
        port=args.port,
        root=args.server_root,
    )
    server_pids = [p.pid for p in servers.processes]
    print(
        f"server: {ProductionServers.DESCRIPTION.format(workers=args.workers)}, code of {args.server_root.resolve()}"
        f" (git {_git_head(args.server_root)}), port {servers.ports[0]}"
    )
    rounds: list[Round] = []
    try:
        if not registered:
            print(
                f"\n[register] {len(fleet):,} clusters × {args.islands_per_cluster} islands over HTTP ...",
                flush=True,
            )
            result = run_closed_loop(
                requests=[
                    HttpRequest(
                        "POST",
                        "/api/v1/clusters",
                        {"Authorization": f"Bearer {tokens[p.operator]}", "Content-Type": "application/json"},
                        p.body(),
                    )
                    for p in fleet
                ],
                host=servers.host,
                ports=servers.ports,
                concurrency=args.register_concurrency,
            )
            errors += result.errors
            print(f"           {len(fleet) / result.wall_s:,.0f} clusters/s", flush=True)
            _vacuum(database.url)
        else:
            print(f"\n[register] reusing the {registered:,} clusters in the database")

        # A first beat of every cluster (not measured): warms the workers and leaves every cluster beaten.
        base_at = datetime.now(UTC).replace(microsecond=0)
        warm, _ = build_round(fleet, tokens, seed=args.seed, sent_at=base_at)
        warm = batched(warm[: args.warmup], args.batch)
        print(f"[warm-up]  {len(warm):,} beats (not measured) ...", flush=True)
        errors += run_closed_loop(
            requests=warm,
            host=servers.host,
            ports=servers.ports,
            concurrency=args.concurrency,
            check=applied(warm),
        ).errors[:20]

        for r in range(1, args.rounds + 1):
            sent_at = base_at + timedelta(milliseconds=r)
            requests, expected = build_round(fleet, tokens, seed=args.seed + r, sent_at=sent_at)
            requests = requests[: args.beats or len(requests)]
            beaten = {r.path.split("/")[4] for r in requests}
            expected = {cpi: cards for cpi, cards in expected.items() if cpi in beaten}
            n_beats = len(requests)
            requests = batched(requests, args.batch)
            print(
                f"[round {r}]  {n_beats:,} beats{_in_batches(args, requests)}, {args.concurrency} clients, closed loop ...",
                flush=True,
            )
            with CpuSampler(server_pids=server_pids, database=database.name) as cpu:
                result = run_closed_loop(
                    requests=requests,
                    host=servers.host,
                    ports=servers.ports,
                    concurrency=args.concurrency,
                    check=applied(requests),
                )
            errors += result.errors[:20]
            errors += check_database(database.url, sent_at=sent_at, expected=expected)
            rounds.append(Round(n=n_beats, wall_s=result.wall_s, latency_s=result.latency_s, cpu=cpu))

        paced_result = None
        if args.paced_seconds > 0:
            n = int(args.rate * args.paced_seconds)
            sent_at = base_at + timedelta(milliseconds=args.rounds + 1)
            requests, _ = build_round(
                [fleet[i % len(fleet)] for i in range(min(n, len(fleet)))],
                tokens,
                seed=args.seed - 1,
                sent_at=sent_at,
            )
            if n > len(fleet):  # a beat per cluster at most: later ones would be stale
                print(f"           (paced run capped at one beat per cluster: {len(fleet):,})")
            n_beats = len(requests)
            requests = batched(requests, args.batch)
            print(
                f"[paced]    {n_beats:,} beats{_in_batches(args, requests)} at {args.rate:.0f}/s, open loop, "
                f"{args.concurrency} clients ...",
                flush=True,
            )
            with CpuSampler(server_pids=server_pids, database=database.name) as cpu:
                latency, wall, paced_errors = paced(
                    requests=requests,
                    host=servers.host,
                    port=servers.ports[0],
                    rate=args.rate * len(requests) / n_beats,  # requests/s: beats/s in batches
                    threads=args.concurrency,
                )
            errors += paced_errors[:20]
            paced_result = Round(n=n_beats, wall_s=wall, latency_s=latency, cpu=cpu)

        print(f"[baseline] GET /healthz × {args.healthz:,}, same server, same clients ...", flush=True)
        with CpuSampler(server_pids=server_pids, database=database.name) as healthz_cpu:
            healthz = run_closed_loop(
                requests=[HttpRequest("GET", "/healthz", {})] * args.healthz,
                host=servers.host,
                ports=servers.ports,
                concurrency=args.concurrency,
            )
        errors += healthz.errors[:20]
        healthz_round = Round(
            n=args.healthz, wall_s=healthz.wall_s, latency_s=healthz.latency_s, cpu=healthz_cpu
        )
    finally:
        servers.stop()

    report(args=args, rounds=rounds, paced_result=paced_result, healthz=healthz_round)
    if args.profile:
        profile_in_process(fleet=fleet, tokens=tokens, n=min(args.profile, len(fleet)), top=args.top)
    return errors


def _in_batches(args: argparse.Namespace, requests: Sequence[HttpRequest]) -> str:
    return f" in {len(requests):,} batches of up to {args.batch}" if args.batch > 1 else ""


def _git_head(root: Path) -> str:
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _vacuum(database_url: str) -> None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in ("federation_cluster", "federation_island", "federation_issuedidentifier"):
            conn.execute(f"VACUUM ANALYZE {table}")


def report(
    *, args: argparse.Namespace, rounds: Sequence[Round], paced_result: Round | None, healthz: Round
) -> None:
    rows = [
        [
            f"round {i} (closed loop)",
            f"{r.per_s:,.0f}",
            *Summary.of(r.latency_s).ms_cells()[1:4:2],
            f"{r.cpu_ms('server'):.2f}",
            f"{r.cpu_ms('postgres'):.2f}",
            f"{r.cpu_ms('server') + r.cpu_ms('postgres'):.2f}",
        ]
        for i, r in enumerate(rounds, start=1)
    ]
    if paced_result is not None:
        s = Summary.of(paced_result.latency_s)
        rows.append(
            [
                f"paced at {args.rate:.0f}/s (latency from due time)",
                f"{paced_result.per_s:,.0f}",
                ms(s.p50),
                ms(s.p99),
                f"{paced_result.cpu_ms('server'):.2f}",
                f"{paced_result.cpu_ms('postgres'):.2f}",
                f"{paced_result.cpu_ms('server') + paced_result.cpu_ms('postgres'):.2f}",
            ]
        )
    hs = Summary.of(healthz.latency_s)
    rows.append(
        [
            "baseline GET /healthz, same server",
            f"{healthz.per_s:,.0f}",
            ms(hs.p50),
            ms(hs.p99),
            f"{healthz.cpu_ms('server'):.2f}",
            f"{healthz.cpu_ms('postgres'):.2f}",
            f"{healthz.cpu_ms('server') + healthz.cpu_ms('postgres'):.2f}",
        ]
    )
    print_table(
        f"Heartbeats over HTTP: {args.clusters:,} clusters × {args.islands_per_cluster} islands, {args.workers} web "
        f"workers, {args.concurrency} clients (CPU ms per beat, user+system from /proc"
        + (f"; beats sent in batches of {args.batch}, p50/p99 per batch" if args.batch > 1 else "")
        + "; /healthz per request)",
        ["phase", "beats/s", "p50 ms", "p99 ms", "server CPU", "PG CPU", "CPU total"],
        rows,
    )
    pooled = Summary.of([x for r in rounds for x in r.latency_s])
    print(f"closed loop, rounds pooled: {SUMMARY_MS_HEADERS} = {pooled.ms_cells()}")
    cpu = [r.cpu_ms("server") + r.cpu_ms("postgres") for r in rounds]
    rates = [r.per_s for r in rounds]
    healthz_ms = healthz.cpu_ms("server")
    print(f"machine at the end: {machine_description()}")
    cores = os.cpu_count() or 1
    capacity = cores * 1000 / max(sorted(cpu)[len(cpu) // 2], 1e-9) if cpu else math.nan
    cpu_ok = bool(cpu) and sorted(cpu)[len(cpu) // 2] <= TARGET_CPU_S * 1000
    if paced_result is not None:
        s = Summary.of(paced_result.latency_s)
        kept_up = paced_result.per_s >= PACED_KEPT_UP * args.rate and s.p99 <= PACED_P99_S
        rate_note = (
            f"paced {paced_result.per_s:,.0f}/s delivered of {args.rate:.0f}/s, p99 {ms(s.p99)} ms from due"
        )
    else:
        kept_up = bool(rates) and max(rates) >= TARGET_PER_S
        rate_note = f"closed loop {max(rates, default=0):,.0f}/s"
    print_table(
        "Results",
        ["figure", "value"],
        [
            [
                "sent as",
                f"batches of up to {args.batch} beats (POST /api/v1/heartbeats)"
                if args.batch > 1
                else "one beat per request (POST /api/v1/clusters/<cpi>/heartbeats)",
            ],
            ["heartbeats/s, closed loop (per round)", ", ".join(f"{x:,.0f}" for x in rates)],
            [
                "CPU per heartbeat, server + PostgreSQL (per round)",
                ", ".join(f"{x:.2f} ms" for x in cpu) + f" (min/median/max {spread(cpu)})",
            ],
            [
                "→ heartbeats/s if the cores were heartbeats' alone",
                f"{capacity:,.0f} on {cores} cores",
            ],
            [
                "baseline GET /healthz: server CPU per request",
                f"{healthz_ms:.2f} ms (a heartbeat's server CPU is "
                f"{min(r.cpu_ms('server') for r in rounds) / max(healthz_ms, 1e-9):.1f}× that)"
                if rounds
                else f"{healthz_ms:.2f} ms",
            ],
            [
                f"target: ≤ {TARGET_CPU_S * 1000:.0f} ms CPU per heartbeat (333/s × 3 ms = 1 of 2 cores; the soak's "
                f"{DESIGN_CLUSTERS:,} clusters / {HEARTBEAT_INTERVAL_S} s beside quotes and usage)",
                "PASS" if cpu_ok else "MISS",
            ],
            [
                f"target: ≥ {TARGET_PER_S:.0f} heartbeats/s sustained ({rate_note})",
                "PASS" if kept_up else "MISS",
            ],
        ],
        left_columns=2,
    )


if __name__ == "__main__":
    sys.exit(main())
