"""Buyers' leases in the portal: the list, a lease with its state history, locked price card and live
usage (a fragment the page polls while the lease runs), and cancelling one."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from broker import selectors
from broker.draws import lease_draw_plan
from broker.errors import LeaseTransitionError
from broker.models import HOLDING_STATES, Lease, LeaseState
from broker.services import leases as lease_services
from core.portal import portal_view

PAGE_SIZE = 50
# While a lease is in one of these states usage can still arrive, so its page keeps polling.
LIVE_STATES = (LeaseState.RUNNING, LeaseState.STOP_REQUESTED)
CANCELLABLE_STATES = (LeaseState.RESERVED, LeaseState.RUNNING)


@portal_view("buyer")
def lease_list(request: HttpRequest) -> HttpResponse:
    buyer = request.portal.organisation  # type: ignore[attr-defined]
    state = request.GET.get("state", "")
    if state not in LeaseState.values:
        state = ""
    leases = selectors.lease_list_for_buyer(buyer=buyer)
    if state:
        leases = leases.filter(state=state)
    page = Paginator(leases, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "broker/leases/list.html",
        {"page": page, "state": state, "states": LeaseState.choices},
    )


def _usage_context(lease: Lease) -> dict[str, Any]:
    usage = selectors.lease_usage(lease=lease)
    planned = Decimal(lease.cards * int((lease.end_at - lease.start_at).total_seconds())) / 3600
    return {
        "lease": lease,
        "usage": usage,
        "live": lease.state in LIVE_STATES,
        "planned_card_hours": planned,
        "progress": min(int(usage.card_hours * 100 / planned), 100) if planned else 0,
        "now": timezone.now(),
    }


@portal_view("buyer")
def lease_detail(request: HttpRequest, lease_id: int) -> HttpResponse:
    buyer = request.portal.organisation  # type: ignore[attr-defined]
    lease = selectors.lease_get_for_buyer(buyer=buyer, lease_id=lease_id)
    card = lease.price_card
    return render(
        request,
        "broker/leases/detail.html",
        {
            **_usage_context(lease),
            "transitions": list(selectors.lease_transitions(lease=lease)),
            "price_card": card,
            "tariff": card.tariff_version.tariff,
            "can_cancel": lease.state in CANCELLABLE_STATES,
            # How the expected draw is paid, in the paying packs' units, while the lease can still draw.
            "plan": lease_draw_plan(lease=lease)
            if lease.state in HOLDING_STATES and lease.expected_draw > 0
            else None,
            "time_zone": timezone.get_current_timezone_name(),
        },
    )


@portal_view("buyer")
def lease_usage_fragment(request: HttpRequest, lease_id: int) -> HttpResponse:
    """The live-usage block of a lease page alone, for ``data-poll-url``; it carries ``data-poll-done``
    once the lease can receive no more usage."""
    buyer = request.portal.organisation  # type: ignore[attr-defined]
    lease = selectors.lease_get_for_buyer(buyer=buyer, lease_id=lease_id)
    return render(request, "broker/leases/_usage.html", _usage_context(lease))


@require_POST
@portal_view("buyer", write=True)
def lease_cancel(request: HttpRequest, lease_id: int) -> HttpResponse:
    portal = request.portal  # type: ignore[attr-defined]
    lease = selectors.lease_get_for_buyer(buyer=portal.organisation, lease_id=lease_id)
    try:
        lease = lease_services.lease_cancel(
            lease_id=lease.pk, actor=portal.actor, reason="cancelled by the buyer in the portal"
        )
    except LeaseTransitionError:
        messages.error(
            request,
            _("Lease %(lease)s is %(state)s: only a reserved or running lease can be cancelled.")
            % {"lease": lease.pk, "state": lease.get_state_display()},
        )
    else:
        if lease.state == LeaseState.CANCELLED:
            messages.success(
                request, _("Lease %(lease)s cancelled; its cards are released.") % {"lease": lease.pk}
            )
        else:
            messages.success(
                request,
                _("Lease %(lease)s is asked to stop; it ends when the operator reports it stopped.")
                % {"lease": lease.pk},
            )
    return redirect("lease-detail", lease_id=lease.pk)


urlpatterns: list[URLPattern] = [
    path("leases/", lease_list, name="lease-list"),
    path("leases/<int:lease_id>/", lease_detail, name="lease-detail"),
    path("leases/<int:lease_id>/usage/", lease_usage_fragment, name="lease-usage-fragment"),
    path("leases/<int:lease_id>/cancel/", lease_cancel, name="lease-cancel"),
]
