"""The buyers' marketplace: capacity by hub, chip and operator, with free cards now, the price per
card-hour, today's band strip of each tariff and the latency from the buyer's home hub."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext as _

from broker.draws import buyer_packs_after_leases, chip_factors
from broker.forms.market import HomeHubForm, MarketFilterForm
from broker.market import (
    MarketQuery,
    buyer_home_hub_resolve,
    market_filter_choices,
    market_page,
    market_summary,
)
from broker.services.preferences import buyer_home_hub_set
from core.errors import DomainError
from core.portal import portal_view

PAGE_SIZE = 50


@portal_view(("buyer", "operator"), write=True)
def market(request: HttpRequest) -> HttpResponse:
    """GET: the marketplace, filtered by its GET form. POST: set the buyer's home hub, then back to the
    same filtered page.

    Operators may read it too, to price against the market: they see what buyers see but the buying (no
    home hub of their own, no "place a job", no pack prices), with their own clusters marked."""
    portal = request.portal  # type: ignore[attr-defined]
    buyer = portal.organisation
    is_buyer = portal.is_buyer
    if request.method == "POST" and not is_buyer:
        raise PermissionDenied(_("Only a buyer organisation has a home hub."))
    hubs, chips, operators = market_filter_choices()
    home_form = HomeHubForm(request.POST or None, hubs=hubs)
    if request.method == "POST" and home_form.is_valid():
        try:
            buyer_home_hub_set(
                buyer=buyer,
                hub_code=home_form.cleaned_data["home_hub"],
                actor=request.portal.actor,  # type: ignore[attr-defined]
            )
        except DomainError as exc:
            fields = exc.extra.get("fields", {})
            for message in fields.get("home_hub", []) or [exc.message]:
                home_form.add_error("home_hub", message)
        else:
            messages.success(
                request,
                _("Your home hub is now %(hub)s: latency is measured from there.")
                % {"hub": home_form.cleaned_data["home_hub"]},
            )
            return redirect(request.get_full_path())
    home = buyer_home_hub_resolve(buyer=buyer)
    if request.method != "POST":
        home_form = HomeHubForm(initial={"home_hub": home.code}, hubs=hubs)

    filters = MarketFilterForm(request.GET or None, hubs=hubs, chips=chips, operators=operators)
    query = filters.market_query() if filters.is_bound else MarketQuery()
    now = timezone.now()
    page, rows = market_page(
        query=query, origin_hub=home.code, at=now, page_number=request.GET.get("page"), per_page=PAGE_SIZE
    )
    strips = {row.strip.tariff_version_id: row.strip for row in rows if row.strip is not None}
    # The buyer's own price beside each operator's rate: from the pack rating would draw first.
    yours: dict[int, Any] = {}
    holds_packs = False
    if is_buyer:
        packs = buyer_packs_after_leases(buyer=buyer, at=now)
        holds_packs = bool(packs.slots)
        factors = chip_factors({row.cluster.accelerator.slug for row in rows})
        yours = {
            row.cluster.pk: packs.effective_price(
                chip=row.cluster.accelerator.slug, factor=factors.get(row.cluster.accelerator.slug), at=now
            )
            for row in rows
        }
    return render(
        request,
        "broker/market/market.html",
        {
            "filters": filters,
            "query": query,
            "home": home,
            "home_form": home_form,
            "home_hub_name": next((h.name for h in hubs if h.code == home.code), home.code),
            "summary": market_summary(include_offline=query.include_offline, at=now),
            "page": page,
            "rows": rows,
            "priced_rows": [(row, yours.get(row.cluster.pk)) for row in rows],
            "yours": yours,
            "holds_packs": holds_packs,
            "is_buyer": is_buyer,
            # An operator's own clusters are marked (an organisation may be a buyer and an operator).
            "own_operator_id": buyer.pk if portal.is_operator else None,
            "own_clusters": sum(
                1 for row in rows if portal.is_operator and row.cluster.operator_id == buyer.pk
            ),
            "bands": sorted({band for strip in strips.values() for band in strip.multipliers}),
            "now": now,
        },
    )


urlpatterns = [path("market/", market, name="market")]
