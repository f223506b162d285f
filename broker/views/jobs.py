"""Buyers' jobs in the portal: place a job (and quote it at once), its ranked quotes with their band
breakdown and the reasons other islands were rejected, accept a quote, re-quote, cancel, and the list."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path
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
from broker.forms.jobs import JobForm
from broker.market import buyer_home_hub_resolve
from broker.models import Job, Quote
from broker.services import jobs as job_services
from broker.services import leases as lease_services
from broker.services import quotes as quote_services
from core.charts import band_colour, band_sort_key
from core.errors import DomainError
from core.models import Organisation
from core.portal import portal_view
from federation.selectors import accelerator_list
from metering.errors import InsufficientBalanceError

PAGE_SIZE = 50
# The rejection summaries kept in a browser's session: the latest few jobs quoted, so a session that quotes
# all day does not grow without bound.
SUMMARIES_KEPT = 20

# Why islands were not quoted, in the buyer's words (the matcher's rejection reasons).
REJECTION_REASONS: dict[str, Any] = {
    "offline": gettext_lazy("the cluster is offline, draining or retired"),
    "chip": gettext_lazy("the chip model is not allowed, or has too few TFLOPS"),
    "memory": gettext_lazy("the cards have too little memory"),
    "fabric": gettext_lazy("the island's fabric is not allowed"),
    "latency": gettext_lazy("the latency from your origin hub is over the budget"),
    "unpriced": gettext_lazy("the cluster has no price card in force"),
    "price": gettext_lazy("even its cheapest start is over your price cap"),
    "capacity": gettext_lazy("too few free cards for the whole run at any start"),
    "window": gettext_lazy("no start fits the window any more"),
}


def _summary_key(job_id: int) -> str:
    return f"cardhour_quote_summary_{job_id}"


def _error_key(job_id: int) -> str:
    return f"cardhour_quote_error_{job_id}"


def _home_hub(buyer: Organisation) -> str:
    """The buyer's home hub: its preference, else its latest job's origin hub, else the platform default."""
    return buyer_home_hub_resolve(buyer=buyer).code


def _summaries_prune(request: HttpRequest, *, keep: int = SUMMARIES_KEPT) -> None:
    """Drop all but the ``keep`` most recently quoted jobs' summaries from the session."""
    prefix = _summary_key(0)[:-1]
    stored = [key for key, _value in request.session.items() if key.startswith(prefix)]
    stored.sort(key=lambda key: str(request.session[key].get("quoted_at", "")), reverse=True)
    for key in stored[keep:]:
        del request.session[key]


def _quote(request: HttpRequest, job: Job) -> None:
    """Quote ``job`` now and remember, for its page, why other islands were rejected (the quotes are
    stored; the rejection counts are not)."""
    quote_set = quote_services.quote_create(job=job)
    result = quote_set.result
    request.session[_summary_key(job.pk)] = {
        "quoted_at": timezone.now().isoformat(),
        "expires_at": quote_set.expires_at.isoformat(),
        "rejections": {key: int(value) for key, value in result.rejections.items()},
        "considered": int(result.considered),
        "feasible": int(result.feasible),
        "window_start_at": result.window_start_at.isoformat(),
        "window_end_at": result.window_end_at.isoformat(),
    }
    request.session.pop(_error_key(job.pk), None)
    _summaries_prune(request)


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
        form = JobForm(initial=JobForm.prefill(request.GET, origin_hub=_home_hub(buyer)))
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
class QuoteRow:
    quote: Quote
    cluster: str
    hub: str
    accelerator: str
    chip: str
    islands: list[tuple[str, str, int]]  # (short name, CPI, cards)
    rate_per_card_hour: str
    tariff: str
    bands: list[BandPart]
    cheapest: bool
    expires_in: int
    lease_id: int | None
    plan: DrawPlan | None  # which of the buyer's packs would pay, in their units, and the effective price


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
        lease = getattr(quote, "lease", None)
        rows.append(
            QuoteRow(
                quote=quote,
                cluster=str(extra.get("cluster", quote.cluster_id)),
                hub=str(extra.get("hub", "")),
                accelerator=str(extra.get("accelerator", quote.draw_class)),
                chip=chips.get(quote.draw_class, quote.draw_class),
                islands=[
                    (str(island["cpi"]).rsplit(":", 1)[-1], str(island["cpi"]), int(island["cards"]))
                    for island in extra.get("islands", [])
                ],
                rate_per_card_hour=str(extra.get("rate_per_card_hour", "")),
                tariff=str(extra.get("tariff", "")),
                bands=parts,
                cheapest=len(quotes) > 1 and quote is cheapest,
                expires_in=max(int((quote.expires_at - now).total_seconds()), 0),
                lease_id=lease.pk if lease is not None else None,
                plan=_quote_plan(quote, extra, packs),
            )
        )
    return rows


def _summary(request: HttpRequest, job: Job, quotes: list[Quote]) -> dict[str, Any] | None:
    """The rejection counts of the job's latest quote request, if this browser made it."""
    stored = request.session.get(_summary_key(job.pk))
    if not isinstance(stored, dict):
        return None
    if quotes and parse_datetime(str(stored.get("expires_at", ""))) != quotes[0].expires_at:
        return None  # from an older request than the quotes shown
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
        "window_start_at": parse_datetime(stored.get("window_start_at", "")),
        "window_end_at": parse_datetime(stored.get("window_end_at", "")),
    }


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
    return render(
        request,
        "broker/jobs/detail.html",
        {
            "job": job,
            "duration": _duration(job.duration_seconds),
            "chips": [chips.get(slug, slug) for slug in job.accelerators or []],
            "quotes": rows,
            "quotes_expired": bool(quotes) and all(row.expires_in == 0 for row in rows),
            "bands": sorted({part.band for row in rows for part in row.bands}, key=band_sort_key),
            "summary": _summary(request, job, quotes),
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
