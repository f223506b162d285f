"""How a quote's cost grows with the market: with islands at the same holds, and with holds on the same
islands (issue 14: "the cost of a quote must grow less than linearly in islands").

    python -m benchmarks.matcher_scaling            # 10k clusters: 100k islands and 100k, then 300k leases; 300k islands and 300k leases
    python -m benchmarks.matcher_scaling --quick    # 500 clusters: 5k and 15k islands, 5k and 15k leases

Three markets of the same ``--clusters``, each written by benchmarks.broker (``build_market``: the same
operators, buyers, prices and lease layout as its quote benchmark, leases spread over the next days) into a
throwaway PostgreSQL database of its own and measured in a process of its own, one after the other:

- **A**: ``--islands`` islands, ``--leases`` / 3 leases (the design load: 100,000 of each);
- **B**: the same islands, ``--leases`` leases (three times the holds);
- **C**: three times the islands, ``--leases`` leases: B's holds on three times the market. B → C is the
  issue's own measure (its table: 23 ms at 100,000 islands, 46 ms at 300,000, both with ~300,000 leases,
  the busiest buyer holding 2,905 and 2,931 of them), which it called linear in islands.

In each, 200 jobs of benchmarks.broker's quote shape (8 cards on one island, any chip, a 48-hour window in the
next five days, 8 hours long) are quoted in this process, no HTTP: the matcher alone
(``placements_find``, ``--calls`` calls) and the quote service (``quote_create``: the matcher, the buyer's
affordability, storing the ten quotes; ``--calls`` / 2 calls), CPU ms per call of this process (the service's
PostgreSQL work is not in it: benchmarks.broker measures the whole request). Beside them, measured the same
way in the same process, the baselines: one compiled pass over every hold of the book
(``HoldBook.overlapping`` over all time: what any work linear in holds costs at the least) and one numpy
pass over every island of the catalogue (a mask of their cards: the least that linear in islands costs).

Printed: each market's figures, then for islands ×3 (B → C) and holds ×3 (A → B) the ratio of each
figure and its exponent (``log(ratio) / log(3)``: 1 is linear, 0 flat), with PASS/MISS for the matcher and
the service against "less than linearly in islands", read strictly: an exponent below 0.5 (the issue's own
×2.0 was 0.63). Holds have no target; their exponent is printed as measured.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from benchmarks._common import DEFAULT_SERVER_URL, BenchDatabase, machine_description, print_table

BENCH_DATABASE = "cardhour_bench_scaling"
EXPONENT_TARGET = 0.5
FIGURES = (
    ("matcher", "matcher (placements_find) CPU ms per call"),
    ("service", "quote service (quote_create) CPU ms per call, this process"),
    ("holds_pass", "baseline: one compiled pass over every hold, CPU ms"),
    ("islands_pass", "baseline: one numpy pass over every island, CPU ms"),
)


class _InProcessClient:
    """benchmarks._common.JsonClient's ``call`` through Django's test client: the jobs are submitted over the
    API's own code path, in this process."""

    def __init__(self) -> None:
        from django.test import Client

        self.client = Client(HTTP_HOST="127.0.0.1")

    def call(
        self, method: str, path: str, *, token: str, body: dict[str, Any] | None = None, label: str = ""
    ) -> tuple[int, Any]:
        assert method == "POST"
        response = self.client.post(
            path, data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )
        return response.status_code, response.json()


def _cpu_ms(function: Any, n: int) -> float:
    cpu = time.process_time()
    for _ in range(n):
        function()
    return (time.process_time() - cpu) / n * 1000


def measure_one(args: argparse.Namespace) -> dict[str, Any]:
    """Build one market in ``args.database_url`` and measure it in this process."""
    import numpy as np

    from benchmarks._common import django_setup
    from benchmarks.broker import (
        MATCHER_CPU_S,
        build_market,
        create_jobs,
        matcher_in_process,
        service_in_process,
    )

    django_setup(database_url=args.database_url, conn_max_age=600)
    from django.conf import settings

    from broker.catalog import market as the_market

    # As a server runs (production's TTL): the catalogue and the hold book loaded once, not per quote.
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5.0

    market = build_market(args, args.database_url)  # its clusters, islands, leases, operators, buyers, seed
    jobs = create_jobs(
        _InProcessClient(), token=market.quote_buyer_token, n=200, duration_hours=8, seed=args.seed
    )
    _, _, feasible = matcher_in_process(jobs, args.calls)
    matcher_ms = MATCHER_CPU_S[-1] * 1000
    cpu = time.process_time()
    service_in_process(jobs, args.calls // 2)
    service_ms = (time.process_time() - cpu) / (args.calls // 2) * 1000
    catalogue, _holds, alive, _held = the_market.book_view()
    book = the_market.holds
    holds_pass = _cpu_ms(lambda: book.overlapping(-(2**62), 2**62), 200)
    capacity = catalogue.island_capacity
    islands_pass = _cpu_ms(lambda: np.count_nonzero(capacity >= 8), 200)
    return {
        "islands": int(catalogue.size),
        "clusters": len(catalogue.cluster_id),
        "holds": int(np.count_nonzero(alive)),
        "feasible": statistics.median(feasible),
        "matcher": matcher_ms,
        "service": service_ms,
        "holds_pass": holds_pass,
        "islands_pass": islands_pass,
    }


def _exponent(before: float, after: float) -> float:
    return math.log(after / before) / math.log(3) if before > 0 and after > 0 else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.matcher_scaling", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument(
        "--islands", type=int, default=100_000, help="A's and B's islands (C has three times)"
    )
    parser.add_argument("--leases", type=int, default=300_000, help="B's and C's leases (A has a third)")
    parser.add_argument("--operators", type=int, default=100)
    parser.add_argument("--buyers", type=int, default=100)
    parser.add_argument(
        "--calls", type=int, default=2_000, help="matcher calls per market (the service: half)"
    )
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--quick", action="store_true", help="500 clusters, 5k islands, 15k leases, 300 calls"
    )
    parser.add_argument(
        "--server-url", default=DEFAULT_SERVER_URL, help="the PostgreSQL server of the throwaway databases"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one market, in this process
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.clusters, args.islands, args.leases, args.operators, args.buyers, args.calls = (
            500,
            5_000,
            15_000,
            20,
            20,
            300,
        )
    warnings.filterwarnings("ignore", message="No directory at")
    if args.one:
        print(json.dumps(measure_one(args)))
        return 0

    print("Cardhour matcher scaling benchmark")
    print(f"machine: {machine_description()}")
    markets = {
        "A": (args.islands, args.leases // 3),
        "B": (args.islands, args.leases),
        "C": (args.islands * 3, args.leases),
    }
    results: dict[str, dict[str, Any]] = {}
    for name, (islands, leases) in markets.items():
        database = BenchDatabase.create(server_url=args.server_url, name=BENCH_DATABASE)
        try:
            started = time.perf_counter()
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.matcher_scaling",
                    "--one",
                    "--database-url",
                    database.url,
                    "--clusters",
                    str(args.clusters),
                    "--islands",
                    str(islands),
                    "--leases",
                    str(leases),
                    "--operators",
                    str(args.operators),
                    "--buyers",
                    str(args.buyers),
                    "--calls",
                    str(args.calls),
                    "--seed",
                    str(args.seed),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
                return 1
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"market {name}: {islands:,} islands, {leases:,} leases, {time.perf_counter() - started:.0f} s",
                flush=True,
            )
        finally:
            database.drop()

    print_table(
        "Markets (each in its own database and process; CPU ms per call in this process)",
        [
            "figure",
            *(f"{name}: {r['islands']:,} islands, {r['holds']:,} holds" for name, r in results.items()),
        ],
        [
            ["clusters", *(f"{r['clusters']:,}" for r in results.values())],
            ["feasible islands per quote (median)", *(f"{r['feasible']:,.0f}" for r in results.values())],
            *([label, *(f"{r[key]:.3f}" for r in results.values())] for key, label in FIGURES),
        ],
    )
    rows = []
    verdicts = []
    for label, before, after in (
        ("islands ×3, same holds (B → C)", "B", "C"),
        ("holds ×3, same islands (A → B)", "A", "B"),
    ):
        for key, figure in FIGURES:
            ratio = results[after][key] / results[before][key]
            exponent = _exponent(results[before][key], results[after][key])
            verdict = ""
            if before == "B" and key in ("matcher", "service"):
                verdict = "PASS" if exponent < EXPONENT_TARGET else "MISS"
                verdicts.append(verdict)
            rows.append([label, figure, f"×{ratio:.2f}", f"{exponent:.2f}", verdict])
    print_table(
        f"Growth (exponent: log(ratio) / log 3; target for islands: below {EXPONENT_TARGET}, less than linear read "
        "strictly; holds: as measured)",
        ["change", "figure", "ratio", "exponent", "verdict"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
