"""The broker at design size: quotes over a 10,000-cluster / 100,000-island market holding 100,000 leases,
and usage reported against running leases through the REST API, on PostgreSQL.

    python -m benchmarks.broker            # 10,000 clusters, 100,000 islands, 100,000 leases
    python -m benchmarks.broker --quick    # 500 clusters, 5,000 islands, 5,000 leases: a smoke run

What it does, in order:

1. **Set-up (bulk, not measured against a target).** A throwaway database (``cardhour_bench_broker``) is
   migrated; ``--operators`` operators and ``--buyers`` buyers are created with the services, with one API
   token each. The fleet (chips, hubs, sites and island sizes drawn as benchmarks.federation draws them)
   and everything the market holds are then written with PostgreSQL ``COPY`` — the rows the services
   would write, column for column: issued identifiers, clusters, islands and their status history as
   ``cluster_register`` writes them; version-1 price cards as ``price_card_set`` writes them (on the cn-gd
   preset in the Greater Bay Area, cn-nx in Ningxia, one of cn-gd / cn-nx / flat elsewhere; rates per chip
   varied ±25 %), effective two days before the run; and ``--leases`` leases, each with its job (as
   ``job_create`` writes it, body hash included), its capacity hold and its creation transition, as
   ``lease_create`` writes them when called without a quote (as failover's re-placement calls it).
   Leases land on random islands at random starts from 24 h ago to the end of the 7-day planning horizon,
   1–72 h long, taking 1 card to the whole island; a lease is only placed where the island's exact
   occupancy (a sweep over hold edges) stays within its cards at every instant, so nothing is
   oversubscribed. Leases whose start has passed are running, with their reserved → running transition
   at their start, as ``lease_start`` writes it; their expected cost and draw come from the tariff, as a
   quote's would.
2. **Quotes over HTTP.** The production server (benchmarks.prodserver: gunicorn, ``--workers`` uvicorn
   workers, production settings, so the production catalogue TTL of 5 s; the test settings pin it to 0). One buyer submits ``--jobs`` jobs of 8 cards, island gang, any chip, a
   48-hour window (earliest start spread over the first 5 days of the horizon), ``--duration-hours`` long,
   from varied origin hubs. The first quote of each server (it loads the island catalogue and the hold
   book) is timed apart; then ``--warmup`` quotes, then ``--quotes`` ``POST /api/v1/jobs/<id>/quotes``
   from ``--concurrency`` closed-loop clients: p50 / p99 / p99.9 / max, quotes per second, CPU per quote,
   and the servers' peak RSS (VmHWM); then ``--healthz`` ``GET /healthz`` from the same clients on the same
   server, the same-run baseline (latency and server CPU per request).
3. **Breakdown.** ``broker.services.quotes.placements_find`` (the matcher alone) and ``quote_create`` (the
   matcher, the buyer's affordability and storing the quotes) for the same jobs in this process (same TTL),
   so the HTTP figure can be split into matcher, service and HTTP/DRF. Also one client alone over HTTP,
   for the latency without queueing.
4. **Usage over REST.** ``--records`` usage records of one minute each against the running leases,
   ``POST /api/v1/operator/usage`` in batches of 1,000 (one operator per batch, each operator with its own
   token) from ``--usage-concurrency`` clients; then one batch sent again must come back all
   ``duplicate`` (strict dedup on the unique (operator, key) index). Baseline: the same rows written with
   raw ``COPY`` into metering's usage table (timed, then truncated), as benchmarks.metering does.

Targets (issue 4): quote p99 ≤ 50 ms and ≥ 200 quotes/s on this 2-core machine; usage over REST ≥ 20,000
records/s. Each is marked PASS or MISS. Exits non-zero only on errors (a request that failed or answered
something unexpected, rows missing), never on a missed target.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from types import SimpleNamespace
from typing import Any

from benchmarks._common import (
    BenchDatabase,
    CpuSampler,
    HttpRequest,
    JsonClient,
    Timer,
    add_server_env_argument,
    django_setup,
    machine_description,
    ms,
    peak_rss_mb,
    percentile,
    print_table,
    run_closed_loop,
    run_on_database,
    spread,
    windowed_rates,
)
from benchmarks.federation import HUBS, ClusterPlan, build_fleet
from benchmarks.prodserver import PRODUCTION_WORKERS, ProductionServers

BENCH_DATABASE = "cardhour_bench_broker"
QUOTE_P99_TARGET_S = 0.050
QUOTE_RATE_TARGET = 200
QUOTE_CPU_TARGET_S = 0.010  # 200 quotes/s on 2 cores (issue 14)
FIRST_QUOTE_TARGET_S = 1.0
USAGE_RATE_TARGET = 20_000
USAGE_BATCH = 1_000
USAGE_RECORD_SECONDS = 60
HORIZON = timedelta(days=7)
PAST = timedelta(hours=24)
TARIFFS = ("cn-gd", "cn-nx", "flat")
# List price per card-hour (CNY) of each chip of benchmarks.federation.ACCELERATORS; each cluster varies it.
BASE_RATE = {
    "nvidia-a800-sxm4-80gb": Decimal("9.00"),
    "nvidia-h800-sxm5-80gb": Decimal("22.00"),
    "nvidia-h20": Decimal("7.00"),
    "nvidia-l40s": Decimal("5.00"),
    "huawei-ascend-910b2": Decimal("8.50"),
    "huawei-ascend-910c": Decimal("12.00"),
    "cambricon-mlu370-x8": Decimal("3.00"),
    "hygon-dcu-k100": Decimal("4.00"),
}
LEASE_CARDS = (1, 2, 4, 8, 8, 8, 16, 32, 64)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CENT = Decimal("0.01")
_MICRO = Decimal("0.000001")


# --- The market ---------------------------------------------------------------------------------------------


@dataclass
class Market:
    fleet: list[ClusterPlan]
    operator_ids: dict[str, int]
    operator_tokens: dict[str, str]
    buyer_ids: list[int]
    quote_buyer_token: str
    cluster_rate: list[Decimal]  # by cluster index
    cluster_tariff_version: list[int]
    island_cluster: list[int]  # island index → cluster index
    island_cards: list[int]
    leases: list[LeasePlan]
    rows: dict[str, int]
    seconds: float


@dataclass
class LeasePlan:
    island: int  # index
    cards: int
    start: datetime
    end: datetime
    created: datetime
    buyer_id: int
    hub: str
    running: bool
    expected_cost: Decimal = Decimal(0)
    expected_draw: Decimal = Decimal(0)


def _copy(cursor: Any, table: str, columns: Sequence[str], rows: Any) -> int:
    n = 0
    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
            n += 1
    return n


def place_leases(
    *, n: int, island_cards: Sequence[int], buyer_ids: Sequence[int], now: datetime, rng: random.Random
) -> tuple[list[LeasePlan], int]:
    """``n`` leases on random islands without oversubscribing any (exact sweep over each island's holds);
    returns them and how many draws were refused for lack of room."""
    by_island: dict[int, list[tuple[datetime, datetime, int]]] = defaultdict(list)
    leases = []
    refused = 0
    span = int((PAST + HORIZON).total_seconds()) // 60
    while len(leases) < n:
        island = rng.randrange(len(island_cards))
        capacity = island_cards[island]
        cards = rng.choice([c for c in LEASE_CARDS if c <= capacity] or [capacity])
        if rng.random() < 0.15:
            cards = capacity  # whole-island training runs
        hours = max(1, min(72, round(math.exp(rng.uniform(0, math.log(72))))))
        start = now - PAST + timedelta(minutes=rng.randrange(span))
        end = start + timedelta(hours=hours)
        holds = by_island[island]
        edges = [(max(s, start), c) for s, e, c in holds if s < end and e > start]
        edges += [(min(e, end), -c) for s, e, c in holds if s < end and e > start]
        edges.sort(key=lambda edge: (edge[0], edge[1]))
        peak = current = 0
        for _, delta in edges:
            current += delta
            peak = max(peak, current)
        if peak + cards > capacity:
            refused += 1
            continue
        holds.append((start, end, cards))
        created = min(start, now) - timedelta(minutes=rng.randrange(10, 24 * 60))
        leases.append(
            LeasePlan(
                island=island,
                cards=cards,
                start=start,
                end=end,
                created=created,
                buyer_id=rng.choice(buyer_ids),
                hub=rng.choice(HUBS),
                running=start <= now,
            )
        )
    return leases, refused


def build_market(
    args: argparse.Namespace,
    database_url: str,
    *,
    place: Callable[..., tuple[list[LeasePlan], int]] | None = None,
) -> Market:
    """Organisations through the services, everything else with COPY (see the module docstring).
    ``place`` lays out the leases (default :func:`place_leases`; benchmarks.soak runs every lease now)."""
    import psycopg
    from django.utils import timezone

    from broker.services.jobs import JobInput, _body_hash
    from core.money import to_micros
    from core.services import api_token_create, organisation_create
    from core.types import Actor
    from federation.models import Accelerator, Hub
    from metering.models import PackOrder, PackProduct, TariffVersion
    from metering.selectors.tariffs import compiled_tariff
    from metering.services.packs import pack_issue

    rng = random.Random(args.seed)
    now = timezone.now().replace(microsecond=0)
    registered = now - PAST - timedelta(days=2)
    operators = [f"op{i:03d}" for i in range(args.operators)]
    operator_ids: dict[str, int] = {}
    operator_tokens: dict[str, str] = {}
    operator_labels: dict[int, str] = {}
    for slug in operators:
        organisation = organisation_create(slug=slug, name=f"Benchmark operator {slug}", is_operator=True)
        token, raw = api_token_create(organisation=organisation, name="agent")
        operator_ids[slug], operator_tokens[slug] = organisation.pk, raw
        operator_labels[organisation.pk] = Actor(organisation=organisation, token=token).label
    buyer_ids, buyer_labels = [], {}
    buyers = []
    for b in range(args.buyers):
        organisation = organisation_create(slug=f"buyer{b:03d}", name=f"Benchmark buyer {b}", is_buyer=True)
        token, _ = api_token_create(organisation=organisation, name="portal")
        buyer_ids.append(organisation.pk)
        buyers.append(organisation)
        buyer_labels[organisation.pk] = Actor(organisation=organisation, token=token).label
    quoter = organisation_create(slug="quoter", name="Benchmark quoting buyer", is_buyer=True)
    _, quote_token = api_token_create(organisation=quoter, name="quotes")
    product = PackProduct.objects.create(
        code="bench-std", name="standard", card_hours=1_000_000, price=9_000_000
    )
    # Every buyer has a pack, so the affordability of a buyer with many live leases sets them aside.
    for buyer in [quoter, *buyers]:
        order = PackOrder.objects.create(
            buyer=buyer,
            product=product,
            card_hours=1_000_000,
            amount=Decimal(9_000_000),
            validity_days=365,
            idempotency_key=f"bench-{buyer.slug}",
        )
        pack_issue(order=order, paid_at=registered, posted_by="benchmark")

    islands_per_cluster = max(1, args.islands // args.clusters)
    fleet = build_fleet(
        clusters=args.clusters, islands_per_cluster=islands_per_cluster, operators=operators, seed=args.seed
    )
    hub_ids = dict(Hub.objects.values_list("code", "pk"))
    accelerator_ids = dict(Accelerator.objects.values_list("slug", "pk"))
    presets = dict(
        TariffVersion.objects.filter(tariff__owner__isnull=True, version=1).values_list("tariff__code", "pk")
    )
    cluster_rate, cluster_tariff_version = [], []
    for plan in fleet:
        tariff = {"gba": "cn-gd", "nx": "cn-nx"}.get(plan.hub) or rng.choice(TARIFFS)
        cluster_tariff_version.append(presets[tariff])
        base = BASE_RATE[plan.accelerator]
        cluster_rate.append((base * Decimal(rng.uniform(0.75, 1.25))).quantize(_CENT))
    island_cluster = [c for c, plan in enumerate(fleet) for _ in plan.islands]
    island_cards = [cards for plan in fleet for _, cards, _ in plan.islands]

    with Timer() as place_timer:
        leases, refused = (place or place_leases)(
            n=args.leases, island_cards=island_cards, buyer_ids=buyer_ids, now=now, rng=rng
        )
    # Expected cost and draw as a quote carries them: the tariff's bands, each priced to the fen.
    tariffs = {pk: compiled_tariff(tariff_version_id=pk) for pk in set(cluster_tariff_version)}
    for lease in leases:
        c = island_cluster[lease.island]
        tariff = tariffs[cluster_tariff_version[c]]
        seconds: dict[int, int] = defaultdict(int)
        start_s = (lease.start - _EPOCH) // timedelta(seconds=1)
        for a, b, band in tariff.slices(start_s, start_s + int((lease.end - lease.start).total_seconds())):
            seconds[band] += b - a
        cost, draw = Decimal(0), Decimal(0)
        for band, s in seconds.items():
            multiplier = Decimal(tariff.multipliers_e4[band]).scaleb(-4)
            card_seconds = lease.cards * s
            cost += (cluster_rate[c] * card_seconds * multiplier / 3600).quantize(_CENT, ROUND_HALF_EVEN)
            draw += Decimal(card_seconds) * multiplier / 3600
        lease.expected_cost, lease.expected_draw = cost, draw.quantize(_MICRO, ROUND_HALF_EVEN)

    rows: dict[str, int] = {}
    system = "benchmark set-up (COPY)"
    with (
        Timer() as copy_timer,
        psycopg.connect(database_url) as conn,
        conn.transaction(),
        conn.cursor() as cur,
    ):
        rows["federation_issuedidentifier"] = _copy(
            cur,
            "federation_issuedidentifier",
            ("cpi", "kind", "operator_id", "issued_at"),
            (
                row
                for plan in fleet
                for row in [
                    (plan.cpi, "cluster", operator_ids[plan.operator], registered),
                    *(
                        (f"{plan.cpi}:{name}", "island", operator_ids[plan.operator], registered)
                        for name, _, _ in plan.islands
                    ),
                ]
            ),
        )
        rows["federation_cluster"] = _copy(
            cur,
            "federation_cluster",
            (
                "id", "operator_id", "cpi", "name", "hub_id", "site", "accelerator_id", "endpoint_url",
                "status", "status_before_offline", "offline_cause", "health", "total_cards",
                "available_cards", "registered_at", "updated_at",
            ),
            (
                (
                    pk, operator_ids[plan.operator], plan.cpi, plan.name, hub_ids[plan.hub], plan.site,
                    accelerator_ids[plan.accelerator], plan.endpoint_url, "active", "", "", "unknown",
                    sum(c for _, c, _ in plan.islands), sum(c for _, c, _ in plan.islands), registered,
                    registered,
                )
                for pk, plan in enumerate(fleet, start=1)
            ),
        )  # fmt: skip
        rows["federation_island"] = _copy(
            cur,
            "federation_island",
            (
                "id",
                "cluster_id",
                "cpi",
                "name",
                "cards",
                "fabric",
                "available_cards",
                "unhealthy_cards",
                "created_at",
            ),
            (
                (i, c + 1, f"{fleet[c].cpi}:{name}", name, cards, fabric, cards, 0, registered)
                for i, (c, (name, cards, fabric)) in enumerate(
                    ((c, island) for c, plan in enumerate(fleet) for island in plan.islands), start=1
                )
            ),
        )
        rows["federation_clusterstatuschange"] = _copy(
            cur,
            "federation_clusterstatuschange",
            (
                "cluster_id",
                "from_status",
                "to_status",
                "changed_at",
                "actor_token_id",
                "actor_label",
                "reason",
            ),
            ((pk, "", "active", registered, None, system, "registered") for pk in range(1, len(fleet) + 1)),
        )
        rows["metering_pricecard"] = _copy(
            cur,
            "metering_pricecard",
            ("id", "cluster_id", "version", "rate_per_card_hour", "currency", "tariff_version_id",
             "effective_from", "created_at", "created_by", "sla_credit_schedule"),
            (
                (pk, pk, 1, cluster_rate[pk - 1], "CNY", cluster_tariff_version[pk - 1], registered,
                 registered, operator_labels[operator_ids[fleet[pk - 1].operator]], "[]")
                for pk in range(1, len(fleet) + 1)
            ),
        )  # fmt: skip
        job_rows = []
        for pk, lease in enumerate(leases, start=1):
            duration = int((lease.end - lease.start).total_seconds())
            data = JobInput(
                name=f"bench-{pk}",
                origin_hub=lease.hub,
                latency_budget_ms=50,
                deadline_at=lease.end,
                duration_seconds=duration,
                cards=lease.cards,
                earliest_start_at=lease.start,
            )
            job_rows.append(
                (
                    pk, lease.buyer_id, data.name, "", _body_hash(data, data.earliest_start_at), lease.cards,
                    None, "[]", None, None, "[]", "island", hub_ids[lease.hub], 50, lease.start, lease.end,
                    duration, None, False, "price", Decimal(1), "placed", "", "{}", lease.created, lease.created,
                )
            )  # fmt: skip
        rows["broker_job"] = _copy(
            cur,
            "broker_job",
            ("id", "buyer_id", "name", "idempotency_key", "body_hash", "cards", "standard_cards", "accelerators",
             "min_fp16_tflops", "min_memory_gb", "fabrics", "gang", "origin_hub_id", "latency_budget_ms",
             "earliest_start_at", "deadline_at", "duration_seconds", "max_price_per_card_hour", "checkpointable",
             "preference", "price_weight", "state", "failure_reason", "quote_summary", "created_at", "updated_at"),
            job_rows,
        )  # fmt: skip
        del job_rows
        chips = [plan.accelerator for plan in fleet]
        rows["broker_lease"] = _copy(
            cur,
            "broker_lease",
            ("id", "job_id", "quote_id", "buyer_id", "operator_id", "cluster_id", "cards", "start_at", "end_at",
             "price_card_id", "expected_cost", "expected_draw", "draw_class", "state", "state_changed_at",
             "replaces_id", "started_at", "stop_requested_at", "ended_at", "last_usage_end_at", "reason",
             "created_at"),
            (
                (
                    pk, pk, None, lease.buyer_id, operator_ids[fleet[island_cluster[lease.island]].operator],
                    island_cluster[lease.island] + 1, lease.cards, lease.start, lease.end,
                    island_cluster[lease.island] + 1, lease.expected_cost, lease.expected_draw,
                    chips[island_cluster[lease.island]], "running" if lease.running else "reserved",
                    lease.start if lease.running else lease.created, None,
                    lease.start if lease.running else None, None, None, None, "", lease.created,
                )
                for pk, lease in enumerate(leases, start=1)
            ),
        )  # fmt: skip
        # Each live lease's pending draw (broker.services.draw_holds): its whole expected draw (no usage is
        # rated yet), and their sums per buyer and chip.
        pending: dict[tuple[int, str], int] = defaultdict(int)
        for lease in leases:
            pending[(lease.buyer_id, chips[island_cluster[lease.island]])] += to_micros(lease.expected_draw)
        rows["broker_drawhold"] = _copy(
            cur,
            "broker_drawhold",
            ("lease_id", "buyer_id", "draw_class", "expected_micros", "posted_micros", "created_at", "voided_at"),
            (
                (pk, lease.buyer_id, chips[island_cluster[lease.island]], to_micros(lease.expected_draw), 0,
                 lease.created, None)
                for pk, lease in enumerate(leases, start=1)
            ),
        )  # fmt: skip
        rows["broker_drawpending"] = _copy(
            cur,
            "broker_drawpending",
            ("buyer_id", "draw_class", "open_micros"),
            ((buyer_id, chip, micros) for (buyer_id, chip), micros in sorted(pending.items())),
        )
        rows["broker_capacityhold"] = _copy(
            cur,
            "broker_capacityhold",
            ("id", "lease_id", "island_id", "cards", "start_at", "end_at", "active"),
            (
                (pk, pk, lease.island + 1, lease.cards, lease.start, lease.end, True)
                for pk, lease in enumerate(leases, start=1)
            ),
        )
        transitions = [(lease.created, pk, "", "reserved") for pk, lease in enumerate(leases, start=1)]
        transitions += [
            (lease.start, pk, "reserved", "running")
            for pk, lease in enumerate(leases, start=1)
            if lease.running
        ]
        transitions.sort()
        rows["broker_leasetransition"] = _copy(
            cur,
            "broker_leasetransition",
            ("id", "lease_id", "operator_id", "from_state", "to_state", "at", "actor_label", "reason"),
            (
                (
                    tid,
                    pk,
                    operator_ids[fleet[island_cluster[leases[pk - 1].island]].operator],
                    from_state,
                    to_state,
                    at,
                    buyer_labels[leases[pk - 1].buyer_id]
                    if to_state == "reserved"
                    else operator_labels[operator_ids[fleet[island_cluster[leases[pk - 1].island]].operator]],
                    "",
                )
                for tid, (at, pk, from_state, to_state) in enumerate(transitions, start=1)
            ),
        )
        for table in ("federation_cluster", "federation_island", "metering_pricecard", "broker_job",
                      "broker_lease", "broker_capacityhold", "broker_leasetransition"):  # fmt: skip
            cur.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
            )
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in rows:
            conn.execute(f"VACUUM ANALYZE {table}")
    print(
        f"set-up: {len(fleet):,} clusters, {len(island_cards):,} islands, {len(leases):,} leases "
        f"({sum(lease.running for lease in leases):,} running; {refused:,} draws refused for lack of room, "
        f"placed in {place_timer.seconds:.1f} s); COPY of {sum(rows.values()):,} rows in {copy_timer.seconds:.1f} s"
    )
    return Market(
        fleet=fleet,
        operator_ids=operator_ids,
        operator_tokens=operator_tokens,
        buyer_ids=buyer_ids,
        quote_buyer_token=quote_token,
        cluster_rate=cluster_rate,
        cluster_tariff_version=cluster_tariff_version,
        island_cluster=island_cluster,
        island_cards=island_cards,
        leases=leases,
        rows=rows,
        seconds=copy_timer.seconds,
    )


def reused_market() -> Market:
    """The market a previous run built in this database, as far as the quote part needs it (a new token for
    the quoting buyer; sizes from the tables); no fleet or lease plans, so no usage part."""
    from django.db import connection

    from core.models import Organisation
    from core.services import api_token_create

    quoter = Organisation.objects.get(slug="quoter")
    _, token = api_token_create(organisation=quoter, name="quotes (reused)")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM federation_cluster), (SELECT count(*) FROM federation_island), "
            "(SELECT count(*) FROM broker_lease WHERE job_id IN (SELECT id FROM broker_job WHERE name LIKE "
            "'bench-%'))"
        )
        clusters, islands, leases = cursor.fetchone()
    print(f"reusing the market: {clusters:,} clusters, {islands:,} islands, {leases:,} leases")
    return Market(
        fleet=[None] * clusters,  # type: ignore[list-item]
        operator_ids={},
        operator_tokens={},
        buyer_ids=[],
        quote_buyer_token=token,
        cluster_rate=[],
        cluster_tariff_version=[],
        island_cluster=[],
        island_cards=[0] * islands,
        leases=[None] * leases,  # type: ignore[list-item]
        rows={},
        seconds=0.0,
    )


def reused_usage_market() -> Market:
    """The market a previous run built in this database as far as the usage part needs it: every lease (ids
    1… in order, so the usage rows and their keys are the first run's), the operators with a new token each.
    The usage the earlier runs stored is removed first (usage_reset), so each run starts from the same state."""
    from django.db import connection

    from core.models import Organisation
    from core.services import api_token_create

    usage_reset()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.id, l.cluster_id, o.slug, l.buyer_id, l.cards, l.start_at, l.end_at, l.created_at,"
            " l.state = 'running' FROM broker_lease l JOIN core_organisation o ON o.id = l.operator_id"
            " ORDER BY l.id"
        )
        rows = cursor.fetchall()
        cursor.execute("SELECT max(id) FROM federation_cluster")
        clusters = cursor.fetchone()[0]
    if [row[0] for row in rows] != list(range(1, len(rows) + 1)):
        raise RuntimeError("the leases are not the ones a benchmark run built (ids 1…n)")
    fleet: list[Any] = [None] * clusters
    operator_ids: dict[str, int] = {}
    operator_tokens: dict[str, str] = {}
    for organisation in Organisation.objects.filter(is_operator=True, slug__startswith="op"):
        operator_ids[organisation.slug] = organisation.pk
        _, operator_tokens[organisation.slug] = api_token_create(
            organisation=organisation, name="usage (reused)"
        )
    leases = []
    island_cluster = []
    for index, (_pk, cluster_id, operator, buyer_id, cards, start, end, created, running) in enumerate(rows):
        fleet[cluster_id - 1] = SimpleNamespace(operator=operator)  # all the usage part reads of a cluster
        island_cluster.append(cluster_id - 1)
        leases.append(LeasePlan(index, cards, start, end, created, buyer_id, "", running))
    running = sum(lease.running for lease in leases)
    print(f"reusing the market: {clusters:,} clusters, {len(leases):,} leases ({running:,} running)")
    return Market(
        fleet=fleet,
        operator_ids=operator_ids,
        operator_tokens=operator_tokens,
        buyer_ids=[],
        quote_buyer_token="",
        cluster_rate=[],
        cluster_tariff_version=[],
        island_cluster=island_cluster,
        island_cards=[],
        leases=leases,
        rows={},
        seconds=0.0,
    )


def usage_reset() -> None:
    """Remove every usage record (with its key and pending row) and every lease's usage frontier, then vacuum
    and checkpoint: the kept market as its set-up left it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE metering_usagerecord, metering_usagekey, metering_usagepending CASCADE")
        cursor.execute("UPDATE broker_lease SET last_usage_end_at = NULL WHERE last_usage_end_at IS NOT NULL")
        for table in ("metering_usagerecord", "metering_usagekey", "metering_usagepending", "broker_lease"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("CHECKPOINT")


def check_market(market: Market) -> list[str]:
    """Every lease has its job, hold and creation transition; no island is oversubscribed at any instant
    (checked in SQL over every hold edge, independently of the set-up's own check)."""
    from django.db import connection

    errors = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM broker_lease l WHERE NOT EXISTS (SELECT 1 FROM broker_capacityhold h "
            "WHERE h.lease_id = l.id AND h.active) OR NOT EXISTS (SELECT 1 FROM broker_leasetransition t "
            "WHERE t.lease_id = l.id AND t.from_state = '' AND t.to_state = 'reserved')"
        )
        incomplete = cursor.fetchone()[0]
        cursor.execute(
            """
            WITH edges AS (
                SELECT island_id, start_at AS at, cards AS delta FROM broker_capacityhold WHERE active
                UNION ALL
                SELECT island_id, end_at, -cards FROM broker_capacityhold WHERE active
            ), running AS (
                SELECT island_id, sum(delta) OVER (PARTITION BY island_id ORDER BY at, delta
                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS occupied
                FROM edges
            )
            SELECT count(*) FROM (SELECT island_id, max(occupied) AS peak FROM running GROUP BY island_id) p
            JOIN federation_island i ON i.id = p.island_id WHERE p.peak > i.cards - i.unhealthy_cards
            """
        )
        oversubscribed = cursor.fetchone()[0]
    if incomplete:
        errors.append(f"{incomplete} leases without their hold or creation transition")
    if oversubscribed:
        errors.append(f"{oversubscribed} islands oversubscribed")
    print(
        f"market check: leases without hold/transition {incomplete}, islands oversubscribed {oversubscribed}"
    )
    return errors


# --- Quotes ---------------------------------------------------------------------------------------------------


def create_jobs(client: JsonClient, *, token: str, n: int, duration_hours: int, seed: int) -> list[int]:
    from django.utils import timezone

    rng = random.Random(seed)
    now = timezone.now().replace(microsecond=0)
    ids = []
    for i in range(n):
        # Windows of 48 h starting within the first 5 days keep every deadline inside the 7-day horizon.
        earliest = now + timedelta(minutes=5 + rng.randrange((5 * 24 - 1) * 60))
        body = {
            "name": f"quote-{i}",
            "cards": 8,
            "accelerators": [],
            "gang": "island",
            "origin_hub": rng.choice(HUBS),
            "latency_budget_ms": 50,
            "earliest_start_at": earliest.isoformat(),
            "deadline_at": (earliest + timedelta(hours=48)).isoformat(),
            "duration_seconds": duration_hours * 3600,
            "preference": "price",
        }
        status, answer = client.call("POST", "/api/v1/jobs", token=token, body=body, label="POST /jobs")
        if status != 201:
            raise RuntimeError(f"POST /jobs: HTTP {status} {str(answer)[:300]}")
        ids.append(answer["id"])
    return ids


def quote_requests(job_ids: Sequence[int], n: int, token: str, offset: int = 0) -> list[HttpRequest]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = json.dumps({"limit": 10}).encode()
    return [
        HttpRequest("POST", f"/api/v1/jobs/{job_ids[(offset + i) % len(job_ids)]}/quotes", headers, body)
        for i in range(n)
    ]


def quoted(index: int, status: int, body: bytes) -> str | None:
    if status != 201:
        return f"quote {index}: HTTP {status} {body[:300]!r}"
    answer = json.loads(body)
    if not answer.get("quotes"):
        return f"quote {index}: no quotes; rejections {answer.get('rejections')}"
    return None


def matcher_in_process(job_ids: Sequence[int], n: int) -> tuple[list[float], float, list[int]]:
    """placements_find for ``n`` jobs (cycling), in this process; (latencies, first-call seconds, feasible)."""
    from django.utils import timezone

    from broker.models import Job
    from broker.services.jobs import job_spec
    from broker.services.quotes import placements_find

    jobs = {job.pk: job for job in Job.objects.filter(pk__in=job_ids).select_related("origin_hub", "buyer")}
    specs = [job_spec(job=jobs[pk]) for pk in job_ids]
    t0 = time.perf_counter()
    placements_find(spec=specs[0], now=timezone.now(), limit=10)
    first = time.perf_counter() - t0
    latencies, feasible = [], []
    cpu = time.process_time()
    for i in range(n):
        t0 = time.perf_counter()
        result = placements_find(spec=specs[i % len(specs)], now=timezone.now(), limit=10)
        latencies.append(time.perf_counter() - t0)
        feasible.append(result.feasible)
    MATCHER_CPU_S.append((time.process_time() - cpu) / n)
    return latencies, first, feasible


MATCHER_CPU_S: list[float] = []


def catalogue_load_cpu_s(loads: int = 3) -> tuple[float, float]:
    """CPU seconds, in this process, of reading the catalogue whole (a new process; a change a refresh
    cannot patch) and of a refresh with nothing written since (what each worker does every TTL while
    quoting here: this benchmark sends no heartbeats), the median of ``loads`` each (broker.catalog)."""
    from broker.catalog import _load_catalogue_quietly

    whole, refresh = [], []
    for _ in range(loads):
        cpu = time.process_time()
        catalogue = _load_catalogue_quietly()
        whole.append(time.process_time() - cpu)
        cpu = time.process_time()
        _load_catalogue_quietly(catalogue)
        refresh.append(time.process_time() - cpu)
    return sorted(whole)[len(whole) // 2], sorted(refresh)[len(refresh) // 2]


def affordability_in_process(n: int) -> list[tuple[str, int, float]]:
    """CPU seconds per ``buyer_packs_after_leases`` (what a quote asks of the buyer's packs and live
    leases) for the quoting buyer and for the buyer holding the most live leases: (who, live leases,
    CPU s per call)."""
    from django.db.models import Count
    from django.utils import timezone

    from broker.catalog import market
    from broker.draws import buyer_packs_after_leases
    from broker.models import HOLDING_STATES, DrawPending, Lease
    from core.models import Organisation
    from metering.models import Pack

    busiest = (
        Lease.objects.filter(state__in=HOLDING_STATES, end_at__gt=timezone.now())
        .values("buyer_id")
        .annotate(n=Count("id"))
        .order_by("-n")
        .first()
    )
    buyers = [("quoting buyer", Organisation.objects.get(slug="quoter"), 0)]
    if busiest:
        buyers.append(("busiest buyer", Organisation.objects.get(pk=busiest["buyer_id"]), busiest["n"]))
    out = []
    for label, buyer, live in buyers:
        # What the call's work follows: the buyer's packs and the draw classes its live leases keep
        # pending (one maintained row each, broker.models.DrawPending), not the number of live leases.
        packs = Pack.objects.filter(buyer=buyer).count()
        classes = DrawPending.objects.filter(buyer=buyer, open_micros__gt=0).count()
        label = f"{label} ({packs:,} packs, {classes:,} draw classes pending)"
        # As a quote asks: the chips' standard-card factors from the catalogue the matcher calls loaded.
        known = market.catalogue.standard_card_factors if market.catalogue is not None else None
        buyer_packs_after_leases(buyer=buyer, known_factors=known)
        cpu = time.process_time()
        for _ in range(n):
            buyer_packs_after_leases(buyer=buyer, known_factors=known)
        out.append((label, live, (time.process_time() - cpu) / n))
    return out


def service_in_process(job_ids: Sequence[int], n: int) -> list[float]:
    """broker.services.quotes.quote_create (matcher + the buyer's affordability + storing the quotes) for
    ``n`` jobs (cycling), in this process, after the matcher's catalogue is loaded."""
    from broker.models import Job
    from broker.services.quotes import quote_create

    jobs = list(Job.objects.filter(pk__in=job_ids).select_related("origin_hub", "buyer"))
    latencies = []
    for i in range(n):
        t0 = time.perf_counter()
        quote_create(job=jobs[i % len(jobs)], limit=10)
        latencies.append(time.perf_counter() - t0)
    return latencies


# --- Usage ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsageRow:
    lease_id: int
    operator: str
    key: str
    start: datetime
    end: datetime
    cards: int


def usage_rows(market: Market, *, n: int, now: datetime, leases_per_batch: int = 0) -> list[UsageRow]:
    """``n`` one-minute records of the running leases, from their start, never past now, in the order
    usage_batches cuts them into batches of USAGE_BATCH per operator.

    ``leases_per_batch`` K > 0: each batch names K of its operator's running leases, USAGE_BATCH / K
    consecutive minutes of each (every lease reports its next minutes; in each round an operator's leases
    with that many minutes left are taken K at a time): the same shape of batch at every size of market,
    so that what changes from one size to another is the market (the tables, the leases running), not the
    number of leases a batch names. 0: round robin over every running lease of the operator; a batch then
    names more leases the more each operator runs (median 14 at 10k leases, 362 at 300k), and what it costs
    per lease named adds to what it costs per record."""
    running = [
        (pk, lease) for pk, lease in enumerate(market.leases, start=1) if lease.running and lease.start < now
    ]
    minute = timedelta(seconds=USAGE_RECORD_SECONDS)

    def row(pk: int, lease: LeasePlan, step: int) -> UsageRow | None:
        start = lease.start + step * minute
        end = start + minute
        if end > now or end > lease.end:
            return None
        return UsageRow(
            lease_id=pk,
            operator=market.fleet[market.island_cluster[lease.island]].operator,
            key=f"u-{pk}-{step}",
            start=start,
            end=end,
            cards=lease.cards,
        )

    rows: list[UsageRow] = []
    if leases_per_batch > 0:
        if USAGE_BATCH % leases_per_batch:
            raise ValueError(f"--usage-leases-per-batch must divide {USAGE_BATCH}")
        minutes = USAGE_BATCH // leases_per_batch
        by_operator: dict[str, list[tuple[int, LeasePlan]]] = defaultdict(list)
        for pk, lease in running:
            by_operator[market.fleet[market.island_cluster[lease.island]].operator].append((pk, lease))
        cursor = dict.fromkeys((pk for pk, _ in running), 0)  # each lease's next minute
        while len(rows) < n:
            # A round: per operator, its leases with ``minutes`` more minutes to report, K at a time, each
            # reporting its next ``minutes``; then the next round, until enough rows.
            added = False
            for leases in by_operator.values():
                ready = [(pk, lease) for pk, lease in leases if row(pk, lease, cursor[pk] + minutes - 1)]
                for first in range(0, len(ready) - leases_per_batch + 1, leases_per_batch):
                    for pk, lease in ready[first : first + leases_per_batch]:
                        rows += [row(pk, lease, s) for s in range(cursor[pk], cursor[pk] + minutes)]  # type: ignore[misc]
                        cursor[pk] += minutes
                    added = True
                    if len(rows) >= n:
                        return rows[:n]
            if not added:
                raise RuntimeError(
                    f"the running leases hold only {len(rows)} records in batches of this shape"
                )
        return rows
    step = 0
    while len(rows) < n:
        added = False
        for pk, lease in running:
            r = row(pk, lease, step)
            if r is None:
                continue
            rows.append(r)
            added = True
            if len(rows) == n:
                break
        if not added:
            raise RuntimeError(f"the running leases hold only {len(rows)} minutes of usage")
        step += 1
    return rows


def usage_batches(rows: Sequence[UsageRow]) -> list[tuple[str, list[UsageRow]]]:
    """The rows in batches of USAGE_BATCH, each of one operator's records in their order, shuffled."""
    by_operator: dict[str, list[UsageRow]] = defaultdict(list)
    for r in rows:
        by_operator[r.operator].append(r)
    batches = []
    for operator, records in by_operator.items():
        for i in range(0, len(records), USAGE_BATCH):
            batches.append((operator, records[i : i + USAGE_BATCH]))
    random.Random(7).shuffle(batches)
    return batches


def usage_body(records: Sequence[UsageRow]) -> bytes:
    def iso(value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    return json.dumps(
        {
            "records": [
                {
                    "lease": r.lease_id,
                    "idempotency_key": r.key,
                    "start_at": iso(r.start),
                    "end_at": iso(r.end),
                    "cards": r.cards,
                }
                for r in records
            ]
        }
    ).encode()


def usage_copy_baseline(market: Market, rows: Sequence[UsageRow]) -> float:
    """COPY the same rows (what metering would store for them) into metering_usagerecord; time; truncate."""
    from django.db import connection
    from django.utils import timezone

    from metering.services.usage import epoch_seconds, usage_body_hash

    with Timer() as timer:
        now = timezone.now()
        with (
            connection.cursor() as cursor,
            cursor.copy(
                "COPY metering_usagerecord (operator_id, cluster_id, buyer_id, cards, start_at, end_at, "
                "price_card_id, idempotency_key, reference, body_hash, received_at) FROM STDIN"
            ) as copy,
        ):
            for r in rows:
                lease = market.leases[r.lease_id - 1]
                cluster_id = market.island_cluster[lease.island] + 1
                reference = f"lease:{r.lease_id}"
                copy.write_row(
                    (
                        market.operator_ids[r.operator],
                        cluster_id,
                        lease.buyer_id,
                        r.cards,
                        r.start,
                        r.end,
                        cluster_id,
                        r.key,
                        reference,
                        usage_body_hash(
                            cluster_id=cluster_id,
                            buyer_id=lease.buyer_id,
                            cards=r.cards,
                            start=epoch_seconds(r.start),
                            end=epoch_seconds(r.end),
                            price_card_id=cluster_id,
                            reference=reference,
                        ),
                        now,
                    )
                )
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE metering_usagerecord CASCADE")
        cursor.execute("VACUUM ANALYZE metering_usagerecord")
    return timer.seconds


# --- Main ---------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.broker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--islands", type=int, default=100_000, help="in all (an equal number per cluster)")
    parser.add_argument("--leases", type=int, default=100_000)
    parser.add_argument("--operators", type=int, default=100)
    parser.add_argument("--buyers", type=int, default=100, help="buyers holding the existing leases")
    parser.add_argument("--jobs", type=int, default=200, help="distinct jobs the quotes cycle over")
    parser.add_argument("--duration-hours", type=int, default=8, help="run length of the quoted job")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--quotes", type=int, default=6_000, help="timed quotes (run at least ~20 s)")
    parser.add_argument("--min-seconds", type=float, default=20.0, help="repeat the quotes until this long")
    parser.add_argument("--concurrency", type=int, default=4, help="quote clients (closed loop)")
    parser.add_argument(
        "--single-quotes", type=int, default=500, help="quotes from one client (unloaded latency)"
    )
    parser.add_argument("--matcher-calls", type=int, default=2_000, help="in-process placements_find calls")
    parser.add_argument(
        "--healthz", type=int, default=3_000, help="GET /healthz requests of the same-server baseline"
    )
    parser.add_argument("--records", type=int, default=200_000, help="usage records over REST")
    parser.add_argument("--usage-concurrency", type=int, default=4)
    parser.add_argument(
        "--usage-leases-per-batch",
        type=int,
        default=10,
        help="leases each usage batch names (USAGE_BATCH / N minutes of each): the same shape at every market "
        "size; 0: round robin over all the operator's running leases (more per batch the larger the market)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=PRODUCTION_WORKERS,
        help=f"web server processes (default {PRODUCTION_WORKERS}: the production default, one more than the cores)",
    )
    parser.add_argument(
        "--catalog-ttl", type=float, default=5.0, help="the servers' catalogue TTL (production 5)"
    )
    add_server_env_argument(parser)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--database-url", help="an empty PostgreSQL database to use (not dropped)")
    parser.add_argument("--keep", action="store_true", help="do not drop the database created for the run")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--port",
        type=int,
        help="the servers' port (else a free one the kernel picks, from its ephemeral range): a fixed port keeps "
        "a run inside the range a shared machine gives it",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="reuse the market a previous run left in --database-url (kept with --keep or given): no set-up; "
        "quotes only, or with --only usage the usage part (the usage stored by earlier runs removed first)",
    )
    parser.add_argument(
        "--only",
        choices=("quotes", "usage"),
        help="run one part: the quotes (with the breakdown) or the usage over REST; both by default",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.clusters, args.islands, args.leases, args.operators, args.buyers = 500, 5_000, 5_000, 20, 20
        args.quotes, args.warmup, args.min_seconds, args.matcher_calls, args.records = (
            1_000,
            50,
            5.0,
            300,
            20_000,
        )
        args.jobs = 50
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="No directory at")
    print("Cardhour broker benchmark")
    print(f"command: python -m benchmarks.broker {' '.join(argv)}".rstrip())
    print(f"machine: {machine_description()}")
    database = (
        BenchDatabase.existing(args.database_url)
        if args.database_url
        else BenchDatabase.create(name=BENCH_DATABASE)
    )
    return run_on_database(database, lambda db: run(args, db), keep=args.keep)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def run(args: argparse.Namespace, database: BenchDatabase) -> list[str]:
    errors: list[str] = []
    started = time.perf_counter()
    print(f"database: {database.url} (PostgreSQL {database.server_version()})")
    django_setup(database_url=database.url, conn_max_age=600)
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = args.catalog_ttl
    if args.reuse and args.only == "usage":
        market = reused_usage_market()
    elif args.reuse:
        args.only = "quotes"
        market = reused_market()
    else:
        market = build_market(args, database.url)
        errors += check_market(market)
    setup_s = time.perf_counter() - started

    servers = ProductionServers(
        workers=args.workers,
        database_url=database.url,
        extra={"CARDHOUR_BROKER_CATALOG_TTL_SECONDS": str(args.catalog_ttl), **dict(args.server_env)},
        port=args.port,
    )
    server_pids = [p.pid for p in servers.processes]

    def server_processes() -> list[int]:
        """The master and its workers now: with --server-env GUNICORN_MAX_REQUESTS the workers change."""
        return [p.pid for p in servers.processes]

    client = JsonClient(host=servers.host, ports=servers.ports)
    try:
        if args.only != "usage":
            with Timer() as jobs_timer:
                job_ids = create_jobs(
                    client,
                    token=market.quote_buyer_token,
                    n=args.jobs,
                    duration_hours=args.duration_hours,
                    seed=args.seed,
                )
            # The first quote of each server loads the catalogue and the hold book.
            cold = []
            with CpuSampler(server_pids=server_processes, database=database.name) as cold_cpu:
                for port in servers.ports:
                    one = run_closed_loop(
                        requests=quote_requests(job_ids, 1, market.quote_buyer_token),
                        host=servers.host,
                        ports=[port],
                        concurrency=1,
                        check=quoted,
                    )
                    errors += one.errors
                    cold.append(one.latency_s[0])
            rss_after_load = [process_rss_mb(pid) for pid in server_pids]
            print(
                "first quote per server (catalogue + hold book load): "
                + ", ".join(f"{x:.2f} s" for x in cold)
                + f" (CPU: servers {cold_cpu.seconds('server'):.2f} s, PostgreSQL {cold_cpu.seconds('postgres'):.2f} s)"
                + "; server RSS after it: "
                + ", ".join(f"{x:.0f} MiB" for x in rss_after_load),
                flush=True,
            )
            warm = run_closed_loop(
                requests=quote_requests(job_ids, args.warmup, market.quote_buyer_token, offset=1),
                host=servers.host,
                ports=servers.ports,
                concurrency=args.concurrency,
                check=quoted,
            )
            errors += warm.errors
            # One client alone: the latency without queueing, and the CPU a quote costs when nothing
            # else runs beside it (against the closed loop's: what the concurrency itself costs).
            with CpuSampler(server_pids=server_processes, database=database.name) as single_cpu:
                single = run_closed_loop(
                    requests=quote_requests(job_ids, args.single_quotes, market.quote_buyer_token, offset=2),
                    host=servers.host,
                    ports=servers.ports,
                    concurrency=1,
                    check=quoted,
                )
            errors += single.errors
            latencies: list[float] = []
            done_at: list[float] = []
            wall = 0.0
            rounds = 0
            with CpuSampler(server_pids=server_processes, database=database.name) as quote_cpu:
                while wall < args.min_seconds or rounds == 0:
                    result = run_closed_loop(
                        requests=quote_requests(
                            job_ids, args.quotes, market.quote_buyer_token, offset=rounds
                        ),
                        host=servers.host,
                        ports=servers.ports,
                        concurrency=args.concurrency,
                        check=quoted,
                    )
                    errors += result.errors[:20]
                    latencies += result.latency_s
                    done_at += [wall + t for t in result.done_at_s]
                    wall += result.wall_s
                    rounds += 1
            print(f"quotes: {len(latencies):,} in {wall:.1f} s ({rounds} round(s))", flush=True)
            # The same-run baseline: GET /healthz (no authentication, no SQL) from the same clients.
            with CpuSampler(server_pids=server_processes, database=database.name) as healthz_cpu:
                healthz = run_closed_loop(
                    requests=[HttpRequest("GET", "/healthz", {})] * args.healthz,
                    host=servers.host,
                    ports=servers.ports,
                    concurrency=args.concurrency,
                )
            errors += healthz.errors[:20]

        if args.only != "quotes":
            # Usage over REST against the running leases.
            now = timezone.now().replace(microsecond=0)
            rows = usage_rows(market, n=args.records, now=now, leases_per_batch=args.usage_leases_per_batch)
            with CpuSampler(database=database.name) as copy_cpu:
                copy_s = usage_copy_baseline(market, rows)
            batches = usage_batches(rows)
            requests = [
                HttpRequest(
                    "POST",
                    "/api/v1/operator/usage",
                    {
                        "Authorization": f"Bearer {market.operator_tokens[op]}",
                        "Content-Type": "application/json",
                    },
                    usage_body(records),
                )
                for op, records in batches
            ]

            def stored(index: int, status: int, body: bytes) -> str | None:
                if status != 201:
                    return f"usage batch {index}: HTTP {status} {body[:300]!r}"
                created = json.loads(body)["created"]
                return (
                    None if created == len(batches[index][1]) else f"usage batch {index}: {created} created"
                )

            # Warm each worker's usage path (imports, URL resolution, the body's validator) outside the timed
            # part, as the quotes do when both parts run: an empty batch is refused with 400 and writes nothing.
            if args.only == "usage":
                warm_token = market.operator_tokens[batches[0][0]]
                for port in servers.ports:
                    warmed = run_closed_loop(
                        requests=[
                            HttpRequest(
                                "POST",
                                "/api/v1/operator/usage",
                                {"Authorization": f"Bearer {warm_token}", "Content-Type": "application/json"},
                                b'{"records": []}',
                            )
                        ]
                        * 4,
                        host=servers.host,
                        ports=[port],
                        concurrency=1,
                        check=lambda i, status, body: (
                            None if status == 400 else f"usage warm-up: HTTP {status}"
                        ),
                    )
                    errors += warmed.errors
            with CpuSampler(server_pids=server_processes, database=database.name) as usage_cpu:
                usage = run_closed_loop(
                    requests=requests,
                    host=servers.host,
                    ports=servers.ports,
                    concurrency=args.usage_concurrency,
                    check=stored,
                )
            errors += usage.errors[:20]
            again = max(range(len(batches)), key=lambda i: len(batches[i][1]))
            replay = run_closed_loop(
                requests=[requests[again]],
                host=servers.host,
                ports=servers.ports,
                concurrency=1,
                check=lambda i, status, body: (
                    None
                    if status == 200 and json.loads(body)["duplicates"] == len(batches[again][1])
                    else f"replayed batch: HTTP {status} {body[:300]!r}"
                ),
            )
            errors += replay.errors
    finally:
        servers.stop(keep_log=bool(errors))
        if errors:
            errors.append(f"server log: {servers.log_path}")
    if args.only != "quotes":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM metering_usagerecord")
            stored_count = cursor.fetchone()[0]
        if stored_count != len(rows):
            errors.append(f"{stored_count} usage records stored, {len(rows)} sent")

    if args.only != "usage":
        matcher, matcher_first, feasible = matcher_in_process(job_ids, args.matcher_calls)
        service = sorted(service_in_process(job_ids, args.matcher_calls // 2))
        affordability = affordability_in_process(max(args.matcher_calls // 10, 10))
    # --- Report ----------------------------------------------------------------------------------------------------
    if args.only != "usage":
        ordered = sorted(latencies)
        quote_cpu_s = (quote_cpu.seconds("server") + quote_cpu.seconds("postgres")) / len(latencies)
        # Each worker refreshes the catalogue about once a TTL while quotes arrive (broker.catalog): a cost per
        # second, not per quote, so at a few quotes a second (a shared machine) it dominates the per-quote
        # figure. Its server side is estimated from a refresh timed in this process.
        whole_cpu_s, reload_cpu_s = catalogue_load_cpu_s()
        reload_per_quote_s = reload_cpu_s * args.workers * (wall / args.catalog_ttl) / len(latencies)
        quote_net_s = max(quote_cpu.seconds("server") / len(latencies) - reload_per_quote_s, 0.0)
        p50, p99, p999 = (percentile(ordered, p) for p in (50, 99, 99.9))
        rate = len(latencies) / wall
        quote_server_ms = quote_cpu.seconds("server") / len(latencies) * 1000
        healthz_server_ms = healthz_cpu.seconds("server") / max(len(healthz.latency_s), 1) * 1000
        windows = windowed_rates(done_at)
        islands = len(market.island_cards)
        print_table(
            f"Quote latency over HTTP: POST /api/v1/jobs/<id>/quotes, 8 cards, island gang, any chip, 48-hour window, "
            f"{args.duration_hours} h run; {args.concurrency} clients, {args.workers} workers",
            ["figure", "value"],
            [
                [
                    "market",
                    f"{len(market.fleet):,} clusters, {islands:,} islands, {len(market.leases):,} leases",
                ],
                ["quotes timed", f"{len(latencies):,} over {wall:.1f} s (after {args.warmup} warm-up)"],
                ["p50 / p90 ms", f"{ms(p50)} / {ms(percentile(ordered, 90))}"],
                ["p99 / p99.9 / max ms", f"{ms(p99)} / {ms(p999)} / {ms(ordered[-1])}"],
                ["quotes per second (sustained)", f"{rate:,.0f}"],
                [
                    f"one client alone ({len(single.latency_s):,} quotes): p50 / p99 ms, quotes/s",
                    f"{ms(percentile(sorted(single.latency_s), 50))} / {ms(percentile(sorted(single.latency_s), 99))}, "
                    f"{len(single.latency_s) / single.wall_s:,.0f}",
                ],
                [
                    "one client alone: CPU ms per quote, servers / PostgreSQL",
                    f"{single_cpu.seconds('server') / max(len(single.latency_s), 1) * 1000:.2f} / "
                    f"{single_cpu.seconds('postgres') / max(len(single.latency_s), 1) * 1000:.2f}",
                ],
                ["quotes per second in 10 slices (min / median / max)", spread(windows) if windows else "—"],
                [
                    "CPU ms per quote: servers / PostgreSQL / clients",
                    f"{quote_cpu.seconds('server') / len(latencies) * 1000:.2f} / "
                    f"{quote_cpu.seconds('postgres') / len(latencies) * 1000:.2f} / "
                    f"{quote_cpu.own_seconds / len(latencies) * 1000:.2f}",
                ],
                [
                    "catalogue refresh (while quoting, every TTL in each worker; nothing written since): CPU ms "
                    "in this process, against a whole read; its share per quote at this run's rate / at 200 quotes/s",
                    f"{reload_cpu_s * 1000:.1f} (whole read {whole_cpu_s * 1000:.0f}); {reload_per_quote_s * 1000:.3f} / "
                    f"{reload_cpu_s * args.workers / args.catalog_ttl / QUOTE_RATE_TARGET * 1000:.3f}",
                ],
                [
                    "servers' CPU ms per quote without the catalogue reloads (what a quote itself costs)",
                    f"{quote_net_s * 1000:.2f}",
                ],
                [
                    "first quote per server (catalogue load): wall; CPU servers + PostgreSQL",
                    ", ".join(f"{x * 1000:,.0f} ms" for x in cold)
                    + f"; {(cold_cpu.seconds('server') + cold_cpu.seconds('postgres')) * 1000:,.0f} ms",
                ],
                ["jobs submitted (POST /jobs)", f"{args.jobs} in {jobs_timer.seconds:.1f} s"],
                [
                    f"baseline: GET /healthz × {len(healthz.latency_s):,}, same server and clients: p50 / p99 ms; "
                    "server CPU ms per request",
                    f"{ms(percentile(sorted(healthz.latency_s), 50))} / "
                    f"{ms(percentile(sorted(healthz.latency_s), 99))}; {healthz_server_ms:.2f} "
                    f"(a quote costs {quote_server_ms / max(healthz_server_ms, 1e-9):.0f}× a /healthz)",
                ],
            ],
        )
        m = sorted(matcher)
        print_table(
            "Breakdown, in this process (one caller, no HTTP): the matcher (broker.services.quotes.placements_find) "
            "and the quote service",
            ["figure", "value"],
            [
                ["calls", f"{len(matcher):,} (first call, loading the catalogue: {matcher_first:.2f} s)"],
                ["p50 / p99 / max ms", f"{ms(percentile(m, 50))} / {ms(percentile(m, 99))} / {ms(m[-1])}"],
                ["matcher CPU ms per call", f"{MATCHER_CPU_S[-1] * 1000:.2f}"],
                *(
                    [
                        f"affordability (buyer_packs_after_leases), {label}, {live:,} live leases: CPU ms per call",
                        f"{cpu_s * 1000:.2f}",
                    ]
                    for label, live, cpu_s in affordability
                ),
                [
                    f"quote_create (matcher + affordability + 10 Quote rows), {len(service):,} calls: p50 / p99 ms",
                    f"{ms(percentile(service, 50))} / {ms(percentile(service, 99))}",
                ],
                [
                    "feasible islands per call (min / median / max)",
                    f"{min(feasible):,} / {sorted(feasible)[len(feasible) // 2]:,} / {max(feasible):,}",
                ],
                ["this process's peak RSS", f"{peak_rss_mb():.0f} MiB"],
            ],
        )
    if args.only != "quotes":
        usage_rate = len(rows) / usage.wall_s
        copy_rate = len(rows) / copy_s
        u = sorted(usage.latency_s)
        named = sorted(len({r.lease_id for r in records}) for _, records in batches)
        print_table(
            f"Usage over REST: POST /api/v1/operator/usage, batches of {USAGE_BATCH:,} one-minute records against "
            f"running leases, {args.usage_concurrency} clients; leases a batch names: min {named[0]}, median "
            f"{named[len(named) // 2]}, max {named[-1]} ("
            + (
                f"--usage-leases-per-batch {args.usage_leases_per_batch}: the same at every market size)"
                if args.usage_leases_per_batch
                else "round robin over each operator's running leases: more the larger the market)"
            ),
            ["path", "records", "seconds", "records/s", "vs COPY"],
            [
                ["COPY baseline (same rows, metering_usagerecord)", f"{len(rows):,}", f"{copy_s:.2f}",
                 f"{copy_rate:,.0f}", "1.00×"],
                ["REST API", f"{len(rows):,}", f"{usage.wall_s:.2f}", f"{usage_rate:,.0f}",
                 f"{usage_rate / copy_rate:.2f}×"],
            ],
        )  # fmt: skip
        print(
            f"usage batch latency p50 {ms(percentile(u, 50))} ms, p99 {ms(percentile(u, 99))} ms; CPU ms per 1,000 "
            f"records: servers {usage_cpu.seconds('server') / len(rows) * 1e6:.1f}, PostgreSQL "
            f"{usage_cpu.seconds('postgres') / len(rows) * 1e6:.1f}; replayed batch: all {len(batches[again][1]):,} "
            f"duplicates in {replay.latency_s[0] * 1000:.0f} ms; stored {stored_count:,} of {len(rows):,}"
        )
        print(
            f"CPU µs per record: REST {(usage_cpu.seconds('server') + usage_cpu.seconds('postgres')) / len(rows) * 1e6:.1f}"
            f" (servers + PostgreSQL); COPY {(copy_cpu.own_seconds + copy_cpu.seconds('postgres')) / len(rows) * 1e6:.1f}"
            " (this process + PostgreSQL)"
        )
    rss = servers.peak_rss_mb
    print(
        "peak RSS (VmHWM) of the server processes: "
        + ", ".join("?" if math.isnan(x) else f"{x:.0f} MiB" for x in rss)
        + (
            f"; after loading the catalogue: {', '.join(f'{x:.0f} MiB' for x in rss_after_load)}"
            if args.only != "usage"
            else ""
        )
    )
    print(
        f"machine at the end: {machine_description()}; whole run {time.perf_counter() - started:.0f} s (set-up {setup_s:.0f} s)"
    )
    results = []
    if args.only != "usage":
        results += [
            [f"quote p99 ≤ {QUOTE_P99_TARGET_S * 1000:.0f} ms", f"{ms(p99)} ms", verdict(p99 <= QUOTE_P99_TARGET_S)],
            [f"≥ {QUOTE_RATE_TARGET} quotes/s", f"{rate:,.0f} /s", verdict(rate >= QUOTE_RATE_TARGET)],
            [f"CPU per quote (servers + PostgreSQL) ≤ {QUOTE_CPU_TARGET_S * 1000:.0f} ms",
             f"{quote_cpu_s * 1000:.2f} ms", verdict(quote_cpu_s <= QUOTE_CPU_TARGET_S)],
            ["CPU per quote without catalogue reloads (servers + PostgreSQL) ≤ 10 ms",
             f"{(quote_net_s + quote_cpu.seconds('postgres') / len(latencies)) * 1000:.2f} ms",
             verdict(quote_net_s + quote_cpu.seconds("postgres") / len(latencies) <= QUOTE_CPU_TARGET_S)],
            [f"first quote of a new server ≤ {FIRST_QUOTE_TARGET_S:.0f} s", f"{max(cold) * 1000:,.0f} ms",
             verdict(max(cold) <= FIRST_QUOTE_TARGET_S)],
        ]  # fmt: skip
    if args.only != "quotes":
        results += [
            [f"usage over REST ≥ {USAGE_RATE_TARGET:,} records/s", f"{usage_rate:,.0f} /s",
             verdict(usage_rate >= USAGE_RATE_TARGET)],
        ]  # fmt: skip
    print_table("Results", ["target", "measured", ""], results)
    return errors


def process_rss_mb(pid: int) -> float:
    """Current resident memory (VmRSS) of a live process, or NaN."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


if __name__ == "__main__":
    sys.exit(main())
