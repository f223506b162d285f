"""Long-polling agents against the production server: do 400 waiting agents slow anything else down?

    python -m benchmarks.longpoll              # 400 agents, 20 s per phase
    python -m benchmarks.longpoll --quick      # 100 agents, 8 s per phase

On a throwaway PostgreSQL database, a market of ``--agents`` clusters (one lease agent each, as operators run
them) is written as benchmarks.broker writes its market. The production server (gunicorn with uvicorn
workers, config.asgi, production settings from the environment: benchmarks.prodserver) then serves two
phases of the same mixed closed-loop load — ``/healthz``, heartbeats (each cluster's operator token), and
quotes (``POST /api/v1/jobs/<id>/quotes``) — measured separately:

1. **baseline**: no long-polls;
2. **with long-polls**: once every agent's first poll has been handled (the server's CPU has gone quiet),
   every agent holds ``GET /api/v1/operator/leases?after=<cursor>&cluster=<cpi>&wait=30``
   open, re-polling at once when it answers, for the whole phase.

The two phases alternate ``--rounds`` times (baseline, long-polls, baseline, long-polls) and each one's
figures are pooled, so a burst from a neighbour on a shared machine falls on both sides more evenly. Before
them, **what one waiting poll costs**: the server's CPU per ``/healthz`` alone, then per long-poll answered
with every agent polling alone (``wait=2``, nothing new) — CPU time, which a noisy machine moves much less
than latency.

For each request kind: count, p50 / p99 wall latency, and the server's CPU per request (both phases' CPU
is the server's total over the phase divided by all requests answered, long-poll answers included); the
PostgreSQL connections the server held at the end of each phase; how many long-polls answered (a wait
that ran out or a change). Baseline: the same load in the same run without long-polls, and ``/healthz`` on
the same server. PASS when every kind's p99 with long-polls is within 1.5× its baseline p99 (or 10 ms of it,
whichever is larger) and no request failed; MISS otherwise. Exits non-zero only on errors.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from benchmarks._common import (
    BenchDatabase,
    CpuSampler,
    JsonClient,
    machine_description,
    percentile,
    print_table,
    process_cpu_seconds,
)
from benchmarks.broker import build_market, create_jobs
from benchmarks.prodserver import Server, free_port, production_env, production_server

BENCH_DATABASE = "cardhour_bench_longpoll"
APP_NAME = "cardhour-bench-longpoll"
KINDS = ("healthz", "heartbeat", "quote")


@dataclass
class Phase:
    name: str
    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    errors: list[str] = field(default_factory=list)
    server_cpu_s: float = 0.0
    postgres_cpu_s: float = 0.0
    long_polls_answered: int = 0
    connections: int = 0
    wall_s: float = 0.0

    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values())

    def answer(self, kind: str, *, code: int, raw: bytes, took: float) -> None:
        with self.lock:
            if code in (200, 201):
                self.latencies[kind].append(took)
            else:
                self.errors.append(f"{kind}: HTTP {code} {raw[:200]!r}")


def _request(
    conn: http.client.HTTPConnection,
    kind: str,
    rng: random.Random,
    *,
    heartbeat: list[tuple[str, str, str]],
    quotes: list[tuple[int, str]],
) -> tuple[int, bytes]:
    """One request of ``kind`` on ``conn``: its status (0 when the connection failed) and body."""
    headers = {"Host": "127.0.0.1"}
    body = None
    if kind == "healthz":
        method, path = "GET", "/healthz"
    elif kind == "heartbeat":
        cpi, island, token = heartbeat[rng.randrange(len(heartbeat))]
        method, path = "POST", f"/api/v1/clusters/{cpi}/heartbeats"
        headers |= {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        body = json.dumps(
            {
                "sent_at": datetime.now(UTC).isoformat(),
                "health": "ok",
                "islands": [{"name": island, "available_cards": 1, "unhealthy_cards": 0}],
            }
        ).encode()
    else:
        job_id, token = quotes[rng.randrange(len(quotes))]
        method, path = "POST", f"/api/v1/jobs/{job_id}/quotes"
        headers |= {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        body = json.dumps({"limit": 10}).encode()
    for attempt in (1, 2):
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected) as exc:
            # The server closed a keep-alive connection that sat idle past its timeout (an open-loop
            # sender may wait seconds between requests): reconnect once, as HTTP clients do.
            conn.close()
            if attempt == 2:
                return 0, repr(exc).encode()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            return 0, repr(exc).encode()
    raise AssertionError("unreachable")


def mixed_load(
    server: Server,
    *,
    seconds: float,
    clients: int,
    heartbeat: list[tuple[str, str, str]],
    quotes: list[tuple[int, str]],
    phase: Phase,
) -> None:
    """``clients`` closed-loop threads, each cycling healthz → heartbeat → quote until ``seconds`` pass: the
    server's capacity (it keeps both cores busy, so latency here is mostly queueing)."""
    stop_at = time.monotonic() + seconds

    def client(n: int) -> None:
        rng = random.Random(n)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        i = n
        try:
            while time.monotonic() < stop_at:
                kind = KINDS[i % len(KINDS)]
                i += 1
                began = time.perf_counter()
                code, raw = _request(conn, kind, rng, heartbeat=heartbeat, quotes=quotes)
                phase.answer(kind, code=code, raw=raw, took=time.perf_counter() - began)
        finally:
            conn.close()

    _run_threads(client, clients)


def open_loop_load(
    server: Server,
    *,
    seconds: float,
    rate: float,
    senders: int,
    heartbeat: list[tuple[str, str, str]],
    quotes: list[tuple[int, str]],
    phase: Phase,
    seed: int,
) -> None:
    """Requests arriving at ``rate`` per second (Poisson; healthz, heartbeat and quote equally likely)
    whatever the server's answers take: ``senders`` threads, each a Poisson stream of ``rate / senders``.

    Latency runs from when a request was *due*, not from when its thread got round to sending it, so a
    server that falls behind is charged for the queue it builds (no coordinated omission)."""
    stop_at = time.monotonic() + seconds
    per_sender = rate / senders

    def sender(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        due = time.perf_counter() + rng.expovariate(per_sender)
        try:
            while time.monotonic() < stop_at:
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                kind = KINDS[rng.randrange(len(KINDS))]
                code, raw = _request(conn, kind, rng, heartbeat=heartbeat, quotes=quotes)
                phase.answer(kind, code=code, raw=raw, took=time.perf_counter() - due)
                due += rng.expovariate(per_sender)
        finally:
            conn.close()

    _run_threads(sender, senders)


def _run_threads(target: Callable[[int], None], n: int) -> None:
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class Agents:
    """``len(agents)`` lease agents, each holding a long-poll on its own cluster's feed, re-polling at once."""

    def __init__(
        self, server: Server, agents: list[tuple[str, str]], cursor_of: dict[str, int], *, wait: int = 30
    ) -> None:
        self.server = server
        self.wait = wait
        self.agents = agents
        self.cursor_of = cursor_of
        self.stop = threading.Event()
        self.answered = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(cpi, token), daemon=True, name=f"agent-{n}")
            for n, (cpi, token) in enumerate(agents)
        ]

    def _run(self, cpi: str, token: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=60)
        after = self.cursor_of[token]
        headers = {"Host": "127.0.0.1", "Authorization": f"Bearer {token}"}
        try:
            while not self.stop.is_set():
                try:
                    conn.request(
                        "GET",
                        f"/api/v1/operator/leases?after={after}&cluster={cpi}&wait={self.wait}",
                        headers=headers,
                    )
                    response = conn.getresponse()
                    raw = response.read()
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    with self.lock:
                        self.errors.append(f"long-poll: {exc!r}")
                    time.sleep(0.5)
                    continue
                if response.status != 200:
                    with self.lock:
                        self.errors.append(f"long-poll: HTTP {response.status} {raw[:200]!r}")
                    time.sleep(0.5)
                    continue
                after = json.loads(raw)["cursor"]
                with self.lock:
                    self.answered += 1
        finally:
            conn.close()

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(40)


@dataclass
class PollCost:
    healthz_requests: int = 0
    healthz_server_cpu_s: float = 0.0
    polls: int = 0
    polls_server_cpu_s: float = 0.0
    polls_postgres_cpu_s: float = 0.0
    wait_s: int = 0


def measure_poll_cost(
    server: Server,
    *,
    pids: Sequence[int],
    database: str,
    agents: list[tuple[str, str]],
    cursor_of: dict[str, int],
    seconds: float,
    wait_s: int = 2,
) -> PollCost:
    """CPU per request of ``/healthz`` alone, then of waiting polls alone: every agent long-polls with a
    short ``wait_s`` (so the phase sees many complete waits) and nothing else runs. CPU time, not wall
    time: the figure a noisy machine does not move much."""
    cost = PollCost(wait_s=wait_s)
    stop_at = time.monotonic() + min(seconds, 5.0)
    with CpuSampler(server_pids=pids, database=database) as cpu:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        while time.monotonic() < stop_at:
            conn.request("GET", "/healthz", headers={"Host": "127.0.0.1"})
            conn.getresponse().read()
            cost.healthz_requests += 1
        conn.close()
    cost.healthz_server_cpu_s = cpu.seconds("server")
    group = Agents(server, agents, cursor_of, wait=wait_s)
    group.start()
    time.sleep(wait_s + 1.0)  # past the burst of first polls: measure polls that wait and re-poll
    with CpuSampler(server_pids=pids, database=database) as cpu:
        before = group.answered
        time.sleep(seconds)
        cost.polls = group.answered - before
    group.finish()
    cost.polls_server_cpu_s = cpu.seconds("server")
    cost.polls_postgres_cpu_s = cpu.seconds("postgres")
    return cost


def server_connections(database_url: str) -> int:
    import psycopg

    with psycopg.connect(database_url.split("?")[0].replace("postgres://", "postgresql://", 1)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]
        ).fetchone()
        return int(row[0]) if row else 0


def report_cost(cost: PollCost) -> None:
    healthz_ms = cost.healthz_server_cpu_s / max(cost.healthz_requests, 1) * 1000
    poll_ms = cost.polls_server_cpu_s / max(cost.polls, 1) * 1000
    print_table(
        f"What one waiting poll costs (polls alone, wait={cost.wait_s} s; CPU per request)",
        ["request", "answered", "server CPU ms", "PostgreSQL CPU ms", "× /healthz"],
        [
            ["/healthz alone", f"{cost.healthz_requests:,}", f"{healthz_ms:.2f}", "-", "1.0"],
            [
                "long-poll, nothing new",
                f"{cost.polls:,}",
                f"{poll_ms:.2f}",
                f"{cost.polls_postgres_cpu_s / max(cost.polls, 1) * 1000:.2f}",
                f"{poll_ms / healthz_ms:.1f}" if healthz_ms else "-",
            ],
        ],
        left_columns=1,
    )


def _cost_table(title: str, phases: Sequence[Phase]) -> None:
    print_table(
        title,
        [
            "phase",
            "requests",
            "wall s",
            "server CPU ms/request",
            "PostgreSQL CPU ms/request",
            "server DB conns",
            "long-polls answered",
        ],
        [
            [
                p.name,
                f"{p.requests():,}",
                f"{p.wall_s:.1f}",
                f"{p.server_cpu_s / max(p.requests() + p.long_polls_answered, 1) * 1000:.2f}",
                f"{p.postgres_cpu_s / max(p.requests() + p.long_polls_answered, 1) * 1000:.2f}",
                str(p.connections),
                f"{p.long_polls_answered:,}",
            ]
            for p in phases
        ],
    )


def report_capacity(phases: Sequence[Phase], agents: int) -> None:
    """The closed loop's figures: throughput, and latency at saturation (informational: with both cores
    busy, latency is the queue, and any added work lengthens it)."""
    rows = []
    for phase in phases:
        row = [phase.name, f"{phase.requests():,}", f"{phase.requests() / max(phase.wall_s, 1e-9):.1f}"]
        for kind in KINDS:
            values = sorted(phase.latencies[kind])
            row.append(
                f"{percentile(values, 50) * 1000:.1f} / {percentile(values, 99) * 1000:.1f}"
                if values
                else "-"
            )
        rows.append(row)
    print_table(
        "Capacity (closed loop, both cores busy; latency here is mostly the queue)",
        ["phase", "requests", "requests/s", *(f"{kind} p50 / p99 ms" for kind in KINDS)],
        rows,
    )
    _cost_table("Capacity phases: cost per request (CPU over the phase / requests answered)", phases)
    base, loaded = phases
    if base.requests() and base.wall_s and loaded.wall_s:
        kept = (loaded.requests() / loaded.wall_s) / (base.requests() / base.wall_s)
        print(f"\nthroughput with {agents} long-polls waiting: {kept:.0%} of the baseline's")


def report(phases: Sequence[Phase], agents: int, *, title: str) -> list[str]:
    """The open loop's latencies by kind, and the verdicts: PASS when each kind's p99 with long-polls is
    within 1.5× its baseline p99 (or 10 ms of it, whichever is larger)."""
    base, loaded = phases
    rows = []
    verdicts = []
    for kind in KINDS:
        for phase in phases:
            values = sorted(phase.latencies[kind])
            rows.append(
                [
                    kind,
                    phase.name,
                    f"{len(values):,}",
                    f"{percentile(values, 50) * 1000:.1f}" if values else "-",
                    f"{percentile(values, 99) * 1000:.1f}" if values else "-",
                ]
            )
        b = sorted(base.latencies[kind])
        w = sorted(loaded.latencies[kind])
        if b and w:
            p99_b, p99_w = percentile(b, 99), percentile(w, 99)
            limit = max(1.5 * p99_b, p99_b + 0.010)
            verdicts.append(
                f"{kind}: p99 {p99_w * 1000:.1f} ms with {agents} long-polls vs {p99_b * 1000:.1f} ms without "
                f"(limit {limit * 1000:.1f} ms): {'PASS' if p99_w <= limit else 'MISS'}"
            )
    print_table(title, ["request", "phase", "answered", "p50 ms", "p99 ms"], rows, left_columns=2)
    _cost_table("Latency phases: cost per request (CPU over the phase / requests answered)", phases)
    print()
    for line in verdicts:
        print(line)
    return verdicts


def run(args: argparse.Namespace, database: BenchDatabase) -> int:
    from benchmarks._common import django_setup

    print(machine_description())
    django_setup(database_url=database.url, conn_max_age=0)
    market_args = argparse.Namespace(
        clusters=args.agents,
        islands=args.agents * 4,
        leases=args.agents,
        operators=max(args.agents // 20, 1),
        buyers=5,
        seed=args.seed,
    )
    market = build_market(market_args, database.url)
    operator_token = {slug: market.operator_tokens[slug] for slug in market.operator_tokens}
    agents = [(plan.cpi, operator_token[plan.operator]) for plan in market.fleet]
    heartbeat = [(plan.cpi, plan.islands[0][0], operator_token[plan.operator]) for plan in market.fleet]

    url = f"{database.url}?application_name={APP_NAME}"
    env = production_env(
        database_url=url,
        port=free_port(),
        extra={
            "WEB_CONCURRENCY": str(args.workers),
            "CACHE_URL": args.cache_url,
            "API_THROTTLE_CREDENTIAL": "1000000/min",
            "API_THROTTLE_HEARTBEAT": "1000000/min",
        },
    )
    errors: list[str] = []
    with production_server(env) as server:
        pids = _server_pids(server)
        client = JsonClient(host="127.0.0.1", ports=[server.port])
        job_ids = create_jobs(
            client, token=market.quote_buyer_token, n=args.jobs, duration_hours=8, seed=args.seed
        )
        quotes = [(job_id, market.quote_buyer_token) for job_id in job_ids]
        cursor_of: dict[str, int] = {}
        for token in set(operator_token.values()):
            _, answer = client.call("GET", "/api/v1/operator/leases?page_size=1", token=token, label="feed")
            cursor_of[token] = answer["cursor"]
        # Warm every worker (catalogue, hold book) before measuring.
        mixed_load(
            server,
            seconds=3,
            clients=args.clients,
            heartbeat=heartbeat,
            quotes=quotes,
            phase=Phase("warm-up"),
        )

        cost = measure_poll_cost(
            server,
            pids=pids,
            database=database.url.rsplit("/", 1)[1],
            agents=agents,
            cursor_of=cursor_of,
            seconds=args.cost_seconds,
        )
        database_name = database.url.rsplit("/", 1)[1]

        def alternate(load: Callable[[Phase], None]) -> list[Phase]:
            """Baseline and long-poll phases of ``load``, alternating ``--rounds`` times; each kind's
            figures are pooled over its rounds, so a neighbour's burst on a shared machine lands on both
            sides more evenly."""
            phases = {name: Phase(name) for name in ("baseline", f"{args.agents} long-polls")}
            for _ in range(args.rounds):
                for name, with_agents in (("baseline", False), (f"{args.agents} long-polls", True)):
                    phase = phases[name]
                    group = Agents(server, agents, cursor_of) if with_agents else None
                    answered_before = 0
                    if group is not None:
                        group.start()
                        # Measure only once every agent is waiting: 400 first polls arrive at once, and
                        # their burst of work must not be billed to the phase's other requests.
                        settled_s = _wait_until_server_quiet(pids)
                        answered_before = group.answered
                        print(
                            f"{args.agents} agents waiting; the server settled {settled_s:.1f} s after they "
                            "connected"
                        )
                    with CpuSampler(server_pids=pids, database=database_name) as cpu:
                        began = time.monotonic()
                        load(phase)
                        phase.wall_s += time.monotonic() - began
                    phase.connections = max(phase.connections, server_connections(database.url))
                    if group is not None:
                        phase.long_polls_answered += group.answered - answered_before
                        group.finish()
                        errors.extend(group.errors[:20])
                    phase.server_cpu_s += cpu.seconds("server")
                    phase.postgres_cpu_s += cpu.seconds("postgres")
            for phase in phases.values():
                errors.extend(phase.errors[:20])
            return list(phases.values())

        # 1. Capacity: closed-loop clients keep both cores busy; what long-polls take from throughput.
        capacity = alternate(
            lambda phase: mixed_load(
                server,
                seconds=args.seconds,
                clients=args.clients,
                heartbeat=heartbeat,
                quotes=quotes,
                phase=phase,
            )
        )
        # 2. Latency at a normal load: requests arrive at a fixed rate, a share of the capacity measured
        # without long-polls, with and without the agents waiting.
        base_capacity = capacity[0].requests() / max(capacity[0].wall_s, 1e-9)
        rate = args.rate or args.load * base_capacity
        print(
            f"\nopen loop: {rate:.1f} requests/s ({args.load:.0%} of the {base_capacity:.1f}/s the closed loop "
            "reached without long-polls)"
            if not args.rate
            else f"\nopen loop: {rate:.1f} requests/s (--rate)"
        )
        latency = alternate(
            lambda phase: open_loop_load(
                server,
                seconds=args.seconds,
                rate=rate,
                senders=args.senders,
                heartbeat=heartbeat,
                quotes=quotes,
                phase=phase,
                seed=args.seed,
            )
        )
        print()
        report_cost(cost)
        report_capacity(capacity, args.agents)
        report(
            latency, args.agents, title=f"Latency at {rate:.1f} requests/s (wall, open loop, from when due)"
        )
    for error in errors:
        print("ERROR", error, file=sys.stderr)
    return 1 if errors else 0


def _wait_until_server_quiet(
    pids: Sequence[int], *, interval_s: float = 0.5, quiet_cpu_s: float = 0.05, timeout_s: float = 60.0
) -> float:
    """Block until the server processes spend under ``quiet_cpu_s`` of CPU in one ``interval_s`` (every
    agent's first poll handled and waiting); return how long that took."""
    began = time.monotonic()

    def total() -> float:
        return sum(process_cpu_seconds(pid) or 0.0 for pid in pids)

    last = total()
    while time.monotonic() - began < timeout_s:
        time.sleep(interval_s)
        now = total()
        if now - last < quiet_cpu_s:
            break
        last = now
    return time.monotonic() - began


def _server_pids(server: Server) -> list[int]:
    import subprocess

    children = subprocess.run(
        ["pgrep", "-P", str(server.process.pid)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return [server.process.pid, *(int(pid) for pid in children)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.longpoll", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--agents", type=int, default=400, help="long-polling lease agents (one per cluster)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients of the mixed load")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of baseline and long-poll phases")
    parser.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="open-loop rate as a share of the closed loop's baseline throughput",
    )
    parser.add_argument("--rate", type=float, help="open-loop requests/s (instead of --load)")
    parser.add_argument("--senders", type=int, default=16, help="open-loop sender threads")
    parser.add_argument("--cost-seconds", type=float, default=10.0, help="length of the poll-cost phase")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2, help="server processes (WEB_CONCURRENCY)")
    parser.add_argument("--cache-url", default="redis://127.0.0.1:6379/10")
    parser.add_argument("--database-url", help="an empty PostgreSQL database to use (not dropped)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--quick", action="store_true", help="100 agents, 8 s per phase")
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.seconds, args.rounds, args.cost_seconds = 100, 8.0, 1, 5.0
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
