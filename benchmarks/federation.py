"""Federation at design size: register clusters with their islands through the REST API, then resolve
compute identifiers, on PostgreSQL.

    python -m benchmarks.federation                      # 10,000 clusters × 10 islands, 10,000 resolves
    python -m benchmarks.federation --clusters 500       # a quick check

What it does, in order:

1. Creates a throwaway database (``cardhour_bench``; or uses ``--database-url``), migrates it with
   Django's ``migrate``, creates ``--operators`` operator organisations with one API token each.
2. Baseline: the same clusters, islands, issued identifiers and status-history rows written with raw
   PostgreSQL COPY (psycopg 3) into the same tables, timed, then truncated.
3. Registration: every cluster is POSTed to /api/v1/clusters over real HTTP against the production server
   (benchmarks.prodserver: gunicorn with uvicorn workers, production settings), from a small pool of
   closed-loop clients.
4. VACUUM ANALYZE (what autovacuum would do shortly after such a load).
5. Resolution: ``--resolves`` GET /api/v1/resolve/<identifier> over a fixed-seed mix of levels, repeated
   ``--rounds`` times over HTTP, then the same identifiers through federation.selectors.resolve in this
   process (no HTTP, no DRF), and the SQL queries per request at each level.

6. Baseline on the same server in the same run: ``GET /healthz`` (no authentication, no SQL) with the same
   clients, wall latency and the server's CPU per request; and, in this process, the CPU that token
   authentication and the throttle take in each resolve (the share of a resolve that is not resolution).

Prints the figures and PASS/MISS against the targets (resolution p99 ≤ 20 ms over HTTP; registration ≥ 200
clusters/s with 10 islands each). Exits non-zero only on errors (a request that failed or answered
something unexpected, rows missing), never on a missed target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from benchmarks._common import (
    DEFAULT_SERVER_URL,
    SUMMARY_MS_HEADERS,
    BenchDatabase,
    CpuSampler,
    HttpRequest,
    Summary,
    Timer,
    django_setup,
    machine_description,
    ms,
    peak_rss_mb,
    print_table,
    run_closed_loop,
    run_on_database,
    spread,
    windowed_rates,
)
from benchmarks.prodserver import ProductionServers

RESOLUTION_P99_TARGET_S = 0.020
REGISTRATION_TARGET_PER_S = 200

# Hubs of federation.identifiers.HUB_CODES (repeated so the module imports before Django is set up).
HUBS = ("jjj", "yrd", "gba", "cy", "nmg", "gz", "gs", "nx", "ext")
# A mix of NVIDIA and domestic chips from the seeded catalog, each with the fabrics it is built with.
ACCELERATORS = (
    ("nvidia-a800-sxm4-80gb", ("nvlink", "infiniband")),
    ("nvidia-h800-sxm5-80gb", ("nvlink", "infiniband")),
    ("nvidia-h20", ("nvlink", "roce")),
    ("nvidia-l40s", ("pcie", "roce")),
    ("huawei-ascend-910b2", ("hccs", "roce")),
    ("huawei-ascend-910c", ("hccs",)),
    ("cambricon-mlu370-x8", ("pcie",)),
    ("hygon-dcu-k100", ("pcie", "roce")),
)
ISLAND_CARDS = (8, 8, 16, 32, 64)
# Share of each resolution level in the identifier mix.
LEVEL_MIX = (("cluster", 0.80), ("island", 0.15), ("hub", 0.04), ("operator", 0.01))
LEVELS = [level for level, _ in LEVEL_MIX]
# Each round of resolution is also summarised in this many successive slices, to show noise.
SLICES = 5
FEDERATION_TABLES = (
    "federation_clusterstatuschange",
    "federation_island",
    "federation_cluster",
    "federation_issuedidentifier",
)


@dataclass(frozen=True)
class ClusterPlan:
    operator: str
    cpi: str
    name: str
    hub: str
    site: str
    accelerator: str
    endpoint_url: str
    islands: tuple[tuple[str, int, str], ...]

    def body(self) -> bytes:
        return json.dumps(
            {
                "cpi": self.cpi,
                "site": self.site,
                "accelerator": self.accelerator,
                "endpoint_url": self.endpoint_url,
                "islands": [{"name": n, "cards": c, "fabric": f} for n, c, f in self.islands],
            }
        ).encode()


def build_fleet(
    *, clusters: int, islands_per_cluster: int, operators: Sequence[str], seed: int, endpoint_ip: str = ""
) -> list[ClusterPlan]:
    """Clusters spread evenly over operators and hubs, chips and island sizes drawn with a fixed seed.
    Endpoints name ``agent.<operator>.example.com``, or the IP literal ``endpoint_ip`` when given."""
    rng = random.Random(seed)
    fleet = []
    for i in range(clusters):
        operator = operators[i % len(operators)]
        hub = HUBS[(i // len(operators)) % len(HUBS)]
        accelerator, fabrics = rng.choice(ACCELERATORS)
        name = f"c{i:05d}"
        fleet.append(
            ClusterPlan(
                operator=operator,
                cpi=f"cpi:{operator}:{hub}:{name}",
                name=name,
                hub=hub,
                site=f"{hub}-dc{rng.randrange(1, 4)}",
                accelerator=accelerator,
                endpoint_url=f"https://{endpoint_ip or f'agent.{operator}.example.com'}/{name}",
                islands=tuple(
                    (f"isl-{j:02d}", rng.choice(ISLAND_CARDS), rng.choice(fabrics))
                    for j in range(islands_per_cluster)
                ),
            )
        )
    return fleet


@dataclass(frozen=True)
class Lookup:
    level: str
    identifier: str
    viewer: int  # index of the operator whose token asks


def build_lookups(
    *, fleet: Sequence[ClusterPlan], operators: Sequence[str], n: int, seed: int
) -> list[Lookup]:
    rng = random.Random(seed)
    lookups = []
    for _ in range(n):
        draw = rng.random()
        plan = rng.choice(fleet)
        cumulative = 0.0
        level = LEVELS[-1]
        for candidate, share in LEVEL_MIX:
            cumulative += share
            if draw < cumulative:
                level = candidate
                break
        identifier = {
            "cluster": plan.cpi,
            "island": f"{plan.cpi}:{rng.choice(plan.islands)[0]}",
            "hub": f"cpi:{plan.operator}:{plan.hub}",
            "operator": f"cpi:{plan.operator}",
        }[level]
        lookups.append(Lookup(level=level, identifier=identifier, viewer=rng.randrange(len(operators))))
    return lookups


# --- Phases ---------------------------------------------------------------------------------------------


@dataclass
class CopyResult:
    rows: dict[str, int]
    seconds: float

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def copy_baseline(*, database_url: str, fleet: Sequence[ClusterPlan]) -> CopyResult:
    """Write the fleet with COPY into the federation tables (one transaction), count, then truncate.

    Row building in Python is inside the timing, as parsing the requests is inside the API's.
    """
    import psycopg

    from core.models import Organisation
    from federation.models import Accelerator, Hub

    operator_ids = dict(Organisation.objects.filter(is_operator=True).values_list("slug", "pk"))
    hub_ids = dict(Hub.objects.values_list("code", "pk"))
    accelerator_ids = dict(Accelerator.objects.values_list("slug", "pk"))
    truncate = f"TRUNCATE {', '.join(FEDERATION_TABLES)} RESTART IDENTITY CASCADE"  # tables of other apps that point here are empty
    now = datetime.now(UTC)
    with psycopg.connect(database_url) as conn:
        conn.execute(truncate)
        conn.commit()
        with Timer() as timer, conn.transaction(), conn.cursor() as cur:
            with cur.copy(
                "COPY federation_issuedidentifier (cpi, kind, operator_id, issued_at) FROM STDIN"
            ) as copy:
                for plan in fleet:
                    operator_id = operator_ids[plan.operator]
                    copy.write_row((plan.cpi, "cluster", operator_id, now))
                    for island, _, _ in plan.islands:
                        copy.write_row((f"{plan.cpi}:{island}", "island", operator_id, now))
            with cur.copy(
                "COPY federation_cluster (id, operator_id, cpi, name, hub_id, site, accelerator_id, "
                "endpoint_url, status, status_before_offline, offline_cause, health, total_cards, "
                "available_cards, registered_at, updated_at) FROM STDIN"
            ) as copy:
                for pk, plan in enumerate(fleet, start=1):
                    cards = sum(c for _, c, _ in plan.islands)
                    copy.write_row(
                        (
                            pk,
                            operator_ids[plan.operator],
                            plan.cpi,
                            plan.name,
                            hub_ids[plan.hub],
                            plan.site,
                            accelerator_ids[plan.accelerator],
                            plan.endpoint_url,
                            "active",
                            "",
                            "",
                            "unknown",
                            cards,
                            cards,
                            now,
                            now,
                        )
                    )
            with cur.copy(
                "COPY federation_island (cluster_id, cpi, name, cards, fabric, available_cards, "
                "unhealthy_cards, created_at) FROM STDIN"
            ) as copy:
                for pk, plan in enumerate(fleet, start=1):
                    for island, cards, fabric in plan.islands:
                        copy.write_row((pk, f"{plan.cpi}:{island}", island, cards, fabric, cards, 0, now))
            with cur.copy(
                "COPY federation_clusterstatuschange (cluster_id, from_status, to_status, changed_at, "
                "actor_label, reason) FROM STDIN"
            ) as copy:
                for pk in range(1, len(fleet) + 1):
                    copy.write_row((pk, "", "active", now, "benchmark COPY", "registered"))
        rows = {}
        for table in FEDERATION_TABLES:
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            rows[table] = int(row[0]) if row else 0
        conn.execute(truncate)
        conn.execute("SELECT setval(pg_get_serial_sequence('federation_cluster', 'id'), 1, false)")
        conn.commit()
    return CopyResult(rows=rows, seconds=timer.seconds)


def table_counts(database_url: str) -> dict[str, int]:
    import psycopg

    counts = {}
    with psycopg.connect(database_url) as conn:
        for table in FEDERATION_TABLES:
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            counts[table] = int(row[0]) if row else 0
    return counts


def table_sizes_mb(database_url: str) -> dict[str, float]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return {
            table: int(conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0]) / 2**20  # type: ignore[index]
            for table in FEDERATION_TABLES
        }


def vacuum_analyze(database_url: str) -> float:
    import psycopg

    with Timer() as timer, psycopg.connect(database_url, autocommit=True) as conn:
        for table in FEDERATION_TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
    return timer.seconds


def resolve_direct(*, lookups: Sequence[Lookup], viewers: Sequence[object], page_size: int) -> list[float]:
    """federation.selectors.resolve in this process, evaluating what the view evaluates (for prefixes:
    the count and the first page). Latencies in seconds, in ``lookups`` order."""
    from federation import selectors

    latencies = []
    for lookup in lookups:
        t0 = time.perf_counter()
        resolution = selectors.resolve(identifier=lookup.identifier, viewer=viewers[lookup.viewer])  # type: ignore[arg-type]
        if resolution.clusters is not None:
            resolution.clusters.count()
            list(resolution.clusters[:page_size])
        latencies.append(time.perf_counter() - t0)
    return latencies


def _data_queries(captured: Sequence[dict[str, str]]) -> int:
    return sum(1 for q in captured if "SAVEPOINT" not in q["sql"].upper())


def count_queries(
    *,
    lookups: Sequence[Lookup],
    viewers: Sequence[object],
    tokens: Sequence[str],
    page_size: int,
    per_level: int = 20,
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]], int, list[str]]:
    """SQL queries per resolution, by level: (min, max) over ``per_level`` identifiers, for the selector
    alone and for the whole API request in-process; and for one registration (rolled back)."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    from federation import selectors

    errors: list[str] = []
    by_level: dict[str, list[Lookup]] = defaultdict(list)
    for lookup in lookups:
        if len(by_level[lookup.level]) < per_level:
            by_level[lookup.level].append(lookup)
    clients = []
    for token in tokens:
        client = APIClient(HTTP_HOST="127.0.0.1")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        clients.append(client)
    selector_counts: dict[str, tuple[int, int]] = {}
    view_counts: dict[str, tuple[int, int]] = {}
    for level, sample in by_level.items():
        direct, full = [], []
        for lookup in sample:
            with CaptureQueriesContext(connection) as ctx:
                resolution = selectors.resolve(identifier=lookup.identifier, viewer=viewers[lookup.viewer])  # type: ignore[arg-type]
                if resolution.clusters is not None:
                    resolution.clusters.count()
                    list(resolution.clusters[:page_size])
            direct.append(_data_queries(ctx.captured_queries))
            with CaptureQueriesContext(connection) as ctx:
                response = clients[lookup.viewer].get(f"/api/v1/resolve/{lookup.identifier}")
            if response.status_code != 200:
                errors.append(f"in-process resolve {lookup.identifier}: HTTP {response.status_code}")
            full.append(_data_queries(ctx.captured_queries))
        selector_counts[level] = (min(direct), max(direct))
        view_counts[level] = (min(full), max(full))

    probe = {
        "cpi": "cpi:op00:nx:query-probe",
        "site": "probe",
        "accelerator": ACCELERATORS[0][0],
        "endpoint_url": "https://agent.example.com/probe",
        "islands": [{"name": f"isl-{j:02d}", "cards": 8, "fabric": "nvlink"} for j in range(10)],
    }
    with transaction.atomic():
        with CaptureQueriesContext(connection) as ctx:
            response = clients[0].post("/api/v1/clusters", probe, format="json")
        transaction.set_rollback(True)
    if response.status_code != 201:
        errors.append(
            f"in-process registration probe: HTTP {response.status_code} {response.content[:300]!r}"
        )
    return selector_counts, view_counts, _data_queries(ctx.captured_queries), errors


@dataclass
class AuthShare:
    """CPU seconds (this thread) over ``requests`` in-process resolves: whole request, token
    authentication (DRF's perform_authentication, which reads the token), throttles."""

    requests: int
    request_s: float
    authentication_s: float
    throttle_s: float


def auth_throttle_share(*, lookups: Sequence[Lookup], tokens: Sequence[str]) -> AuthShare:
    """Resolve ``lookups`` through the Django test client in this process, timing (thread CPU) what token
    authentication and the throttle take inside each request. Nothing is patched in the server."""
    from rest_framework.test import APIClient
    from rest_framework.views import APIView

    clients = []
    for token in tokens:
        client = APIClient(HTTP_HOST="127.0.0.1")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        clients.append(client)
    spent = {"authentication": 0.0, "throttle": 0.0}
    original = {"authentication": APIView.perform_authentication, "throttle": APIView.check_throttles}

    def timed(name: str) -> Callable[[APIView, object], None]:
        def wrapper(view: APIView, request: object) -> None:
            t0 = time.thread_time()
            try:
                original[name](view, request)  # type: ignore[arg-type]
            finally:
                spent[name] += time.thread_time() - t0

        return wrapper

    APIView.perform_authentication = timed("authentication")  # type: ignore[method-assign,assignment]
    APIView.check_throttles = timed("throttle")  # type: ignore[method-assign,assignment]
    try:
        total = 0.0
        for lookup in lookups:
            t0 = time.thread_time()
            response = clients[lookup.viewer].get(f"/api/v1/resolve/{lookup.identifier}")
            total += time.thread_time() - t0
            if response.status_code != 200:
                raise RuntimeError(f"in-process resolve {lookup.identifier}: HTTP {response.status_code}")
    finally:
        APIView.perform_authentication = original["authentication"]  # type: ignore[method-assign]
        APIView.check_throttles = original["throttle"]  # type: ignore[method-assign]
    return AuthShare(
        requests=len(lookups),
        request_s=total,
        authentication_s=spent["authentication"],
        throttle_s=spent["throttle"],
    )


# --- Main ---------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.federation", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--islands-per-cluster", type=int, default=10)
    parser.add_argument("--resolves", type=int, default=10_000, help="identifiers resolved per round")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of resolution (same identifiers)")
    parser.add_argument("--operators", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="web server processes")
    parser.add_argument("--concurrency", type=int, default=4, help="registration clients (closed loop)")
    parser.add_argument(
        "--resolve-concurrency", type=int, default=1, help="resolution clients; 1 measures latency unloaded"
    )
    parser.add_argument("--warmup", type=int, default=500, help="resolves before measuring, not counted")
    parser.add_argument(
        "--healthz", type=int, default=3_000, help="GET /healthz requests of the same-server baseline"
    )
    parser.add_argument(
        "--conn-max-age", type=int, default=60, help="DATABASE_CONN_MAX_AGE of the servers (production: 60)"
    )
    parser.add_argument(
        "--database-url",
        help=f"an empty PostgreSQL database to use as it is (default: create {DEFAULT_SERVER_URL.rsplit('/', 1)[0]}/cardhour_bench, drop it after)",
    )
    parser.add_argument("--keep", action="store_true", help="do not drop the database created for the run")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--endpoint-ip",
        default="",
        help="endpoint URLs name this public IP literal instead of agent.<operator>.example.com, which "
        "registration resolves in DNS (core.net.endpoint_url_check): on a machine whose resolver takes "
        "0.3-5 s to answer that a name is unknown, that wait, not the platform, paces registration",
    )
    args = parser.parse_args(argv)
    if args.clusters < 1 or args.islands_per_cluster < 1 or args.operators < 1 or args.workers < 1:
        parser.error("sizes must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # WhiteNoise warns once per process that collectstatic has not run; static files are not benchmarked.
    warnings.filterwarnings("ignore", message="No directory at")
    print("Cardhour federation benchmark")
    print(
        f"command: python -m benchmarks.federation {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip()
    )
    print(f"machine: {machine_description()}")

    database = BenchDatabase.existing(args.database_url) if args.database_url else BenchDatabase.create()
    return run_on_database(database, lambda db: run(args, db), keep=args.keep)


def run(args: argparse.Namespace, database: BenchDatabase) -> list[str]:
    errors: list[str] = []
    print(f"database: {database.url} (PostgreSQL {database.server_version()})")
    with Timer() as setup_timer:
        django_setup(database_url=database.url, conn_max_age=args.conn_max_age)
    from core.api.pagination import StandardPagination
    from core.models import Organisation
    from core.services import api_token_create, organisation_create
    from federation.models import Accelerator, Cluster

    if Cluster.objects.exists():
        return [f"{database.url} already has clusters; the benchmark needs an empty database"]
    missing = {slug for slug, _ in ACCELERATORS} - set(Accelerator.objects.values_list("slug", flat=True))
    if missing:
        return [f"accelerators missing from the seeded catalog: {sorted(missing)}"]
    operator_slugs = [f"op{i:02d}" for i in range(args.operators)]
    viewers: list[Organisation] = []
    tokens: list[str] = []
    for slug in operator_slugs:
        organisation = organisation_create(slug=slug, name=f"Benchmark operator {slug}", is_operator=True)
        _, raw = api_token_create(organisation=organisation, name="benchmark")
        viewers.append(organisation)
        tokens.append(raw)
    token_of = dict(zip(operator_slugs, tokens, strict=True))
    print(f"migrated and seeded {args.operators} operators in {setup_timer.seconds:.1f} s")

    fleet = build_fleet(
        clusters=args.clusters,
        islands_per_cluster=args.islands_per_cluster,
        operators=operator_slugs,
        seed=args.seed,
        endpoint_ip=args.endpoint_ip,
    )
    n_islands = args.clusters * args.islands_per_cluster
    api_rows = {
        "federation_cluster": args.clusters,
        "federation_island": n_islands,
        "federation_issuedidentifier": args.clusters + n_islands,
        "federation_clusterstatuschange": args.clusters,
    }

    # 2. COPY baseline.
    print(f"\n[1/4] COPY baseline: {args.clusters:,} clusters, {n_islands:,} islands ...", flush=True)
    copied = copy_baseline(database_url=database.url, fleet=fleet)
    if copied.rows != api_rows:
        errors.append(f"COPY wrote {copied.rows}, expected {api_rows}")

    # 3. Registration through the API.
    servers = ProductionServers(workers=args.workers, database_url=database.url)
    try:
        print(
            f"[2/4] registering {args.clusters:,} clusters over HTTP: "
            f"{ProductionServers.DESCRIPTION.format(workers=args.workers)}; {args.concurrency} clients ...",
            flush=True,
        )
        requests = [
            HttpRequest(
                "POST",
                "/api/v1/clusters",
                {"Authorization": f"Bearer {token_of[plan.operator]}", "Content-Type": "application/json"},
                plan.body(),
            )
            for plan in fleet
        ]

        def registered(index: int, status: int, body: bytes) -> str | None:
            return None if status == 201 else f"POST {fleet[index].cpi}: HTTP {status} {body[:300]!r}"

        server_pids = [p.pid for p in servers.processes]
        with CpuSampler(server_pids=server_pids, database=database.name) as registration_cpu:
            registration = run_closed_loop(
                requests=requests,
                host=servers.host,
                ports=servers.ports,
                concurrency=args.concurrency,
                check=registered,
            )
        errors += registration.errors
        counts = table_counts(database.url)
        if counts != api_rows:
            errors.append(f"after registration the tables hold {counts}, expected {api_rows}")
        sizes = table_sizes_mb(database.url)
        vacuum_s = vacuum_analyze(database.url)

        # 5. Resolution over HTTP, then the selector alone.
        lookups = build_lookups(fleet=fleet, operators=operator_slugs, n=args.resolves, seed=args.seed + 1)
        warmup = build_lookups(fleet=fleet, operators=operator_slugs, n=args.warmup, seed=args.seed + 2)

        def resolve_requests(items: Sequence[Lookup]) -> list[HttpRequest]:
            return [
                HttpRequest(
                    "GET", f"/api/v1/resolve/{x.identifier}", {"Authorization": f"Bearer {tokens[x.viewer]}"}
                )
                for x in items
            ]

        def resolved(items: Sequence[Lookup]) -> Callable[[int, int, bytes], str | None]:
            def check(index: int, status: int, body: bytes) -> str | None:
                lookup = items[index]
                if status != 200:
                    return f"GET {lookup.identifier}: HTTP {status} {body[:300]!r}"
                level = json.loads(body).get("level")
                if level != lookup.level:
                    return f"GET {lookup.identifier}: level {level!r}, expected {lookup.level!r}"
                return None

            return check

        print(
            f"[3/4] resolving {args.resolves:,} identifiers × {args.rounds} round(s) over HTTP "
            f"({args.resolve_concurrency} client(s), after {args.warmup} warm-up requests) ...",
            flush=True,
        )
        resolve_ports = servers.ports
        if args.warmup:
            errors += run_closed_loop(
                requests=resolve_requests(warmup),
                host=servers.host,
                ports=resolve_ports,
                concurrency=max(args.resolve_concurrency, args.workers),
                check=resolved(warmup),
            ).errors
        http_rounds = []
        http_cpu = []
        for _ in range(args.rounds):
            with CpuSampler(server_pids=server_pids, database=database.name) as cpu:
                result = run_closed_loop(
                    requests=resolve_requests(lookups),
                    host=servers.host,
                    ports=resolve_ports,
                    concurrency=args.resolve_concurrency,
                    check=resolved(lookups),
                )
            errors += result.errors
            http_rounds.append(result)
            http_cpu.append(cpu)

        print(
            f"      baseline: GET /healthz × {args.healthz:,} on the same server, same clients ...",
            flush=True,
        )
        with CpuSampler(server_pids=server_pids, database=database.name) as healthz_cpu:
            healthz = run_closed_loop(
                requests=[HttpRequest("GET", "/healthz", {})] * args.healthz,
                host=servers.host,
                ports=resolve_ports,
                concurrency=args.resolve_concurrency,
            )
        errors += healthz.errors
    finally:
        servers.stop(keep_log=bool(errors))
        if errors:
            errors.append(f"server log: {servers.log_path}")

    print(
        f"[4/4] resolving the same identifiers × {args.rounds} round(s) through federation.selectors.resolve ...",
        flush=True,
    )
    page_size = StandardPagination.page_size
    resolve_direct(lookups=warmup, viewers=viewers, page_size=page_size)
    direct_rounds = []
    direct_cpu = []
    for _ in range(args.rounds):
        with CpuSampler(database=database.name) as cpu:
            direct_rounds.append(resolve_direct(lookups=lookups, viewers=viewers, page_size=page_size))
        direct_cpu.append(cpu)
    selector_queries, view_queries, registration_queries, query_errors = count_queries(
        lookups=lookups, viewers=viewers, tokens=tokens, page_size=page_size
    )
    errors += query_errors
    share = auth_throttle_share(lookups=lookups[: min(len(lookups), 2_000)], tokens=tokens)

    report(
        args=args,
        copied=copied,
        registration_wall_s=registration.wall_s,
        registration_cpu=registration_cpu,
        registration_latency=registration.latency_s,
        registration_windows=windowed_rates(registration.done_at_s),
        api_rows=api_rows,
        sizes=sizes,
        vacuum_s=vacuum_s,
        lookups=lookups,
        http_rounds=[r.latency_s for r in http_rounds],
        http_walls=[r.wall_s for r in http_rounds],
        direct_rounds=direct_rounds,
        http_cpu=http_cpu,
        direct_cpu=direct_cpu,
        selector_queries=selector_queries,
        view_queries=view_queries,
        registration_queries=registration_queries,
        server_rss=servers.peak_rss_mb,
        healthz_latency=healthz.latency_s,
        healthz_cpu=healthz_cpu,
        share=share,
    )
    return errors


def report(
    *,
    args: argparse.Namespace,
    copied: CopyResult,
    registration_wall_s: float,
    registration_cpu: CpuSampler,
    registration_latency: Sequence[float],
    registration_windows: Sequence[float],
    api_rows: dict[str, int],
    sizes: dict[str, float],
    vacuum_s: float,
    lookups: Sequence[Lookup],
    http_rounds: Sequence[Sequence[float]],
    http_walls: Sequence[float],
    direct_rounds: Sequence[Sequence[float]],
    http_cpu: Sequence[CpuSampler],
    direct_cpu: Sequence[CpuSampler],
    selector_queries: dict[str, tuple[int, int]],
    view_queries: dict[str, tuple[int, int]],
    registration_queries: int,
    server_rss: Sequence[float],
    healthz_latency: Sequence[float],
    healthz_cpu: CpuSampler,
    share: AuthShare,
) -> None:
    n_islands = args.clusters * args.islands_per_cluster
    api_total_rows = sum(api_rows.values())
    clusters_per_s = args.clusters / registration_wall_s
    copy_rows_per_s = copied.total_rows / copied.seconds
    api_rows_per_s = api_total_rows / registration_wall_s

    print_table(
        "Registration: API (POST /api/v1/clusters over HTTP) vs raw COPY of the same rows",
        ["path", "wall s", "clusters/s", "islands/s", "rows/s", "rows"],
        [
            [
                "COPY (psycopg 3, one transaction)",
                f"{copied.seconds:.2f}",
                f"{args.clusters / copied.seconds:,.0f}",
                f"{n_islands / copied.seconds:,.0f}",
                f"{copy_rows_per_s:,.0f}",
                f"{copied.total_rows:,}",
            ],
            [
                f"REST API ({args.workers} workers, {args.concurrency} clients)",
                f"{registration_wall_s:.2f}",
                f"{clusters_per_s:,.1f}",
                f"{n_islands / registration_wall_s:,.0f}",
                f"{api_rows_per_s:,.0f}",
                f"{api_total_rows:,}",
            ],
        ],
    )
    print(
        f"API/COPY throughput ratio: {api_rows_per_s / copy_rows_per_s:.4f} "
        f"(COPY is {copy_rows_per_s / api_rows_per_s:,.0f}× faster)"
    )
    reg = Summary.of(registration_latency)
    print(
        f"registration latency per request (closed loop, queueing included): p50 {ms(reg.p50)} ms, "
        f"p90 {ms(reg.p90)} ms, p99 {ms(reg.p99)} ms, max {ms(reg.max)} ms"
    )
    if registration_windows:
        print(
            "registration clusters/s in 10 successive slices of the run (min / median / max): "
            f"{spread(registration_windows)}; slices: {', '.join(f'{r:.0f}' for r in registration_windows)}"
        )
    print(
        "table sizes after registration (MB): "
        + ", ".join(f"{t.removeprefix('federation_')} {mb:.1f}" for t, mb in sizes.items())
        + f"; VACUUM ANALYZE {vacuum_s:.1f} s"
    )

    levels_present = [level for level in LEVELS if any(x.level == level for x in lookups)]
    level_of = [x.level for x in lookups]

    def by_level(round_latencies: Sequence[Sequence[float]]) -> dict[str, list[float]]:
        pooled: dict[str, list[float]] = defaultdict(list)
        for latencies in round_latencies:
            for level, latency in zip(level_of, latencies, strict=True):
                pooled[level].append(latency)
        return pooled

    http_by_level = by_level(http_rounds)
    http_all = [x for r in http_rounds for x in r]
    direct_by_level = by_level(direct_rounds)
    direct_all = [x for r in direct_rounds for x in r]

    mix = {level: level_of.count(level) for level in levels_present}
    print(
        f"\nResolution mix per round ({len(lookups):,} identifiers, seed {args.seed + 1}): "
        + ", ".join(f"{level} {count:,}" for level, count in mix.items())
        + f"; {args.operators} operators, ~{args.clusters // args.operators:,} clusters each, page size 50"
    )
    print_table(
        f"Resolution over HTTP (GET /api/v1/resolve/<identifier>), {args.rounds} round(s) pooled, "
        f"{args.resolve_concurrency} client(s)",
        ["level", *SUMMARY_MS_HEADERS],
        [[level, *Summary.of(http_by_level[level]).ms_cells()] for level in levels_present]
        + [["all", *Summary.of(http_all).ms_cells()]],
    )
    print_table(
        f"Resolution through federation.selectors.resolve in-process (no HTTP, no DRF), {args.rounds} round(s) pooled",
        ["level", *SUMMARY_MS_HEADERS],
        [[level, *Summary.of(direct_by_level[level]).ms_cells()] for level in levels_present]
        + [["all", *Summary.of(direct_all).ms_cells()]],
    )
    # Noise: the same figures for successive slices of each round (same identifiers in every round).
    slice_rows = []
    http_p99s = []
    for r, (http_latencies, direct_latencies) in enumerate(
        zip(http_rounds, direct_rounds, strict=True), start=1
    ):
        size = max(1, len(http_latencies) // SLICES)
        for k in range(0, len(http_latencies), size):
            h = Summary.of(http_latencies[k : k + size])
            d = Summary.of(direct_latencies[k : k + size])
            http_p99s.append(h.p99 * 1000)
            slice_rows.append(
                [
                    f"round {r}, requests {k + 1}–{k + h.n}",
                    ms(h.p50),
                    ms(h.p99),
                    ms(h.max),
                    ms(d.p50),
                    ms(d.p99),
                ]
            )
    print_table(
        "Resolution by slice of the run (noise)",
        ["slice", "HTTP p50", "HTTP p99", "HTTP max", "selector p50", "selector p99"],
        slice_rows,
    )
    print(f"HTTP p99 over slices, min / median / max: {spread(http_p99s)} ms")
    print(
        "HTTP requests/s per round (1 client = 1 / mean latency): "
        + ", ".join(f"{len(r) / w:,.0f}" for r, w in zip(http_rounds, http_walls, strict=True))
    )

    def per_request(cpu: CpuSampler, n: int) -> list[str]:
        return [
            f"{cpu.seconds('server') / n * 1000:.2f}",
            f"{cpu.seconds('postgres') / n * 1000:.2f}",
            f"{cpu.own_seconds / n * 1000:.2f}",
        ]

    cpu_rows = [["register (HTTP)", *per_request(registration_cpu, args.clusters)]]
    cpu_rows += [["baseline: GET /healthz (HTTP)", *per_request(healthz_cpu, len(healthz_latency))]]
    cpu_rows += [
        [f"resolve HTTP, round {i}", *per_request(c, len(lookups))] for i, c in enumerate(http_cpu, start=1)
    ]
    cpu_rows += [
        [f"resolve selector, round {i}", "—", *per_request(c, len(lookups))[1:]]
        for i, c in enumerate(direct_cpu, start=1)
    ]
    print_table(
        "CPU ms per request (user+system from /proc; steadier than wall time on a busy machine)",
        ["phase", "web workers", "PostgreSQL backends", "this process (clients / selector)"],
        cpu_rows,
    )

    def span(pair: tuple[int, int]) -> str:
        return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}–{pair[1]}"

    print_table(
        "SQL queries per request (min–max over up to 20 identifiers per level; savepoints not counted)",
        ["request", "selector", "whole API request"],
        [
            [f"resolve {level}", span(selector_queries[level]), span(view_queries[level])]
            for level in levels_present
        ]
        + [["register 1 cluster with 10 islands", "—", str(registration_queries)]],
    )
    print(
        f"\npeak RSS: benchmark process {peak_rss_mb():.0f} MB; server workers "
        + ", ".join("?" if math.isnan(x) else f"{x:.0f} MB" for x in server_rss)
    )
    print(f"machine at the end: {machine_description()}")

    healthz = Summary.of(healthz_latency)
    healthz_server_ms = healthz_cpu.seconds("server") / len(healthz_latency) * 1000
    resolve_server_ms = [c.seconds("server") / len(lookups) * 1000 for c in http_cpu]
    resolve_pg_ms = [c.seconds("postgres") / len(lookups) * 1000 for c in http_cpu]
    selector_ms = [c.own_seconds / len(lookups) * 1000 for c in direct_cpu]
    selector_pg_ms = [c.seconds("postgres") / len(lookups) * 1000 for c in direct_cpu]
    register_server_ms = registration_cpu.seconds("server") / args.clusters * 1000
    register_pg_ms = registration_cpu.seconds("postgres") / args.clusters * 1000
    # What 2 cores would sustain if registration had them to itself (server + PostgreSQL CPU per cluster).
    cores = os.cpu_count() or 1
    register_capacity = cores * 1000 / max(register_server_ms + register_pg_ms, 1e-9)
    in_process_ms = share.request_s / share.requests * 1000
    auth_ms = share.authentication_s / share.requests * 1000
    throttle_ms = share.throttle_s / share.requests * 1000
    print(
        f"\nIn-process resolve through the Django test client ({share.requests:,} requests, thread CPU): "
        f"{in_process_ms:.2f} ms per request, of which token authentication {auth_ms:.2f} ms "
        f"({auth_ms / in_process_ms:.0%}) and throttles {throttle_ms:.2f} ms ({throttle_ms / in_process_ms:.0%})"
    )

    http = Summary.of(http_all)
    direct = Summary.of(direct_all)
    verdict = "PASS" if http.p99 <= RESOLUTION_P99_TARGET_S else "MISS"
    registration_verdict = "PASS" if clusters_per_s >= REGISTRATION_TARGET_PER_S else "MISS"
    print_table(
        "Results",
        ["figure", "value"],
        [
            [
                "set-up",
                f"{args.workers} web workers, {args.concurrency} registration clients, "
                f"{args.resolve_concurrency} resolution client(s), {os.cpu_count()} CPUs shared",
            ],
            ["clusters registered per second (REST API)", f"{clusters_per_s:,.1f}"],
            [
                "CPU per registration: server / PostgreSQL",
                f"{register_server_ms:.2f} / {register_pg_ms:.2f} ms "
                f"(→ {register_capacity:,.0f} clusters/s if {cores} cores were registration's alone)",
            ],
            ["islands registered per second (REST API)", f"{n_islands / registration_wall_s:,.0f}"],
            ["registration wall time", f"{registration_wall_s:.1f} s for {args.clusters:,} clusters"],
            ["COPY baseline rows/s (same rows)", f"{copy_rows_per_s:,.0f} ({copied.seconds:.2f} s)"],
            ["API rows/s / COPY rows/s", f"{api_rows_per_s / copy_rows_per_s:.4f}"],
            ["resolution p50 over HTTP", f"{ms(http.p50)} ms"],
            ["resolution p99 over HTTP", f"{ms(http.p99)} ms (slices min/median/max {spread(http_p99s)})"],
            ["resolution p50 / p99 selector only", f"{ms(direct.p50)} / {ms(direct.p99)} ms"],
            [
                "CPU per resolve over HTTP: server / PostgreSQL (per round)",
                ", ".join(
                    f"{a:.2f} / {b:.2f} ms" for a, b in zip(resolve_server_ms, resolve_pg_ms, strict=True)
                ),
            ],
            [
                "CPU per resolve, selector alone: this process / PostgreSQL (per round)",
                ", ".join(f"{a:.2f} / {b:.2f} ms" for a, b in zip(selector_ms, selector_pg_ms, strict=True)),
            ],
            [
                "baseline GET /healthz, same server: p50 / p99, server CPU",
                f"{ms(healthz.p50)} / {ms(healthz.p99)} ms, {healthz_server_ms:.2f} ms "
                f"(a resolve costs {min(resolve_server_ms) / max(healthz_server_ms, 1e-9):.1f}× a /healthz)",
            ],
            [
                "token authentication / throttles per resolve (in-process CPU)",
                f"{auth_ms:.2f} ms ({auth_ms / in_process_ms:.0%}) / {throttle_ms:.2f} ms "
                f"({throttle_ms / in_process_ms:.0%}) of {in_process_ms:.2f} ms",
            ],
            [f"target: resolution p99 ≤ {RESOLUTION_P99_TARGET_S * 1000:.0f} ms over HTTP", verdict],
            [f"target: registration ≥ {REGISTRATION_TARGET_PER_S} clusters/s", registration_verdict],
        ],
        left_columns=2,
    )


if __name__ == "__main__":
    sys.exit(main())
