"""Usage reports in this process: ``POST /api/v1/operator/usage`` batches through Django's test client (the
whole middleware stack, token authentication, the view) over the market a ``python -m benchmarks.broker
--only usage --keep`` run left in a PostgreSQL database, with the CPU of this process and of its
PostgreSQL backend per record, the time of each kind of SQL statement, and optionally a cProfile.

    python -m benchmarks.usage_profile --database-url postgres://…/db [--batches 40] [--profile] [--explain]

Before it runs, the usage the database holds is removed (usage records, keys, pending rows and the
leases' frontiers), so every run starts from the same state and the batches are the same ones the broker
benchmark sends first (one-minute records, round robin over each operator's running leases, 1,000 a
batch). ``--leases-per-batch K`` keeps only each operator's first K running leases, so markets of
different sizes can be compared at the same batch shape (a batch of 1,000 records names min(K, the
operator's running leases) leases: 13 at 10,000 leases, ~385 at 300,000). Beside the CPU it prints what
the batches wrote to the lease table (row updates, the share of them HOT) and the WAL they made (records,
full-page images, bytes). ``--explain`` logs each statement's plan with EXPLAIN (ANALYZE, BUFFERS) for one
batch (auto_explain, as notices).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks._common import django_setup, django_setup_production, process_cpu_seconds

BATCH = 1_000
MINUTE = timedelta(seconds=60)


def usage_reset() -> None:
    """Remove every usage record and frontier: the kept market as its set-up left it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE metering_usagerecord, metering_usagekey, metering_usagepending CASCADE")
        cursor.execute("UPDATE broker_lease SET last_usage_end_at = NULL WHERE last_usage_end_at IS NOT NULL")
        cursor.execute(
            "SELECT to_regclass('broker_leaseusagefrontier') IS NOT NULL",
        )
        if cursor.fetchone()[0]:
            cursor.execute("UPDATE broker_leaseusagefrontier SET end_at = NULL WHERE end_at IS NOT NULL")
    with connection.cursor() as cursor:
        for table in ("metering_usagerecord", "metering_usagekey", "metering_usagepending", "broker_lease"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("CHECKPOINT")


def lease_writes() -> tuple[int, int, int, int, int]:
    """The lease table's row updates and HOT updates so far, and the server's WAL records, full-page images
    and bytes (pg_stat_wal counts every database: read it on a quiet server)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT s.n_tup_upd, s.n_tup_hot_upd, w.wal_records, w.wal_fpi, w.wal_bytes::bigint"
            " FROM pg_stat_user_tables s, pg_stat_wal w WHERE s.relname = 'broker_lease'"
        )
        row = cursor.fetchone()
    return tuple(int(v) for v in row)  # type: ignore[return-value]


def running_leases() -> dict[str, list[tuple[int, datetime, datetime, int]]]:
    """Per operator slug, its running leases (id, start, end, cards) in id order."""
    from django.db import connection

    by_operator: dict[str, list[tuple[int, datetime, datetime, int]]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT o.slug, l.id, l.start_at, l.end_at, l.cards FROM broker_lease l"
            " JOIN core_organisation o ON o.id = l.operator_id WHERE l.state = 'running' ORDER BY l.id"
        )
        for slug, pk, start, end, cards in cursor.fetchall():
            by_operator[slug].append((pk, start, end, cards))
    return by_operator


def batches_of(
    leases: dict[str, list[tuple[int, datetime, datetime, int]]], *, n: int, now: datetime
) -> list[tuple[str, bytes]]:
    """The broker benchmark's rows (round robin from each lease's start, one minute each), batched per
    operator, cycling over operators so consecutive batches name different operators."""

    def iso(value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    per_operator: dict[str, list[list[dict[str, Any]]]] = {}
    for slug, rows in leases.items():
        records: list[dict[str, Any]] = []
        step = 0
        while len(records) < BATCH * 3:
            added = False
            for pk, start, end, cards in rows:
                s = start + step * MINUTE
                e = s + MINUTE
                if e > now or e > end:
                    continue
                records.append(
                    {"lease": pk, "idempotency_key": f"u-{pk}-{step}", "start_at": iso(s), "end_at": iso(e),
                     "cards": cards}
                )  # fmt: skip
                added = True
            if not added:
                break
            step += 1
        per_operator[slug] = [records[i : i + BATCH] for i in range(0, len(records) - BATCH + 1, BATCH)]
    out: list[tuple[str, bytes]] = []
    round_ = 0
    while len(out) < n:
        added = False
        for slug, chunks in per_operator.items():
            if round_ < len(chunks) and len(out) < n:
                out.append((slug, json.dumps({"records": chunks[round_]}).encode()))
                added = True
        if not added:
            break
        round_ += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.usage_profile")
    parser.add_argument("--database-url", required=True, help="a database a benchmarks.broker run kept")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile the timed batches")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN (ANALYZE, BUFFERS) one batch")
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument(
        "--leases-per-batch",
        type=int,
        help="keep only each operator's first K running leases (the same batch shape at any market size)",
    )
    parser.add_argument(
        "--no-triggers",
        action="store_true",
        help="an experiment: the timed batches with session_replication_role = replica (no foreign-key checks)",
    )
    parser.add_argument(
        "--production",
        action="store_true",
        help="the production settings and environment the benchmark's servers run with (else the test settings)",
    )
    parser.add_argument(
        "--rating-on-arrival",
        action="store_true",
        help="queue rating on arrival after each batch, as the servers do (off: only the report's own cost)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    if args.production:
        django_setup_production(database_url=args.database_url)
    else:
        django_setup(database_url=args.database_url, conn_max_age=600)
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from core.models import Organisation
    from core.services import api_token_create

    settings.CARDHOUR_RATING_ON_ARRIVAL = args.rating_on_arrival
    usage_reset()
    leases = running_leases()
    if args.leases_per_batch:
        leases = {slug: rows[: args.leases_per_batch] for slug, rows in leases.items()}
    now = timezone.now().replace(microsecond=0)
    batches = batches_of(leases, n=args.warmup + args.batches, now=now)
    tokens = {}
    for slug in {slug for slug, _ in batches}:
        _, tokens[slug] = api_token_create(organisation=Organisation.objects.get(slug=slug), name="profile")
    client = Client(HTTP_HOST="localhost")
    names = sum(len(v) for v in leases.values())
    print(f"running leases: {names:,}; batches: {len(batches)} ({args.warmup} warm-up)")

    timings: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])

    def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            head = re.sub(r'"s\d+_x\d+"', '"…"', " ".join(sql.split()))[:90]
            timings[head][0] += time.perf_counter() - started
            timings[head][1] += 1

    def post(slug: str, body: bytes) -> int:
        if slug not in tokens:  # the --explain batch may name an operator the timed ones did not
            _, tokens[slug] = api_token_create(
                organisation=Organisation.objects.get(slug=slug), name="profile"
            )
        response = client.post(
            "/api/v1/operator/usage", body, content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {tokens[slug]}",
        )  # fmt: skip
        if response.status_code != 201:
            raise RuntimeError(f"HTTP {response.status_code}: {response.content[:300]!r}")
        return len(json.loads(response.content)["records"])

    for slug, body in batches[: args.warmup]:
        post(slug, body)
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
        if args.no_triggers:
            cursor.execute("SET session_replication_role = replica")
    timed_batches = batches[args.warmup :]
    profiler = cProfile.Profile() if args.profile else None
    records = 0
    writes0 = lease_writes()
    wall0, cpu0, pg0 = time.perf_counter(), time.process_time(), process_cpu_seconds(backend) or 0.0
    with connection.execute_wrapper(timed):
        if profiler:
            profiler.enable()
        for slug, body in timed_batches:
            records += post(slug, body)
        if profiler:
            profiler.disable()
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    pg = (process_cpu_seconds(backend) or 0.0) - pg0
    writes = [after - before for before, after in zip(writes0, lease_writes(), strict=True)]
    print(
        f"{records:,} records in {len(timed_batches)} batches: wall {wall / records * 1e6:.1f} µs/record, CPU "
        f"µs/record: this process {cpu / records * 1e6:.1f}, PostgreSQL backend {pg / records * 1e6:.1f}; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    named = sum(len({r["lease"] for r in json.loads(body)["records"]}) for _, body in timed_batches)
    updates, hot, wal_records, wal_fpi, wal_bytes = writes
    print(
        f"leases named per batch: {named / len(timed_batches):.0f}; lease rows updated {updates:,} "
        f"({hot / max(updates, 1):.1%} HOT); WAL (whole server) per record: {wal_records / records:.2f} records, "
        f"{wal_fpi / records:.3f} full-page images, {wal_bytes / records:,.0f} bytes"
    )
    print("SQL (wall ms per batch, calls per batch):")
    for head, (seconds, calls) in sorted(timings.items(), key=lambda kv: -kv[1][0]):
        print(f"  {seconds / len(timed_batches) * 1e3:8.2f} ms  {calls / len(timed_batches):5.1f}  {head}")
    if profiler:
        for order in ("tottime", "cumulative"):
            stream = io.StringIO()
            pstats.Stats(profiler, stream=stream).sort_stats(order).print_stats(args.top)
            print(stream.getvalue())
    if args.explain:
        more = batches_of(leases, n=args.warmup + args.batches + 1, now=now)
        if len(more) > len(batches):
            notices: list[str] = []
            raw = connection.connection
            raw.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            with connection.cursor() as cursor:
                cursor.execute("LOAD 'auto_explain'")
                for setting in (
                    "auto_explain.log_min_duration = 0", "auto_explain.log_analyze = on",
                    "auto_explain.log_buffers = on", "auto_explain.log_level = notice",
                    "auto_explain.log_nested_statements = on", "auto_explain.log_timing = on",
                ):  # fmt: skip
                    cursor.execute(f"SET {setting}")
            post(*more[-1])
            with connection.cursor() as cursor:
                cursor.execute("SET auto_explain.log_min_duration = -1")
            for notice in notices:
                print(notice)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
