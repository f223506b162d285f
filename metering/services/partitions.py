"""Monthly partitions of the usage history on PostgreSQL: created ahead by a beat, detached for retention.

Usage records (on ``start_at``) and rated segments (on ``record_start_at``, their record's start) are
``PARTITION BY RANGE`` tables (migration 0014), one partition per calendar month of the billing zone
(``CARDHOUR_BILLING_TIME_ZONE``), so a month's close reads one month, and a month leaves the database by
``DETACH PARTITION`` instead of billions of DELETEs. Names: ``<table>_pYYYYMM``; a DEFAULT partition
``<table>_default`` catches a row no month holds yet (the beat did not run), so an insert never fails.

Other databases keep plain tables: every function here is a no-op there.

Retention: ``usage_partition_detach`` (the ``usage_partitions`` management command) detaches one month of
both tables once it is closed — past the late window, nothing pending rating, every segment on an invoice and
a settlement — deletes that month's idempotency keys (usage so old is refused as too late, so the keys can
never be needed) and clears exhaustion flags' pointers into it. The detached tables stay as plain tables to
archive (``pg_dump -t``) and drop (``--drop``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from metering.errors import PartitionNotRetainableError

logger = logging.getLogger("cardhour.partitions")

# table -> partition column
PARTITIONED_TABLES = {"metering_usagerecord": "start_at", "metering_ratedsegment": "record_start_at"}
# One key for every partition change, so two beats (or a beat and the command) never race on DDL.
_LOCK_KEY = 0x43485F50415254  # "CH_PART"


@dataclass(frozen=True)
class Partition:
    table: str
    name: str
    month: date | None  # None: the DEFAULT partition
    rows_estimate: int


def _zone() -> ZoneInfo:
    return ZoneInfo(settings.CARDHOUR_BILLING_TIME_ZONE)


def next_month(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def partition_month_of(at: datetime) -> date:
    """The month (first day) of the partition that holds ``at``."""
    return at.astimezone(_zone()).date().replace(day=1)


def partition_bounds(month: date) -> tuple[datetime, datetime]:
    """``[local midnight of the 1st, local midnight of the next 1st)`` in the billing zone: the same bounds
    as the month's billing period (metering.services.billing.billing_period_bounds)."""
    zone = _zone()
    following = next_month(month)
    return (
        datetime(month.year, month.month, 1, tzinfo=zone),
        datetime(following.year, following.month, 1, tzinfo=zone),
    )


def partition_name(table: str, month: date) -> str:
    return f"{table}_p{month:%Y%m}"


def _partitions_of(cursor, table: str) -> set[str]:
    cursor.execute(
        "SELECT child.relname FROM pg_inherits i JOIN pg_class child ON child.oid = i.inhrelid"
        " JOIN pg_class parent ON parent.oid = i.inhparent WHERE parent.relname = %s",
        [table],
    )
    return {name for (name,) in cursor.fetchall()}


def _is_partitioned(cursor, table: str) -> bool:
    cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE relname = %s", [table])
    row = cursor.fetchone()
    return bool(row and row[0])


def usage_partitions_ensure(*, now: datetime | None = None, months_ahead: int | None = None) -> list[str]:
    """Create the missing monthly partitions of both tables, from the month the late window reaches back to
    through ``months_ahead`` (``CARDHOUR_USAGE_PARTITIONS_AHEAD``) months after the current one; return
    the names created. Idempotent (a month that exists is left alone) and serialised by an advisory lock.

    A month whose rows already sit in the DEFAULT partition (inserted while it did not exist) is created
    empty, the rows are moved into it and it is attached, in one transaction. Creating a partition takes a
    brief exclusive lock on the parent, so this waits at most 5 s for it (then fails and is retried) rather
    than queueing every insert behind a long transaction.
    """
    if connection.vendor != "postgresql":
        return []
    now = now or timezone.now()
    ahead = settings.CARDHOUR_USAGE_PARTITIONS_AHEAD if months_ahead is None else months_ahead
    month = partition_month_of(now - timedelta(days=settings.CARDHOUR_LATE_USAGE_DAYS))
    last = partition_month_of(now)
    for _ in range(ahead):
        last = next_month(last)
    months = []
    while month <= last:
        months.append(month)
        month = next_month(month)
    created: list[str] = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '5s'")
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        for table, column in PARTITIONED_TABLES.items():
            if not _is_partitioned(cursor, table):
                continue
            existing = _partitions_of(cursor, table)
            for month in months:
                name = partition_name(table, month)
                if name not in existing:
                    _create(cursor, table=table, column=column, name=name, month=month)
                    created.append(name)
    if created:
        logger.info("usage partitions created: %s", ", ".join(created))
    return created


def _create(cursor, *, table: str, column: str, name: str, month: date) -> None:
    low, high = partition_bounds(month)
    bounds = f"FROM ('{low.isoformat()}') TO ('{high.isoformat()}')"
    default = f"{table}_default"
    cursor.execute(
        f"SELECT EXISTS (SELECT 1 FROM {default} WHERE {column} >= %s AND {column} < %s)",  # noqa: S608
        [low, high],
    )
    if not cursor.fetchone()[0]:
        cursor.execute(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES {bounds}")
        return
    # Rows of this month were caught by the DEFAULT partition: a partition cannot be created over them.
    cursor.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    cursor.execute(
        f"WITH moved AS (DELETE FROM {default} WHERE {column} >= %s AND {column} < %s RETURNING *)"  # noqa: S608
        f" INSERT INTO {name} SELECT * FROM moved",
        [low, high],
    )
    moved = cursor.rowcount
    cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES {bounds}")
    logger.warning("usage partition %s created late: %d rows moved out of %s", name, moved, default)


def usage_partitions_list() -> list[Partition]:
    """Every partition of both tables with the planner's row estimate (the DEFAULT one last)."""
    if connection.vendor != "postgresql":
        return []
    found: list[Partition] = []
    with connection.cursor() as cursor:
        for table in PARTITIONED_TABLES:
            cursor.execute(
                "SELECT child.relname, greatest(child.reltuples, 0)::bigint FROM pg_inherits i"
                " JOIN pg_class child ON child.oid = i.inhrelid JOIN pg_class parent ON parent.oid = i.inhparent"
                " WHERE parent.relname = %s ORDER BY child.relname",
                [table],
            )
            for name, rows in cursor.fetchall():
                suffix = name.removeprefix(f"{table}_p")
                month = date(int(suffix[:4]), int(suffix[4:6]), 1) if suffix.isdigit() else None
                found.append(Partition(table=table, name=name, month=month, rows_estimate=rows))
    return sorted(found, key=lambda p: (p.table, p.month is None, p.month or date.min))


@transaction.atomic
def usage_partition_detach(*, month: date, drop: bool = False, now: datetime | None = None) -> list[str]:
    """Detach (and with ``drop``, drop) ``month``'s partitions of usage records and rated segments.

    Refuses with PartitionNotRetainableError unless the month ended before the late window (no record of it
    can still arrive), no record of it waits for rating, and every segment of it is on an invoice and a
    settlement (its statements are issued and frozen). Deletes the month's idempotency keys and clears the
    exhaustion flags' pointers to its records (both would dangle). Returns the detached tables' names.
    """
    if connection.vendor != "postgresql":
        raise PartitionNotRetainableError(
            "Usage history is partitioned on PostgreSQL only.", extra={"month": month.isoformat()}
        )
    now = now or timezone.now()
    month = month.replace(day=1)
    low, high = partition_bounds(month)
    if high > now - timedelta(days=settings.CARDHOUR_LATE_USAGE_DAYS):
        raise PartitionNotRetainableError(
            f"{month:%Y-%m} is inside the {settings.CARDHOUR_LATE_USAGE_DAYS}-day late window.",
            extra={"month": month.isoformat()},
        )
    records, segments = (partition_name(table, month) for table in PARTITIONED_TABLES)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '5s'")
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        present = _partitions_of(cursor, "metering_usagerecord") | _partitions_of(
            cursor, "metering_ratedsegment"
        )
        if records not in present or segments not in present:
            raise PartitionNotRetainableError(
                f"No attached partitions for {month:%Y-%m}.", extra={"month": month.isoformat()}
            )
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM metering_usagepending WHERE start_at >= %s AND start_at < %s)",
            [low, high],
        )
        if cursor.fetchone()[0]:
            raise PartitionNotRetainableError(
                f"Usage of {month:%Y-%m} still waits for rating.", extra={"month": month.isoformat()}
            )
        cursor.execute(
            f"SELECT count(*) FROM {segments} WHERE invoice_id IS NULL OR settlement_id IS NULL"  # noqa: S608
        )
        unbilled = cursor.fetchone()[0]
        if unbilled:
            raise PartitionNotRetainableError(
                f"{unbilled} segment(s) of {month:%Y-%m} are on no issued statement yet.",
                extra={"month": month.isoformat(), "unbilled_segments": unbilled},
            )
        cursor.execute(
            f"DELETE FROM metering_usagekey k USING {records} u"  # noqa: S608
            " WHERE k.operator_id = u.operator_id AND k.idempotency_key = u.idempotency_key"
            " AND k.usage_record_id = u.id"
        )
        keys = cursor.rowcount
        cursor.execute(
            f"UPDATE metering_buyerexhaustion SET usage_record_id = NULL WHERE usage_record_id IN"  # noqa: S608
            f" (SELECT id FROM {records})"
        )
        for table, name in zip(PARTITIONED_TABLES, (records, segments), strict=True):
            cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {name}")
            if drop:
                cursor.execute(f"DROP TABLE {name}")
    logger.warning(
        "usage partitions of %s %s (%d keys deleted)",
        f"{month:%Y-%m}",
        "dropped" if drop else "detached",
        keys,
    )
    return [records, segments]
