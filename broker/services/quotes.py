"""Quotes: the ranked placements of a job, stored for a short time so the buyer can accept one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import Exists, Field, OuterRef
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone
from django.utils.translation import gettext as _
from pydantic_core import to_json

from broker.catalog import market
from broker.draws import BuyerPacks, DrawPlan, buyer_packs_after_leases
from broker.errors import JobClosedError
from broker.matching import StartCosts, match, start_costs, window_of
from broker.models import Job, Lease, Quote
from broker.services.jobs import job_spec
from broker.services.relaxations import relaxations_find
from broker.types import JobSpec, MatchResult, Placement, Relaxation
from core.db import bound_cursor
from core.models import Organisation
from metering.selectors.tariffs import compiled_tariff
from metering.tariffs import CompiledTariff


def _tariff(tariff_version_id: int) -> CompiledTariff:
    return compiled_tariff(tariff_version_id=tariff_version_id)


def placements_find(
    *,
    spec: JobSpec,
    buyer: Organisation | None = None,
    now: datetime | None = None,
    limit: int = 10,
    distinct: bool = False,
) -> MatchResult:
    """The best ``limit`` feasible placements of ``spec`` (best first, by its preference) and why the
    other islands were rejected. With ``distinct``, identical islands of a cluster are one placement (an
    offer, the others in its ``alternatives``) and ``limit`` counts offers. Reads the in-memory market
    (see broker.catalog); holds nothing."""
    catalogue, holds, alive, held = market.book_view()
    return match(
        spec=spec,
        catalogue=catalogue,
        holds=holds,
        now=now or timezone.now(),
        step=settings.CARDHOUR_QUOTE_STEP_SECONDS,
        limit=limit,
        tariff_of=_tariff,
        distinct=distinct,
        held=held,
        alive=alive,
    )


def start_costs_find(
    *, spec: JobSpec, cluster_id: int, island_ids: tuple[int, ...], cards: int, now: datetime | None = None
) -> StartCosts | None:
    """What ``cards`` cards on one of ``island_ids`` would cost at each start of ``spec``'s window, and
    where the holds leave too few (broker.matching.start_costs on the in-memory market): the cost-against-
    start chart of an offer."""
    now = now or timezone.now()
    step = settings.CARDHOUR_QUOTE_STEP_SECONDS
    window = window_of(spec, now=now, step=step)
    catalogue, holds = market.view(start=window.span[0], end=window.span[1])
    return start_costs(
        spec=spec,
        catalogue=catalogue,
        holds=holds,
        now=now,
        step=step,
        cluster_id=cluster_id,
        island_ids=island_ids,
        cards=cards,
        tariff_of=_tariff,
    )


@dataclass(frozen=True)
class QuoteSet:
    job: Job
    quotes: list[Quote]
    result: MatchResult
    expires_at: datetime
    # When nothing fitted: the nearest changes to the job that would produce a quote (nearest first).
    relaxations: list[Relaxation]


def _plan(placement: Placement, packs: BuyerPacks | None) -> DrawPlan | None:
    if packs is None:
        return None
    return packs.plan(
        chip=placement.accelerator,
        factor=placement.standard_card_factor,
        draw=placement.expected_draw,
        rate=placement.rate_per_card_hour,
        at=placement.start_at,
    )


class _Shared:
    """What the quotes of one request share, made once: the draw plans and their JSON by what a plan
    depends on, and the bands' JSON by the placements' bands (the matcher gives placements priced alike
    the same bands). The JSON documents are shared between the quotes' breakdowns, which are written as
    they are and never changed."""

    __slots__ = ("bands", "packs", "plans")

    def __init__(self, packs: BuyerPacks | None) -> None:
        self.packs = packs
        self.plans: dict[tuple[object, ...], tuple[DrawPlan | None, dict[str, object] | None]] = {}
        self.bands: dict[int, tuple[tuple[object, ...], list[dict[str, object]]]] = {}

    def plan(self, placement: Placement) -> tuple[DrawPlan | None, dict[str, object] | None]:
        key = (
            placement.accelerator,
            placement.standard_card_factor,
            placement.expected_draw,
            placement.rate_per_card_hour,
            placement.start_at,
        )
        known = self.plans.get(key)
        if known is None:
            plan = _plan(placement, self.packs)
            known = self.plans[key] = (plan, plan.as_json() if plan is not None else None)
        return known

    def bands_json(self, placement: Placement) -> list[dict[str, object]]:
        known = self.bands.get(id(placement.bands))
        if known is None or known[0] is not placement.bands:  # the tuple is kept, so its id is its own
            known = self.bands[id(placement.bands)] = (
                placement.bands,
                [
                    {
                        "band": band.band,
                        "multiplier": str(band.multiplier),
                        "card_seconds": band.card_seconds,
                        "card_hours": str(band.card_hours),
                        "cost": str(band.cost),
                    }
                    for band in placement.bands
                ],
            )
        return known[1]


def _breakdown(
    placement: Placement, plan_json: dict[str, object] | None, bands: list[dict[str, object]]
) -> dict[str, object]:
    return {
        # Which of the buyer's packs would pay, in each pack's unit, and the buyer's effective price:
        # the buyer's balances at quote time, drawn rating's way (broker.draws).
        "draw_plan": plan_json,
        "bands": bands,
        "rate_per_card_hour": str(placement.rate_per_card_hour),
        "price_card_version": placement.price_card_version,
        "tariff": placement.tariff,
        "cluster": placement.cluster_cpi,
        "hub": placement.hub,
        "accelerator": placement.accelerator,
        "islands": [
            {"cpi": cpi, "cards": cards}
            for cpi, (_, cards) in zip(placement.island_cpis, placement.allocation, strict=True)
        ],
        "alternatives": [
            {"cpi": cpi, "cards": cards}
            for cpi, (_, cards) in zip(placement.alternative_cpis, placement.alternatives, strict=True)
        ],
        "standard_card_factor": str(placement.standard_card_factor)
        if placement.standard_card_factor
        else None,
        "expected_standard_draw": (
            str(placement.expected_standard_draw) if placement.expected_standard_draw is not None else None
        ),
        "earliest_feasible_cost": str(placement.earliest_feasible_cost),
        # The cluster's reliability score when quoted (the platform's prior for a new cluster) and the SLA
        # credit its price card would give at that availability (broker.services.reliability).
        "reliability": {
            "percent": str(placement.reliability_percent)
            if placement.reliability_percent is not None
            else None,
            "prior": placement.reliability_prior,
            "interruptions_per_1000_card_hours": (
                str(placement.interruptions_per_1000_card_hours)
                if placement.interruptions_per_1000_card_hours is not None
                else None
            ),
        },
        "expected_credit": str(placement.expected_credit),
        "adjusted_cost": str(placement.adjusted_cost),
        "earliest_feasible_start_at": placement.earliest_feasible_start_at.isoformat()
        if placement.earliest_feasible_start_at
        else None,
    }


def quote_create(*, job: Job, limit: int | None = None, now: datetime | None = None) -> QuoteSet:
    """Quote a job: store its best placements (``limit``, default 10, at most 100) as quotes that expire
    after ``CARDHOUR_QUOTE_TTL_SECONDS`` and hold nothing. Each quote says whether the buyer's packs,
    less its live leases' pending draws (expected less posted), cover the quote's expected draw. Raises JobClosedError for a
    job that is completed, failed or cancelled."""
    if job.state in (Job.State.COMPLETED, Job.State.FAILED, Job.State.CANCELLED):
        raise JobClosedError(
            _("Job %(job)s is %(state)s.") % {"job": job.pk, "state": job.state},
            extra={"job_id": job.pk, "state": job.state},
        )
    now = now or timezone.now()
    limit = min(max(limit or settings.CARDHOUR_QUOTE_LIMIT_DEFAULT, 1), settings.CARDHOUR_QUOTE_LIMIT_MAX)
    spec = job_spec(job=job)
    result = placements_find(spec=spec, now=now, limit=limit, distinct=True)
    relaxations = (
        []
        if result.placements
        else relaxations_find(
            spec=spec,
            result=result,
            find=lambda changed: placements_find(spec=changed, now=now, limit=1, distinct=True),
            now=now,
        )
    )
    expires_at = now + timedelta(seconds=settings.CARDHOUR_QUOTE_TTL_SECONDS)
    # The pending leases' chips are valued at the factors the placements carry (the catalogue's), which
    # also spares the quote two queries for the standard card and the chips.
    catalogue = market.catalogue
    packs = (
        buyer_packs_after_leases(
            buyer=job.buyer,
            at=now,
            known_factors=catalogue.standard_card_factors if catalogue is not None else None,
        )
        if result.placements
        else None
    )
    shared = _Shared(packs)
    plans = [shared.plan(placement) for placement in result.placements]
    quotes = [
        _quote_new(
            job,
            rank=rank,
            cluster_id=placement.cluster_id,
            allocation=[[island_id, cards] for island_id, cards in placement.allocation],
            alternatives=[[island_id, cards] for island_id, cards in placement.alternatives],
            cards=placement.cards,
            start_at=placement.start_at,
            end_at=placement.end_at,
            price_card_id=placement.price_card_id,
            cost=placement.cost,
            breakdown=_breakdown(placement, plan_json, shared.bands_json(placement)),
            latency_ms=placement.latency_ms,
            saving=placement.saving,
            expected_draw=placement.expected_draw,
            draw_class=placement.accelerator,
            # The rule lease_create applies when the quote is accepted (broker.draws).
            balance_sufficient=plan is not None and plan.covered,
            created_at=now,
            expires_at=expires_at,
        )
        for rank, (placement, (plan, plan_json)) in enumerate(
            zip(result.placements, plans, strict=True), start=1
        )
    ]
    summary = quote_summary_of(result=result, relaxations=relaxations, quoted_at=now, expires_at=expires_at)
    _quotes_store(quotes, job_id=job.pk, summary=summary)
    job.quote_summary = summary
    return QuoteSet(job=job, quotes=quotes, result=result, expires_at=expires_at, relaxations=relaxations)


@cache
def _quote_attnames() -> tuple[str, ...]:
    return tuple(field.attname for field in Quote._meta.concrete_fields)


def _quote_new(job: Job, **values: object) -> Quote:
    """``Quote(job=job, **values)`` at a fraction of its cost: what the model's positional constructor
    (the one ``Model.from_db`` uses) does for a new object, without its per-field ``setattr``: a fresh
    ``ModelState`` and every concrete field's value in the instance's ``__dict__`` (the foreign keys'
    descriptors only clear a cached related object on ``__set__``, and a new object caches none). When a
    receiver listens to Quote's ``pre_init`` or ``post_init``, the constructor itself, so that it runs.
    ``values`` are by attribute name (``cluster_id``); the id and ``replaces`` are None, as for a new
    quote; ``quote.job`` is ``job``, as the keyword constructor would cache it. A field added to Quote
    without a value here fails loudly."""
    values["id"] = None
    values["job_id"] = job.pk
    values.setdefault("replaces_id", None)
    attnames = _quote_attnames()
    ordered = [values.pop(name) for name in attnames]
    if values:
        raise TypeError(f"not fields of Quote: {sorted(values)}")
    if pre_init.has_listeners(Quote) or post_init.has_listeners(Quote):
        quote = Quote(*ordered)
    else:
        quote = Quote.__new__(Quote)
        quote._state = ModelState()
        quote.__dict__.update(zip(attnames, ordered, strict=True))
    Quote.job.field.set_cached_value(quote, job)
    return quote


def quote_summary_of(
    *, result: MatchResult, relaxations: list[Relaxation], quoted_at: datetime, expires_at: datetime
) -> dict[str, object]:
    """What a job keeps of its latest quote request (Job.quote_summary), in JSON."""
    return {
        "quoted_at": quoted_at.isoformat(),
        "expires_at": expires_at.isoformat(),
        "considered": int(result.considered),
        "feasible": int(result.feasible),
        "offers": len(result.placements),
        "rejections": {reason: int(count) for reason, count in result.rejections.items()},
        "window_start_at": result.window_start_at.isoformat(),
        "window_end_at": result.window_end_at.isoformat(),
        "relaxations": [relaxation_json(relaxation) for relaxation in relaxations],
    }


def relaxation_json(relaxation: Relaxation) -> dict[str, object]:
    return {
        "kind": relaxation.kind,
        "changes": relaxation.changes,
        "cluster": relaxation.cluster_cpi,
        "accelerator": relaxation.accelerator,
        "start_at": relaxation.start_at.isoformat(),
        "cost": str(relaxation.cost),
    }


@cache
def _job_quote_summary_sql() -> str:
    connection = connections[router.db_for_write(Job)]
    quote = connection.ops.quote_name
    # Identifiers from the model's metadata; the values are bound parameters.
    return "UPDATE {table} SET {summary} = %s WHERE {pk} = %s".format(  # noqa: S608
        table=quote(Job._meta.db_table),
        summary=quote(str(Job._meta.get_field("quote_summary").column)),
        pk=quote(str(Job._meta.pk.column)),
    )


def _job_quote_summary_set(*, job_id: int, summary: dict[str, object]) -> None:
    """``Job.objects.filter(pk=job_id).update(quote_summary=summary)`` without composing the query on every
    quote: the same statement (no ``updated_at``, no signals), its text built once."""
    alias = router.db_for_write(Job)
    connection = connections[alias]
    value = Job._meta.get_field("quote_summary").get_db_prep_save(summary, connection)
    with bound_cursor(alias) as cursor:  # prepared once per connection in production (core.db)
        cursor.execute(_job_quote_summary_sql(), [value, job_id])


def _quotes_store(quotes: list[Quote], *, job_id: int, summary: dict[str, object]) -> None:
    """Store a quote request's quotes and the job's summary that counts them, together: both or neither.

    On PostgreSQL, one statement (the quotes' insert with the job's update in a data-modifying ``WITH``,
    which PostgreSQL runs to completion whether or not the outer query reads it): a single statement is
    atomic on its own, so the request makes one round trip where ``BEGIN``, the insert, the update and
    ``COMMIT`` made four. Elsewhere (or with the two models on different databases), the insert and the
    update in one transaction.

    That statement, when it is its own transaction (no transaction open around it), commits
    asynchronously (``synchronous_commit`` off for it alone, as ``SET LOCAL`` would: see
    _recordset_insert_with_summary_sql): it answers without waiting for its WAL to reach the disk. A quote
    is an offer that holds nothing and expires in a minute; what a crash can lose is the quotes of the last
    moments before it (PostgreSQL's ``wal_writer_delay``, 200 ms, three times at most), never anything
    else and never a half: the WAL is one sequence, so a later transaction that commits synchronously —
    the acceptance that makes a lease of a quote — flushes the quote's insert with its own commit. Inside
    a transaction the caller opened, the commit is the caller's and stays as the caller set it."""
    alias = router.db_for_write(Quote)
    if quotes and connections[alias].vendor == "postgresql" and router.db_for_write(Job) == alias:
        _quotes_insert_recordset(quotes, alias, summary=(job_id, summary))
        return
    if not quotes:
        _job_quote_summary_set(job_id=job_id, summary=summary)  # one statement: atomic by itself
        return
    with transaction.atomic(using=alias):
        _quotes_insert(quotes)
        _job_quote_summary_set(job_id=job_id, summary=summary)


def _quotes_insert(quotes: list[Quote]) -> None:
    """Store ``quotes``, setting their ids: the rows ``Quote.objects.bulk_create`` writes, at a fraction of
    its cost.

    On PostgreSQL, one ``INSERT … SELECT … FROM jsonb_to_recordset(%s) … RETURNING id``: every row in one
    JSON parameter, so the statement's text is the same for any number of quotes (psycopg parses it once
    and caches it; a ``VALUES`` list of 10 × 19 placeholders is over psycopg's cache limits and was split
    on every request) and each value is converted by PostgreSQL's input function of its column's type, as
    a bound parameter would be. Elsewhere, one ``INSERT … VALUES … RETURNING id`` per batch the backend
    accepts, each value prepared by its field as bulk_create prepares it. A backend that cannot return
    rows from an insert uses bulk_create. Like bulk_create, no signals; ids come back in the order of
    the rows (an ``INSERT … SELECT`` from one set-returning function keeps its order, which bulk_create's
    own ``UNNEST`` insert relies on too)."""
    if not quotes:
        return
    alias = router.db_for_write(Quote)
    connection = connections[alias]
    if connection.vendor == "postgresql":
        _quotes_insert_recordset(quotes, alias)
        return
    if not connection.features.can_return_rows_from_bulk_insert:
        Quote.objects.bulk_create(quotes)
        return
    fields = [field for field in Quote._meta.concrete_fields if not field.primary_key]
    batch = max(connection.ops.bulk_batch_size(fields, quotes), 1)
    for first in range(0, len(quotes), batch):
        _quotes_insert_batch(quotes[first : first + batch], fields, alias)


@cache
def _recordset_insert_sql() -> tuple[str, tuple[tuple[Field, str], ...]]:
    """The PostgreSQL insert of Quote rows from a JSON array of objects keyed by column, and how each field
    is written into that JSON (see _recordset_value)."""
    connection = connections[router.db_for_write(Quote)]
    quote = connection.ops.quote_name
    fields = [field for field in Quote._meta.concrete_fields if not field.primary_key]
    kinds = []
    for field in fields:
        kind = field.get_internal_type()
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            kind = "auto"  # pre_save sets the value, as bulk_create's does
        kinds.append((field, kind))
    columns = ", ".join(quote(str(field.column)) for field in fields)
    record = ", ".join(f"{quote(str(field.column))} {field.db_type(connection)}" for field in fields)
    # Identifiers and types come from the model's metadata; the rows are one bound parameter.
    sql = (
        f"INSERT INTO {quote(Quote._meta.db_table)} ({columns}) "  # noqa: S608
        f"SELECT {columns} FROM jsonb_to_recordset(%s::jsonb) AS r({record}) "
        f"RETURNING {quote(str(Quote._meta.pk.column))}"
    )
    return sql, tuple(kinds)


@cache
def _recordset_insert_with_summary_sql(*, asynchronous: bool) -> str:
    """_recordset_insert_sql's insert and the job's quote summary update as one statement: the rows, then
    the summary and the job's id, as bound parameters; the quotes' ids come back in the order of the rows
    (the ``WITH``'s rows are read in the order its ``RETURNING`` gave them), each with a second column.

    ``asynchronous``: the statement sets ``synchronous_commit`` off for its own transaction
    (``set_config(…, true)`` is ``SET LOCAL``: it lasts until that transaction ends, and a transaction's
    commit reads it) — for a statement that is its own transaction only (see _quotes_store). The setting is
    made in the select list, so once per row returned: every call stores at least one quote."""
    connection = connections[router.db_for_write(Quote)]
    quote = connection.ops.quote_name
    insert, _ = _recordset_insert_sql()
    second = "set_config('synchronous_commit', 'off', true)" if asynchronous else "NULL"
    # Both statements' text comes from the models' metadata; every value is a bound parameter.
    return (
        f"WITH inserted AS ({insert}), summarised AS ({_job_quote_summary_sql()}) "  # noqa: S608
        f"SELECT {quote(str(Quote._meta.pk.column))}, {second} FROM inserted"
    )


_AS_IS: dict[str, type] = {
    "ForeignKey": int,
    "IntegerField": int,
    "PositiveIntegerField": int,
    "PositiveSmallIntegerField": int,
    "SmallIntegerField": int,
    "BigIntegerField": int,
    "CharField": str,
    "BooleanField": bool,
    "DecimalField": Decimal,
    "DateTimeField": datetime,
}


_NONE = type(None)
_MISSING = object()  # not in the instance's __dict__: read through the field, as _recordset_value reads it


# What a value of each kind of field may be to go into the rows as it is, for pydantic-core to encode:
# the classes _recordset_value passes through unprepared (a time only when aware), and None. A JSON
# document goes in as it is, whatever it is.
_ENCODED_AS_IS: dict[str, frozenset[type]] = {
    kind: frozenset({exact, _NONE}) for kind, exact in _AS_IS.items()
}


@cache
def _recordset_columns() -> tuple[tuple[str, str, bool, frozenset[type], bool, Field, str], ...]:
    """Per column of _recordset_insert_sql: its name, the field's attribute, whether its value goes into
    the rows as it is whatever it is (a JSON document), the classes it goes in as otherwise (none: always
    through _recordset_value), whether it is a time (as is only when aware), the field and its kind."""
    _, kinds = _recordset_insert_sql()
    return tuple(
        (
            str(field.column),
            field.attname,
            kind == "JSONField",
            frozenset() if kind == "auto" else _ENCODED_AS_IS.get(kind, frozenset()),
            kind == "DateTimeField",
            field,
            kind,
        )
        for field, kind in kinds
    )


def _recordset_value(quote: Quote, field: Field, kind: str) -> object:
    """A field's value as JSON that PostgreSQL's input function of the column's type reads as the value
    Django would bind: JSON documents as themselves (JSONField dumps them with json too), numbers and
    times as text, prepared by the field (a naive time is made aware with Django's warning)."""
    value: Any = field.pre_save(quote, True) if kind == "auto" else getattr(quote, field.attname)
    if value is None or kind == "JSONField":
        return value
    # What get_prep_value returns unchanged (an int for an integer field, an aware datetime, a Decimal):
    # as is, without the field's call; anything else (a string of digits, a naive time) through it.
    exact = _AS_IS.get(kind)
    if (
        exact is None
        or value.__class__ is not exact
        or (kind == "DateTimeField" and timezone.is_naive(value))
    ):
        value = field.get_prep_value(value)
    if kind == "DateTimeField":
        return value.isoformat()
    if kind == "DecimalField":
        return str(value)
    return value


def _quotes_insert_recordset(
    quotes: list[Quote], alias: str, *, summary: tuple[int, dict[str, object]] | None = None
) -> None:
    """The PostgreSQL insert; with ``summary`` (the job's id and quote summary), the job's update in the
    same statement."""
    sql, _ = _recordset_insert_sql()
    columns = _recordset_columns()
    rows = []
    for quote in quotes:
        values = quote.__dict__
        rows.append(
            {
                column: value
                if (always and value is not _MISSING)
                or (
                    value.__class__ in classes
                    and (value is None or not timed or value.utcoffset() is not None)
                )
                else _recordset_value(quote, field, kind)
                for column, attname, always, classes, timed, field, kind in columns
                for value in (values.get(attname, _MISSING),)
            }
        )
    # pydantic-core's encoder: a third of the CPU of json.dumps for these rows (their breakdowns make them
    # ~2 KB each); PostgreSQL reads the same document from either (non-ASCII as UTF-8, not \u escapes).
    # The breakdown is built of str, int, bool and None; a Decimal is written as ``str`` writes it and an
    # aware time in ISO 8601 (``Z`` for UTC), the text _recordset_value gives them up to the zone's
    # spelling, which PostgreSQL reads as the same instant.
    params: list[Any] = [to_json(rows).decode()]
    if summary is not None:
        job_id, document = summary
        sql = _recordset_insert_with_summary_sql(asynchronous=not connections[alias].in_atomic_block)
        value = Job._meta.get_field("quote_summary").get_db_prep_save(document, connections[alias])
        params += [value, job_id]
    with bound_cursor(alias) as cursor:  # prepared once per connection in production (core.db)
        cursor.execute(sql, params)
        ids = [row[0] for row in cursor.fetchall()]
    for quote, pk in zip(quotes, ids, strict=True):
        quote.pk = pk
        quote._state.adding = False
        quote._state.db = alias


def _quotes_insert_batch(quotes: list[Quote], fields: list[Field], alias: str) -> None:
    connection = connections[alias]
    # Prepared as bulk_create prepares them: pre_save (add), then get_db_prep_save.
    params = [
        field.get_db_prep_save(field.pre_save(quote, True), connection)
        for quote in quotes
        for field in fields
    ]
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    # Identifiers come from the model's metadata and every value is a bound parameter.
    sql = "INSERT INTO {table} ({columns}) VALUES {rows} RETURNING {pk}".format(  # noqa: S608
        table=connection.ops.quote_name(Quote._meta.db_table),
        columns=", ".join(connection.ops.quote_name(str(field.column)) for field in fields),
        rows=", ".join([row] * len(quotes)),
        pk=connection.ops.quote_name(str(Quote._meta.pk.column)),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [pk for (pk,) in cursor.fetchall()]
    for quote, pk in zip(quotes, ids, strict=True):
        quote.pk = pk
        quote._state.adding = False
        quote._state.db = alias


def quotes_purge(
    *, now: datetime | None = None, older_than: timedelta = timedelta(days=1), batch: int = 10_000
) -> int:
    """Delete quotes that expired more than ``older_than`` ago and were never accepted; return how many.

    Set-based, ``batch`` rows per statement (each its own transaction), oldest first: at design load quote
    requests store ~2,000 quotes a second, so an hourly run meets ~7 million rows, which the ORM's
    ``delete()`` would first read into Python (a lease's ``quote`` is SET_NULL, so the collector fetches
    every row to look for one). Here each statement picks its rows by the expiry index and deletes them
    in the database. A quote with a lease is never picked, and an expired quote cannot be accepted, so
    nothing ever needs setting to null; should a lease name one all the same, the lease's foreign key
    refuses the delete. No signals (Quote has no receivers)."""
    now = now or timezone.now()
    cutoff = now - older_than
    alias = router.db_for_write(Quote)
    total = 0
    while True:
        picked = (
            Quote.objects.using(alias)
            .filter(expires_at__lt=cutoff)
            .exclude(Exists(Lease.objects.filter(quote=OuterRef("pk"))))  # an anti-join on the lease's key
            .order_by("expires_at")
            .values("pk")[:batch]
        )
        # _raw_delete: the DELETE the collector itself issues once it has nothing to cascade.
        deleted = Quote.objects.using(alias).filter(pk__in=picked)._raw_delete(alias)
        total += deleted
        if deleted < batch:
            return total
