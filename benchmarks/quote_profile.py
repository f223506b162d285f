"""cProfile of quote requests in this process: ``POST /api/v1/jobs/<id>/quotes`` through Django's test
client (the whole middleware stack, token authentication, the view, the JSON rendering) over the market a
``python -m benchmarks.broker --keep`` run left in a PostgreSQL database.

    python -m benchmarks.quote_profile --database-url postgres://…/db [--requests 200] [--top 40]

It prints the CPU time per request (process time, this process only: PostgreSQL's share is not in it)
and the profile's top entries by own and by cumulative time, so the request path outside the matcher can
be compared before and after a change. Warm-up requests first (the catalogue and the hold book load, the
query compilers' caches fill); the profiled ones cycle over the quoting buyer's jobs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Sequence

from benchmarks._common import django_setup, django_setup_production


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quote_profile")
    parser.add_argument("--database-url", required=True, help="a database a benchmarks.broker run kept")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-profile", action="store_true", help="the unprofiled CPU per quote only")
    parser.add_argument(
        "--production",
        action="store_true",
        help="the production settings and environment the benchmark's servers run with (else the test settings)",
    )
    parser.add_argument("--dump", help="also write the profile to this file (pstats: callers, callees)")
    parser.add_argument("--catalog-ttl", type=float, default=3600.0, help="long: no reload while profiled")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    if args.production:
        django_setup_production(database_url=args.database_url)
    else:
        django_setup(database_url=args.database_url, conn_max_age=600, migrate=False)
    from django.conf import settings
    from django.test import Client

    from broker.models import Job
    from core.models import Organisation
    from core.services import api_token_create

    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = args.catalog_ttl
    buyer = Organisation.objects.get(slug="quoter")
    _, token = api_token_create(organisation=buyer, name="quote profile")
    job_ids = list(
        Job.objects.filter(buyer=buyer, name__startswith="quote-", state=Job.State.OPEN)
        .order_by("id")
        .values_list("id", flat=True)
    )
    if not job_ids:
        print("no quote-* jobs of the quoting buyer: run benchmarks.broker --keep first")
        return 1
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST="localhost")

    def quote(i: int) -> None:
        response = client.post(
            f"/api/v1/jobs/{job_ids[i % len(job_ids)]}/quotes", {"limit": 10}, content_type="application/json"
        )
        if response.status_code != 201:
            raise RuntimeError(f"HTTP {response.status_code}: {response.content[:300]!r}")

    for i in range(args.warmup):
        quote(i)
    started_cpu, started = time.process_time(), time.perf_counter()
    for i in range(args.requests):
        quote(i)
    cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started
    print(
        f"unprofiled: {args.requests} quotes, {cpu / args.requests * 1e3:.2f} ms CPU per quote (this process)"
    )
    print(f"            {wall / args.requests * 1e3:.2f} ms wall per quote")

    if args.no_profile:
        return 0
    # CPU time, not wall: the machine is shared, and waiting for PostgreSQL is not this process's cost.
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for i in range(args.requests):
        quote(i)
    profiler.disable()
    if args.dump:
        profiler.dump_stats(args.dump)
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(args.top)
        print(f"\n--- top {args.top} by {order} ---")
        print(out.getvalue().split("\n", 4)[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
