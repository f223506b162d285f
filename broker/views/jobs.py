"""Buyers' jobs in the portal: place a job (and quote it at once), its ranked quotes with their band
breakdown and the reasons other islands were rejected, accept a quote, re-quote, cancel, and the list."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from broker import selectors
from broker.draws import BuyerPacks, DrawPlan, buyer_packs_after_leases
from broker.errors import (
    CapacityTakenError,
    ClusterUnavailableError,
    JobClosedError,
    JobConflictError,
    JobInvalidError,
    QuoteExpiredError,
    QuoteSupersededError,
)
from broker.forms.jobs import DATETIME_LOCAL, PREFILL_FIELDS, JobForm
from broker.market import buyer_home_hub_resolve
from broker.models import Job, Quote
from broker.services import jobs as job_services
from broker.services import leases as lease_services
from broker.services import quotes as quote_services
from core.charts import SERIES_COLOURS, Series, band_colour, band_sort_key, series_svg
from core.errors import DomainError
from core.models import Organisation
from core.portal import portal_view
from core.templatetags.portal import count, money, zoned
from federation.selectors import accelerator_list
from metering.errors import InsufficientBalanceError

PAGE_SIZE = 50
# Offers drawn in the cost-against-start chart: the best few, one per cluster.
CHART_OFFERS = 3

# Why islands were not quoted, in the buyer's words (the matcher's rejection reasons).
REJECTION_REASONS: dict[str, Any] = {
    "offline": gettext_lazy("the cluster is offline, draining or retired"),
    "chip": gettext_lazy("the chip model is not allowed, or has too few TFLOPS"),
    "memory": gettext_lazy("the cards have too little memory"),
    "fabric": gettext_lazy("the island's fabric is not allowed"),
    "latency": gettext_lazy("the latency from your origin hub is over the budget"),
    "unpriced": gettext_lazy("the cluster has no price card in force"),
    "reliability": gettext_lazy("the cluster's reliability score is below your minimum"),
    "price": gettext_lazy("even its cheapest start is over your price cap"),
    "capacity": gettext_lazy("too few free cards for the whole run at any start"),
    "window": gettext_lazy("no start fits the window any more"),
}


def _error_key(job_id: int) -> str:
    return f"cardhour_quote_error_{job_id}"


def _home_hub(buyer: Organisation) -> str:
    """The buyer's home hub: its preference, else its latest job's origin hub, else the platform default."""
    return buyer_home_hub_resolve(buyer=buyer).code


def _quote(request: HttpRequest, job: Job) -> None:
    """Quote ``job`` now; the job keeps what the request found (Job.quote_summary) for its page."""
    quote_services.quote_create(job=job)
    request.session.pop(_error_key(job.pk), None)


# --- Place a job ------------------------------------------------------------------------------------


@portal_view("buyer", write=True)
def job_create(request: HttpRequest) -> HttpResponse:
    buyer = request.portal.organisation  # type: ignore[attr-defined]
    if request.method == "POST":
        form = JobForm(request.POST)
        if form.is_valid():
            try:
                job, created = job_services.job_create(
                    buyer=buyer,
                    data=form.job_input(),
                    actor=request.portal.actor,  # type: ignore[attr-defined]
                )
            except JobInvalidError as exc:
                form.add_service_errors(exc.extra.get("errors", []))
            except JobConflictError as exc:
                form.fresh_key()
                form.add_error(
                    None,
                    _(
                        "This form already placed job %(job)s with other values. Submit again to place "
                        "a new job with these."
                    )
                    % {"job": exc.extra.get("job_id")},
                )
            else:
                if created:
                    _quote(request, job)
                    messages.success(request, _("Job %(name)s placed and quoted.") % {"name": job.name})
                return redirect("job-detail", job_id=job.pk)
    else:
        source = request.GET.get("from_job", "")
        similar = selectors.job_get_for(buyer=buyer, job_id=int(source)) if source.isdigit() else None
        form = JobForm(initial=JobForm.prefill(request.GET, origin_hub=_home_hub(buyer), job=similar))
        if similar is not None:
            messages.info(
                request,
                _("A new job like %(name)s: change what you need, then place it.") % {"name": similar.name},
            )
    return render(
        request,
        "broker/jobs/create.html",
        {"form": form, "time_zone": timezone.get_current_timezone_name()},
    )


# --- A job and its quotes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BandPart:
    band: str
    multiplier: str
    card_hours: Decimal
    cost: Decimal
    share: Decimal  # per cent of the quote's card-hours, for the bar
    colour: str


@dataclass(frozen=True)
class TimeShift:
    """When a quote starts, and what the same offer would cost at its earliest possible start."""

    starts_in: str  # "now", "in 16 h"
    earliest_at: datetime | None
    earliest_in: str
    earliest_cost: Decimal
    saving: Decimal  # earliest_cost − cost, at list; > 0 when waiting is cheaper
    shifted: bool  # the quote starts later than it could
    saving_is_best: bool  # no quote ranked above is cheaper: the saving may be shown as good news


@dataclass(frozen=True)
class QuoteRow:
    quote: Quote
    cluster: str
    hub: str
    accelerator: str
    chip: str
    islands: list[tuple[str, str, int]]  # (short name, CPI, cards)
    islands_available: int
    island_span: str  # "isl-01–isl-06" for an offer of several identical islands
    rate_per_card_hour: str
    tariff: str
    bands: list[BandPart]
    cheapest: bool
    expires_in: int
    lease_id: int | None
    plan: DrawPlan | None  # which of the buyer's packs would pay, in their units, and the effective price
    shift: TimeShift
    reliability: QuoteReliability | None = None


@dataclass(frozen=True)
class QuoteReliability:
    """The cluster's reliability score when quoted, and the SLA credit expected at it."""

    percent: Decimal
    prior: bool
    interruptions_per_1000_card_hours: Decimal | None
    expected_credit: Decimal
    adjusted_cost: Decimal


def _quote_reliability(quote: Quote, extra: dict[str, Any]) -> QuoteReliability | None:
    """What the quote kept of its cluster's reliability; None for a quote made before it was kept."""
    stored = extra.get("reliability")
    if not isinstance(stored, dict) or stored.get("percent") is None:
        return None
    rate = stored.get("interruptions_per_1000_card_hours")
    credit = Decimal(str(extra.get("expected_credit") or "0"))
    return QuoteReliability(
        percent=Decimal(str(stored["percent"])),
        prior=bool(stored.get("prior")),
        interruptions_per_1000_card_hours=Decimal(str(rate)) if rate is not None else None,
        expected_credit=credit,
        adjusted_cost=Decimal(str(extra.get("adjusted_cost") or quote.cost - credit)),
    )


def _quote_plan(quote: Quote, extra: dict[str, Any], packs: Callable[[], BuyerPacks]) -> DrawPlan:
    """The plan the quote was made with; a quote made before plans were stored gets one from the
    buyer's packs as they stand now."""
    stored = extra.get("draw_plan")
    if isinstance(stored, dict):
        return DrawPlan.from_json(stored)
    factor = extra.get("standard_card_factor")
    return packs().plan(
        chip=quote.draw_class,
        factor=Decimal(str(factor)) if factor else None,
        draw=quote.expected_draw,
        rate=Decimal(str(extra.get("rate_per_card_hour", "0"))),
        at=quote.start_at,
    )


def _in(delta_seconds: float) -> str:
    """How far ahead an instant is, briefly: "now", "in 15 min", "in 16 h", "in 2 d 4 h"."""
    minutes = int(delta_seconds // 60)
    if minutes < 1:
        return _("now")
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    if days:
        return _("in %(d)d d %(h)d h") % {"d": days, "h": hours} if hours else _("in %(d)d d") % {"d": days}
    if hours:
        return (
            _("in %(h)d h %(m)d min") % {"h": hours, "m": minutes}
            if minutes
            else _("in %(h)d h") % {"h": hours}
        )
    return _("in %(m)d min") % {"m": minutes}


def island_span(names: list[str]) -> str:
    """Island names as runs: ``isl-01, isl-02, isl-03, isl-05`` → ``"isl-01–isl-03, isl-05"``; more
    than three runs end in "…"."""
    parsed = []
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        parsed.append((match.group(1), int(match.group(2)), name) if match else (name, -1, name))
    parsed.sort()
    runs: list[list[tuple[str, int, str]]] = []
    for item in parsed:
        last = runs[-1][-1] if runs else None
        if last is not None and last[1] >= 0 and item[0] == last[0] and item[1] == last[1] + 1:
            runs[-1].append(item)
        else:
            runs.append([item])
    words = [run[0][2] if len(run) == 1 else f"{run[0][2]}–{run[-1][2]}" for run in runs]
    return ", ".join(words[:3]) + (", …" if len(words) > 3 else "")


def _time_shift(
    quote: Quote, extra: dict[str, Any], *, now: datetime, cheapest_above: Decimal | None
) -> TimeShift:
    earliest_at = parse_datetime(str(extra.get("earliest_feasible_start_at") or ""))
    earliest_cost = Decimal(str(extra.get("earliest_feasible_cost", quote.cost + quote.saving)))
    shifted = quote.saving > 0 or (earliest_at is not None and earliest_at < quote.start_at)
    return TimeShift(
        starts_in=_in((quote.start_at - now).total_seconds()),
        earliest_at=earliest_at,
        earliest_in=_in((earliest_at - now).total_seconds()) if earliest_at else "",
        earliest_cost=earliest_cost,
        saving=quote.saving,
        shifted=shifted,
        saving_is_best=quote.saving > 0 and (cheapest_above is None or quote.cost <= cheapest_above),
    )


def _quote_rows(quotes: list[Quote], *, now: datetime, buyer: Organisation) -> list[QuoteRow]:
    slugs = {quote.draw_class for quote in quotes}
    chips = (
        {
            slug: f"{vendor} {model}"
            for slug, vendor, model in accelerator_list()
            .filter(slug__in=slugs)
            .values_list("slug", "vendor", "model")
        }
        if slugs
        else {}
    )
    # The best-ranked of the cheapest quotes is highlighted (ranks may put a nearer one first).
    cheapest = min(quotes, key=lambda quote: (quote.cost, quote.rank), default=None)
    loaded: list[BuyerPacks] = []

    def packs() -> BuyerPacks:
        if not loaded:
            loaded.append(buyer_packs_after_leases(buyer=buyer, at=now))
        return loaded[0]

    rows = []
    cheapest_above: Decimal | None = None
    for quote in quotes:
        extra: dict[str, Any] = quote.breakdown if isinstance(quote.breakdown, dict) else {}
        bands = sorted(extra.get("bands", []), key=lambda band: band_sort_key(str(band["band"])))
        total_hours = sum((Decimal(str(band["card_hours"])) for band in bands), Decimal(0))
        parts = [
            BandPart(
                band=str(band["band"]),
                multiplier=str(band["multiplier"]),
                card_hours=Decimal(str(band["card_hours"])),
                cost=Decimal(str(band["cost"])),
                share=(Decimal(str(band["card_hours"])) * 100 / total_hours).quantize(Decimal("0.1"))
                if total_hours
                else Decimal(0),
                colour=band_colour(str(band["band"])),
            )
            for band in bands
        ]
        islands = [
            (str(island["cpi"]).rsplit(":", 1)[-1], str(island["cpi"]), int(island["cards"]))
            for island in extra.get("islands", [])
        ]
        alternatives = [str(island["cpi"]).rsplit(":", 1)[-1] for island in extra.get("alternatives", [])]
        lease = getattr(quote, "lease", None)
        rows.append(
            QuoteRow(
                quote=quote,
                cluster=str(extra.get("cluster", quote.cluster_id)),
                hub=str(extra.get("hub", "")),
                accelerator=str(extra.get("accelerator", quote.draw_class)),
                chip=chips.get(quote.draw_class, quote.draw_class),
                islands=islands,
                islands_available=1 + len(quote.alternatives or ()),
                island_span=island_span([short for short, _cpi, _cards in islands[:1]] + alternatives),
                rate_per_card_hour=str(extra.get("rate_per_card_hour", "")),
                tariff=str(extra.get("tariff", "")),
                bands=parts,
                cheapest=len(quotes) > 1 and quote is cheapest,
                expires_in=max(int((quote.expires_at - now).total_seconds()), 0),
                lease_id=lease.pk if lease is not None else None,
                plan=_quote_plan(quote, extra, packs),
                shift=_time_shift(quote, extra, now=now, cheapest_above=cheapest_above),
                reliability=_quote_reliability(quote, extra),
            )
        )
        cheapest_above = quote.cost if cheapest_above is None else min(cheapest_above, quote.cost)
    return rows


def _summary(job: Job, quotes: list[Quote]) -> dict[str, Any] | None:
    """What the job's latest quote request found (Job.quote_summary), in the buyer's words; None before
    the first quote, or when the quotes shown come from another request."""
    stored = job.quote_summary
    if not isinstance(stored, dict) or not stored:
        return None
    if quotes and parse_datetime(str(stored.get("expires_at", ""))) != quotes[0].expires_at:
        return None  # from another request than the quotes shown
    rejections = [
        {"reason": reason, "count": count, "text": REJECTION_REASONS.get(reason, reason)}
        for reason, count in sorted(stored.get("rejections", {}).items(), key=lambda item: -item[1])
        if count
    ]
    return {
        "rejections": rejections,
        "rejected": sum(row["count"] for row in rejections),
        "considered": stored.get("considered", 0),
        "feasible": stored.get("feasible", 0),
        "quoted_at": parse_datetime(str(stored.get("quoted_at", ""))),
        "window_start_at": parse_datetime(str(stored.get("window_start_at", ""))),
        "window_end_at": parse_datetime(str(stored.get("window_end_at", ""))),
    }


@dataclass(frozen=True)
class Suggestion:
    """A relaxation in the buyer's words, with the link that opens the job form changed accordingly."""

    kind: str
    change: str
    outcome: str
    url: str


def _prefill_query(job: Job, changes: dict[str, Any]) -> str:
    """The job form's query for a copy of ``job`` with ``changes`` (the API's field names and values)."""
    query = QueryDict(mutable=True)
    query["from_job"] = str(job.pk)
    for name, value in changes.items():
        if name not in PREFILL_FIELDS:
            continue
        if isinstance(value, list):
            query.setlist(name, [str(item) for item in value] or [""])
        elif value is None:
            query[name] = ""
        elif name == "deadline_at":
            parsed = parse_datetime(str(value))
            query[name] = timezone.localtime(parsed).strftime(DATETIME_LOCAL) if parsed else ""
        else:
            query[name] = str(value)
    return f"{reverse('job-create')}?{query.urlencode()}"


def _suggestions(job: Job) -> list[Suggestion]:
    """The relaxations the job's latest quote request found, as suggestions with their links."""
    stored = job.quote_summary.get("relaxations", []) if isinstance(job.quote_summary, dict) else []
    slugs = {str(item.get("accelerator", "")) for item in stored}
    chips = dict(accelerator_list().filter(slug__in=slugs).values_list("slug", "model")) if stored else {}
    out = []
    for item in stored:
        kind = str(item.get("kind", ""))
        changes: dict[str, Any] = item.get("changes", {}) or {}
        start = parse_datetime(str(item.get("start_at", "")))
        chip = chips.get(str(item.get("accelerator", "")), str(item.get("accelerator", "")))
        if kind == "cluster":
            change = _("Any cluster, not only %(cpi)s") % {"cpi": job.cluster.cpi if job.cluster else ""}
        elif kind == "latency":
            change = _("A latency budget of %(new)s ms (now %(old)s ms)") % {
                "new": changes.get("latency_budget_ms"),
                "old": job.latency_budget_ms,
            }
        elif kind == "chip":
            change = _("Another chip: %(chip)s") % {"chip": chip}
        elif kind == "memory":
            change = _("No minimum memory per card")
        elif kind == "fabric":
            change = _("Any fabric")
        elif kind == "reliability":
            change = _("A minimum reliability of %(new)s %% (now %(old)s %%)") % {
                "new": changes.get("min_reliability"),
                "old": job.min_reliability,
            }
        elif kind == "price":
            change = _("A price cap of %(new)s per card-hour (now %(old)s)") % {
                "new": money(changes.get("max_price_per_card_hour")),
                "old": money(job.max_price_per_card_hour),
            }
        elif kind == "window":
            deadline = parse_datetime(str(changes.get("deadline_at", "")))
            change = _("A later deadline: %(at)s") % {"at": zoned(deadline)}
        elif kind == "gang":
            change = _("Let the cards span the islands of one cluster")
        elif kind == "cards":
            change = _("%(new)s cards instead of %(old)s") % {
                "new": count(changes.get("cards")),
                "old": count(job.cards),
            }
        else:
            continue
        outcome = _("%(cluster)s (%(chip)s) could start it at %(at)s for %(cost)s at list price.") % {
            "cluster": item.get("cluster", ""),
            "chip": chip,
            "at": zoned(start),
            "cost": money(item.get("cost")),
        }
        out.append(Suggestion(kind=kind, change=change, outcome=outcome, url=_prefill_query(job, changes)))
    return out


def _chart(job: Job, rows: list[QuoteRow], *, now: datetime, expired: bool) -> dict[str, Any] | None:
    """Cost against start time over the job's window for the best offers (one per cluster, at most
    CHART_OFFERS), at the list price: where each quote starts, and its earliest possible start."""
    if not rows or job.state != Job.State.OPEN:
        return None
    spec = job_services.job_spec(job=job)
    # On the live quotes' own grid of starts (their request's time), so each quote's start is one of them;
    # expired quotes' starts may have passed: the chart is then today's, from now.
    quoted_at = now if expired else rows[0].quote.created_at
    lines: list[tuple[Series, QuoteRow]] = []
    starts: tuple[datetime, ...] = ()
    seen: set[int] = set()
    for row in rows:
        quote = row.quote
        if quote.cluster_id in seen or len(lines) == CHART_OFFERS:
            continue
        seen.add(quote.cluster_id)
        # An island-gang offer: its islands; a placement spanning islands: no per-island check.
        islands = (
            ()
            if len(quote.allocation) > 1
            else tuple(int(i) for i, _cards in quote.allocation)
            + tuple(int(i) for i, _cards in quote.alternatives or ())
        )
        curve = quote_services.start_costs_find(
            spec=spec, cluster_id=quote.cluster_id, island_ids=islands, cards=quote.cards, now=quoted_at
        )
        if curve is None:
            continue
        starts = curve.starts
        colour = SERIES_COLOURS[len(lines) % len(SERIES_COLOURS)]
        marks = []
        for at, kind, text in (
            (row.shift.earliest_at, "earliest", _("earliest possible start")),
            (quote.start_at, "chosen", _("quote #%(rank)s starts here") % {"rank": quote.rank}),
        ):
            if at is not None and at in curve.starts:
                index = curve.starts.index(at)
                marks.append((index, kind, f"{text}: {zoned(at)}, {money(curve.costs[index])}"))
        lines.append(
            (
                Series(label=row.cluster, colour=colour, values=curve.costs, marks=marks),
                row,
            )
        )
    if not lines or len(starts) < 2:
        return None
    title = _("Cost at list price against start time, for the best offers")
    series = [line for line, _row in lines]
    return {
        # The same chart twice: wide for a desktop, narrow (taller, fewer ticks) for a phone, where a
        # scaled-down wide one would have unreadable text; CSS shows one.
        "svg": series_svg(series, title=title, ticks=_ticks(starts), prefix="¥"),
        "svg_narrow": series_svg(
            series, title=title, ticks=_ticks(starts, narrow=True), prefix="¥", width=360, height=220
        ),
        "legend": [(series.colour, row) for series, row in lines],
        "first": starts[0],
        "last": starts[-1],
    }


def _ticks(starts: tuple[datetime, ...], *, narrow: bool = False) -> list[tuple[int, str]]:
    """Tick positions and labels where local time passes a multiple of 6, 12 or 24 hours (by the window's
    length; twice as far apart on a narrow chart): the date at midnight, else the hour."""
    span_hours = (starts[-1] - starts[0]).total_seconds() / 3600 * (2 if narrow else 1)
    every = 6 if span_hours <= 48 else 12 if span_hours <= 96 else 24
    ticks = []
    previous = None
    for index, at in enumerate(starts):
        local = timezone.localtime(at)
        bucket = (local.date(), local.hour // every)
        if previous is not None and bucket != previous:
            boundary = local.replace(hour=bucket[1] * every, minute=0)
            ticks.append(
                (index, boundary.strftime("%m-%d") if boundary.hour == 0 else boundary.strftime("%H:%M"))
            )
        previous = bucket
    return ticks


def _duration(seconds: int) -> str:
    hours, rest = divmod(int(seconds), 3600)
    minutes = rest // 60
    if hours and minutes:
        return _("%(h)d h %(m)d min") % {"h": hours, "m": minutes}
    if hours:
        return _("%(h)d h") % {"h": hours}
    return _("%(m)d min") % {"m": minutes}


@portal_view("buyer")
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    buyer = request.portal.organisation  # type: ignore[attr-defined]
    job = selectors.job_get_for(buyer=buyer, job_id=job_id)
    now = timezone.now()
    quotes = selectors.job_quotes_latest(job=job)
    rows = _quote_rows(quotes, now=now, buyer=buyer)
    chips = dict(
        accelerator_list()
        .filter(slug__in=job.accelerators or [])
        .values_list("slug", "model")
        .order_by("model")
    )
    open_job = job.state == Job.State.OPEN
    quotes_expired = bool(quotes) and all(row.expires_in == 0 for row in rows)
    return render(
        request,
        "broker/jobs/detail.html",
        {
            "job": job,
            "duration": _duration(job.duration_seconds),
            "chips": [chips.get(slug, slug) for slug in job.accelerators or []],
            "quotes": rows,
            "quotes_expired": quotes_expired,
            "bands": sorted({part.band for row in rows for part in row.bands}, key=band_sort_key),
            "summary": _summary(job, quotes),
            "suggestions": _suggestions(job) if open_job and not quotes else [],
            "chart": _chart(job, rows, now=now, expired=quotes_expired),
            "quote_error": request.session.pop(_error_key(job.pk), None),
            "leases": list(selectors.job_leases(job=job)),
            "history": list(selectors.job_history(job=job)),
            "notices": list(selectors.job_notices(job=job)[:20]),
            "can_accept": open_job,
            "can_requote": open_job,
            "can_cancel": job.state in (Job.State.OPEN, Job.State.PLACED),
            "quote_ttl": settings.CARDHOUR_QUOTE_TTL_SECONDS,
            "time_zone": timezone.get_current_timezone_name(),
        },
    )


@require_POST
@portal_view("buyer", write=True)
def job_requote(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.job_get_for(buyer=request.portal.organisation, job_id=job_id)  # type: ignore[attr-defined]
    try:
        _quote(request, job)
    except JobClosedError:
        messages.error(
            request, _("This job is %(state)s: it cannot be quoted.") % {"state": job.get_state_display()}
        )
    return redirect("job-detail", job_id=job.pk)


def _accept_error(exc: DomainError, quote: Quote) -> dict[str, Any]:
    """What the job page says about a refused acceptance, in the buyer's words."""
    pack_link = False
    if isinstance(exc, QuoteExpiredError):
        text = _(
            "This quote has expired: quotes hold for %(ttl)d seconds. Get new quotes to see today's prices "
            "and free cards."
        ) % {"ttl": settings.CARDHOUR_QUOTE_TTL_SECONDS}
    elif isinstance(exc, CapacityTakenError):
        text = _(
            "Another lease took those cards since the quote was made. Get new quotes to see what is free."
        )
    elif isinstance(exc, InsufficientBalanceError):
        text = _(
            "Your card-hour packs, less what your live leases will still draw, cannot pay this quote's "
            "expected draw: %(draw)s. Buy a pack, then get new quotes."
        ) % {"draw": exc.extra.get("draw_text") or exc.message}
        pack_link = True
    elif isinstance(exc, ClusterUnavailableError):
        text = _(
            "The cluster went offline, or its operator changed its price, since the quote. Get new quotes."
        )
    elif isinstance(exc, QuoteSupersededError):
        text = _("This job already holds a live lease: cancel it before accepting another quote.")
    elif isinstance(exc, JobClosedError):
        text = _("This job is closed: it can no longer be placed.")
    else:
        text = exc.message
    return {"code": exc.code, "message": text, "pack_link": pack_link}


@require_POST
@portal_view("buyer", write=True)
def quote_accept(request: HttpRequest, quote_id: int) -> HttpResponse:
    portal = request.portal  # type: ignore[attr-defined]
    quote = selectors.quote_get_for(buyer=portal.organisation, quote_id=quote_id)
    try:
        lease, created = lease_services.lease_accept(quote=quote, actor=portal.actor)
    except (
        QuoteExpiredError,
        CapacityTakenError,
        InsufficientBalanceError,
        ClusterUnavailableError,
        QuoteSupersededError,
        JobClosedError,
    ) as exc:
        request.session[_error_key(quote.job_id)] = _accept_error(exc, quote)
        return redirect("job-detail", job_id=quote.job_id)
    if created:
        messages.success(
            request,
            _("Lease %(lease)s reserved: %(cards)d cards from %(start)s.")
            % {
                "lease": lease.pk,
                "cards": lease.cards,
                "start": timezone.localtime(lease.start_at).strftime("%Y-%m-%d %H:%M"),
            },
        )
    return redirect("lease-detail", lease_id=lease.pk)


@require_POST
@portal_view("buyer", write=True)
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    portal = request.portal  # type: ignore[attr-defined]
    job = selectors.job_get_for(buyer=portal.organisation, job_id=job_id)
    try:
        job_services.job_cancel(job=job, actor=portal.actor, reason="cancelled by the buyer in the portal")
    except JobClosedError:
        messages.error(request, _("This job already ended: it cannot be cancelled."))
    else:
        messages.success(request, _("Job %(name)s cancelled.") % {"name": job.name})
    return redirect("job-detail", job_id=job.pk)


# --- The list ---------------------------------------------------------------------------------------


@portal_view("buyer")
def job_list(request: HttpRequest) -> HttpResponse:
    buyer = request.portal.organisation  # type: ignore[attr-defined]
    state = request.GET.get("state", "")
    if state not in Job.State.values:
        state = ""
    page = Paginator(
        selectors.job_list_with_leases_for(buyer=buyer, state=state or None), PAGE_SIZE
    ).get_page(request.GET.get("page"))
    rows = [
        {"job": job, "lease": next(iter(job.leases.all()), None), "duration": _duration(job.duration_seconds)}
        for job in page.object_list
    ]
    return render(
        request,
        "broker/jobs/list.html",
        {"page": page, "rows": rows, "state": state, "states": Job.State.choices},
    )


urlpatterns: list[URLPattern] = [
    path("jobs/", job_list, name="job-list"),
    path("jobs/new/", job_create, name="job-create"),
    path("jobs/<int:job_id>/", job_detail, name="job-detail"),
    path("jobs/<int:job_id>/quotes/", job_requote, name="job-requote"),
    path("jobs/<int:job_id>/cancel/", job_cancel, name="job-cancel"),
    path("quotes/<int:quote_id>/accept/", quote_accept, name="quote-accept"),
]
