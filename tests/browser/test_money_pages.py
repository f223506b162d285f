"""The money pages of a standard-pack buyer in the browser: the quote table, a lease, /usage/ and the packs
page, at 1280 px and 390 px. Every column of the quote table (the draw and the Accept button included) is
inside a 1280 px window, no page scrolls sideways on a 390 px phone, and draws are named in standard
card-hours. Screenshots go to ``$CARDHOUR_SHOTS_DIR`` (default var/screenshots/) for people to look at.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from broker.services.dispatch import LeaseUsageInput, lease_start, lease_usage_report
from broker.services.quotes import quote_create
from core.types import Actor
from metering.services.rating import usage_rate_pending
from tests.broker.factories import make_job, make_lease
from tests.browser.conftest import SCREENSHOTS, Portal, phone_overflow, shot
from tests.browser.portal_world import _person, organisation
from tests.factories import make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

A800 = "nvidia-a800-sxm4-80gb"
SHOTS = Path(os.environ.get("CARDHOUR_SHOTS_DIR") or SCREENSHOTS)


@pytest.fixture
def world() -> dict[str, Any]:
    """Acme holds only a standard pack (500 standard card-hours at 12 CNY); it ran 8 A800 cards for three
    hours on Shanghai's cluster this morning (rated), holds a reserved lease and has live quotes."""
    from metering.services.tariffs import tariff_presets_install

    tariff_presets_install()
    now = timezone.now().replace(microsecond=0)
    buyer = organisation("acme", "Acme AI")
    operator = organisation("ctyun", "China Telecom Cloud", operator=True)
    other = organisation("cucc", "China Unicom", operator=True)
    alice = _person("alice", buyer)
    east = make_cluster(operator=operator, hub="yrd", name="sh-ai01", islands=[("isl-01", 8), ("isl-02", 8)])
    make_price_card(cluster=east, rate="12.0000", tariff_code="cn-gd")
    west = make_cluster(operator=other, hub="nx", name="zw-ai01", islands=[("isl-01", 32)])
    make_price_card(cluster=west, rate="9.0000", tariff_code="cn-nx")
    make_paid_pack(buyer=buyer, card_hours=500, price="6000.00", paid_at=now - timedelta(days=2), key="std")

    start = now - timedelta(hours=5)
    ran = make_job(buyer=buyer, name="pretrain", accelerators=[A800], duration_seconds=3 * 3600)
    lease = make_lease(job=ran, cluster=east, start_at=start, end_at=start + timedelta(hours=3))
    agent = Actor(organisation=operator, system_label="agent")
    lease_start(operator=operator, lease_id=lease.pk, actor=agent, at=start)
    lease_usage_report(
        operator=operator,
        records=[
            LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key=f"u-{h}",
                start_at=start + timedelta(hours=h),
                end_at=start + timedelta(hours=h + 1),
                cards=8,
            )
            for h in range(3)
        ],
        actor=agent,
        now=now,
    )
    usage_rate_pending(now=now)
    reserved_job = make_job(buyer=buyer, name="nightly", accelerators=[A800], cards=8)
    reserved = make_lease(
        job=reserved_job,
        cluster=west,
        start_at=now + timedelta(hours=6),
        end_at=now + timedelta(hours=8),
        expected_draw="8",
    )
    quoted = make_job(buyer=buyer, name="finetune", accelerators=[A800], cards=8)
    assert quote_create(job=quoted).quotes
    return {"alice": alice, "quoted": quoted, "lease": lease, "reserved": reserved}


def _right_edge_of(portal: Portal, selector: str) -> float:
    return float(
        portal.page.evaluate(
            f"Math.max(...Array.from(document.querySelectorAll('{selector}'))"
            ".map(e => e.getBoundingClientRect().right))"
        )
    )


def test_money_pages_fit_and_name_draws_in_standard_card_hours(portal: Portal, world: dict[str, Any]) -> None:
    portal.login_as(world["alice"])
    pages = {
        "money-quotes": f"/jobs/{world['quoted'].pk}/",
        "money-lease": f"/leases/{world['lease'].pk}/",
        "money-lease-reserved": f"/leases/{world['reserved'].pk}/",
        "money-usage": "/usage/",
        "money-packs": "/packs/",
        "money-market": "/market/",
    }
    wrong: list[str] = []
    for name, path in pages.items():
        portal.problems.clear()
        response = portal.goto(path)
        portal.page.wait_for_load_state("networkidle")
        assert response is not None and response.status == 200, path
        shot(portal.page, name, directory=SHOTS)
        overflow = phone_overflow(portal.page)
        if overflow:
            wrong.append(f"{path}: {overflow} px wider than a 390 px phone")
        wrong.extend(f"{path}: {problem}" for problem in portal.problems.all())
        text = portal.page.inner_text("body")
        # A draw *named* in A800 card-hours (the conversion "(8.00 … card-hours × factor 0.78)" may say it).
        if re.search(rf"(?<![(\d.,])[\d][\d.,]* {A800} card-h", text):
            wrong.append(f"{path}: a draw in A800 card-hours, which no pack of this buyer holds")

    # At 1280 px the whole quote table is on screen: the draw column and the Accept buttons too.
    portal.goto(pages["money-quotes"])
    portal.page.set_viewport_size({"width": 1280, "height": 900})
    for selector in ("table.quotes td.draw", "table.quotes .quote-actions button"):
        right = _right_edge_of(portal, selector)
        if right > 1280:
            wrong.append(f"{selector} ends at {right:.0f} px, beyond a 1280 px window")
    assert "std card-h" in portal.page.inner_text("table.quotes")
    assert not wrong, "\n".join(wrong)

    # The lease that ran drew standard card-hours: 8 cards × 3 h × band multipliers × 0.78.
    portal.goto(pages["money-lease"])
    drawn = portal.page.inner_text("ul.draws")
    assert "standard card-hours" in drawn and A800 not in drawn
    assert Decimal(drawn.split()[0]) > 0
