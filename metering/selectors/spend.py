"""What a buyer pays (*spend*, core.money: the segments' ``buyer_value``), as exact lines per usage
reference, for budgets: the broker groups the lines by lease and scope and rounds them by core.money's
rule, so a budget's figure is the one the usage page and the invoice print."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import BooleanField, Case, QuerySet, Sum, Value, When

from core.money import MICROS, round_div, scaled_int
from metering.models import RatedSegment, UsageRecord


@dataclass(frozen=True)
class SpendRow:
    """The exact micro-CNY a buyer paid for the segments of one usage reference (e.g. ``lease:42``), one
    cluster, band and pack class, covered by a pack or not (arrears): one line by core.money's rule."""

    reference: str
    cluster_id: int
    band: str
    pack_class: str
    arrears: bool
    value_micros: int


def buyer_spend_rows(
    *,
    buyer_id: int,
    starts_at: datetime | None = None,
    ends_at: datetime | None = None,
    references: Iterable[str] | None = None,
) -> list[SpendRow]:
    """The buyer's rated spend as lines per reference, in one grouped query: segments starting in
    ``[starts_at, ends_at)`` (a statement period, as /usage/ and the invoice take them), or of the given
    usage ``references`` whenever they happened, or both. Reached through the buyer's usage records
    (indexed by buyer and start, and by reference), never by a scan of the segment table."""
    segments: QuerySet[RatedSegment] = RatedSegment.objects.filter(usage_record__buyer_id=buyer_id)
    if starts_at is not None and ends_at is not None:
        # The record conditions are implied by the segment's (a segment lies inside its record).
        segments = segments.filter(
            usage_record__start_at__lt=ends_at,
            usage_record__end_at__gt=starts_at,
            start_at__gte=starts_at,
            start_at__lt=ends_at,
        )
    if references is not None:
        segments = segments.filter(usage_record__reference__in=list(references))
    rows = (
        segments.annotate(
            arrears=Case(
                When(pack__isnull=True, then=Value(True)), default=Value(False), output_field=BooleanField()
            )
        )
        .values("usage_record__reference", "usage_record__cluster_id", "band", "pack_class", "arrears")
        .annotate(value=Sum("buyer_value"))
        .order_by()
    )
    return [
        SpendRow(
            reference=row["usage_record__reference"],
            cluster_id=row["usage_record__cluster_id"],
            band=row["band"],
            pack_class=row["pack_class"],
            arrears=bool(row["arrears"]),
            value_micros=int(row["value"] or 0),
        )
        for row in rows
    ]


def usage_record_references(
    *, record_ids: list[int], starts: tuple[datetime, datetime] | None = None, prefix: str = ""
) -> dict[int, str]:
    """The reference (what produced it, e.g. ``lease:42``) of each usage record that has one starting with
    ``prefix``, by record id: one query. ``starts`` (the earliest and latest start of the records) lets
    PostgreSQL read only the months that hold them (the table is partitioned by start)."""
    if not record_ids:
        return {}
    if connection.vendor == "postgresql":
        low, high = min(record_ids), max(record_ids)
        dense = high - low < 2 * len(record_ids)
        if dense:
            # A rating batch's ids are mostly one run (the oldest pending records): one range scan of the
            # primary key, the few others dropped below, costs a third of one index descent per id.
            sql = "SELECT id, reference FROM metering_usagerecord WHERE id BETWEEN %s AND %s AND reference LIKE %s"
            params: list[int | str | datetime] = [low, high, _like_prefix(prefix)]
        else:
            # One array parameter, not one placeholder per id: a rating batch asks for up to 20,000
            # records, and a query of 20,000 placeholders cost more to compose than to run.
            sql = "SELECT id, reference FROM metering_usagerecord WHERE id = ANY(%s::bigint[]) AND reference LIKE %s"
            params = ["{" + ",".join(map(str, record_ids)) + "}", _like_prefix(prefix)]
        if starts is not None:
            sql += " AND start_at BETWEEN %s AND %s"
            params += [starts[0], starts[1]]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if not dense:
            return dict(rows)
        wanted = set(record_ids)
        return {record_id: reference for record_id, reference in rows if record_id in wanted}
    records = UsageRecord.objects.filter(pk__in=record_ids, reference__startswith=prefix)
    if starts is not None:
        records = records.filter(start_at__range=starts)
    return dict(records.values_list("pk", "reference"))


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def usage_chip_draws(*, references: Iterable[str]) -> dict[str, int]:
    """What rating has posted for the usage of each reference, in micro chip card-hours × band multiplier
    (whichever pack or arrears paid it), each record converted once as rating does
    (metering.services.rating: ``rated_draws_listener_register``). A from-scratch figure, for proofs and
    reconciliation, not for a hot path."""
    per_record: dict[tuple[str, int], int] = {}
    rows = (
        RatedSegment.objects.filter(usage_record__reference__in=list(references))
        .values_list("usage_record__reference", "usage_record_id", "card_seconds", "multiplier")
        .order_by()
    )
    for reference, record_id, card_seconds, multiplier in rows:
        key = (reference, record_id)
        per_record[key] = per_record.get(key, 0) + card_seconds * scaled_int(multiplier, 4)
    totals: dict[str, int] = {}
    for (reference, _record_id), card_seconds_e4 in per_record.items():
        totals[reference] = totals.get(reference, 0) + round_div(card_seconds_e4 * MICROS, 3600 * 10**4)
    return totals
