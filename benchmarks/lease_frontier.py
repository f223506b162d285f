"""What a usage batch pays per lease it names for the lease's frontier (``last_usage_end_at``), by strategy,
in PostgreSQL CPU per lease (issue 14, item 2): the SQL of each strategy alone, no HTTP, no metering insert.

    python -m benchmarks.lease_frontier --database-url postgres://…/copy [--batches 30] [--leases 385]
        [--rounds 3]

Strategies (each batch: one operator's running leases, ``--leases`` of them, one commit):

- ``lease``: what lease_usage_report does today: lock the lease rows (``FOR NO KEY UPDATE``, reading the
  facts the checks need), then one UPDATE moving their frontier.
- ``narrow``: the frontier in a narrow table of its own (lease id, operator, end; fillfactor 50, so its
  updates are HOT): lock its rows, read the facts from the lease table unlocked, update the narrow rows.
- ``narrow-merged``: the narrow table, locked and moved by one UPDATE that returns the previous frontier (a
  column kept for it), then the facts read.
- ``lease-merged``: one UPDATE of the lease rows that locks them, moves the frontier and returns the facts
  (the previous frontier is not returned: the floor of what merging could save, not a working design).
- ``facts``: only the facts read, unlocked: the part of every strategy that cannot go.

The strategies run in turn, ``--rounds`` times, each on the same batches. It writes to the database it is
given (the frontier of running leases, and a scratch table ``bench_lease_frontier`` it drops at the end):
give it a copy of a kept market (``CREATE DATABASE x TEMPLATE kept``), never the shared one.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from collections.abc import Sequence

import psycopg

from benchmarks._common import process_cpu_seconds

SCRATCH = "bench_lease_frontier"
BASE_US = 1_795_600_000_000_000  # 2026-11-24: later than any frontier the market holds

_FACTS = """
    SELECT id, state, cards, cluster_id, buyer_id, price_card_id, started_at IS NOT NULL,
           (EXTRACT(EPOCH FROM start_at) * 1000000)::bigint, (EXTRACT(EPOCH FROM end_at) * 1000000)::bigint,
           (EXTRACT(EPOCH FROM stop_requested_at) * 1000000)::bigint,
           (EXTRACT(EPOCH FROM ended_at) * 1000000)::bigint, {frontier} replaces_id
      FROM broker_lease WHERE operator_id = %s AND id = ANY(%s::bigint[]) ORDER BY id {lock}
"""
_ADVANCE = """
    UPDATE {table} AS f SET {previous} {column} = GREATEST(f.{column},
           TIMESTAMPTZ 'epoch' + b.end_us * INTERVAL '1 microsecond')
      FROM unnest(%s::bigint[], %s::bigint[]) AS b(id, end_us) WHERE f.{key} = b.id {returning}
"""


def _array(values: Sequence[int]) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def _batch(cursor: psycopg.Cursor, strategy: str, operator: int, ids: str, ends: str) -> int:
    if strategy == "lease":
        frontier = "(EXTRACT(EPOCH FROM last_usage_end_at) * 1000000)::bigint,"
        cursor.execute(_FACTS.format(frontier=frontier, lock="FOR NO KEY UPDATE"), [operator, ids])
        n = len(cursor.fetchall())
        advance = _ADVANCE.format(
            table="broker_lease", previous="", column="last_usage_end_at", key="id", returning=""
        )
        cursor.execute(advance, [ids, ends])
        return n
    if strategy == "narrow":
        cursor.execute(
            f"SELECT lease_id, (EXTRACT(EPOCH FROM end_at) * 1000000)::bigint FROM {SCRATCH}"
            " WHERE operator_id = %s AND lease_id = ANY(%s::bigint[]) ORDER BY lease_id FOR NO KEY UPDATE",
            [operator, ids],
        )
        n = len(cursor.fetchall())
        cursor.execute(_FACTS.format(frontier="", lock=""), [operator, ids])
        cursor.fetchall()
        cursor.execute(
            _ADVANCE.format(table=SCRATCH, previous="", column="end_at", key="lease_id", returning=""),
            [ids, ends],
        )
        return n
    if strategy == "narrow-merged":
        advance = _ADVANCE.format(
            table=SCRATCH,
            previous="previous_end_at = f.end_at,",
            column="end_at",
            key="lease_id",
            returning="AND f.operator_id = %s RETURNING f.lease_id, f.previous_end_at",
        )
        cursor.execute(advance, [ids, ends, operator])
        n = len(cursor.fetchall())
        cursor.execute(_FACTS.format(frontier="", lock=""), [operator, ids])
        cursor.fetchall()
        return n
    if strategy == "lease-merged":
        returning = (
            "AND f.operator_id = %s RETURNING f.id, f.state, f.cards, f.cluster_id, f.buyer_id, f.price_card_id,"
            " f.started_at IS NOT NULL, (EXTRACT(EPOCH FROM f.start_at) * 1000000)::bigint,"
            " (EXTRACT(EPOCH FROM f.end_at) * 1000000)::bigint,"
            " (EXTRACT(EPOCH FROM f.stop_requested_at) * 1000000)::bigint,"
            " (EXTRACT(EPOCH FROM f.ended_at) * 1000000)::bigint, f.replaces_id"
        )
        advance = _ADVANCE.format(
            table="broker_lease", previous="", column="last_usage_end_at", key="id", returning=returning
        )
        cursor.execute(advance, [ids, ends, operator])
        return len(cursor.fetchall())
    cursor.execute(_FACTS.format(frontier="", lock=""), [operator, ids])
    return len(cursor.fetchall())


STRATEGIES = ("lease", "narrow", "narrow-merged", "lease-merged", "facts")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lease_frontier", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--database-url", required=True, help="a copy of a kept market (it is written to)")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument(
        "--leases", type=int, default=385, help="leases named per batch (at most the operator's)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.database_url.rstrip("/").rsplit("/", 1)[-1] == "bench_base":
        parser.error("bench_base is shared: give a copy (CREATE DATABASE x TEMPLATE bench_base)")

    with psycopg.connect(args.database_url) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone() or (0,)
        cursor.execute(f"DROP TABLE IF EXISTS {SCRATCH}")
        cursor.execute(
            f"CREATE TABLE {SCRATCH} (lease_id bigint PRIMARY KEY, operator_id bigint NOT NULL,"
            " end_at timestamptz, previous_end_at timestamptz) WITH (fillfactor = 50)"
        )
        cursor.execute(f"INSERT INTO {SCRATCH} SELECT id, operator_id, last_usage_end_at FROM broker_lease")
        cursor.execute(
            "SELECT operator_id, array_agg(id ORDER BY id) FROM broker_lease WHERE state = 'running' GROUP BY 1"
        )
        operators = cursor.fetchall()
        cursor.execute("SELECT count(*) FROM broker_lease")
        (leases,) = cursor.fetchone() or (0,)
        conn.commit()
        rng = random.Random(args.seed)
        batches = []
        for _ in range(args.batches):
            operator, ids = operators[rng.randrange(len(operators))]
            chosen = sorted(rng.sample(ids, args.leases)) if args.leases < len(ids) else ids
            batches.append((operator, _array(chosen), len(chosen)))
        per_batch = statistics.mean(n for _, _, n in batches)
        print(
            f"{leases:,} leases; {args.batches} batches of {per_batch:.0f} leases; load {os.getloadavg()[0]:.2f}"
        )
        cpu: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        step = 0
        for _ in range(args.rounds):
            for strategy in STRATEGIES:
                named = 0
                before = process_cpu_seconds(backend) or 0.0
                for operator, ids, n in batches:
                    step += 1
                    named += _batch(
                        cursor, strategy, operator, ids, _array([BASE_US + step * 60_000_000] * n)
                    )
                    conn.commit()
                cpu[strategy].append(((process_cpu_seconds(backend) or 0.0) - before) / named * 1e6)
        cursor.execute(f"DROP TABLE {SCRATCH}")
        conn.commit()
    print("PostgreSQL CPU µs per lease named, median (range) of the rounds:")
    for strategy in STRATEGIES:
        values = cpu[strategy]
        print(f"  {strategy:14s} {statistics.median(values):6.1f}  ({min(values):.1f}–{max(values):.1f})")
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
