"""Metering at design size: ingest usage records through the batch service and rate them, on PostgreSQL.

    python -m benchmarks.metering                   # 1,000,000 records (100 batches of 10,000)
    python -m benchmarks.metering --records 100000  # a quick check

What it does, in order:

1. Creates a throwaway database (``cardhour_bench_metering``; or ``--database-url``), migrates it, and sets
   up ``--operators`` operators with ``--clusters`` clusters (A800, H800, Ascend 910B) priced on the
   Guangdong, Ningxia and flat presets, and ``--buyers`` buyers holding paid packs (chip packs and
   standard-card packs; about one buyer in ten runs out, so arrears and exhaustion flags are exercised).
2. Generates the records: each buyer reports its lease every 15 minutes (more often when that would not
   fit; cards from a fixed-seed mix), over the last ~30 days, so records cross band edges and local midnights like real usage.
3. Baseline: the same rows written with raw PostgreSQL ``COPY`` into ``metering_usagerecord`` (timed, then
   truncated) — the physical floor of writing these rows to this table with its indexes.
4. Ingest: the records go through ``metering.services.usage.usage_record_create_batch`` from
   ``--ingest-threads`` threads at once (default 2, each its own connection; 1 sends one batch after
   another), in batches of 10,000 — validation, dedup against the unique (operator, key) index, set-based
   insert — in this process.
5. Replay: one batch sent again must answer ``duplicate`` for every record (timed too).
6. Rating: ``--rating-workers`` separate worker processes (default 1; more as the minute's rating fans out
   over ``CARDHOUR_RATING_SHARDS``; ``python -m benchmarks.metering --rate DATABASE_URL --shard K``) each run
   ``metering.services.rating.usage_rate_pending`` on their part of the buyers (``rating.Shard``) until
   nothing is left, at the same time; the rating's wall time runs from the first one's start to the last
   one's end, and the peak RSS is the largest worker's. CPU is measured beside wall time: each worker
   process's and its own PostgreSQL backend's (from /proc), summed, per record; WAL writer, checkpointer
   and autovacuum are not counted (nor are they for the baseline). ``--rating-workers 1`` is one worker
   rating everything.
7. Baseline for rating: the segments it wrote, COPYed again into a table like ``metering_ratedsegment``
   (same indexes), timed with the same CPU accounting — the floor of writing those rows.
8. Checks: every record rated once, Σ of every ledger unit zero, segments' card-seconds = records', and
   the reconciliation task (metering.services.maintenance.ledger_reconcile) finds no breach.

9. With ``--preload-rows N`` (issue 14 item 4, partitioned history): after all of the above (the *empty*
   measurement), N usage records with their keys and one segment each are written straight into past months
   (``INSERT … SELECT generate_series`` into tables attached as monthly partitions, indexes built once),
   then a second record set of the same shape is ingested and rated the same way (the *loaded*
   measurement). Prints both, CPU per record first, and PASS when the loaded ingest and rating rates and
   CPU per record are within 20 % of the empty ones. The ledger reconciliation runs on the empty
   measurement only (preloaded rows have no ledger behind them); the loaded one checks nothing is left
   unrated, every unit sums to zero and the measured records' card-seconds equal their segments'.

Targets (the metering issue): ingest ≥ 20,000 records/s and ≥ 0.5× the same-run COPY, rating ≥ 50,000
records/s and ≤ 40 µs of CPU per record (worker + PostgreSQL), worker peak RSS < 1 GiB. Prints PASS/MISS for each. Exits non-zero only on errors (wrong answers, missing rows), never on a miss.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from benchmarks._common import (
    PROJECT_ROOT,
    BenchDatabase,
    CpuSampler,
    Timer,
    django_environment,
    django_setup,
    machine_description,
    peak_rss_mb,
    print_table,
    process_peak_rss_mb,
)

BENCH_DATABASE = "cardhour_bench_metering"
BATCH = 10_000
REPORT_SECONDS = 900
CHIPS = ("nvidia-a800-sxm4-80gb", "nvidia-h800-sxm5-80gb", "huawei-ascend-910b3")
TARIFFS = ("cn-gd", "cn-nx", "flat")
CARD_MIX = (1, 2, 4, 8, 8, 8, 16, 16, 32, 64)

INGEST_TARGET = 20_000
RATING_TARGET = 50_000
RATING_CPU_TARGET_US = 40  # worker + PostgreSQL CPU per record: 50,000 records/s on 2 cores
RSS_TARGET_MB = 1024


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--operators", type=int, default=5)
    parser.add_argument("--clusters", type=int, default=30)
    parser.add_argument("--buyers", type=int, default=200)
    parser.add_argument("--rating-batch", type=int, default=20_000)
    parser.add_argument(
        "--database-url", help="use this PostgreSQL database (not dropped) instead of a new one"
    )
    parser.add_argument("--keep", action="store_true", help="do not drop the database created for the run")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--no-rating", action="store_true", help="ingest only (COPY baseline, ingest, replay)"
    )
    parser.add_argument(
        "--ingest-threads",
        type=int,
        default=2,
        help="threads calling the batch service at once, each with its own database connection, taking the "
        "next batch when done (operators' agents report concurrently); 1: one batch after another",
    )
    parser.add_argument(
        "--rating-workers",
        type=int,
        default=1,
        help="rating worker processes, each rating one part of the buyers (rating.Shard), as the minute's "
        "rating fans out over CARDHOUR_RATING_SHARDS; 1: one worker rates everything",
    )
    parser.add_argument(
        "--preload-rows",
        type=int,
        default=0,
        help="then write this many records (+ keys, + a segment each) into past months and measure again",
    )
    parser.add_argument(
        "--preload-months", type=int, default=6, help="spread the preloaded rows over this many past months"
    )
    parser.add_argument("--rate", metavar="DATABASE_URL", help=argparse.SUPPRESS)  # the worker process
    parser.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)  # the worker's part
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.rate:
        return rate_worker(
            args.rate, batch_size=args.rating_batch, shard=args.shard, shards=args.rating_workers
        )
    database = (
        BenchDatabase.existing(args.database_url)
        if args.database_url
        else BenchDatabase.create(name=BENCH_DATABASE)
    )
    try:
        return run(args, database)
    finally:
        if not args.keep:
            database.drop()


# --- The world ------------------------------------------------------------------------------------------


def setup_world(
    args: argparse.Namespace, rng: random.Random
) -> tuple[list[tuple[Any, list[Any]]], list[Any]]:
    """Operators with priced clusters; buyers with paid packs. Returns [(operator, clusters)], buyers."""
    from django.utils import timezone

    from core.models import Organisation
    from core.types import Actor
    from federation.services import cluster_register
    from federation.types import IslandSpec
    from metering.models import PackOrder, PackProduct, Tariff
    from metering.services.packs import pack_issue
    from metering.services.tariffs import price_card_set

    operators = []
    for o in range(args.operators):
        operator = Organisation.objects.create(slug=f"op{o:02d}", name=f"Operator {o}", is_operator=True)
        actor = Actor(organisation=operator, system_label="bench")
        clusters = []
        for c in range(o, args.clusters, args.operators):
            chip = CHIPS[c % len(CHIPS)]
            cluster = cluster_register(
                actor=actor,
                operator=operator,
                cpi=f"cpi:{operator.slug}:nx:c{c:03d}",
                site="Zhongwei",
                accelerator_slug=chip,
                islands=[IslandSpec(name="isl-01", cards=1024, fabric="infiniband")],
                endpoint_url="",
            )
            tariff = Tariff.objects.get(code=TARIFFS[c % len(TARIFFS)], owner__isnull=True)
            price_card_set(
                cluster=cluster,
                rate_per_card_hour=Decimal(rng.choice(["6.5000", "8.0000", "9.2500", "12.0000"])),
                tariff=tariff,
                effective_from=None,
                actor=actor,
            )
            clusters.append(cluster)
        operators.append((operator, clusters))

    buyers = []
    paid_at = timezone.now() - timedelta(days=40)
    for b in range(args.buyers):
        buyer = Organisation.objects.create(slug=f"buyer{b:04d}", name=f"Buyer {b}", is_buyer=True)
        buyers.append(buyer)
        starved = b % 10 == 9
        for chip in (None, *CHIPS):
            card_hours = 50 if starved else 40_000
            product, _ = PackProduct.objects.get_or_create(
                code=f"{chip or 'std'}-{card_hours}",
                defaults={
                    "name": f"{chip or 'std'} {card_hours}",
                    "card_hours": card_hours,
                    "price": card_hours * 9,
                    "accelerator": None if chip is None else _accelerator(chip),
                },
            )
            order = PackOrder.objects.create(
                buyer=buyer,
                product=product,
                accelerator=None if chip is None else _accelerator(chip),
                card_hours=card_hours,
                amount=card_hours * 9,
                validity_days=365,
                idempotency_key=f"bench-{chip}",
            )
            pack_issue(order=order, paid_at=paid_at, posted_by="bench")
    return operators, buyers


def _accelerator(slug: str) -> Any:
    from federation.models import Accelerator

    return Accelerator.objects.get(slug=slug)


def generate(
    args: argparse.Namespace,
    rng: random.Random,
    operators: list[tuple[Any, list[Any]]],
    buyers: list[Any],
    key_prefix: str = "",
) -> Iterator[tuple[Any, list[Any]]]:
    """Yield (operator, batch of UsageRecordInput), batches of at most 10,000 of one operator."""
    from django.utils import timezone

    from metering.types import UsageRecordInput

    now = timezone.now().replace(microsecond=0)
    per_buyer = -(-args.records // len(buyers))
    # Reports every 15 minutes, or more often when that many would not fit the last 29 days (the usage
    # service refuses usage in the future or older than its late window).
    interval = max(60, min(REPORT_SECONDS, int(timedelta(days=29).total_seconds()) // per_buyer))
    span = timedelta(seconds=per_buyer * interval)
    earliest = now - timedelta(days=30)
    assignments = []  # (buyer, operator, cluster, cards, first start)
    for buyer in buyers:
        operator, clusters = operators[rng.randrange(len(operators))]
        cluster = clusters[rng.randrange(len(clusters))]
        offset = rng.randrange(max(int((now - earliest - span).total_seconds()), 1))
        assignments.append(
            (buyer, operator, cluster, rng.choice(CARD_MIX), earliest + timedelta(seconds=offset))
        )

    produced = 0
    pending: dict[int, list[Any]] = {}
    for step in range(per_buyer):
        for buyer, operator, cluster, cards, first in assignments:
            if produced == args.records:
                break
            start = first + timedelta(seconds=step * interval)
            record = UsageRecordInput(
                idempotency_key=f"{key_prefix}{buyer.slug}-{step}",
                cluster=cluster.cpi,
                buyer=buyer.slug,
                cards=cards,
                start_at=start,
                end_at=start + timedelta(seconds=interval),
                price_card_version=1,
                reference=f"lease:{buyer.pk}",
            )
            produced += 1
            batch = pending.setdefault(operator.pk, [])
            batch.append(record)
            if len(batch) == BATCH:
                yield operator, batch
                pending[operator.pk] = []
    by_pk = {operator.pk: operator for operator, _ in operators}
    for operator_pk, batch in pending.items():
        if batch:
            yield by_pk[operator_pk], batch


# --- The run --------------------------------------------------------------------------------------------


def input_freeze() -> None:
    """Leave the records generated so far out of the collector's full collections. They are this
    benchmark's input, held for the whole run (~750 MiB at a million), and each full collection inside the
    timed ingest walked them all: CPU of this process that no server spends, since a server never holds
    them (13.3 → 6.4 µs per record)."""
    gc.collect()
    gc.freeze()


@dataclass
class Ingested:
    created: int
    wrong: str | None  # the first wrong answer; None when every batch answered ``created``
    release: Callable[[], None]  # lets the threads close their connections


def ingest_batches(batches: list[tuple[Any, list[Any]]], *, threads: int) -> Ingested:
    """Send every batch through ``usage_record_create_batch`` from ``threads`` threads, each with its own
    database connection, each taking the next batch when it is done (operators' agents report at once).
    Returns when every batch is answered; the connections stay open until ``release()``, so a CPU sampler
    around the call counts their backends' whole CPU (a backend that exits takes its last half-second
    with it)."""
    from django.db import connection

    from metering.services.usage import usage_record_create_batch

    pending = iter(list(batches))
    lock = threading.Lock()
    created = [0] * threads
    wrong: list[str] = []
    finished = threading.Barrier(threads + 1)
    released = threading.Event()

    def work(slot: int) -> None:
        try:
            while not wrong:
                with lock:
                    item = next(pending, None)
                if item is None:
                    break
                operator, batch = item
                result = usage_record_create_batch(operator=operator, records=batch)
                created[slot] += result.created
                if result.created != len(batch):
                    wrong.append(
                        f"batch answered {result.duplicates} duplicates, {result.conflicts} conflicts"
                    )
        except Exception as exc:  # reported by the caller as a wrong answer
            wrong.append(repr(exc))
        finally:
            finished.wait()
            released.wait()
            connection.close()

    for slot in range(threads):
        threading.Thread(target=work, args=(slot,), daemon=True).start()
    finished.wait()
    return Ingested(created=sum(created), wrong=wrong[0] if wrong else None, release=released.set)


def copy_baseline(batches: list[tuple[Any, list[Any]]]) -> tuple[float, int]:
    """COPY the same rows (what the service would store) into metering_usagerecord; time it; truncate."""
    from django.db import connection
    from django.utils import timezone

    from core.models import Organisation
    from federation.models import Cluster
    from metering.models import PriceCard
    from metering.services.usage import epoch_seconds, usage_body_hash

    clusters = dict(Cluster.objects.values_list("cpi", "id"))
    buyers = dict(Organisation.objects.filter(is_buyer=True).values_list("slug", "id"))
    cards = dict(PriceCard.objects.filter(version=1).values_list("cluster_id", "id"))
    rows = []
    now = timezone.now()
    for operator, batch in batches:
        for r in batch:
            cluster_id = clusters[r.cluster]
            buyer_id = buyers[r.buyer]
            price_card_id = cards[cluster_id]
            body_hash = usage_body_hash(
                cluster_id=cluster_id,
                buyer_id=buyer_id,
                cards=r.cards,
                start=epoch_seconds(r.start_at),
                end=epoch_seconds(r.end_at),
                price_card_id=price_card_id,
                reference=r.reference,
            )
            rows.append(
                (
                    operator.pk,
                    cluster_id,
                    buyer_id,
                    r.cards,
                    r.start_at,
                    r.end_at,
                    price_card_id,
                    r.idempotency_key,
                    r.reference,
                    body_hash,
                    now,
                )
            )
    columns = (
        "operator_id, cluster_id, buyer_id, cards, start_at, end_at, price_card_id, idempotency_key, "
        "reference, body_hash, received_at"
    )
    with (
        Timer() as timer,
        connection.cursor() as cursor,
        cursor.copy(f"COPY metering_usagerecord ({columns}) FROM STDIN") as copy,
    ):
        for row in rows:
            copy.write_row(row)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE metering_usagerecord CASCADE")
    return timer.seconds, len(rows)


def run(args: argparse.Namespace, database: BenchDatabase) -> int:
    print(f"Cardhour metering benchmark — {machine_description()}")
    print(f"PostgreSQL {database.server_version()} at {database.name}; {args.records:,} records")
    with Timer() as setup:
        django_setup(database_url=database.url, conn_max_age=600)
        rng = random.Random(args.seed)
        operators, buyers = setup_world(args, rng)
        batches = list(generate(args, rng, operators, buyers))
    input_freeze()
    print(
        f"setup: {args.operators} operators, {args.clusters} clusters, {len(buyers)} buyers, "
        f"{len(batches)} batches ({setup.seconds:.1f} s)"
    )

    from django.db import connection

    from metering.models import LedgerEntry, RatedSegment, UsageRecord
    from metering.services.usage import usage_record_create_batch

    with CpuSampler(database=database.name) as copy_cpu:
        copy_seconds, copied = copy_baseline(batches)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE metering_usagerecord")

    ingest_profile = os.environ.get(
        "CARDHOUR_BENCH_PROFILE_INGEST"
    )  # a path for cProfile stats of the ingest (one thread: cProfile sees only the thread it runs in)
    threads = 1 if ingest_profile else args.ingest_threads
    if ingest_profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    with CpuSampler(database=database.name) as ingest_cpu, Timer() as ingest:
        ingested = ingest_batches(batches, threads=threads)
    ingested.release()
    created = ingested.created
    if ingested.wrong:
        print(f"ERROR: {ingested.wrong}")
        return 1
    if ingest_profile:
        profiler.disable()
        profiler.dump_stats(ingest_profile)
    ingest_rss = peak_rss_mb()

    replay_operator, replay_batch = batches[len(batches) // 2]
    with Timer() as replay:
        again = usage_record_create_batch(operator=replay_operator, records=replay_batch)
    if again.duplicates != len(replay_batch):
        print(f"ERROR: replay answered {again.created} created, {again.conflicts} conflicts")
        return 1
    # CPU per record: this process (Python) + the database's backends, each path in its own block. The COPY
    # figure includes preparing its rows (lookups and body hashes), as the service's includes validating.
    copy_us = (copy_cpu.own_seconds + copy_cpu.seconds("postgres")) / copied * 1e6
    ingest_us = (ingest_cpu.own_seconds + ingest_cpu.seconds("postgres")) / created * 1e6
    cpu_line = (
        f"CPU µs per record (this process + PostgreSQL): COPY {copy_us:.1f} "
        f"({copy_cpu.own_seconds / copied * 1e6:.1f} + {copy_cpu.seconds('postgres') / copied * 1e6:.1f}), "
        f"ingest {ingest_us:.1f} ({ingest_cpu.own_seconds / created * 1e6:.1f} + "
        f"{ingest_cpu.seconds('postgres') / created * 1e6:.1f}): {ingest_us / copy_us:.2f}× COPY's CPU"
    )
    if args.no_rating:
        copy_rate = copied / copy_seconds
        ingest_rate = created / ingest.seconds
        print_table(
            "Results (ingest only)",
            ["step", "records", "seconds", "records/s", "vs COPY", "target", ""],
            [
                ["COPY baseline (same rows, same table)", f"{copied:,}", f"{copy_seconds:.1f}",
                 f"{copy_rate:,.0f}", "1.00×", "", ""],
                ["ingest: usage_record_create_batch", f"{created:,}", f"{ingest.seconds:.1f}",
                 f"{ingest_rate:,.0f}", f"{ingest_rate / copy_rate:.2f}×", f"≥ {INGEST_TARGET:,} and ≥ 0.5×",
                 _verdict(ingest_rate >= INGEST_TARGET and ingest_rate >= 0.5 * copy_rate)],
                ["replay of one batch (all duplicates)", f"{len(replay_batch):,}", f"{replay.seconds:.2f}",
                 f"{len(replay_batch) / replay.seconds:,.0f}", "", "", ""],
            ],
        )  # fmt: skip
        print(cpu_line)
        return 0

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE metering_usagerecord")
    rated = rate_in_workers(args, database)
    if rated is None:
        return 1

    copy_segments = segment_copy_baseline(database.name)

    from django.db.models import Sum

    from metering.services.maintenance import ledger_reconcile

    reconciled = ledger_reconcile()
    unrated = UsageRecord.objects.unrated().count()
    units = {row["unit"]: row["t"] for row in LedgerEntry.objects.values("unit").annotate(t=Sum("amount"))}
    record_seconds = sum(
        r.cards * int((r.end_at - r.start_at).total_seconds()) for _, batch in batches for r in batch
    )
    segment_seconds = RatedSegment.objects.aggregate(s=Sum("card_seconds"))["s"]
    segments = RatedSegment.objects.count()
    ok = (
        unrated == 0
        and all(v == 0 for v in units.values())
        and segment_seconds == record_seconds
        and reconciled.ok
    )

    ingest_rate = created / ingest.seconds
    copy_rate = copied / copy_seconds
    rating_rate = rated["records"] / rated["seconds"]
    per_record = max(rated["records"], 1)
    worker_us = rated["worker_cpu"] / per_record * 1e6
    postgres_us = rated["postgres_cpu"] / per_record * 1e6
    rating_us = worker_us + postgres_us
    copy_us = (copy_segments["client_cpu"] + copy_segments["postgres_cpu"]) / per_record * 1e6
    print_table(
        "Results",
        ["step", "records", "seconds", "records/s", "vs COPY", "target", ""],
        [
            [
                "COPY baseline (same rows, same table)",
                f"{copied:,}",
                f"{copy_seconds:.1f}",
                f"{copy_rate:,.0f}",
                "1.00×",
                "",
                "",
            ],
            [
                "ingest: usage_record_create_batch",
                f"{created:,}",
                f"{ingest.seconds:.1f}",
                f"{ingest_rate:,.0f}",
                f"{ingest_rate / copy_rate:.2f}×",
                f"≥ {INGEST_TARGET:,} and ≥ 0.5×",
                _verdict(ingest_rate >= INGEST_TARGET and ingest_rate >= 0.5 * copy_rate),
            ],
            [
                "replay of one batch (all duplicates)",
                f"{len(replay_batch):,}",
                f"{replay.seconds:.2f}",
                f"{len(replay_batch) / replay.seconds:,.0f}",
                "",
                "",
                "",
            ],
            [
                f"rating: usage_rate_pending ({args.rating_workers} worker{'s' if args.rating_workers > 1 else ''})",
                f"{rated['records']:,}",
                f"{rated['seconds']:.1f}",
                f"{rating_rate:,.0f}",
                "",
                f"≥ {RATING_TARGET:,}",
                _verdict(rating_rate >= RATING_TARGET),
            ],
        ],
    )
    print(cpu_line)
    print_table(
        "Rating CPU per record (workers + their PostgreSQL backends)",
        ["step", "records", "wall s", "worker µs", "PostgreSQL µs", "total µs", "target", ""],
        [
            [
                f"baseline: COPY of the same {segments:,} segments",
                f"{rated['records']:,}",
                f"{copy_segments['seconds']:.1f}",
                f"{copy_segments['client_cpu'] / per_record * 1e6:.1f}",
                f"{copy_segments['postgres_cpu'] / per_record * 1e6:.1f}",
                f"{copy_us:.1f}",
                "",
                "",
            ],
            [
                "rating: usage_rate_pending",
                f"{rated['records']:,}",
                f"{rated['seconds']:.1f}",
                f"{worker_us:.1f}",
                f"{postgres_us:.1f}",
                f"{rating_us:.1f}",
                f"≤ {RATING_CPU_TARGET_US}",
                _verdict(rating_us <= RATING_CPU_TARGET_US),
            ],
        ],
    )
    if len(rated["by_worker"]) > 1:
        print(
            "rating workers (records, seconds): "
            + "; ".join(f"{n:,} in {seconds:.1f} s" for n, seconds in rated["by_worker"])
        )
    print(
        f"rating at 2 cores' worth of CPU: {2e6 / rating_us:,.0f} records/s "
        f"({rating_us / max(copy_us, 1e-9):.2f}× the COPY baseline's CPU)"
    )
    print(
        f"\nrated segments: {segments:,} ({segments / max(rated['records'], 1):.2f} per record); "
        f"arrears segments: {rated['arrears']:,}; exhaustion flags: {rated['flags']}"
    )
    print(
        f"peak RSS: rating worker {rated['peak_rss_mb']:.0f} MiB (target < {RSS_TARGET_MB} MiB: "
        f"{_verdict(rated['peak_rss_mb'] < RSS_TARGET_MB)}); ingesting process {ingest_rss:.0f} MiB "
        "(it also holds all generated records)"
    )
    print(
        f"checks: unrated {unrated}, Σ per unit {units}, card-seconds segments = records: "
        f"{segment_seconds == record_seconds}, reconciliation breaches "
        f"{[b.code for b in reconciled.breaches]} → {'OK' if ok else 'ERROR'}"
    )
    if not ok or not args.preload_rows:
        return 0 if ok else 1
    empty = {
        "ingest_rate": ingest_rate,
        "ingest_us": ingest_us,
        "rating_rate": rating_rate,
        "rating_us": rating_us,
        "records": created,
        "record_seconds": record_seconds,
    }
    return loaded_run(args, database, rng, operators, buyers, empty)


# --- With history present (--preload-rows) --------------------------------------------------------------


def preload(*, rows: int, months: int) -> tuple[float, list[str]]:
    """Write ``rows`` usage records, their keys and one rated segment each into the ``months`` months that
    end before the late window (so nothing measured touches them), as fast as PostgreSQL allows: each month
    filled as a plain table with ``INSERT … SELECT generate_series``, constrained to its bounds, then
    attached as the month's partition (its indexes built once, by sorting); the key table's primary key
    dropped and rebuilt around its insert. Returns (seconds, the months' partitions)."""
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from core.models import Organisation
    from federation.models import Cluster
    from metering.models import PriceCard
    from metering.services.partitions import next_month, partition_bounds, partition_month_of, partition_name

    clusters = list(Cluster.objects.order_by("pk").values_list("pk", "operator_id"))
    cards = dict(PriceCard.objects.filter(version=1).values_list("cluster_id", "pk"))
    buyers = list(Organisation.objects.filter(is_buyer=True).order_by("pk").values_list("pk", flat=True))
    last = partition_month_of(timezone.now() - timedelta(days=settings.CARDHOUR_LATE_USAGE_DAYS + 31))
    first = last
    for _ in range(months - 1):
        first = (first.replace(day=1) - timedelta(days=1)).replace(day=1)
    month_list = []
    month = first
    while month <= last:
        month_list.append(month)
        month = next_month(month)
    per_month = -(-rows // len(month_list))
    names: list[str] = []
    with Timer() as timer, connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '512MB'")
        cursor.execute(
            "SELECT nextval('metering_usagerecord_id_seq'), nextval('metering_ratedsegment_id_seq')"
        )
        record_base, segment_base = cursor.fetchone()
        cursor.execute("SELECT setval('metering_usagerecord_id_seq', %s)", [record_base + rows + 1])
        cursor.execute("SELECT setval('metering_ratedsegment_id_seq', %s)", [segment_base + rows + 1])
        cluster_ids = [c for c, _ in clusters]
        operator_ids = [o for _, o in clusters]
        card_ids = [cards[c] for c in cluster_ids]
        done = 0
        for index, month in enumerate(month_list):
            count = min(per_month, rows - done)
            if count <= 0:
                break
            low, high = partition_bounds(month)
            minutes = int((high - low).total_seconds()) // 60 - 1
            for table, column in (
                ("metering_usagerecord", "start_at"),
                ("metering_ratedsegment", "record_start_at"),
            ):
                name = partition_name(table, month)
                cursor.execute(f"DROP TABLE IF EXISTS {name}")
                cursor.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
                cursor.execute(
                    f"ALTER TABLE {name} ADD CONSTRAINT {name}_bounds CHECK"
                    f" ({column} >= '{low.isoformat()}' AND {column} < '{high.isoformat()}')"
                )
                names.append(name)
            records = partition_name("metering_usagerecord", month)
            segments = partition_name("metering_ratedsegment", month)
            params = {
                "n": count,
                "first_id": record_base + done,
                "first_segment": segment_base + done,
                "low": low,
                "minutes": minutes,
                "clusters": cluster_ids,
                "operators": operator_ids,
                "cards": card_ids,
                "buyers": buyers,
                "nc": len(cluster_ids),
                "nb": len(buyers),
                "month": index,
            }
            cursor.execute(
                f"""
                INSERT INTO {records} (id, operator_id, cluster_id, buyer_id, cards, start_at, end_at,
                    price_card_id, idempotency_key, reference, body_hash, received_at)
                SELECT %(first_id)s + g, (%(operators)s::bigint[])[1 + g %% %(nc)s],
                       (%(clusters)s::bigint[])[1 + g %% %(nc)s], (%(buyers)s::bigint[])[1 + g %% %(nb)s], 8,
                       %(low)s::timestamptz + ((g %% %(minutes)s) * interval '1 minute'),
                       %(low)s::timestamptz + ((g %% %(minutes)s + 1) * interval '1 minute'),
                       (%(cards)s::bigint[])[1 + g %% %(nc)s], 'pre-' || %(month)s || '-' || g, 'lease:preload',
                       md5(g::text) || md5((-g)::text), %(low)s::timestamptz
                  FROM generate_series(0, %(n)s - 1) AS g
                """,  # the table names are ours
                params,
            )
            cursor.execute(
                f"""
                INSERT INTO {segments} (id, usage_record_id, buyer_id, operator_id, seq, start_at, end_at,
                    record_start_at, band, multiplier, card_seconds, pack_id, pack_class, standard_factor,
                    pack_draw, gross, commission, buyer_value, transfer_id)
                SELECT %(first_segment)s + u.id - %(first_id)s, u.id, u.buyer_id, u.operator_id, 0, u.start_at,
                       u.end_at, u.start_at, 'flat', 1, 480, NULL, 'preload', NULL, 133333, 1333333, 133333,
                       1333333, 0
                  FROM {records} u
                """,
                params,
            )
            done += count
        cursor.execute("ALTER TABLE metering_usagekey DROP CONSTRAINT usage_key_unique")
        for month in month_list:
            records = partition_name("metering_usagerecord", month)
            cursor.execute(
                f"INSERT INTO metering_usagekey (usage_record_id, operator_id, idempotency_key, start_at)"
                f" SELECT id, operator_id, idempotency_key, start_at FROM {records}"
            )
        cursor.execute(
            "ALTER TABLE metering_usagekey ADD CONSTRAINT usage_key_unique PRIMARY KEY (operator_id, idempotency_key)"
        )
        for month in month_list:
            low, high = partition_bounds(month)
            for table in ("metering_usagerecord", "metering_ratedsegment"):
                cursor.execute(
                    f"ALTER TABLE {table} ATTACH PARTITION {partition_name(table, month)}"
                    f" FOR VALUES FROM ('{low.isoformat()}') TO ('{high.isoformat()}')"
                )
        for table in ("metering_usagerecord", "metering_ratedsegment", "metering_usagekey"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    return timer.seconds, names


def measure_set(
    args: argparse.Namespace,
    database: BenchDatabase,
    rng: random.Random,
    operators: list[tuple[Any, list[Any]]],
    buyers: list[Any],
    key_prefix: str,
) -> dict[str, Any] | None:
    """Ingest and rate one more record set of the run's shape (keys under ``key_prefix``): rates and CPU
    per record, measured like the main run's. None on a wrong answer."""
    from django.db import connection

    batches = list(generate(args, rng, operators, buyers, key_prefix=key_prefix))
    input_freeze()
    # Fresh statistics before each measured step, on both sides alike.
    tables = ("metering_usagerecord", "metering_usagekey", "metering_usagepending", "metering_ratedsegment")
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"VACUUM ANALYZE {table}")
    with CpuSampler(database=database.name) as ingest_cpu, Timer() as ingest:
        ingested = ingest_batches(batches, threads=args.ingest_threads)
    ingested.release()
    created = ingested.created
    if ingested.wrong:
        print(f"ERROR: {ingested.wrong}")
        return None
    with connection.cursor() as cursor:
        for table in tables[:3]:
            cursor.execute(f"VACUUM ANALYZE {table}")
    rated = rate_in_workers(args, database)
    if rated is None:
        return None
    if rated["records"] != created:
        print(f"ERROR: {created:,} records ingested, {rated['records']:,} rated")
        return None
    return {
        "ingest_rate": created / ingest.seconds,
        "ingest_us": (ingest_cpu.own_seconds + ingest_cpu.seconds("postgres")) / created * 1e6,
        "rating_rate": rated["records"] / rated["seconds"],
        "rating_us": (rated["worker_cpu"] + rated["postgres_cpu"]) / created * 1e6,
        "records": created,
        "record_seconds": sum(
            r.cards * int((r.end_at - r.start_at).total_seconds()) for _, batch in batches for r in batch
        ),
        "loadavg": Path("/proc/loadavg").read_text().split()[0],
    }


def loaded_run(
    args: argparse.Namespace,
    database: BenchDatabase,
    rng: random.Random,
    operators: list[tuple[Any, list[Any]]],
    buyers: list[Any],
    first: dict[str, float],
) -> int:
    """The main run warmed everything up (and its first record set ran the starved buyers dry); now one
    record set on the empty history, the preload, and one record set of the same shape on the loaded one."""
    from django.conf import settings
    from django.db import connection
    from django.db.models import Sum
    from django.utils import timezone

    from metering.models import LedgerEntry, RatedSegment, UsagePending

    empty = measure_set(args, database, rng, operators, buyers, key_prefix="empty-")
    if empty is None:
        return 1
    print(f"\npreloading {args.preload_rows:,} records (+ keys, + a segment each) into past months …")
    seconds, _names = preload(rows=args.preload_rows, months=args.preload_months)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM metering_usagerecord")
        present = cursor.fetchone()[0]
        cursor.execute(
            "SELECT (SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits"
            "        WHERE inhparent = 'metering_usagerecord'::regclass),"
            " (SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits"
            "        WHERE inhparent = 'metering_ratedsegment'::regclass),"
            " pg_size_pretty(pg_total_relation_size('metering_usagekey'))"
        )
        sizes = cursor.fetchone()
    print(
        f"preloaded in {seconds:.0f} s: {present:,} usage records present; records {sizes[0]}, "
        f"segments {sizes[1]}, key table {sizes[2]} (one month's partition of each holds the measured rows)"
    )
    loaded = measure_set(args, database, rng, operators, buyers, key_prefix="loaded-")
    if loaded is None:
        return 1

    window_start = timezone.now() - timedelta(days=settings.CARDHOUR_LATE_USAGE_DAYS)
    units = {row["unit"]: row["t"] for row in LedgerEntry.objects.values("unit").annotate(t=Sum("amount"))}
    record_seconds = int(first["record_seconds"] + empty["record_seconds"] + loaded["record_seconds"])
    # Every measured set starts within the last 30 days; the preload ends before the late window.
    segment_seconds = RatedSegment.objects.filter(
        record_start_at__gte=window_start - timedelta(days=1)
    ).aggregate(s=Sum("card_seconds"))["s"]
    unrated = UsagePending.objects.count()
    ok = unrated == 0 and all(v == 0 for v in units.values()) and segment_seconds == record_seconds

    rows = []
    for label, key in (
        ("ingest CPU µs/record (process + PostgreSQL)", "ingest_us"),
        ("rating CPU µs/record (worker + PostgreSQL)", "rating_us"),
        ("ingest records/s (wall)", "ingest_rate"),
        ("rating records/s (wall)", "rating_rate"),
    ):
        fmt = "{:,.1f}" if key.endswith("_us") else "{:,.0f}"
        ratio = loaded[key] / empty[key]
        rows.append(
            [label, fmt.format(empty[key]), fmt.format(loaded[key]), f"{ratio:.2f}×", "within 20 %",
             _verdict(0.8 <= ratio <= 1.2)]
        )  # fmt: skip
    print_table(
        f"Empty history vs {present - first['records'] - empty['records']:,} preloaded rows "
        f"({loaded['records']:,} records ingested and rated on each side; load average "
        f"{empty['loadavg']} / {loaded['loadavg']})",
        ["figure", "empty", "loaded", "loaded / empty", "target", ""],
        rows,
    )
    print(
        f"checks (all measured sets): unrated {unrated}, Σ per unit {units}, card-seconds segments = records: "
        f"{segment_seconds == record_seconds} → {'OK' if ok else 'ERROR'}"
    )
    return 0 if ok else 1


def rate_in_workers(args: argparse.Namespace, database: BenchDatabase) -> dict[str, Any] | None:
    """Rate everything pending in ``--rating-workers`` worker processes at once, each on its part of the
    buyers: records, wall seconds (first start to last end), the workers' and their backends' CPU, the
    largest worker's peak RSS. None if a worker failed (its output is printed)."""
    env = {**os.environ, **django_environment(database_url=database.url, conn_max_age=600)}
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.metering",
                "--rate",
                database.url,
                "--rating-batch",
                str(args.rating_batch),
                "--shard",
                str(index),
                "--rating-workers",
                str(args.rating_workers),
            ],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(args.rating_workers)
    ]
    outputs = [worker.communicate() for worker in workers]
    if any(worker.returncode != 0 for worker in workers):
        for stdout, stderr in outputs:
            print(stdout, stderr)
        return None
    parts = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    # The workers run at once: the rating took from the first one's start to the last one's end.
    rated = {
        "records": sum(p["records"] for p in parts),
        "seconds": max(p["ended"] for p in parts) - min(p["started"] for p in parts),
        "worker_cpu": sum(p["worker_cpu"] for p in parts),
        "postgres_cpu": sum(p["postgres_cpu"] for p in parts),
        "peak_rss_mb": max(p["peak_rss_mb"] for p in parts),
        "arrears": parts[0]["arrears"],
        "flags": parts[0]["flags"],
        "by_worker": [(p["records"], p["ended"] - p["started"]) for p in parts],
    }
    return rated


def segment_copy_baseline(database: str) -> dict[str, float]:
    """COPY the rated segments (read back first) into a fresh table with metering_ratedsegment's columns
    and indexes: time and CPU (this process + its PostgreSQL backend); drop the table."""
    from django.db import connection

    from benchmarks._common import close_django_connections
    from metering.services.rating import _SEGMENT_COLUMNS

    columns = ", ".join(("id", *_SEGMENT_COLUMNS))
    close_django_connections()  # a fresh backend, so the sampler counts only this work
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_segment_copy")
        cursor.execute("CREATE TABLE bench_segment_copy (LIKE metering_ratedsegment INCLUDING INDEXES)")
        chunks: list[bytes] = []
        with cursor.copy(f"COPY (SELECT {columns} FROM metering_ratedsegment) TO STDOUT") as copy:
            chunks.extend(bytes(chunk) for chunk in copy)
    with (
        CpuSampler(database=database) as cpu,
        Timer() as timer,
        connection.cursor() as cursor,
        cursor.copy(f"COPY bench_segment_copy ({columns}) FROM STDIN") as copy,
    ):
        for chunk in chunks:
            copy.write(chunk)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_segment_copy")
    return {"seconds": timer.seconds, "client_cpu": cpu.own_seconds, "postgres_cpu": cpu.seconds("postgres")}


def rate_worker(database_url: str, *, batch_size: int, shard: int, shards: int) -> int:
    django_setup(database_url=database_url, conn_max_age=600, migrate=False)
    from metering.models import BuyerExhaustion, RatedSegment
    from metering.services.rating import Shard, usage_rate_pending

    profile_to = os.environ.get("CARDHOUR_BENCH_PROFILE")  # a path: write cProfile stats of the rating there
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    from django.db import connection

    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    part = Shard(index=shard, of=shards) if shards > 1 else None
    # This worker's own backend only (the other workers' backends are theirs to count).
    with CpuSampler(server_pids=[backend]) as cpu, Timer() as timer:
        started = time.time()
        records = usage_rate_pending(batch_size=batch_size, shard=part)
        ended = time.time()
    if profile_to:
        profiler.disable()
        profiler.dump_stats(f"{profile_to}.{shard}" if shards > 1 else profile_to)
    print(
        json.dumps(
            {
                "records": records,
                "seconds": timer.seconds,
                "started": started,
                "ended": ended,
                "worker_cpu": cpu.own_seconds,
                "postgres_cpu": cpu.seconds("server"),
                # VmHWM, not ru_maxrss: the latter survives exec and would report the parent's peak.
                "peak_rss_mb": process_peak_rss_mb(os.getpid()),
                "arrears": RatedSegment.objects.filter(pack__isnull=True).count(),
                "flags": BuyerExhaustion.objects.count(),
            }
        )
    )
    return 0


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


if __name__ == "__main__":
    sys.exit(main())
