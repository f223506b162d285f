"""Broker reads: a buyer's jobs and leases, an operator's leases, and what a buyer can still afford."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import connections, router
from django.db.models import BooleanField, Case, Count, Max, Prefetch, QuerySet, Sum, Value, When
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]
from django.utils import timezone
from django.utils.translation import gettext as _

from broker.errors import JobNotFoundError, LeaseNotFoundError, QuoteNotFoundError
from broker.models import (
    HOLDING_STATES,
    BuyerNotice,
    CapacityHold,
    DrawHold,
    DrawPending,
    Job,
    Lease,
    LeaseTransition,
    Quote,
)
from core.charts import band_sort_key
from core.db import bound_cursor
from core.models import Organisation
from core.money import from_micros, lines_total, to_micros
from metering.models import Pack, RatedSegment, UsageRecord
from metering.selectors.payments import (
    PACK_BALANCES_SELECT,
    buyer_balance_summary,
    pack_balances_params,
    pack_balances_rows,
    pack_balances_usable,
)
from metering.selectors.spend import usage_chip_draws

STANDARD_CLASS = "std"
_DRAW_QUANTUM = Decimal("0.000001")


def job_list_for(*, buyer: Organisation) -> QuerySet[Job]:
    return job_list_for_ids(buyer_id=buyer.pk)


def job_list_for_ids(*, buyer_id: int) -> QuerySet[Job]:
    return (
        Job.objects.filter(buyer_id=buyer_id)
        .select_related("origin_hub", "cluster")
        .order_by("-created_at", "-id")
    )


def job_get_for(*, buyer: Organisation, job_id: int) -> Job:
    """One of the buyer's jobs; another buyer's job is JobNotFoundError (404), so existence does not leak.

    The query is ``job_list_for(buyer=buyer).filter(pk=job_id).first()`` (its origin hub and cluster
    selected with it), composed once per thread and run with each call's buyer and job (see
    _PreparedJobQuery): composing it cost more CPU than running it, on every quote."""
    job = _prepared_job_query().get(buyer_id=buyer.pk, job_id=job_id) if 0 < job_id < 2**63 else None
    if job is None:
        raise JobNotFoundError(_("No job %(id)s.") % {"id": job_id}, extra={"job_id": job_id})
    job.buyer = buyer  # the row was selected by it: no query for ``job.buyer`` later (a quote reads it)
    return job


# Stand-ins for the two parameters while the query is composed; they are found among its parameters
# and replaced by each call's values. Negative: no real buyer or job has them.
_BUYER_STAND_IN, _JOB_STAND_IN = -7_301_113, -7_301_127


class _PreparedJobQuery:
    """``job_list_for(buyer).filter(pk=job).first()`` composed once: the SQL and the compiler Django made
    for it, run again with other values through the same row conversion and model building as a
    queryset's (ModelIterable's steps: the compiler's converters, ``Job.from_db``, the related
    populators of select_related). One per thread and database connection, as a compiler is."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.connection = connections[alias]
        queryset = job_list_for_ids(buyer_id=_BUYER_STAND_IN).using(alias).filter(pk=_JOB_STAND_IN)[:1]
        self.compiler = queryset.query.get_compiler(using=alias)
        self.sql, params = self.compiler.as_sql()
        self.order = tuple({_BUYER_STAND_IN: "buyer", _JOB_STAND_IN: "job"}[param] for param in params)
        assert sorted(self.order) == ["buyer", "job"], params
        klass_info = self.compiler.klass_info
        assert klass_info is not None
        select = self.compiler.select
        fields = klass_info["select_fields"]
        self.start, self.end = fields[0], fields[-1] + 1
        self.init_list = [column[0].target.attname for column in select[self.start : self.end]]
        self.populators = get_related_populators(klass_info, select, alias)
        # The row converters results_iter would look up on every call (a tenth of the job lookup's CPU):
        # found once, applied as results_iter applies them.
        columns = [column[0] for column in select[0 : self.compiler.col_count]]
        self.converters = self.compiler.get_converters(columns)
        assert not self.compiler.has_composite_fields(columns)

    def get(self, *, buyer_id: int, job_id: int) -> Job | None:
        values = {"buyer": buyer_id, "job": job_id}
        with bound_cursor(self.alias) as cursor:  # prepared once per connection in production (core.db)
            cursor.execute(self.sql, [values[name] for name in self.order])
            rows = cursor.fetchall()
        if self.converters:
            rows = list(self.compiler.apply_converters(rows, self.converters))
        for row in rows:
            job = Job.from_db(self.alias, self.init_list, row[self.start : self.end])
            for populator in self.populators:
                populator.populate(row, job)
            return job
        return None


_prepared = threading.local()


def _prepared_job_query() -> _PreparedJobQuery:
    alias = router.db_for_read(Job)
    query: _PreparedJobQuery | None = getattr(_prepared, "job", None)
    if query is None or query.alias != alias or query.connection is not connections[alias]:
        query = _prepared.job = _PreparedJobQuery(alias)
    return query


def quote_get_for(*, buyer: Organisation, quote_id: int) -> Quote:
    quote = (
        Quote.objects.filter(pk=quote_id, job__buyer=buyer)
        .select_related("job", "cluster", "price_card")
        .first()
        if 0 < quote_id < 2**63
        else None
    )
    if quote is None:
        raise QuoteNotFoundError(_("No quote %(id)s.") % {"id": quote_id}, extra={"quote_id": quote_id})
    return quote


def notice_list_for(*, buyer: Organisation) -> QuerySet[BuyerNotice]:
    return BuyerNotice.objects.filter(buyer=buyer).order_by("-created_at", "-id")


def _leases() -> QuerySet[Lease]:
    return Lease.objects.select_related(
        "cluster",
        "cluster__accelerator",
        "cluster__hub",
        "price_card__tariff_version__tariff",
        "job",
        "buyer",
        "operator",
    ).prefetch_related(
        Prefetch("holds", queryset=CapacityHold.objects.select_related("island").order_by("island_id"))
    )


def lease_list_for_buyer(*, buyer: Organisation) -> QuerySet[Lease]:
    return _leases().filter(buyer=buyer).order_by("-start_at", "-id")


def lease_get_for_buyer(*, buyer: Organisation, lease_id: int) -> Lease:
    lease = lease_list_for_buyer(buyer=buyer).filter(pk=lease_id).first() if 0 < lease_id < 2**63 else None
    if lease is None:
        raise LeaseNotFoundError(_("No lease %(id)s.") % {"id": lease_id}, extra={"lease_id": lease_id})
    return lease


def lease_list_for_operator(*, operator: Organisation) -> QuerySet[Lease]:
    return _leases().filter(operator=operator).order_by("id")


def lease_get_for_operator(*, operator: Organisation, lease_id: int) -> Lease:
    lease = (
        lease_list_for_operator(operator=operator).filter(pk=lease_id).first()
        if 0 < lease_id < 2**63
        else None
    )
    if lease is None:
        raise LeaseNotFoundError(_("No lease %(id)s.") % {"id": lease_id}, extra={"lease_id": lease_id})
    return lease


def lease_transitions(*, lease: Lease) -> QuerySet[LeaseTransition]:
    return LeaseTransition.objects.filter(lease=lease).order_by("id")


@dataclass(frozen=True)
class Affordability:
    """A buyer's balances per class and its live leases' pending draws, as a refusal's ``extra`` reports
    them. Whether a draw is paid is decided by broker.draws (rating's order), not here.

    ``chip`` maps a chip slug to card-hours of that chip's packs; ``standard`` is standard card-hours.
    ``committed`` is what live leases are still expected to draw, per chip (in that chip's card-hours).
    """

    chip: dict[str, Decimal]
    standard: Decimal
    committed: dict[str, Decimal]
    factors: dict[str, Decimal | None]


def buyer_affordability(*, buyer: Organisation, at: datetime | None = None) -> Affordability:
    """The buyer's pack balances and what its live leases are still expected to draw: their pending draws,
    expected less posted (draw_pending_for)."""
    at = at or timezone.now()
    chip: dict[str, Decimal] = {}
    standard = Decimal(0)
    for balance in buyer_balance_summary(buyer=buyer, at=at):
        if balance.accelerator is None:
            standard += balance.remaining_card_hours
        else:
            chip[balance.accelerator] = (
                chip.get(balance.accelerator, Decimal(0)) + balance.remaining_card_hours
            )
    committed = draw_pending_for(buyer_id=buyer.pk)
    factors: dict[str, Decimal | None] = {}
    if committed:
        factors.update(_chip_factors(set(committed)))
    return Affordability(chip=chip, standard=standard, committed=committed, factors=factors)


def draw_pending_for(*, buyer_id: int, exclude_lease_ids: Sequence[int] = ()) -> dict[str, Decimal]:
    """What the buyer's live leases are still expected to draw, per draw class (chip card-hours × band
    multiplier): each live lease's expected draw less what rating has posted for it, never below zero,
    summed (broker.services.draw_holds keeps the sum as leases are accepted, rated and end). One row per
    class, whatever the number of leases; without the open holds of ``exclude_lease_ids``."""
    alias = router.db_for_read(DrawPending)
    # Fixed text with bound values: every quote asks, and compiling the ORM query cost more than running it.
    # Bound by PostgreSQL (prepared once per connection in production, core.db), so not planned each time.
    with bound_cursor(alias) as cursor:
        cursor.execute(_DRAW_PENDING_SQL, [buyer_id])
        pending = dict(cursor.fetchall())
    if exclude_lease_ids:
        for hold in DrawHold.objects.filter(lease_id__in=list(exclude_lease_ids), buyer_id=buyer_id):
            if hold.draw_class in pending:
                pending[hold.draw_class] -= hold.open_micros
    return _pending_amounts(pending)


def _pending_amounts(pending: dict[str, int]) -> dict[str, Decimal]:
    return {draw_class: from_micros(micros) for draw_class, micros in sorted(pending.items()) if micros > 0}


def pack_balances_and_pending(
    *, buyer_id: int, at: datetime
) -> tuple[list[tuple[int, str, datetime, datetime, int, Decimal, int]], dict[str, Decimal]]:
    """``pack_balances_usable(buyer_id, at)`` and ``draw_pending_for(buyer_id)``, what every quote reads
    about its buyer, in one round trip on PostgreSQL: the two fixed-text statements as one ``UNION ALL``
    (bound and prepared like them, core.db), a pending class's row carrying its class where a pack's
    carries its chip and its open micro-card-hours where a pack's carries its balance, and no pack id.
    Each round trip a quote makes is a wait for PostgreSQL and then for the interpreter lock, which the
    quote pays many times its CPU on a busy server (issue 14). Elsewhere, the two calls."""
    alias = router.db_for_read(DrawPending)
    if connections[alias].vendor != "postgresql" or router.db_for_read(Pack) != alias:
        return pack_balances_usable(buyer_id=buyer_id, at=at), draw_pending_for(buyer_id=buyer_id)
    with bound_cursor(alias) as cursor:
        cursor.execute(_PACKS_AND_PENDING_SQL, [*pack_balances_params(buyer_id, at), buyer_id])
        rows = cursor.fetchall()
    packs = pack_balances_rows([row for row in rows if row[0] is not None])
    return packs, _pending_amounts({row[1]: row[4] for row in rows if row[0] is None})


def draw_pending_recompute(*, buyer_id: int) -> dict[str, Decimal]:
    """``draw_pending_for`` from scratch, for proofs and reconciliation (never on a hot path): every live
    lease's expected draw less what rating has posted for its usage (metering.selectors.spend), never below
    zero, summed per draw class. The maintained figure must equal it after any sequence of acceptances,
    usage, rating, ends, cancellations and failovers."""
    live = list(
        Lease.objects.filter(buyer_id=buyer_id, state__in=HOLDING_STATES).values_list(
            "pk", "draw_class", "expected_draw"
        )
    )
    posted = usage_chip_draws(references=[f"lease:{pk}" for pk, _, _ in live])
    pending: dict[str, int] = {}
    for pk, draw_class, expected in live:
        open_micros = max(to_micros(expected) - posted.get(f"lease:{pk}", 0), 0)
        pending[draw_class] = pending.get(draw_class, 0) + open_micros
    return {draw_class: from_micros(micros) for draw_class, micros in sorted(pending.items()) if micros > 0}


_DRAW_PENDING_SQL = (
    f"SELECT draw_class, open_micros FROM {DrawPending._meta.db_table} "  # noqa: S608
    "WHERE buyer_id = %s AND open_micros > 0"
)
# The packs first, earliest expiry first (their order of draw), then the pending classes (no expiry: last).
_PACKS_AND_PENDING_SQL = (
    f"({PACK_BALANCES_SELECT}) UNION ALL "  # noqa: S608
    f"(SELECT NULL, draw_class, NULL, NULL, open_micros, NULL, NULL FROM {DrawPending._meta.db_table} "
    "WHERE buyer_id = %s AND open_micros > 0) ORDER BY 4, 1"
)


def _chip_factors(slugs: set[str]) -> dict[str, Decimal | None]:
    from federation.selectors import accelerator_list, standard_card_current, standard_card_factor

    standard = standard_card_current()
    return {
        accelerator.slug: standard_card_factor(tflops=accelerator.dense_fp16_tflops, standard=standard)
        for accelerator in accelerator_list().filter(slug__in=slugs)
    }


# --- Portal reads -----------------------------------------------------------------------------------


def job_list_with_leases_for(*, buyer: Organisation, state: str | None = None) -> QuerySet[Job]:
    """The buyer's jobs, newest first (optionally in one ``state``), each with its leases prefetched
    newest first (one query for the whole page, however many jobs)."""
    jobs = job_list_for(buyer=buyer)
    if state:
        jobs = jobs.filter(state=state)
    return jobs.prefetch_related(
        Prefetch("leases", queryset=Lease.objects.select_related("cluster").order_by("-created_at", "-id"))
    )


def job_quotes_latest(*, job: Job) -> list[Quote]:
    """The job's latest batch of quotes (those made by its last quote request), best rank first, each
    with its lease if it was accepted. Empty when the job was never quoted."""
    latest = Quote.objects.filter(job=job).order_by("-created_at", "-id").values_list("created_at", flat=True)
    created_at = latest.first()
    if created_at is None:
        return []
    return list(
        Quote.objects.filter(job=job, created_at=created_at).select_related("lease").order_by("rank", "id")
    )


def job_leases(*, job: Job) -> QuerySet[Lease]:
    """The job's leases, newest first, with their clusters and islands."""
    return _leases().filter(job=job).order_by("-created_at", "-id")


def job_history(*, job: Job) -> QuerySet[LeaseTransition]:
    """Every state change of every lease of the job, in order."""
    return LeaseTransition.objects.filter(lease__job=job).order_by("at", "id")


def job_notices(*, job: Job) -> QuerySet[BuyerNotice]:
    return BuyerNotice.objects.filter(job=job, buyer_id=job.buyer_id).order_by("-created_at", "-id")


@dataclass(frozen=True)
class ClassDraw:
    """Card-hours drawn in one pack class's unit (standard card-hours for ``std``, the chip's otherwise),
    or, with ``arrears``, the chip's card-hours × multiplier no pack covered."""

    class_key: str
    arrears: bool
    micros: int

    @property
    def card_hours(self) -> Decimal:
        return from_micros(self.micros)


@dataclass(frozen=True)
class BandUsage:
    """Rated usage of a lease in one tariff band: card-seconds, what the buyer pays for it (``spend``:
    prepaid value drawn plus arrears at the operator's gross, the sum of its lines rounded by
    core.money's rule), the operator's list price (gross), and what it drew per pack class."""

    band: str
    card_seconds: int
    spend: Decimal
    list_price: Decimal
    draws: tuple[ClassDraw, ...]

    @property
    def card_hours(self) -> Decimal:
        return (Decimal(self.card_seconds) / 3600).quantize(_DRAW_QUANTUM)


@dataclass(frozen=True)
class UsageLine:
    start_at: datetime
    end_at: datetime
    cards: int
    received_at: datetime
    rated: bool

    @property
    def card_hours(self) -> Decimal:
        seconds = int((self.end_at - self.start_at).total_seconds()) * self.cards
        return (Decimal(seconds) / 3600).quantize(_DRAW_QUANTUM)


@dataclass(frozen=True)
class LeaseUsage:
    """What was reported against a lease so far (usage records carrying its reference ``lease:<id>``):
    how many records, the card-hours they cover, the rated part by band with its cost and pack draw, and
    the latest records."""

    records: int
    unrated_records: int
    card_seconds: int
    bands: tuple[BandUsage, ...]
    recent: tuple[UsageLine, ...]
    last_end_at: datetime | None

    @property
    def card_hours(self) -> Decimal:
        return (Decimal(self.card_seconds) / 3600).quantize(_DRAW_QUANTUM)

    @property
    def rated_card_hours(self) -> Decimal:
        return sum((band.card_hours for band in self.bands), Decimal(0))

    @property
    def spend(self) -> Decimal:
        """What the buyer pays so far: the sum of the lease's rounded lines (band × pack class)."""
        return sum((band.spend for band in self.bands), Decimal("0.00"))

    @property
    def list_price(self) -> Decimal:
        return sum((band.list_price for band in self.bands), Decimal("0.00"))

    @property
    def draws(self) -> tuple[ClassDraw, ...]:
        """What the lease drew so far per pack class (each in its unit), then arrears."""
        sums: dict[tuple[bool, str], int] = {}
        for band in self.bands:
            for draw in band.draws:
                sums[(draw.arrears, draw.class_key)] = (
                    sums.get((draw.arrears, draw.class_key), 0) + draw.micros
                )
        return tuple(
            ClassDraw(class_key=key, arrears=arrears, micros=micros)
            for (arrears, key), micros in sorted(
                sums.items(), key=lambda kv: (kv[0][0], kv[0][1] != "std", kv[0][1])
            )
        )


def lease_usage(*, lease: Lease, recent: int = 10) -> LeaseUsage:
    """Usage reported against ``lease`` (its buyer's records with reference ``lease:<id>``) in a fixed
    number of queries, however many records: the rated part is summed per band in the database, only the
    records not rated yet (a few, between rating runs) are read row by row."""
    records = UsageRecord.objects.filter(buyer_id=lease.buyer_id, reference=lease.reference)
    totals = records.aggregate(count=Count("id"), last_end_at=Max("end_at"))
    unrated = list(records.unrated().values_list("cards", "start_at", "end_at"))
    unrated_seconds = sum(cards * int((end - start).total_seconds()) for cards, start, end in unrated)
    rows = (
        RatedSegment.objects.filter(
            usage_record__buyer_id=lease.buyer_id, usage_record__reference=lease.reference
        )
        .annotate(
            arrears=Case(
                When(pack__isnull=True, then=Value(True)), default=Value(False), output_field=BooleanField()
            )
        )
        .values("band", "pack_class", "arrears")
        .annotate(
            card_seconds=Sum("card_seconds"),
            gross=Sum("gross"),
            value=Sum("buyer_value"),
            draw=Sum("pack_draw"),
        )
        .order_by()
    )
    # One line per band × pack class × arrears (a lease is on one cluster): core.money's rounding rule.
    per_band: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        per_band.setdefault(row["band"], []).append(row)
    bands = tuple(
        sorted(
            (
                BandUsage(
                    band=band,
                    card_seconds=sum(int(row["card_seconds"] or 0) for row in band_rows),
                    spend=lines_total(int(row["value"] or 0) for row in band_rows),
                    list_price=lines_total(int(row["gross"] or 0) for row in band_rows),
                    draws=tuple(
                        ClassDraw(
                            class_key=row["pack_class"],
                            arrears=bool(row["arrears"]),
                            micros=int(row["draw"] or 0),
                        )
                        for row in band_rows
                    ),
                )
                for band, band_rows in per_band.items()
            ),
            key=lambda band: band_sort_key(band.band),
        )
    )
    latest = [
        # A record still in the pending-rating queue is not rated yet (one left join, one-to-one).
        UsageLine(start_at=start, end_at=end, cards=cards, received_at=received, rated=pending is None)
        for cards, start, end, received, pending in records.order_by("-end_at", "-id").values_list(
            "cards", "start_at", "end_at", "received_at", "rating_pending"
        )[:recent]
    ]
    return LeaseUsage(
        records=int(totals["count"] or 0),
        unrated_records=len(unrated),
        card_seconds=unrated_seconds + sum(band.card_seconds for band in bands),
        bands=bands,
        recent=tuple(latest),
        last_end_at=totals["last_end_at"],
    )
