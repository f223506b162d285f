"""cProfile of quote requests in this process: ``POST /api/v1/jobs/<id>/quotes`` through Django's test
client (the whole middleware stack, token authentication, the view, the JSON rendering) over the market a
``python -m benchmarks.broker --keep`` run left in a PostgreSQL database.

    python -m benchmarks.quote_profile --database-url postgres://…/db [--requests 200] [--top 40]

It prints the CPU time per request (process time, this process only: PostgreSQL's share is not in it)
and the profile's top entries by own and by cumulative time, so the request path outside the matcher can
be compared before and after a change. Warm-up requests first (the catalogue and the hold book load, the
query compilers' caches fill); the profiled ones cycle over the quoting buyer's jobs.

``--parts`` prints instead what each part of a quote request costs, unprofiled: the whole request, then
token authentication, the job lookup, the request's validation, the matcher, the buyer's affordability,
storing the ten quotes, rendering the answer, and what is left (middleware, DRF's dispatch, throttling,
content negotiation, the test client), each as CPU ms per call in this process and, when PostgreSQL runs
on this machine, in its backend (read from /proc). The parts are timed in turns, ``--rounds`` times, and
each figure is the median of its rounds: the machine is small and shared, and a part timed once can be
off by a third. ``/healthz`` through the same stack is the baseline.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks._common import django_setup, django_setup_production, print_table, process_cpu_seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quote_profile")
    parser.add_argument("--database-url", required=True, help="a database a benchmarks.broker run kept")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-profile", action="store_true", help="the unprofiled CPU per quote only")
    parser.add_argument("--parts", action="store_true", help="the CPU of each part of a quote request")
    parser.add_argument("--rounds", type=int, default=5, help="with --parts: turns, the median reported")
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
    if args.parts:
        return parts(client, token, buyer, job_ids, requests=args.requests, rounds=args.rounds)
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


def parts(client: Any, token: str, buyer: Any, job_ids: list[int], *, requests: int, rounds: int) -> int:
    """Print the CPU of each part of a quote request (see the module docstring)."""
    from django.db import connection
    from django.utils import timezone

    from broker.api.buyer import JobQuoteApi
    from broker.api.quote_render import quote_set_json
    from broker.catalog import market
    from broker.draws import buyer_packs_after_leases
    from broker.models import Job
    from broker.selectors import job_get_for
    from broker.services.jobs import job_spec
    from broker.services.quotes import _quotes_store, placements_find, quote_create
    from core.services import api_token_authenticate

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = int(cursor.fetchone()[0])
    local = connection.settings_dict.get("HOST") in ("", "localhost", "127.0.0.1", "::1")
    pg_pid = backend if local and process_cpu_seconds(backend) is not None else None

    jobs = {job.pk: job for job in Job.objects.filter(pk__in=job_ids).select_related("origin_hub", "buyer")}
    ordered = [jobs[pk] for pk in job_ids]
    specs = [job_spec(job=job) for job in ordered]
    sample = quote_create(job=ordered[0], limit=10)
    summary = ordered[0].quote_summary

    def store(_: int) -> None:
        for quote in sample.quotes:  # stored again as new rows, as a request stores its quotes
            quote.pk = None
            quote._state.adding = True
        _quotes_store(sample.quotes, job_id=ordered[0].pk, summary=summary)

    def whole(i: int) -> None:
        response = client.post(
            f"/api/v1/jobs/{job_ids[i % len(job_ids)]}/quotes", {"limit": 10}, content_type="application/json"
        )
        if response.status_code != 201:
            raise RuntimeError(f"HTTP {response.status_code}: {response.content[:300]!r}")

    def validate(_: int) -> None:
        data = JobQuoteApi.Input(data={"limit": 10})
        data.is_valid(raise_exception=True)

    known = market.catalogue.standard_card_factors if market.catalogue is not None else None
    steps: list[tuple[str, Callable[[int], object]]] = [
        ("whole request (in this process: middleware, DRF, the view, Django's test client)", whole),
        (
            "token authentication (core.services.api_token_authenticate)",
            lambda _: api_token_authenticate(raw=token),
        ),
        (
            "job lookup (broker.selectors.job_get_for)",
            lambda i: job_get_for(buyer=buyer, job_id=job_ids[i % len(job_ids)]),
        ),
        ("request validation (JobQuoteApi.Input)", validate),
        (
            "quote service (broker.services.quotes.quote_create)",
            lambda i: quote_create(job=ordered[i % len(ordered)], limit=10),
        ),
        (
            "  of which the matcher (placements_find)",
            lambda i: placements_find(
                spec=specs[i % len(specs)], now=timezone.now(), limit=10, distinct=True
            ),
        ),
        (
            "  of which affordability (buyer_packs_after_leases)",
            lambda _: buyer_packs_after_leases(buyer=buyer, at=timezone.now(), known_factors=known),
        ),
        ("  of which storing 10 quotes and the job's summary", store),
        ("rendering the answer (broker.api.quote_render.quote_set_json)", lambda _: quote_set_json(sample)),
        ("/healthz through the same stack (baseline)", lambda _: client.get("/healthz")),
    ]
    measured: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _ in steps}
    for _ in range(rounds):
        for label, step in steps:
            cpu = time.process_time()
            pg = process_cpu_seconds(pg_pid) if pg_pid else None
            for i in range(requests):
                step(i)
            measured[label][0].append((time.process_time() - cpu) / requests)
            if pg is not None and pg_pid:
                measured[label][1].append(((process_cpu_seconds(pg_pid) or pg) - pg) / requests)

    def median(values: list[float]) -> float | None:
        return sorted(values)[len(values) // 2] if values else None

    here = {label: median(values[0]) or 0.0 for label, values in measured.items()}
    there = {label: median(values[1]) for label, values in measured.items()}
    first = steps[0][0]
    top = [label for label, _ in steps[1:-1] if not label.startswith("  ")]
    rest_here = here[first] - sum(here[label] for label in top)
    rest_there = (
        there[first] - sum(there[label] or 0.0 for label in top) if there[first] is not None else None
    )
    rows = []
    for label, _ in steps:
        rows.append(_part_row(label, here[label], there[label], here[first] + (there[first] or 0.0)))
        if label == steps[-2][0]:
            rows.append(
                _part_row(
                    "the rest (middleware, DRF's dispatch, throttling, negotiation, the test client)",
                    rest_here,
                    rest_there,
                    here[first] + (there[first] or 0.0),
                )
            )
    print_table(
        f"A quote request by part: CPU ms per call, median of {rounds} rounds of {requests:,} calls each "
        f"(PostgreSQL: its backend's CPU{'' if pg_pid else ', not on this machine: not measured'})",
        ["part", "this process", "PostgreSQL", "together", "share of the request"],
        rows,
    )
    return 0


def _part_row(label: str, here: float, there: float | None, request: float) -> list[str]:
    together = here + (there or 0.0)
    return [
        label,
        f"{here * 1e3:.3f}",
        "-" if there is None else f"{there * 1e3:.3f}",
        f"{together * 1e3:.3f}",
        f"{together / request:.0%}" if request > 0 else "-",
    ]


if __name__ == "__main__":
    sys.exit(main())
