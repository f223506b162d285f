"""What a buyer pays (*spend*, core.money: the segments' ``buyer_value``), as exact lines per usage
reference, for budgets: the broker groups the lines by lease and scope and rounds them by core.money's
rule, so a budget's figure is the one the usage page and the invoice print."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import BooleanField, Case, QuerySet, Sum, Value, When

from metering.models import RatedSegment


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
