"""The design-load soak: the whole platform at once, for ``--minutes``, on the production stack.

    python -m benchmarks.soak                  # 10k clusters, 100k islands, 100k running leases, 10 minutes
    python -m benchmarks.soak --quick          # 500 clusters, 5k islands, 5k leases, 2 minutes

On a throwaway PostgreSQL database, benchmarks.broker writes the market (operators and buyers through the
services, everything else with COPY), with every lease running now (one per island, started in the last
hours, ending after the soak) and every lease's buyer holding a standard-card pack large enough for the run.
Then the production stack runs as the README deploys it: gunicorn with uvicorn workers (``--workers``), a
Celery worker for the control queue, one for rating and the long jobs, and Celery beat with the database scheduler (production settings from the environment, the
broker on Redis), so the heartbeat monitor, failover, lease events, exhaustion stops and the minute's rating
all run on their schedules. Against it, at the same time, open-loop load generators (requests sent when due,
whatever the answers take; latency measured from when each was due):

- **heartbeats**: every cluster every 30 s (``clusters / 30`` per second), its islands' available cards;
- **usage**: each operator's agent reports the last minute of every one of its running leases once a minute
  (``leases / 60`` records per second, in batches of up to 1,000 per operator), whole seconds, keys
  ``soak-<lease>-<start>``;
- **quotes**: ``--quote-rate`` per second (default 200) from ``--quote-clients`` clients (default 4), each a
  process of its own (``_quote_client``) sending each quote when due on a free one of its
  ``--quote-connections`` keep-alive connections (default 4; with 1 a client waits for each answer before
  its next quote, a queue of its own that the times from due include), over ``--jobs`` jobs of a buyer;
- **failover**: ``--silent`` clusters (default 0.2 % of them) stop heartbeating after the first third of the
  run, so the monitor takes them offline and failover interrupts and re-places their leases meanwhile.

Every 15 s it scrapes ``/metrics`` (the unrated backlog and its oldest record's age, clusters offline, clusters
overdue and whether the heartbeat monitor holds) and the
CPU of each group of processes. At the end the load stops, the backlog is given ``--drain-seconds`` to empty,
and the run is checked: every usage record accepted is stored and rated (records in = records rated), and the
ledger reconciles (``metering.services.maintenance.ledger_reconcile``: every transfer balances, balances
match their entries, no pack below zero, usage transfers match their segments).

Printed: throughput and p50/p99 of each path beside its target (from when each request was due, and
from when it was sent: the difference is the wait in its client's own queue), the backlog over time, CPU seconds per group
(web server, Celery worker, beat, PostgreSQL, this load generator) and per operation (server CPU per request
of the mix; worker CPU per rated record), a same-run ``/healthz`` baseline (CPU per request on the same
server, before the load), and PASS/MISS for each target of issue 14 that the soak can judge. Exits non-zero
only on errors (a failed request, a lost record, a ledger breach).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import http.client
import json
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from multiprocessing.connection import Connection as PipeEnd
from pathlib import Path

from benchmarks._common import (
    BenchDatabase,
    JsonClient,
    LeanConnection,
    add_server_env_argument,
    machine_description,
    percentile,
    postgres_backend_pids,
    print_table,
    process_cpu_seconds,
)
from benchmarks.broker import LEASE_CARDS, LeasePlan, build_market, create_jobs
from benchmarks.prodserver import PRODUCTION_WORKERS, ProductionServers

BENCH_DATABASE = "cardhour_bench_soak"
HEARTBEAT_SECONDS = 30
USAGE_EVERY_SECONDS = 60
USAGE_BATCH = 1_000
SCRAPE_SECONDS = 15
LEASE_ENDED_CODES = {"after_lease_ended", "after_stop_request"}
TARGETS = {  # issue 14: the p99 each path must keep at design load (seconds)
    "quote": 0.050,
}


# --- The market: every lease running ---------------------------------------------------------------------


def running_leases(
    *, n: int, island_cards: Sequence[int], buyer_ids: Sequence[int], now: datetime, rng: random.Random
) -> tuple[list[LeasePlan], int]:
    """``n`` leases, one per island in turn (so none is oversubscribed while ``n`` ≤ islands), each started
    in the last six hours on a whole minute and ending 12–72 hours from now: all of them report usage."""
    from benchmarks.federation import HUBS

    if n > len(island_cards):
        raise SystemExit(f"--leases {n:,} is more than the {len(island_cards):,} islands (one lease each)")
    leases = []
    for island in range(n):
        capacity = island_cards[island]
        cards = min(capacity, rng.choice(LEASE_CARDS))
        start = (now - timedelta(minutes=rng.randrange(10, 6 * 60))).replace(second=0)
        end = now + timedelta(hours=rng.randrange(12, 72))
        leases.append(
            LeasePlan(
                island=island,
                cards=cards,
                start=start,
                end=end,
                created=start - timedelta(minutes=5),
                buyer_id=rng.choice(buyer_ids),
                hub=rng.choice(HUBS),
                running=True,
            )
        )
    return leases, 0


def fund_buyers(buyer_ids: Sequence[int], *, card_hours: int) -> None:
    """A standard-card pack for every buyer holding the leases, paid through the pack service (as a Stripe
    webhook would credit it), so rating draws packs instead of raising arrears and stopping leases; and a pack
    of each chip in the fleet that has no public TFLOPS figure, which standard cards cannot pay for (a quarter
    of the leases run on two such chips: without their packs their buyers are flagged exhausted at the first
    rating and 25,000 leases are stopped, which is not the design load)."""
    from django.utils import timezone

    from core.models import Organisation
    from federation.models import Accelerator, Cluster
    from metering.models import PackOrder, PackProduct
    from metering.services.packs import pack_issue

    products = [
        PackProduct.objects.create(
            code="soak-std", name="soak standard", card_hours=card_hours, price=Decimal(card_hours) * 9
        )
    ]
    for chip in Accelerator.objects.filter(
        pk__in=Cluster.objects.values("accelerator_id"), dense_fp16_tflops__isnull=True
    ).order_by("slug"):
        products.append(
            PackProduct.objects.create(
                code=f"soak-{chip.slug}",
                name=f"soak {chip.slug}",
                accelerator=chip,
                card_hours=card_hours,
                price=Decimal(card_hours) * 9,
            )
        )
    paid_at = timezone.now() - timedelta(days=3)
    for buyer in Organisation.objects.filter(pk__in=buyer_ids):
        for product in products:
            order = PackOrder.objects.create(
                buyer=buyer,
                product=product,
                accelerator=product.accelerator,
                card_hours=card_hours,
                amount=Decimal(card_hours) * 9,
                validity_days=365,
                idempotency_key=f"{product.code}-{buyer.pk}",
            )
            pack_issue(order=order, paid_at=paid_at, posted_by="benchmark")


# --- Load -------------------------------------------------------------------------------------------------


@dataclass
class PathStats:
    latencies: list[float] = field(default_factory=list)  # from when each request was due
    # From when each request was sent: the server's part of its latency (and the network's), without the
    # wait in its client's own queue behind the client's earlier requests.
    answered: list[float] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    late_s: float = 0.0  # the most a request started after it was due (the generator falling behind)
    units: int = 0  # heartbeats, records created, quotes

    def merge(self, other: PathStats) -> None:
        """Add a client process's own stats (its requests, latencies, errors) to these."""
        self.latencies += other.latencies
        self.answered += other.answered
        self.done_at += other.done_at
        self.errors += other.errors
        self.late_s = max(self.late_s, other.late_s)
        self.units += other.units

    def add(self, *, took: float, at: float, units: int, answered: float | None = None) -> None:
        self.latencies.append(took)
        self.answered.append(took if answered is None else answered)
        self.done_at.append(at)
        self.units += units


class Connection:
    """A keep-alive HTTP connection (benchmarks._common.LeanConnection) that reconnects once when the server
    closed it while idle."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = LeanConnection("127.0.0.1", port, timeout=120)
        self.sent_at = 0.0  # when the last call's request went out (perf_counter)

    def call(self, method: str, path: str, *, token: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            try:
                self.sent_at = time.perf_counter()
                return self.conn.request(method, path, body=body, headers=headers)
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected) as exc:
                if attempt == 2:
                    return 0, repr(exc).encode()
            except (OSError, http.client.HTTPException) as exc:
                return 0, repr(exc).encode()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


class Soak:
    def __init__(self, *, port: int, stop_at: float, began: float) -> None:
        self.port = port
        self.stop_at = stop_at
        self.began = began
        self.lock = threading.Lock()
        self.stats = {kind: PathStats() for kind in ("heartbeat", "usage", "quote")}
        # Records dropped because the platform had ended or stopped their lease, by the refusal's code.
        self.refused: Counter[str] = Counter()

    def _record(
        self, kind: str, *, due: float, sent: float, code: int, raw: bytes, units: int, ok: tuple[int, ...]
    ) -> None:
        now = time.perf_counter()
        with self.lock:
            stats = self.stats[kind]
            if code in ok:
                stats.add(took=now - due, at=now - self.began, units=units, answered=now - sent)
            else:
                stats.errors.append(f"{kind}: HTTP {code} {raw[:300]!r}")

    def _sleep_until(self, due: float, kind: str) -> bool:
        """Wait until ``due``; False when the load is over by then. A request due after the end is not
        waited for: a usage agent's next minute would otherwise hold the run up to 60 s past its end,
        which the rates, divided by the load's length, would count as load."""
        pause = due - time.perf_counter()
        if time.monotonic() + max(pause, 0.0) >= self.stop_at:
            return False
        if pause > 0:
            time.sleep(pause)
        else:
            with self.lock:
                self.stats[kind].late_s = max(self.stats[kind].late_s, -pause)
        return time.monotonic() < self.stop_at

    def heartbeats(
        self,
        clusters: Sequence[tuple[str, str, list[tuple[str, int]]]],
        *,
        thread: int,
        threads: int,
        batch: int = 1,
    ) -> None:
        """This thread's share of the clusters, each every 30 s at its own offset in the period: one request per
        beat (``batch`` 1), or each operator's clusters of this share in batches of ``batch`` beats
        (``POST /api/v1/heartbeats``), each batch at its own offset."""
        mine = clusters[thread::threads]
        if batch > 1:  # an agent batches its own operator's clusters: group the share by token
            mine = sorted(mine, key=lambda c: c[1])
        groups: list[list[tuple[str, str, list[tuple[str, int]]]]] = []
        for cluster in mine:
            if groups and len(groups[-1]) < batch and groups[-1][0][1] == cluster[1]:
                groups[-1].append(cluster)
            else:
                groups.append([cluster])
        conn = Connection(self.port)
        period = HEARTBEAT_SECONDS
        try:
            cycle = 0
            while time.monotonic() < self.stop_at:
                for i, group in enumerate(groups):
                    due = self.began + cycle * period + (i + thread / threads) * period / len(groups)
                    if not self._sleep_until(due, "heartbeat"):
                        return
                    silenced = time.perf_counter() - self.began > self.silence_after
                    beats = [
                        {
                            "cpi": cpi,
                            "sent_at": datetime.now(UTC).isoformat(),
                            "health": "ok",
                            "islands": [
                                {"name": name, "available_cards": cards, "unhealthy_cards": 0}
                                for name, cards in islands
                            ],
                        }
                        for cpi, _token, islands in group
                        if not (silenced and cpi in self.silent)
                    ]
                    if not beats:
                        continue
                    token = group[0][1]
                    if batch > 1:
                        code, raw = conn.call(
                            "POST",
                            "/api/v1/heartbeats",
                            token=token,
                            body=json.dumps({"beats": beats}).encode(),
                        )
                        if code == 200 and any(r["error"] is not None for r in json.loads(raw)["results"]):
                            code = 207  # a beat refused inside the batch: an error, not a slow beat
                    else:
                        cpi = beats[0].pop("cpi")
                        code, raw = conn.call(
                            "POST",
                            f"/api/v1/clusters/{cpi}/heartbeats",
                            token=token,
                            body=json.dumps(beats[0]).encode(),
                        )
                    self._record(
                        "heartbeat",
                        due=due,
                        sent=conn.sent_at,
                        code=code,
                        raw=raw,
                        units=len(beats),
                        ok=(200,),
                    )
                cycle += 1
        finally:
            conn.close()

    silent: frozenset[str] = frozenset()
    silence_after: float = 0.0

    def usage(
        self, agents: Sequence[tuple[str, list[tuple[int, int, int]]]], *, thread: int, threads: int
    ) -> None:
        """Operators' agents: each reports, once a minute at its own offset, the minute since its last report
        for each of its leases (``lease id, cards, next start (epoch seconds)``), in batches of 1,000."""
        mine = [(n, agent) for n, agent in enumerate(agents) if n % threads == thread]
        conn = Connection(self.port)
        cursors = {lease: start for _, (_, leases) in mine for lease, _, start in leases}
        ended: set[int] = set()  # leases the platform ended (failover): an agent stops reporting them
        try:
            cycle = 0
            while time.monotonic() < self.stop_at:
                for n, (token, leases) in mine:
                    due = self.began + cycle * USAGE_EVERY_SECONDS + n * USAGE_EVERY_SECONDS / len(agents)
                    if not self._sleep_until(due, "usage"):
                        return
                    now_s = int(time.time())
                    records = []
                    for lease, cards, _ in leases:
                        if lease in ended:
                            continue
                        start = cursors[lease]
                        end = min(start + USAGE_EVERY_SECONDS, now_s)
                        if end <= start:
                            continue
                        records.append(
                            {
                                "lease": lease,
                                "idempotency_key": f"soak-{lease}-{start}",
                                "start_at": _iso(start),
                                "end_at": _iso(end),
                                "cards": cards,
                            }
                        )
                        cursors[lease] = end
                    for i in range(0, len(records), USAGE_BATCH):
                        self._report(conn, token, records[i : i + USAGE_BATCH], due=due, ended=ended)
                cycle += 1
        finally:
            conn.close()

    def _report(
        self, conn: Connection, token: str, records: list[dict[str, object]], *, due: float, ended: set[int]
    ) -> None:
        """POST one batch; records of leases the platform has ended or stopped meanwhile (failover, a stop
        request, the lease's end) are refused with the batch (400 ``lease_usage_invalid``): drop them, as an agent would, and send the rest."""
        while records:
            body = json.dumps({"records": records}).encode()
            code, raw = conn.call("POST", "/api/v1/operator/usage", token=token, body=body)
            if code == 400 and b"lease_usage_invalid" in raw:
                faults = json.loads(raw)["extra"].get("errors", [])
                codes = {records[f["index"]]["lease"]: f.get("code") for f in faults}
                gone = {lease for lease, code in codes.items() if code in LEASE_ENDED_CODES}
                if gone and len(gone) == len(codes):
                    ended.update(gone)  # type: ignore[arg-type]
                    with self.lock:
                        self.refused.update(str(codes[r["lease"]]) for r in records if r["lease"] in gone)
                    records = [r for r in records if r["lease"] not in gone]
                    continue
            created = json.loads(raw).get("created", 0) if code in (200, 201) else 0
            self._record(
                "usage", due=due, sent=conn.sent_at, code=code, raw=raw, units=created, ok=(200, 201)
            )
            return

    def quotes(
        self, jobs: Sequence[int], *, token: str, rate: float, thread: int, connections: int = 1
    ) -> None:
        """One quote client: quotes due at ``rate`` a second with random gaps (a Poisson stream), each sent
        when due on the first of its ``connections`` keep-alive connections that is free (one thread
        each), or as soon as one is free if none is then: the wait counts, from when the quote was due.
        With one connection the client sends its next quote only after the last one's answer."""
        rng = random.Random(thread)
        schedule = threading.Lock()
        due = time.perf_counter() + rng.expovariate(rate)
        body = json.dumps({"limit": 10}).encode()

        def sender() -> None:
            nonlocal due
            conn = Connection(self.port)
            try:
                while True:
                    with schedule:  # the next quote due that no connection has taken yet
                        mine, job = due, jobs[rng.randrange(len(jobs))]
                        due += rng.expovariate(rate)
                    if not self._sleep_until(mine, "quote"):
                        return
                    code, raw = conn.call("POST", f"/api/v1/jobs/{job}/quotes", token=token, body=body)
                    self._record(
                        "quote", due=mine, sent=conn.sent_at, code=code, raw=raw, units=1, ok=(200, 201)
                    )
            finally:
                conn.close()

        senders = [threading.Thread(target=sender, daemon=True) for _ in range(max(connections, 1))]
        for each in senders:
            each.start()
        for each in senders:
            each.join()


def _quote_client(
    port: int, jobs: Sequence[int], token: str, rate: float, thread: int, connections: int, pipe: PipeEnd
) -> None:
    """One quote client in a process of its own (``--quote-clients-in-process`` keeps the old threads): it
    waits for the run's clock (``began``, ``stop_at``: perf_counter and monotonic read the same system-wide
    clock in every process on Linux), sends its quotes when due, hands its PathStats back and waits to be
    let go, so that the parent's last CPU sample still finds it.

    In a thread of the load generator, a quote client shares the interpreter lock with the usage agents
    building their batches of 1,000 records and the heartbeat agents: its quote's answer waited for the
    lock (up to the 5 ms switch interval, several times over) before it was read and timed, and its next
    quote before it went out. A real buyer's client runs elsewhere; here its latencies are the server's and
    its own queue's only."""
    began, stop_at = pipe.recv()
    soak = Soak(port=port, stop_at=stop_at, began=began)
    soak.quotes(jobs, token=token, rate=rate, thread=thread, connections=connections)
    pipe.send(soak.stats["quote"])
    pipe.recv()


def _iso(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- The stack ----------------------------------------------------------------------------------------------


class Celery:
    """Celery as the README deploys it: a worker for the control queue (the monitor, failover, stops, lease
    events), a worker for rating and the long jobs, and beat, with the server's environment."""

    def __init__(
        self, env: dict[str, str], *, concurrency: int, control_concurrency: int, log_dir: Path
    ) -> None:
        celery = str(Path(sys.executable).with_name("celery"))
        self.log_paths = {name: log_dir / f"soak-{name}.log" for name in ("worker", "control", "beat")}
        self.logs = {name: path.open("wb") for name, path in self.log_paths.items()}
        worker_env = {**env, "DATABASE_STATEMENT_TIMEOUT_MS": "7200000"}

        def worker(name: str, queues: str, slots: int) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [
                    *(celery, "-A", "config", "worker", "-Q", queues, "-n", f"{name}@%h"),
                    *("--loglevel", "INFO", "--concurrency", str(slots)),
                ],
                env=worker_env,
                stdout=self.logs[name],
                stderr=subprocess.STDOUT,
            )

        self.processes = {
            "worker": worker("worker", "rating,celery", concurrency),
            "control": worker("control", "control", control_concurrency),
            "beat": subprocess.Popen(
                [
                    celery,
                    "-A",
                    "config",
                    "beat",
                    "--loglevel",
                    "WARNING",
                    "-s",
                    str(log_dir / "soak-beat-schedule"),
                ],
                env=env,
                stdout=self.logs["beat"],
                stderr=subprocess.STDOUT,
            ),
        }

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Wait until both workers say they are ready (their start, ~2 s of CPU each, is over): the load
        then meets Celery as a running deployment has it. Returns the seconds waited; raises SystemExit
        if a worker dies or is not ready within ``timeout``."""
        began = time.monotonic()
        while True:
            if all(b" ready." in self.log_paths[name].read_bytes() for name in ("worker", "control")):
                return time.monotonic() - began
            if not self.alive():
                raise SystemExit("a Celery process died at start (see var/bench/soak-*.log)")
            if time.monotonic() - began > timeout:
                raise SystemExit(f"Celery's workers were not ready within {timeout:.0f} s")
            time.sleep(0.2)

    def pids(self, which: str) -> list[int]:
        process = self.processes[which]
        children = subprocess.run(
            ["pgrep", "-P", str(process.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [process.pid, *(int(pid) for pid in children)]

    def alive(self) -> bool:
        return all(process.poll() is None for process in self.processes.values())

    def stop(self) -> None:
        order = [self.processes[name] for name in ("beat", "control", "worker")]
        for process in order:
            process.terminate()
        for process in order:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in self.logs.values():
            log.close()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def scrape(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Host": "127.0.0.1"})
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def cpu_of(pids: Sequence[int]) -> float:
    return sum(process_cpu_seconds(pid) or 0.0 for pid in pids)


class CpuGroups:
    """CPU seconds of each group of processes, read often enough that PostgreSQL backends which come and go
    are counted while they live."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = groups
        self.last: dict[int, float] = {}
        self.owner: dict[int, str] = {}
        self.total: dict[str, float] = defaultdict(float)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        for name, pids_of in self.groups.items():
            for pid in pids_of():
                now = process_cpu_seconds(pid)
                if now is None:
                    continue
                with self.lock:
                    if pid in self.last:
                        self.total[self.owner[pid]] += now - self.last[pid]
                    self.last[pid], self.owner[pid] = now, name

    def snapshot(self) -> dict[str, float]:
        """The CPU seconds of each group so far (as of the last sample, at most a second ago)."""
        with self.lock:
            return dict(self.total)

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            self.sample()

    def start(self) -> None:
        self.sample()
        self.thread.start()

    def finish(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        self.sample()
        return dict(self.total)


# --- The run ------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, database: BenchDatabase) -> int:
    from benchmarks._common import django_setup

    print(machine_description())
    django_setup(database_url=database.url, conn_max_age=0)
    market = build_market(
        argparse.Namespace(
            clusters=args.clusters,
            islands=args.islands,
            leases=args.leases,
            operators=args.operators,
            buyers=args.buyers,
            seed=args.seed,
        ),
        database.url,
        place=running_leases,
    )
    hours = args.leases * max(LEASE_CARDS) * (args.minutes + 60) / 60
    fund_buyers(market.buyer_ids, card_hours=int(hours / max(len(market.buyer_ids), 1)) + 10_000)

    log_dir = Path(os.environ.get("CARDHOUR_BENCH_LOG_DIR", "var/bench"))
    log_dir.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    servers = ProductionServers(
        workers=args.workers,
        database_url=f"{database.url}?application_name=cardhour-soak",
        extra={
            "CELERY_BROKER_URL": args.broker_url,
            "CACHE_URL": args.cache_url,
            "CARDHOUR_BENCH_SERVER_LOG": str(log_dir / "soak-server.log"),
            "GUNICORN_LOGLEVEL": "info",
            **({"CARDHOUR_WSGI_THREADS": str(args.wsgi_threads)} if args.wsgi_threads else {}),
            **dict(args.server_env),
        },
    )
    celery: Celery | None = None
    try:
        port = servers.ports[0]
        client = JsonClient(host="127.0.0.1", ports=[port])
        jobs = create_jobs(
            client, token=market.quote_buyer_token, n=args.jobs, duration_hours=8, seed=args.seed
        )
        for job in jobs[: args.workers * 4]:  # every worker's catalogue loaded before the baseline
            client.call(
                "POST", f"/api/v1/jobs/{job}/quotes", token=market.quote_buyer_token, body={"limit": 10}
            )
        # The workers as they are now: the master forks them after preloading the market, so the pids read
        # before the warm-up can be the master's alone (a baseline of 0.00 ms).
        healthz_cpu, healthz_n = _healthz_baseline(port, [p.pid for p in servers.processes])
        clusters = [
            (
                plan.cpi,
                market.operator_tokens[plan.operator],
                [(name, cards) for name, cards, _ in plan.islands],
            )
            for plan in market.fleet
        ]
        # Every cluster beats once before the monitor starts: the market was written with no heartbeat, and
        # the monitor would take the whole fleet offline at its first run.
        _first_beats(port, clusters)
        subprocess.run(["redis-cli", "-u", args.broker_url, "flushdb"], check=False, capture_output=True)
        celery = Celery(
            dict(servers.env),
            concurrency=args.celery_concurrency,
            control_concurrency=args.control_concurrency,
            log_dir=log_dir,
        )
        # The load starts once Celery's workers are up, as it meets a running deployment (not their start).
        print(f"Celery's workers ready after {celery.wait_ready():.1f} s", flush=True)

        by_operator: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        began_s = int(time.time())
        for pk, lease in enumerate(market.leases, start=1):
            operator = market.fleet[market.island_cluster[lease.island]].operator
            start = max(int(lease.start.timestamp()), began_s - USAGE_EVERY_SECONDS)
            by_operator[operator].append((pk, lease.cards, start))
        agents = [(market.operator_tokens[op], leases) for op, leases in sorted(by_operator.items())]

        # The quote clients' processes start (a fresh interpreter each) before the clock does.
        quote_rate = args.quote_rate / args.quote_clients
        clients: list[tuple[multiprocessing.process.BaseProcess, PipeEnd]] = []
        if not args.quote_clients_in_process:
            spawn = multiprocessing.get_context("spawn")
            for t in range(args.quote_clients):
                mine, theirs = spawn.Pipe()
                process = spawn.Process(
                    target=_quote_client,
                    args=(
                        port,
                        jobs,
                        market.quote_buyer_token,
                        quote_rate,
                        t,
                        args.quote_connections,
                        theirs,
                    ),
                    daemon=True,
                )
                process.start()
                clients.append((process, mine))

        began = time.perf_counter()
        stop_at = time.monotonic() + args.minutes * 60
        soak = Soak(port=port, stop_at=stop_at, began=began)
        for _, pipe in clients:
            pipe.send((began, stop_at))
        rng = random.Random(args.seed)
        soak.silent = frozenset(rng.sample([c[0] for c in clusters], min(args.silent, len(clusters))))
        soak.silence_after = args.minutes * 60 / 3
        groups = CpuGroups(
            {
                "web server": lambda: [p.pid for p in servers.processes],
                "Celery worker": lambda: celery.pids("worker") if celery else [],
                "Celery control worker": lambda: celery.pids("control") if celery else [],
                "Celery beat": lambda: celery.pids("beat") if celery else [],
                "PostgreSQL": lambda: postgres_backend_pids(database.name),
                "PostgreSQL background": lambda: _postgres_background_pids(database.name),
                "load generator": lambda: [os.getpid()],
                "quote clients": lambda: [process.pid for process, _ in clients if process.pid],
            }
        )
        threads = [
            *(
                threading.Thread(
                    target=soak.heartbeats,
                    args=(clusters,),
                    kwargs={"thread": t, "threads": args.heartbeat_threads, "batch": args.heartbeat_batch},
                )
                for t in range(args.heartbeat_threads)
            ),
            *(
                threading.Thread(target=soak.usage, args=(agents,), kwargs={"thread": t, "threads": 4})
                for t in range(4)
            ),
            *(
                threading.Thread(
                    target=soak.quotes,
                    args=(jobs,),
                    kwargs={
                        "token": market.quote_buyer_token,
                        "rate": quote_rate,
                        "thread": t,
                        "connections": args.quote_connections,
                    },
                )
                for t in range(args.quote_clients if args.quote_clients_in_process else 0)
            ),
        ]
        samples: list[tuple[float, float, float, float, float, float]] = []
        cpu_marks: list[dict[str, float]] = []  # each group's CPU seconds so far, at each sample
        sessions_before = _sessions_opened(database.name)
        groups.start()
        for thread in threads:
            thread.daemon = True
            thread.start()
        while time.monotonic() < stop_at:
            time.sleep(min(SCRAPE_SECONDS, max(stop_at - time.monotonic(), 0.1)))
            text = scrape(port)
            cpu_marks.append(groups.snapshot())
            samples.append(
                (
                    time.perf_counter() - began,
                    metric(text, "cardhour_usage_unrated_records"),
                    metric(text, "cardhour_usage_unrated_oldest_age_seconds"),
                    metric(text, "cardhour_clusters_offline"),
                    metric(text, "cardhour_clusters_heartbeat_overdue"),
                    metric(text, "cardhour_heartbeat_monitor_holding"),
                )
            )
            print(
                f"  {samples[-1][0]:6.0f} s: unrated {samples[-1][1]:,.0f} (oldest {samples[-1][2]:.0f} s), "
                f"clusters offline {samples[-1][3]:.0f}, overdue {samples[-1][4]:.0f}"
                f"{' (monitor holding)' if samples[-1][5] else ''}, Celery alive {celery.alive()}",
                flush=True,
            )
        for thread in threads:
            thread.join(180)
        for process, pipe in clients:
            try:
                if not pipe.poll(180):
                    raise EOFError
                soak.stats["quote"].merge(pipe.recv())
            except EOFError:  # still quoting after the load, or it died (its exit code says which)
                soak.stats["quote"].errors.append(
                    f"quote: client process {process.pid} sent no results (exit code {process.exitcode})"
                )
        load_s = time.perf_counter() - began
        cpu = groups.finish()
        for process, pipe in clients:
            with contextlib.suppress(OSError):
                pipe.send(None)
            process.join(10)
        sessions = _sessions_opened(database.name) - sessions_before

        drained_at = _drain(port, seconds=args.drain_seconds, began=began, samples=samples)
        report(
            args,
            soak,
            samples,
            cpu,
            load_s=load_s,
            healthz=(healthz_cpu, healthz_n),
            drained_at=drained_at,
            cpu_marks=cpu_marks,
        )
        # A backend that lives less than CpuGroups' second is not in the PostgreSQL CPU above: so many opened
        # a second would be work that figure misses (each a backend forked and its caches filled).
        print(
            f"PostgreSQL sessions opened during the load: {sessions:,} ({sessions / load_s:.2f} a second; "
            "pg_stat_database.sessions)"
        )
        errors += _check(soak)
        _silent_report(soak)
        for stats in soak.stats.values():
            errors += stats.errors[:10]
        if celery and not celery.alive():
            errors.append("a Celery process died during the soak (see var/bench/soak-*.log)")
    finally:
        if celery:
            celery.stop()
        servers.stop()
    for error in errors:
        print("ERROR", error, file=sys.stderr)
    return 1 if errors else 0


def _sessions_opened(database: str) -> int:
    """``pg_stat_database.sessions`` of ``database`` (PostgreSQL 14+): sessions established so far."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.pg_version >= 150000:  # this session's own count is flushed now, not in a second
            cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", [database])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _first_beats(port: int, clusters: Sequence[tuple[str, str, list[tuple[str, int]]]]) -> None:
    def beat(share: Sequence[tuple[str, str, list[tuple[str, int]]]]) -> None:
        conn = Connection(port)
        for cpi, token, islands in share:
            body = json.dumps(
                {
                    "sent_at": datetime.now(UTC).isoformat(),
                    "health": "ok",
                    "islands": [{"name": n, "available_cards": c, "unhealthy_cards": 0} for n, c in islands],
                }
            ).encode()
            code, raw = conn.call("POST", f"/api/v1/clusters/{cpi}/heartbeats", token=token, body=body)
            if code != 200:
                raise SystemExit(f"first heartbeat of {cpi}: HTTP {code} {raw[:200]!r}")
        conn.close()

    threads = [threading.Thread(target=beat, args=(clusters[t::8],)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _cores_by_slice(samples: Sequence[tuple[float, ...]], cpu_marks: Sequence[dict[str, float]]) -> list[str]:
    """The cores each group used in each slice between samples (``cpu_marks[i]`` taken at ``samples[i]``;
    the groups' sampler started at 0); "-" for the samples taken after the load (the drain)."""
    out: list[str] = []
    before: dict[str, float] = {}
    before_t = 0.0
    for i, row in enumerate(samples):
        if i >= len(cpu_marks):
            out.append("-")
            continue
        mark, span = cpu_marks[i], max(row[0] - before_t, 1e-9)

        def cores(
            *names: str, mark: dict[str, float] = mark, before: dict[str, float] = before, span: float = span
        ) -> float:
            return sum(mark.get(n, 0.0) - before.get(n, 0.0) for n in names) / span

        out.append(
            f"{cores('web server'):.2f} / {cores('PostgreSQL'):.2f} / {cores('PostgreSQL background'):.2f}"
            f" / {cores('Celery worker', 'Celery control worker', 'Celery beat'):.2f}"
        )
        before, before_t = mark, row[0]
    return out


def _latency_slices(
    stats: PathStats, edges: Sequence[float], *, from_sending: bool = False
) -> list[list[float]]:
    """The latencies (sorted) of the requests answered in each slice ``(edges[i - 1], edges[i]]`` of the
    soak's clock (seconds since it began; the first slice from 0): from when each was due, or with
    ``from_sending`` from when it was sent."""
    values = stats.answered if from_sending else stats.latencies
    answered = sorted(zip(stats.done_at, values, strict=True))
    times = [at for at, _ in answered]
    slices, low = [], 0
    for edge in edges:
        high = bisect.bisect_right(times, edge)
        slices.append(sorted(took for _, took in answered[low:high]))
        low = high
    return slices


def _postgres_background_pids(database: str) -> list[int]:
    """PIDs of this machine's PostgreSQL processes other than the client backends of ``database``:
    autovacuum, the WAL writer, the checkpointer, the background writer (work a load causes later)."""
    backends = set(postgres_backend_pids(database))
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in backends:
            continue
        try:
            title = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        # A client backend's title names its client: "host(port)" or "[local]".
        if title.startswith(b"postgres: ") and b"(" not in title and b"[local]" not in title:
            pids.append(int(entry.name))
    return pids


def _healthz_baseline(port: int, pids: Sequence[int]) -> tuple[float, int]:
    """CPU of the web server per ``/healthz``, alone, before the load: the same-run baseline."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    before, n = cpu_of(pids), 0
    stop = time.monotonic() + 5
    while time.monotonic() < stop:
        conn.request("GET", "/healthz", headers={"Host": "127.0.0.1"})
        conn.getresponse().read()
        n += 1
    conn.close()
    return cpu_of(pids) - before, n


def _drain(
    port: int, *, seconds: float, began: float, samples: list[tuple[float, float, float, float, float, float]]
) -> float:
    """Wait for the unrated backlog to empty (rating runs each minute); when it did, in seconds since the
    soak began (NaN: it did not within ``seconds``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = scrape(port)
        unrated = metric(text, "cardhour_usage_unrated_records")
        samples.append(
            (
                time.perf_counter() - began,
                unrated,
                metric(text, "cardhour_usage_unrated_oldest_age_seconds"),
                metric(text, "cardhour_clusters_offline"),
                metric(text, "cardhour_clusters_heartbeat_overdue"),
                metric(text, "cardhour_heartbeat_monitor_holding"),
            )
        )
        if unrated == 0:
            return time.perf_counter() - began
        time.sleep(5)
    return float("nan")


# A silent cluster goes offline after CARDHOUR_HEARTBEAT_MISSED_LIMIT (3) intervals of 30 s, at the next run
# of the monitor (every 10 s): 100 s after its last beat, plus the monitor's own run time and the queue.
SILENT_OFFLINE_TARGET_S = 120.0


def _silent_report(soak: Soak) -> None:
    """Whether the clusters that fell silent went offline, and how long after their last beat: the safety
    work on the control queue, which a rating backlog must not delay."""
    from django.utils import timezone

    from federation.models import Cluster, ClusterStatus

    # Judged once each silent cluster is offline or has had the target's time since its last beat (the stack
    # still runs): a short run (--quick) ends before a cluster silenced a third of the way in can be.
    deadline = time.monotonic() + SILENT_OFFLINE_TARGET_S + 15
    while True:
        rows = list(
            Cluster.objects.filter(cpi__in=soak.silent).values_list(
                "status", "last_heartbeat_at", "offline_at"
            )
        )
        now = timezone.now()
        waiting = any(
            status != ClusterStatus.OFFLINE
            and last is not None
            and (now - last).total_seconds() < SILENT_OFFLINE_TARGET_S + 5
            for status, last, _ in rows
        )
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(5)
    offline = sorted(
        (off - last).total_seconds()
        for status, last, off in rows
        if status == ClusterStatus.OFFLINE and last is not None and off is not None
    )
    if not rows:
        return
    if not offline:
        print(
            f"\nsilent clusters taken offline: 0 of {len(rows)}: MISS (target within {SILENT_OFFLINE_TARGET_S:.0f} s)"
        )
        return
    worst = offline[-1]
    verdict = "PASS" if len(offline) == len(rows) and worst <= SILENT_OFFLINE_TARGET_S else "MISS"
    print(
        f"\nsilent clusters taken offline: {len(offline)} of {len(rows)}, after their last beat "
        f"p50 {offline[len(offline) // 2]:.0f} s, max {worst:.0f} s: {verdict} "
        f"(target: all, within {SILENT_OFFLINE_TARGET_S:.0f} s)"
    )


def _check(soak: Soak) -> list[str]:
    """Records in = records rated, and the ledger reconciles."""
    from django.db import connection

    from metering.services.maintenance import ledger_reconcile

    problems = []
    created = soak.stats["usage"].units
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM metering_usagerecord")
        stored = cursor.fetchone()[0]
    text = scrape(soak.port)
    unrated = metric(text, "cardhour_usage_unrated_records")
    by_code = ", ".join(f"{code} {n:,}" for code, n in sorted(soak.refused.items())) or "none"
    print(
        f"\nusage records refused because the platform had ended or stopped their lease (failover, a stop "
        f"request, the lease's end): {sum(soak.refused.values()):,} ({by_code})"
    )
    print(
        f"usage records: {created:,} created by the agents, {stored:,} stored, {stored - unrated:,.0f} rated, "
        f"{unrated:,.0f} unrated after the drain"
    )
    if stored != created:
        problems.append(f"{created:,} usage records were created but {stored:,} are stored")
    if unrated != 0:
        problems.append(f"{unrated:,.0f} usage records were still unrated after the drain")
    report = ledger_reconcile()
    breaches = getattr(report, "breaches", [])
    print(f"ledger reconciliation: {'balanced, no breach' if not breaches else f'{len(breaches)} breaches'}")
    problems += [f"ledger breach: {breach}" for breach in breaches]
    return problems


def report(
    args: argparse.Namespace,
    soak: Soak,
    samples: Sequence[tuple[float, float, float, float, float, float]],
    cpu: dict[str, float],
    *,
    load_s: float,
    healthz: tuple[float, int],
    drained_at: float,
    cpu_marks: Sequence[dict[str, float]] = (),
) -> None:
    targets_rate = {
        "heartbeat": args.clusters / HEARTBEAT_SECONDS,
        "usage": args.leases / USAGE_EVERY_SECONDS,
        "quote": args.quote_rate,
    }
    rows = []
    for kind, stats in soak.stats.items():
        values = sorted(stats.latencies)
        sent = sorted(stats.answered)
        p99 = percentile(values, 99) if values else float("nan")
        target = TARGETS.get(kind)
        rate = stats.units / load_s
        rows.append(
            [
                kind,
                f"{len(values):,}",
                f"{stats.units:,}",
                f"{rate:,.1f}",
                f"{targets_rate[kind]:,.1f}",
                f"{percentile(values, 50) * 1000:.1f}" if values else "-",
                f"{p99 * 1000:.1f}" if values else "-",
                f"{percentile(sent, 50) * 1000:.1f} / {percentile(sent, 99) * 1000:.1f}" if sent else "-",
                f"{stats.late_s:.1f}",
                f"{len(stats.errors):,}",
                (
                    ("PASS" if p99 <= target and rate >= 0.95 * targets_rate[kind] else "MISS")
                    if target
                    else ("PASS" if rate >= 0.95 * targets_rate[kind] else "MISS")
                ),
            ]
        )
    print_table(
        f"Paths over {load_s:.0f} s (open loop; latency from when each request was due; 'from sending': "
        "from when it went out, without its client's own queue)",
        [
            "path",
            "requests",
            "units",
            "units/s",
            "design rate/s",
            "p50 ms",
            "p99 ms",
            "from sending p50 / p99 ms",
            "most late s",
            "errors",
            "verdict",
        ],
        rows,
    )
    quote_slices = _latency_slices(soak.stats["quote"], [row[0] for row in samples])
    quote_sent_slices = _latency_slices(soak.stats["quote"], [row[0] for row in samples], from_sending=True)
    beat_slices = _latency_slices(soak.stats["heartbeat"], [row[0] for row in samples])
    print_table(
        "Unrated backlog and latency over time (/metrics; each row's latencies are of the requests answered "
        "since the row before)",
        [
            "at s",
            "unrated records",
            "oldest s",
            "clusters offline",
            "overdue",
            "monitor holding",
            "quotes",
            "quote p50 / p99 ms",
            "from sending",
            "heartbeat p99 ms",
            "cores: web / PostgreSQL / PG background / Celery",
        ],
        [
            [
                f"{t:.0f}",
                f"{u:,.0f}",
                f"{o:.0f}",
                f"{c:.0f}",
                f"{d:.0f}",
                "yes" if h else "",
                f"{len(quotes):,}",
                f"{percentile(quotes, 50) * 1000:.0f} / {percentile(quotes, 99) * 1000:.0f}"
                if quotes
                else "-",
                f"{percentile(sent, 50) * 1000:.0f} / {percentile(sent, 99) * 1000:.0f}" if sent else "-",
                f"{percentile(beats, 99) * 1000:.0f}" if beats else "-",
                cores,
            ]
            for (t, u, o, c, d, h), quotes, sent, beats, cores in zip(
                samples,
                quote_slices,
                quote_sent_slices,
                beat_slices,
                _cores_by_slice(samples, cpu_marks),
                strict=True,
            )
        ],
    )
    requests = sum(len(s.latencies) for s in soak.stats.values())
    rated = soak.stats["usage"].units
    healthz_cpu, healthz_n = healthz
    print_table(
        "CPU by process group over the load",
        ["group", "CPU s", "share of 2 cores", "per operation"],
        [
            [
                name,
                f"{seconds:.1f}",
                f"{seconds / (load_s * (os.cpu_count() or 1)):.0%}",
                {
                    "web server": f"{seconds / max(requests, 1) * 1000:.2f} ms per request "
                    f"(/healthz alone: {healthz_cpu / max(healthz_n, 1) * 1000:.2f} ms)",
                    "Celery worker": f"{seconds / max(rated, 1) * 1e6:.0f} µs per record created",
                    "PostgreSQL": f"{seconds / max(requests, 1) * 1000:.2f} ms per request",
                }.get(name, ""),
            ]
            for name, seconds in cpu.items()
        ],
    )
    print(
        "\nbacklog drained "
        + (
            f"{drained_at - load_s:.0f} s after the load stopped"
            if drained_at == drained_at
            else "NOT within the drain"
        )
    )
    for line in capacity_lines(
        cpu,
        load_s=load_s,
        cores=os.cpu_count() or 1,
        quotes=soak.stats["quote"],
        clients=args.quote_clients,
        connections=args.quote_connections,
    ):
        print(line)


_GENERATORS = ("load generator", "quote clients")


def capacity_lines(
    cpu: dict[str, float],
    *,
    load_s: float,
    cores: int,
    quotes: PathStats,
    clients: int,
    connections: int = 1,
) -> list[str]:
    """What the quote verdict rests on, in two lines: how busy the machine was (the platform's process
    groups and the load generators apart), and how busy each quote client's connections were.

    A quote client sends its quotes at ``rate / clients`` a second with random gaps (a Poisson stream), each
    on a free one of its ``connections``. With one connection it is a single-server queue whose load is its
    rate times the mean answer from sending: its wait grows without bound as that nears 100 %, and its p99
    long before. With every answer as long as the mean (the best case), the p99 from when quotes were due is
    2.9 answers at 30 % busy, 4.4 at 50 %, 6.3 at 65 % and 11 at 80 % (a simulation of that queue, 400,000
    quotes each): 50/s and a p99 of 50 ms from due would need a mean answer of about 10 ms, a limit of the
    client, not of the server. With several connections a quote waits only when all of them are busy, so
    the times from due and from sending differ only when the server falls behind."""
    platform = {name: seconds for name, seconds in cpu.items() if name not in _GENERATORS}
    generators = sum(seconds for name, seconds in cpu.items() if name in _GENERATORS)
    busy = sum(platform.values()) / load_s
    parts = ", ".join(f"{name} {seconds / load_s:.2f}" for name, seconds in platform.items() if seconds)
    lines = [
        f"machine: {busy + generators / load_s:.2f} of {cores} cores busy over the load: the platform "
        f"{busy:.2f} ({parts}), the load generators {generators / load_s:.2f}"
    ]
    if quotes.answered and clients > 0:
        per_client = quotes.units / load_s / clients
        mean = sum(quotes.answered) / len(quotes.answered)
        waited = sum(
            1
            for took, answered in zip(quotes.latencies, quotes.answered, strict=True)
            if took - answered > 0.001
        )
        lines.append(
            f"quote clients: each sent {per_client:.1f} quotes/s ({1000 / per_client:.1f} ms apart on average) "
            f"on up to {connections} connection(s); mean answer from sending {mean * 1000:.1f} ms, so its "
            f"connections were busy {per_client * mean / connections:.0%} of the time; "
            f"{waited / len(quotes.answered):.1%} of the quotes were sent more than 1 ms after they were due"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--islands", type=int, default=100_000)
    parser.add_argument("--leases", type=int, default=100_000, help="running leases (at most one per island)")
    parser.add_argument("--operators", type=int, default=100)
    parser.add_argument("--buyers", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--quote-rate", type=float, default=200.0)
    parser.add_argument("--quote-clients", type=int, default=4)
    parser.add_argument(
        "--quote-connections",
        type=int,
        default=4,
        help="connections of each quote client: a quote goes out when due on a free one (open loop); 1 makes "
        "each client wait for an answer before it sends its next quote",
    )
    parser.add_argument(
        "--quote-clients-in-process",
        action="store_true",
        help="run the quote clients as threads of the load generator (sharing its interpreter lock with the "
        "usage and heartbeat agents), not as a process each",
    )
    parser.add_argument(
        "--heartbeat-threads",
        type=int,
        default=8,
        help="connections the clusters' beats share (10k agents never wait for each other; few connections "
        "make a slow server look like late agents)",
    )
    parser.add_argument(
        "--heartbeat-batch",
        type=int,
        default=1,
        help="beats per request: N > 1 sends each operator's clusters in batches of N (POST /api/v1/heartbeats), "
        "as an agent running many clusters does; 1 (default) is one request per cluster",
    )
    parser.add_argument("--silent", type=int, help="clusters that stop heartbeating (default 0.2 %%)")
    parser.add_argument(
        "--workers",
        type=int,
        default=PRODUCTION_WORKERS,
        help=f"web server processes (default {PRODUCTION_WORKERS}: the production default, one more than the cores)",
    )
    parser.add_argument(
        "--wsgi-threads",
        type=int,
        help="request threads per web worker (CARDHOUR_WSGI_THREADS; default: the production default)",
    )
    parser.add_argument(
        "--celery-concurrency", type=int, default=2, help="slots of the worker for rating and the long jobs"
    )
    parser.add_argument(
        "--control-concurrency", type=int, default=3, help="slots of the worker for the control queue"
    )
    parser.add_argument("--drain-seconds", type=float, default=180.0)
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--cache-url", default="redis://127.0.0.1:6379/6")
    parser.add_argument("--database-url", help="an empty PostgreSQL database to use (not dropped)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--seed", type=int, default=2026)
    add_server_env_argument(parser)
    parser.add_argument("--quick", action="store_true", help="500 clusters, 5k islands and leases, 2 minutes")
    args = parser.parse_args(argv)
    if args.quick:
        args.clusters, args.islands, args.leases, args.operators, args.minutes = 500, 5_000, 5_000, 10, 2.0
        args.quote_rate, args.jobs, args.buyers = 20.0, 50, 20
    if args.silent is None:
        args.silent = max(1, args.clusters // 500)
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
