"""Enforcement on arrival (issue 16): from the 2xx of a usage report that empties a buyer's packs to the
operator's agent seeing its lease's stop request, on the production stack.

    python -m benchmarks.enforcement               # 60 stops idle, 60 under load; ingest 2 × 10 s off and on
    python -m benchmarks.enforcement --quick       # 50 + 50 stops; ingest 1 × 5 s each

On a throwaway PostgreSQL database, benchmarks.broker writes a small market (``--clusters`` clusters,
``--islands`` islands) with every lease running: ``--stops`` buyers (twice as many with the loaded phase)
each hold one lease (8 cards, started two hours ago) and a pack of one card-hour of its chip;
``--funded-leases`` more leases belong to ``--funded-buyers`` buyers whose packs last the whole run. Then the production server (gunicorn + uvicorn
workers, production settings: benchmarks.prodserver) and one Celery worker (``celery -A config worker``, the
broker and the cache on Redis) run as the README deploys them — without beat, so every stop measured came
from the arrival path, not from the minute's rating or the 10 s stop run.

1. **Stops.** One long-poll agent per operator holds ``GET /api/v1/operator/leases?after=<cursor>&wait=30``,
   as a real agent does. The operator's usage agent reports, one lease every ``--interval`` seconds, the
   lease's last two hours on all its cards (16 card-hours × the band's multiplier: more than its buyer's
   pack). For each lease: **accept → seen**, from the report's 2xx to the moment the long-poll
   answer naming the lease as ``stop_requested`` is read; **accept → DB**, from the 2xx (wall clock) to the
   lease's ``stop_requested_at`` as the stop run stamped it (the same machine's clock). p50 / p99 / max and
   PASS/MISS against p99 ≤ 2 s; the CPU the worker, the web server and PostgreSQL spent over the phase, per
   stop; how many arrival runs the worker made (its log), against how many reports. Twice: **idle**, then
   **under ingest load** (``--clients`` closed-loop threads reporting the funded leases' minutes on the same
   server meanwhile, their records/s printed) with another ``--stops`` thin buyers; ``--no-loaded-stops``
   skips the second.
2. **Ingest with arrival rating off and on.** ``--clients`` closed-loop threads report minutes of the funded
   leases in batches of ``--batch`` records, ``--rounds`` × ``--seconds`` per setting, alternating between a
   second server started with ``CARDHOUR_RATING_ON_ARRIVAL=false`` and the one with it on (each phase warmed
   up first; what an off phase leaves unrated is rated between phases, outside the counts, as the minute's
   beat would): records/s, p50 / p99 per request, the server's CPU per record, the worker's CPU and runs, and
   CPU per record of server + worker + PostgreSQL. The arrival hook's own cost (one cache ``add`` per report,
   a publish when it sets the marker) is measured apart, in a process with the server's settings, cache and
   broker: on two shared cores the worker's rating competes with the server for CPU, which the phases' figures
   show together with everything else a neighbour does.

Baselines in the same run: ``/healthz`` on the same server (p50 / p99 and CPU per request) and the report's
own latency. The minute's beat, for comparison, is not run: with it alone a stop waits for the next rating
(every 60 s) and then the next stop run (every 10 s), about 35 s on average and up to 70 s.

Exits non-zero only on errors (a failed request, a stop never seen).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

from benchmarks._common import (
    BenchDatabase,
    machine_description,
    percentile,
    postgres_backend_pids,
    print_table,
    process_cpu_seconds,
)
from benchmarks.broker import LeasePlan, build_market
from benchmarks.prodserver import ProductionServers

BENCH_DATABASE = "cardhour_bench_enforcement"
TARGET_P99_S = 2.0
THIN_CARDS = 8
STOP_USAGE = timedelta(hours=2)
FUNDED_PAST = timedelta(hours=8)


# --- The market ----------------------------------------------------------------------------------------------


def place_for(*, stops: int, funded_buyers: int) -> Callable[..., tuple[list[LeasePlan], int]]:
    """A ``place`` for benchmarks.broker.build_market: every lease running, one per island (islands drawn at
    random, so the thin leases spread over operators); the first ``stops`` leases belong one each to the
    first ``stops`` buyers, the rest to the funded buyers in turn."""

    def place(
        *, n: int, island_cards: Sequence[int], buyer_ids: Sequence[int], now: datetime, rng: random.Random
    ) -> tuple[list[LeasePlan], int]:
        from benchmarks.federation import HUBS

        if n > len(island_cards):
            raise SystemExit(f"{n:,} leases need as many islands, not {len(island_cards):,}")
        islands = rng.sample(range(len(island_cards)), n)
        leases = []
        for index, island in enumerate(islands):
            thin = index < stops
            start = (now - (STOP_USAGE if thin else FUNDED_PAST)).replace(second=0)
            leases.append(
                LeasePlan(
                    island=island,
                    cards=THIN_CARDS,  # every island has at least 8 (benchmarks.federation.ISLAND_CARDS)
                    start=start,
                    end=now + timedelta(hours=12),
                    created=start - timedelta(minutes=5),
                    buyer_id=buyer_ids[index] if thin else buyer_ids[stops + index % funded_buyers],
                    hub=rng.choice(HUBS),
                    running=True,
                )
            )
        return leases, 0

    return place


def fund(*, thin: dict[int, str], funded_ids: Sequence[int], chips: set[str]) -> None:
    """For each thin buyer (id → the chip of its lease) one card-hour of that chip; for each funded buyer a
    standard pack and a pack of every chip without a standard-card factor, large enough for the run; all
    paid through the pack service, as the Stripe webhook credits them."""
    from django.utils import timezone

    from core.models import Organisation
    from federation.models import Accelerator
    from metering.models import PackOrder, PackProduct
    from metering.services.packs import pack_issue

    paid_at = timezone.now() - timedelta(days=3)
    accelerators = {a.slug: a for a in Accelerator.objects.filter(slug__in=chips)}
    one = {
        slug: PackProduct.objects.create(
            code=f"enf-1-{slug}"[:64], name=f"one {slug} card-hour", accelerator=chip, card_hours=1, price=9
        )
        for slug, chip in accelerators.items()
    }
    big = [PackProduct.objects.create(code="enf-std", name="standard", card_hours=1_000_000, price=9_000_000)]
    big += [
        PackProduct.objects.create(
            code=f"enf-{slug}"[:64], name=slug, accelerator=chip, card_hours=1_000_000, price=9_000_000
        )
        for slug, chip in accelerators.items()
        if chip.dense_fp16_tflops is None
    ]
    buyers = Organisation.objects.in_bulk([*thin, *funded_ids])
    orders = [(buyers[pk], one[slug]) for pk, slug in thin.items()]
    orders += [(buyers[pk], product) for pk in funded_ids for product in big]
    for buyer, product in orders:
        order = PackOrder.objects.create(
            buyer=buyer,
            product=product,
            accelerator=product.accelerator,
            card_hours=product.card_hours,
            amount=Decimal(product.price),
            validity_days=365,
            idempotency_key=f"enf-{product.pk}-{buyer.pk}",
        )
        pack_issue(order=order, paid_at=paid_at, posted_by="benchmark")


# --- The worker ---------------------------------------------------------------------------------------------


class Worker:
    """One Celery worker as the README runs it (no beat), with the server's environment; its log counts the
    arrival runs."""

    def __init__(self, env: dict[str, str], *, concurrency: int, log_path: Path) -> None:
        self.log_path = log_path
        self.log = log_path.open("wb")
        celery = str(Path(sys.executable).with_name("celery"))
        self.process = subprocess.Popen(
            [celery, "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", str(concurrency)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def pids(self) -> list[int]:
        children = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [self.process.pid, *(int(pid) for pid in children)]

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while b"ready." not in self.log_path.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker did not start; see {self.log_path}")
            time.sleep(0.2)

    def arrival_runs(self) -> int:
        self.log.flush()
        text = self.log_path.read_bytes().decode(errors="replace")
        return len(re.findall(r"broker\.usage_rate_on_arrival\[[^]]+\] succeeded", text))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def cpu_of(pids: Sequence[int]) -> float:
    return sum(process_cpu_seconds(pid) or 0.0 for pid in pids)


class Cpu:
    """CPU seconds of the web server, the worker and the database's backends over a phase (backends sampled
    every 0.5 s while they live: they come and go)."""

    def __init__(self, *, server: Sequence[int], worker: Sequence[int], database: str) -> None:
        self.groups = {"web server": list(server), "Celery worker": list(worker)}
        self.database = database
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.owner: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self, *, initial: bool = False) -> None:
        pairs = [(pid, name) for name, pids in self.groups.items() for pid in pids]
        pairs += [(pid, "PostgreSQL") for pid in postgres_backend_pids(self.database)]
        for pid, name in pairs:
            cpu = process_cpu_seconds(pid)
            if cpu is None:
                continue
            if pid not in self.first:
                self.first[pid] = cpu if initial or name != "PostgreSQL" else 0.0
                self.owner[pid] = name
            self.last[pid] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __enter__(self) -> Cpu:
        self._sample(initial=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self, name: str) -> float:
        return sum(self.last[pid] - self.first[pid] for pid, owner in self.owner.items() if owner == name)


# --- HTTP ---------------------------------------------------------------------------------------------------


class Http:
    """One keep-alive connection (one per thread)."""

    def __init__(self, port: int, token: str, timeout: float = 60) -> None:
        self.port, self.token, self.timeout = port, token, timeout
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Host": "127.0.0.1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        # A keep-alive connection the server closed while it was idle fails on send, or answers nothing: the
        # request is sent once more on a new connection (as benchmarks._common.JsonClient does); any other
        # failure is an error.
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                return response.status, response.read()
            except (ConnectionError, http.client.CannotSendRequest, http.client.RemoteDisconnected):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                if attempt:
                    raise
        raise RuntimeError("unreachable")

    def close(self) -> None:
        self.conn.close()


@dataclass
class Stop:
    lease: int
    operator: str
    accepted_at: float = 0.0  # monotonic, at the 2xx
    accepted_wall: float = 0.0
    report_s: float = 0.0
    seen_at: float | None = None


class FeedAgent:
    """An operator's lease agent: lists once, then long-polls ``after=<cursor>&wait=30`` and notes when each
    lease is first seen stop_requested."""

    def __init__(self, port: int, token: str, stops: dict[int, Stop], errors: list[str]) -> None:
        self.http = Http(port, token, timeout=60)
        self.stops, self.errors = stops, errors
        self.ready = threading.Event()
        self.done = threading.Event()
        self.polls = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            code, raw = self.http.call("GET", "/api/v1/operator/leases?page_size=1")
            if code != 200:
                self.errors.append(f"lease feed: {code} {raw[:200]!r}")
                return
            cursor = json.loads(raw)["cursor"]
            self.ready.set()
            while not self.done.is_set():
                code, raw = self.http.call(
                    "GET", f"/api/v1/operator/leases?after={cursor}&wait=30&page_size=500"
                )
                read_at = time.monotonic()
                self.polls += 1
                if code != 200:
                    self.errors.append(f"lease feed: {code} {raw[:200]!r}")
                    return
                page = json.loads(raw)
                for lease in page["results"]:
                    stop = self.stops.get(lease["id"])
                    if stop is not None and lease["state"] == "stop_requested" and stop.seen_at is None:
                        stop.seen_at = read_at
                cursor = page["cursor"]
        except Exception as error:
            if not self.done.is_set():  # a poll cut short by the server stopping at the end is no error
                self.errors.append(f"lease feed: {error!r}")
        finally:
            self.ready.set()
            self.http.close()


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- Phases -------------------------------------------------------------------------------------------------


@dataclass
class Ingest:
    label: str
    records: int = 0
    requests: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    server_cpu_s: float = 0.0
    worker_cpu_s: float = 0.0
    postgres_cpu_s: float = 0.0
    runs: int = 0
    backlog: int = 0
    errors: list[str] = field(default_factory=list)


class Minutes:
    """Usage records of the funded leases, a minute each, never the same minute twice: each batch is one
    operator's (operators in turn), round-robin over its leases, so a batch names many leases."""

    def __init__(self, leases: Sequence[tuple[int, int, datetime, str]]) -> None:
        by_operator: dict[str, list[tuple[int, int, datetime]]] = {}
        for lease, cards, start, operator in leases:
            by_operator.setdefault(operator, []).append((lease, cards, start))
        self.operators = sorted(by_operator)
        self.leases = by_operator
        self.next_minute = {lease: 0 for lease, _, _, _ in leases}
        self.turn = dict.fromkeys(self.operators, 0)
        self.operator_turn = 0
        self.lock = threading.Lock()
        self.limit = int(FUNDED_PAST.total_seconds() // 60) - 1

    def batch(self, size: int) -> tuple[str, list[dict[str, object]]]:
        """The next operator and ``size`` records of its leases."""
        records: list[dict[str, object]] = []
        with self.lock:
            operator = self.operators[self.operator_turn % len(self.operators)]
            self.operator_turn += 1
            leases = self.leases[operator]
            for _ in range(size):
                lease, cards, start = leases[self.turn[operator] % len(leases)]
                self.turn[operator] += 1
                minute = self.next_minute[lease]
                if minute >= self.limit:
                    raise SystemExit("the funded leases ran out of minutes: use more --funded-leases")
                self.next_minute[lease] += 1
                begin = start + timedelta(minutes=minute)
                records.append(
                    {
                        "lease": lease,
                        "idempotency_key": f"ingest-{lease}-{minute}",
                        "start_at": _iso(begin),
                        "end_at": _iso(begin + timedelta(minutes=1)),
                        "cards": cards,
                    }
                )
        return operator, records


def ingest(
    *,
    label: str,
    port: int,
    tokens: dict[str, str],
    minutes: Minutes,
    clients: int,
    batch: int,
    seconds: float,
    server_pids: Sequence[int],
    worker: Worker,
    database: str,
) -> Ingest:
    from metering.models import UsagePending

    warm_until = time.monotonic() + min(2.0, seconds)
    warm = Http(port, tokens[next(iter(tokens))])
    while time.monotonic() < warm_until:  # a fresh server's first requests are not what is measured
        operator, records = minutes.batch(batch)
        warm.token = tokens[operator]
        warm.call("POST", "/api/v1/operator/usage", json.dumps({"records": records}).encode())
    warm.close()
    time.sleep(0.5)
    result = Ingest(label=label)
    runs_before = worker.arrival_runs()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        conns = {op: Http(port, token) for op, token in tokens.items()}
        try:
            while time.monotonic() < stop_at:
                operator, records = minutes.batch(batch)
                body = json.dumps({"records": records}).encode()
                t0 = time.perf_counter()
                code, raw = conns[operator].call("POST", "/api/v1/operator/usage", body)
                took = time.perf_counter() - t0
                with lock:
                    if code != 201:
                        result.errors.append(f"usage: {code} {raw[:300]!r}")
                        return
                    result.requests += 1
                    result.records += len(records)
                    result.latencies.append(took)
        finally:
            for conn in conns.values():
                conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    with Cpu(server=server_pids, worker=worker.pids(), database=database) as cpu:
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result.seconds = time.perf_counter() - began
        time.sleep(1.0)  # the last arrival run (if any) finishes inside the phase's CPU count
    result.server_cpu_s = cpu.seconds("web server")
    result.worker_cpu_s = cpu.seconds("Celery worker")
    result.postgres_cpu_s = cpu.seconds("PostgreSQL")
    result.runs = worker.arrival_runs() - runs_before
    result.backlog = UsagePending.objects.count()  # (the phase's warm-up records included)
    return result


HOOK_SCRIPT = """
import time, django
django.setup()
from broker import tasks
from broker.services import enforcement
from config.celery_app import app

def cost(fn, n):
    fn()
    began = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - began) / n

def queuing():
    enforcement.usage_rating_request_clear()
    tasks.usage_rate_on_arrival_request()

enforcement.usage_rating_request_mark()
waiting = cost(tasks.usage_rate_on_arrival_request, 2000)
queued = cost(queuing, 200)
enforcement.usage_rating_request_clear()
app.control.purge()
print(waiting, queued)
"""


def hook_cost(env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds of the arrival hook (broker.tasks.usage_rate_on_arrival_request) per report, in a process
    with the server's settings, cache and broker: when a run is already waiting (one cache ``add``) and when
    it queues one (the marker set, the task published)."""
    out = subprocess.run(
        [sys.executable, "-c", HOOK_SCRIPT],
        env={**env, "DJANGO_LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def pooled(phases: Sequence[Ingest]) -> Ingest:
    out = Ingest(label=phases[0].label)
    for phase in phases:
        out.records += phase.records
        out.requests += phase.requests
        out.seconds += phase.seconds
        out.latencies += phase.latencies
        out.server_cpu_s += phase.server_cpu_s
        out.worker_cpu_s += phase.worker_cpu_s
        out.postgres_cpu_s += phase.postgres_cpu_s
        out.runs += phase.runs
        out.backlog += phase.backlog
        out.errors += phase.errors
    return out


def healthz_baseline(port: int, server_pids: Sequence[int], n: int = 300) -> tuple[list[float], float]:
    conn = Http(port, token="")
    latencies = []
    before = cpu_of(server_pids)
    for _ in range(n):
        t0 = time.perf_counter()
        code, _ = conn.call("GET", "/healthz")
        latencies.append(time.perf_counter() - t0)
        if code != 200:
            raise RuntimeError(f"/healthz answered {code}")
    cpu = cpu_of(server_pids) - before
    conn.close()
    return sorted(latencies), cpu / n


@dataclass
class StopPhase:
    label: str
    stops: dict[int, Stop]
    seconds: float
    runs: int
    polls: int
    worker_cpu_s: float
    server_cpu_s: float
    postgres_cpu_s: float
    load_records: int = 0
    load_seconds: float = 0.0


def stop_phase(
    *,
    label: str,
    leases: Sequence[tuple[int, LeasePlan]],
    port: int,
    tokens: dict[str, str],
    operator_of: Sequence[str],
    interval: float,
    server_pids: Sequence[int],
    worker: Worker,
    database: str,
    errors: list[str],
    load: tuple[Minutes, int, int] | None = None,
) -> StopPhase:
    """One long-poll agent per operator; one report emptying a thin buyer's pack every ``interval`` s; with
    ``load`` (minutes, clients, batch), closed-loop ingest of the funded leases on the same server meanwhile."""
    stops = {pk: Stop(lease=pk, operator=operator_of[pk - 1]) for pk, _ in leases}
    agents = {
        operator: FeedAgent(port, tokens[operator], stops, errors)
        for operator in sorted({s.operator for s in stops.values()})
    }
    for agent in agents.values():
        agent.thread.start()
    for agent in agents.values():
        agent.ready.wait(60)
    time.sleep(1.0)  # every agent's long-poll is waiting

    loaded = threading.Event()
    load_records = [0]
    load_lock = threading.Lock()

    def load_client(minutes: Minutes, batch: int) -> None:
        conns = {op: Http(port, token) for op, token in tokens.items()}
        try:
            while not loaded.is_set():
                operator, records = minutes.batch(batch)
                code, raw = conns[operator].call(
                    "POST", "/api/v1/operator/usage", json.dumps({"records": records}).encode()
                )
                if code != 201:
                    errors.append(f"usage under load: {code} {raw[:300]!r}")
                    return
                with load_lock:
                    load_records[0] += len(records)
        finally:
            for conn in conns.values():
                conn.close()

    load_threads = []
    if load is not None:
        minutes, clients, batch = load
        load_threads = [
            threading.Thread(target=load_client, args=(minutes, batch), daemon=True) for _ in range(clients)
        ]
        for thread in load_threads:
            thread.start()
        time.sleep(2.0)  # the load is under way before the first stop
    load_began = time.monotonic()
    load_before = load_records[0]

    reporters = {op: Http(port, tokens[op]) for op in agents}
    runs_before = worker.arrival_runs()
    with Cpu(server=server_pids, worker=worker.pids(), database=database) as cpu:
        began = time.monotonic()
        for n, (pk, lease) in enumerate(leases):
            time.sleep(max(0.0, began + n * interval - time.monotonic()))
            stop = stops[pk]
            body = json.dumps(
                {
                    "records": [
                        {
                            "lease": pk,
                            "idempotency_key": f"stop-{pk}",
                            "start_at": _iso(lease.start),
                            "end_at": _iso(lease.start + STOP_USAGE),
                            "cards": lease.cards,
                        }
                    ]
                }
            ).encode()
            t0 = time.perf_counter()
            code, raw = reporters[stop.operator].call("POST", "/api/v1/operator/usage", body)
            stop.accepted_at, stop.accepted_wall = time.monotonic(), time.time()
            stop.report_s = time.perf_counter() - t0
            if code != 201:
                errors.append(f"stop report of lease {pk}: {code} {raw[:300]!r}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(s.seen_at is None for s in stops.values()):
            time.sleep(0.05)
        phase_s = time.monotonic() - began
    load_seconds = time.monotonic() - load_began
    load_done = load_records[0] - load_before
    loaded.set()
    for thread in load_threads:
        thread.join()
    runs = worker.arrival_runs() - runs_before
    for agent in agents.values():
        agent.done.set()
    for reporter in reporters.values():
        reporter.close()
    never = [pk for pk, s in stops.items() if s.seen_at is None]
    if never:
        errors.append(f"{label}: {len(never)} stop request(s) never seen within 30 s: leases {never[:10]}")
    return StopPhase(
        label=label,
        stops=stops,
        seconds=phase_s,
        runs=runs,
        polls=sum(agent.polls for agent in agents.values()),
        worker_cpu_s=cpu.seconds("Celery worker"),
        server_cpu_s=cpu.seconds("web server"),
        postgres_cpu_s=cpu.seconds("PostgreSQL"),
        load_records=load_done if load is not None else 0,
        load_seconds=load_seconds if load is not None else 0.0,
    )


# --- The run ------------------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def run(args: argparse.Namespace, database: BenchDatabase) -> int:
    from benchmarks._common import django_setup

    print(machine_description())
    django_setup(database_url=database.url, conn_max_age=0)
    thin_n = args.stops + (args.stops if args.loaded_stops else 0)
    market = build_market(
        argparse.Namespace(
            clusters=args.clusters,
            islands=args.islands,
            leases=thin_n + args.funded_leases,
            operators=args.operators,
            buyers=thin_n + args.funded_buyers,
            seed=args.seed,
        ),
        database.url,
        place=place_for(stops=thin_n, funded_buyers=args.funded_buyers),
    )
    plans = [market.fleet[market.island_cluster[lease.island]] for lease in market.leases]
    fund(
        thin={lease.buyer_id: plans[i].accelerator for i, lease in enumerate(market.leases[:thin_n])},
        funded_ids=market.buyer_ids[thin_n:],
        chips={plan.accelerator for plan in market.fleet},
    )
    operator_of = [plan.operator for plan in plans]
    thin = [(pk, lease) for pk, lease in enumerate(market.leases, start=1) if pk <= thin_n]
    funded = Minutes(
        [
            (pk, lease.cards, lease.start, operator_of[pk - 1])
            for pk, lease in enumerate(market.leases, start=1)
            if pk > thin_n
        ]
    )
    tokens = market.operator_tokens

    log_dir = Path(os.environ.get("CARDHOUR_BENCH_LOG_DIR", "var/bench"))
    log_dir.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    env = {"CELERY_BROKER_URL": args.broker_url, "CACHE_URL": args.cache_url}
    subprocess.run(["redis-cli", "-u", args.broker_url, "flushdb"], check=False, capture_output=True)
    subprocess.run(["redis-cli", "-u", args.cache_url, "flushdb"], check=False, capture_output=True)

    def servers_with(on: bool) -> ProductionServers:
        return ProductionServers(
            workers=args.workers,
            database_url=f"{database.url}?application_name=cardhour-enforcement",
            extra={**env, "CARDHOUR_RATING_ON_ARRIVAL": "true" if on else "false"},
        )

    from metering.services.rating import usage_rate_pending

    # Two servers, one with arrival rating off, the other with it on; one worker. Only one is loaded at a time.
    servers_off = servers_with(False)
    servers = servers_with(True)
    worker = Worker(
        dict(servers.env), concurrency=args.celery_concurrency, log_path=log_dir / "enforcement-worker.log"
    )
    try:
        worker.wait_ready()
        port = servers.ports[0]
        server_pids = [p.pid for p in servers.processes]
        health, health_cpu = healthz_baseline(port, server_pids)

        idle = stop_phase(
            label="idle",
            leases=thin[: args.stops],
            port=port,
            tokens=tokens,
            operator_of=operator_of,
            interval=args.interval,
            server_pids=server_pids,
            worker=worker,
            database=database.name,
            errors=errors,
        )
        loaded = None
        if args.loaded_stops:
            loaded = stop_phase(
                label="under ingest load",
                leases=thin[args.stops :],
                port=port,
                tokens=tokens,
                operator_of=operator_of,
                interval=args.interval,
                server_pids=server_pids,
                worker=worker,
                database=database.name,
                errors=errors,
                load=(funded, args.clients, args.batch),
            )
            usage_rate_pending()

        # Ingest, the two servers in turn (off, on, off, on…), each phase's figures pooled per setting.
        phases: dict[bool, list[Ingest]] = {False: [], True: []}
        for _ in range(args.rounds):
            for arrival_on, target in ((False, servers_off), (True, servers)):
                phase = ingest(
                    label=f"arrival rating {'on' if arrival_on else 'off'}",
                    port=target.ports[0],
                    tokens=tokens,
                    minutes=funded,
                    clients=args.clients,
                    batch=args.batch,
                    seconds=args.seconds,
                    server_pids=[p.pid for p in target.processes],
                    worker=worker,
                    database=database.name,
                )
                errors += phase.errors
                phases[arrival_on].append(phase)
                # What an off phase leaves is the minute's rating's work: rated here, outside every count.
                usage_rate_pending()
    finally:
        servers.stop()
        servers_off.stop()
        worker.stop()
    # With no worker left to take them: the runs it queues are purged, never run.
    hook_waiting_s, hook_queuing_s = hook_cost(dict(servers.env))
    off, on = pooled(phases[False]), pooled(phases[True])

    from broker.models import Lease

    phases_run = [run_ for run_ in (idle, loaded) if run_ is not None]
    stamped = dict(
        Lease.objects.filter(
            pk__in=[pk for run_ in phases_run for pk in run_.stops], stop_requested_at__isnull=False
        ).values_list("pk", "stop_requested_at")
    )
    rows: list[list[object]] = []
    p99s = []
    for stop_run in phases_run:
        stops = stop_run.stops
        seen = sorted(s.seen_at - s.accepted_at for s in stops.values() if s.seen_at is not None)
        to_db = sorted(
            at.timestamp() - stops[pk].accepted_wall
            for pk, at in stamped.items()
            if pk in stops and at is not None
        )
        reports = sorted(s.report_s for s in stops.values())
        p99s.append(percentile(seen, 99) if len(seen) == len(stops) else float("inf"))
        rows += [
            [stop_run.label, "accept (2xx) → seen on the lease feed", len(seen), *_stats(seen)],
            [stop_run.label, "accept (2xx) → stop_requested_at in the DB", len(to_db), *_stats(to_db)],
            [stop_run.label, "baseline: the report itself (POST → 2xx)", len(reports), *_stats(reports)],
        ]
    rows.append(["idle", "baseline: GET /healthz, same server", len(health), *_stats(health)])
    print_table(
        f"Accept → stop request, one report every {args.interval:.2f} s (arrival path only: no beat)",
        ["phase", "measure", "n", "p50 ms", "p99 ms", "max ms"],
        rows,
        left_columns=2,
    )
    if loaded is not None and loaded.load_seconds:
        print(
            f"the load during '{loaded.label}': {loaded.load_records / loaded.load_seconds:,.0f} usage records/s "
            f"({args.clients} closed-loop clients, batches of {args.batch})"
        )
    print_table(
        "CPU over each stop phase, per stop (the load's own work included under load)",
        ["phase", "s", "arrival runs", "reports", "long-polls", "worker ms", "server ms", "PostgreSQL ms"],
        [
            [
                run_.label,
                f"{run_.seconds:.1f}",
                run_.runs,
                len(run_.stops),
                run_.polls,
                f"{run_.worker_cpu_s / len(run_.stops) * 1000:.1f}",
                f"{run_.server_cpu_s / len(run_.stops) * 1000:.1f}",
                f"{run_.postgres_cpu_s / len(run_.stops) * 1000:.1f}",
            ]
            for run_ in phases_run
        ],
    )
    print(f"baseline: web server CPU per /healthz {health_cpu * 1000:.2f} ms")
    print_table(
        f"Ingest, {args.clients} clients × batches of {args.batch} records, {args.rounds} × {args.seconds:.0f} s "
        "per setting, alternating",
        [
            "phase",
            "records/s",
            "p50 ms",
            "p99 ms",
            "server CPU µs/record",
            "worker CPU s",
            "PostgreSQL CPU s",
            "arrival runs",
            "requests",
            "left unrated",
        ],
        [
            [
                phase.label,
                f"{phase.records / phase.seconds:,.0f}" if phase.seconds else "-",
                *_stats(sorted(phase.latencies))[:2],
                f"{phase.server_cpu_s / max(phase.records, 1) * 1e6:.1f}",
                f"{phase.worker_cpu_s:.2f}",
                f"{phase.postgres_cpu_s:.2f}",
                phase.runs,
                phase.requests,
                f"{phase.backlog:,}",
            ]
            for phase in (off, on)
        ],
    )
    print(
        f"the arrival hook itself (same settings, cache and broker, in a process of its own): "
        f"{hook_waiting_s * 1e6:.0f} µs CPU per report when a run is already waiting (a cache add), "
        f"{hook_queuing_s * 1e6:.0f} µs when it queues one (marker + publish); "
        f"{(hook_waiting_s * on.requests + hook_queuing_s * on.runs) / max(on.records, 1) * 1e6:.1f} µs per "
        "record at the on phase's mix"
    )
    for phase in (off, on):
        total = phase.server_cpu_s + phase.worker_cpu_s + phase.postgres_cpu_s
        print(
            f"{phase.label}: {total / max(phase.records, 1) * 1e6:.0f} µs CPU per record, server + worker + "
            f"PostgreSQL{' (its rating left for later)' if phase is off else ' (rating included)'}"
        )
    if off.records and on.records and off.seconds and on.seconds:
        ratio = (on.records / on.seconds) / (off.records / off.seconds)
        print(f"ingest with arrival rating on / off: {ratio:.2f}× the records per second")
    print(
        "\nfor comparison, the minute's beat alone (not run): the next rating (every 60 s) then the next stop "
        "run (every 10 s): ~35 s on average, up to ~70 s"
    )
    print()
    for stop_run, p99 in zip(phases_run, p99s, strict=True):
        verdict = "PASS" if p99 <= TARGET_P99_S else "MISS"
        print(
            f"{verdict} ({stop_run.label}): accept → stop request seen, p99 {ms(p99)} ms against "
            f"≤ {TARGET_P99_S * 1000:.0f} ms"
        )
    for error in errors[:20]:
        print(f"ERROR: {error}", file=sys.stderr)
    return 1 if errors else 0


def _stats(values: Sequence[float]) -> list[str]:
    if not values:
        return ["-", "-", "-"]
    return [ms(percentile(values, 50)), ms(percentile(values, 99)), ms(values[-1])]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.enforcement", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--stops", type=int, default=60, help="thin buyers, one running lease each")
    parser.add_argument(
        "--no-loaded-stops",
        dest="loaded_stops",
        action="store_false",
        help="skip the second stop phase, under ingest load",
    )
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between two stop reports")
    parser.add_argument("--funded-leases", type=int, default=800)
    parser.add_argument("--funded-buyers", type=int, default=10)
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--islands", type=int, default=1_000)
    parser.add_argument("--operators", type=int, default=5)
    parser.add_argument("--clients", type=int, default=2, help="ingest threads")
    parser.add_argument("--batch", type=int, default=100, help="records per ingest request")
    parser.add_argument("--seconds", type=float, default=10.0, help="each ingest phase")
    parser.add_argument("--rounds", type=int, default=2, help="ingest phases per setting, alternating")
    parser.add_argument("--workers", type=int, default=1, help="web server processes")
    parser.add_argument("--celery-concurrency", type=int, default=1)
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--cache-url", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--database-url", help="an empty PostgreSQL database to use (not dropped)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--quick", action="store_true", help="50 stops, 5 s of ingest per phase")
    args = parser.parse_args(argv)
    if args.quick:
        args.stops, args.seconds, args.rounds = 50, 5.0, 1
    database = (
        BenchDatabase(url=args.database_url, owned=False)
        if args.database_url
        else BenchDatabase.create(name=BENCH_DATABASE)
    )
    try:
        return run(args, database)
    finally:
        if not args.keep:
            with contextlib.suppress(Exception):
                database.drop()


if __name__ == "__main__":
    raise SystemExit(main())
