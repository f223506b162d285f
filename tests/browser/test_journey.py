"""The buyer's whole journey in a real browser, against a live server, real localstripe and a real Celery
worker, with the operator's side driven through the operator REST API the lease agents use.

sign up → buy an A800 pack with a test card (credited only when localstripe's webhook reaches the live
server) → place a job with the job form → accept the cheapest quote → the operator's agent starts the
lease, reports its usage and stops it (``simulate_lease_agents``' own functions, with an operator token,
over HTTP) → the worker rates the usage → the usage dashboard shows the card-hours by band and the pack
balance is down by exactly what was drawn → the month is closed (``billing_close_period`` for the month,
with an explicit ``now`` after it) and the invoice shows the same card-hours by band.

Time: the lease's window comes from the quote (the cheapest start may be hours away, in a valley band),
so the platform's clock is moved forward to its start and then past its end (``platform_clock``).

Plus the unhappy paths: a declined card (the message, in role=alert; no pack), a job form with bad input
(errors beside the fields, nothing saved), an operator's tariff with a gap (refused, the gap named in
role=alert, nothing saved).
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import Sum
from django.utils import timezone

from broker.management.commands import simulate_lease_agents as agents
from broker.models import Job, Lease, LeaseState
from core.charts import band_label
from core.models import Organisation
from core.money import MICROS
from core.services import api_token_create
from federation.models import Cluster
from metering import tasks as metering_tasks
from metering.models import Invoice, Pack, PackOrder, PackProduct, RatedSegment, Tariff
from metering.services.billing import billing_close_period, billing_period_bounds
from tests.browser.conftest import PlatformClock, Portal, Worker, shot
from tests.browser.portal_world import organisation
from tests.factories import make_cluster
from tests.metering.factories import make_pack_product, make_price_card

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

A800 = "nvidia-a800-sxm4-80gb"
PASSWORD = "journey-Pass-2026!x"
PAID_CARD = "4242 4242 4242 4242"
DECLINED_CARD = "4000 0000 0000 0002"
WEBHOOK_TIMEOUT_MS = 30_000


@pytest.fixture
def world(presets: None) -> dict[str, Any]:
    """Two operators with priced A800 clusters (Shanghai on Guangdong's tariff, Zhongwei on Ningxia's)
    and an A800 pack of 100 card-hours for sale."""
    east = organisation("ctyun", "China Telecom Cloud", operator=True)
    west = organisation("cucc", "China Unicom", operator=True)
    east_cluster = make_cluster(
        operator=east, hub="yrd", name="sh-ai01", islands=[("isl-01", 8), ("isl-02", 8)]
    )
    make_price_card(cluster=east_cluster, rate="12.0000", tariff_code="cn-gd")
    west_cluster = make_cluster(operator=west, hub="nx", name="zw-ai01", islands=[("isl-01", 32)])
    make_price_card(cluster=west_cluster, rate="9.0000", tariff_code="cn-nx")
    product = make_pack_product(
        code="a800-100", accelerator=A800, card_hours=100, price="900.00", name="A800 × 100"
    )
    return {"operators": [east, west], "clusters": [east_cluster, west_cluster], "product": product}


@pytest.fixture
def presets(db: None) -> None:
    from metering.services.tariffs import tariff_presets_install

    tariff_presets_install()


# --- Steps --------------------------------------------------------------------------------------------------


def sign_up(portal: Portal, *, username: str, organisation_name: str) -> Organisation:
    page = portal.page
    portal.goto("/accounts/signup/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("E-mail address").fill(f"{username}@example.com")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password again").fill(PASSWORD)
    page.get_by_label("Organisation name").fill(organisation_name)
    page.get_by_role("button", name="Create account").click()
    page.wait_for_load_state()
    assert "/accounts/signup/" not in page.url, page.locator("main").inner_text()
    user = User.objects.get(username=username)
    membership = user.memberships.select_related("organisation").get()
    assert membership.organisation.is_buyer and membership.role == "owner"
    return membership.organisation


def order_pack(portal: Portal, product: PackProduct) -> None:
    """From the packs page: choose the pack, quantity 1, continue to the checkout."""
    page = portal.page
    portal.goto("/packs/")
    # A pack option reads "<chip> <card-hours> card-hours · valid … · <price> …".
    chip = product.accelerator.model if product.accelerator else "Standard cards"
    option = re.compile(rf"{re.escape(chip)}.*\b{product.card_hours} card-hours", re.S)
    page.get_by_role("radio", name=option).check()
    page.get_by_label("Quantity").fill("1")
    page.get_by_role("button", name="Continue to payment").click()
    page.wait_for_url(re.compile(r"/packs/orders/\d+/$"))


def pay_with_test_card(portal: Portal, card: str) -> None:
    page = portal.page
    page.get_by_label(re.compile("Test card number")).fill(card)
    page.get_by_role("button", name=re.compile(r"^Pay ")).click()
    page.wait_for_load_state()


def place_job(portal: Portal, *, name: str, hours: int, deadline: datetime) -> Job:
    page = portal.page
    portal.goto("/jobs/new/")
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Cards", exact=True).fill("8")
    page.get_by_role("checkbox", name=re.compile("A800 SXM4")).check()
    page.get_by_label("Latency budget (ms)").fill("200")
    page.get_by_label("Deadline").fill(
        deadline.astimezone(timezone.get_default_timezone()).strftime("%Y-%m-%dT%H:%M")
    )
    page.get_by_label("Hours").fill(str(hours))
    page.get_by_label("Minutes").fill("0")
    page.get_by_role("button", name="Place the job and get quotes").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    return Job.objects.get(name=name)


def accept_cheapest_quote(portal: Portal) -> Lease:
    page = portal.page
    row = page.get_by_role("row").filter(has=page.get_by_text("cheapest", exact=True))
    row.get_by_role("button", name="Accept").click()
    page.wait_for_url(re.compile(r"/leases/\d+/$"))
    lease_id = int(re.search(r"/leases/(\d+)/$", page.url).group(1))  # type: ignore[union-attr]
    return Lease.objects.get(pk=lease_id)


def run_operator_agents(base_url: str, tokens: dict[str, str], *, now: datetime) -> agents.TickReport:
    """One tick of every operator's lease agent at ``now``, over the operator REST API."""
    report = agents.tick(base_url=base_url, tokens=tokens, now=now)
    assert report.errors == [] and not report.unreachable, report.errors
    return report


def pack_left_text(portal: Portal, pack: Pack) -> str:
    """The usage dashboard's "card-hours left / card-hours" cell of ``pack``."""
    row = portal.page.get_by_role("row").filter(
        has=portal.page.get_by_role("cell", name=f"#{pack.pk}", exact=True)
    )
    return row.get_by_role("cell").nth(2).inner_text()


def card_hours(card_seconds: int) -> str:
    return f"{(Decimal(card_seconds) / 3600).quantize(Decimal('0.01')):,}"


# --- The journey ----------------------------------------------------------------------------------------------


def test_buyer_journey_from_sign_up_to_invoice(
    portal: Portal,
    world: dict[str, Any],
    stripe_to_live_server: Any,
    celery_worker: Worker,
    platform_clock: PlatformClock,
) -> None:
    page = portal.page
    product: PackProduct = world["product"]

    # 1. Sign up.
    buyer = sign_up(portal, username="jane", organisation_name="Journey Labs")
    shot(page, "journey-01-signed-up")

    # 2. Buy the A800 pack with a test card; the pack appears only when the webhook has reached the server.
    order_pack(portal, product)
    order = PackOrder.objects.get(buyer=buyer)
    assert order.status == PackOrder.Status.PENDING
    assert not Pack.objects.filter(buyer=buyer).exists()
    pay_with_test_card(portal, PAID_CARD)
    page.get_by_text("100 card-hours added").wait_for(timeout=WEBHOOK_TIMEOUT_MS)
    shot(page, "journey-02-pack-paid")
    order.refresh_from_db()
    assert order.status == PackOrder.Status.PAID
    pack = Pack.objects.get(buyer=buyer)
    assert pack.card_hours == 100

    # 3. Place a job: 8 A800 cards for 1 hour, within the next 8 hours.
    job = place_job(portal, name="journey-train", hours=1, deadline=timezone.now() + timedelta(hours=8))
    assert job.cards == 8 and job.duration_seconds == 3600 and job.accelerators == [A800]
    page.get_by_role("heading", name="Quotes").wait_for()
    shot(page, "journey-03-quotes")

    # 4. Accept the cheapest quote.
    cheapest = job.quotes.order_by("cost", "rank").first()
    assert cheapest is not None
    lease = accept_cheapest_quote(portal)
    assert lease.quote_id is not None and lease.state == LeaseState.RESERVED
    assert lease.quote.cost == cheapest.cost  # type: ignore[union-attr]
    shot(page, "journey-04-lease")

    # 5. The operator's agent runs the lease through the operator API: start, usage, stop.
    operator = Cluster.objects.get(pk=lease.cluster_id).operator
    _, secret = api_token_create(organisation=operator, name="journey agent")
    tokens = {operator.slug: secret}
    platform_clock.advance_to(lease.start_at + timedelta(seconds=30))
    started = run_operator_agents(portal.base_url, tokens, now=platform_clock.now())
    assert started.started == 1
    platform_clock.advance_to(lease.end_at + timedelta(seconds=30))
    finished = run_operator_agents(portal.base_url, tokens, now=platform_clock.now())
    assert finished.stopped == 1
    lease.refresh_from_db()
    assert lease.state == LeaseState.COMPLETED and lease.ended_at == lease.end_at

    # 6. The real worker rates the usage.
    celery_worker.run(metering_tasks.usage_rate_pending)
    segments = RatedSegment.objects.filter(usage_record__buyer=buyer)
    assert segments.exists() and not segments.filter(pack__isnull=True).exists()
    assert segments.aggregate(s=Sum("card_seconds"))["s"] == 8 * 3600
    by_band: dict[str, int] = defaultdict(int)
    for band, seconds in segments.values_list("band", "card_seconds"):
        by_band[band] += seconds
    drawn = segments.aggregate(d=Sum("pack_draw"))["d"]

    # 7. The dashboard: card-hours by band, and the pack's balance down by exactly the draw.
    local = timezone.get_default_timezone()
    portal.goto(
        f"/usage/?from={lease.start_at.astimezone(local).date():%Y-%m-%d}"
        f"&to={lease.end_at.astimezone(local).date():%Y-%m-%d}"
    )
    page.get_by_text("The numbers, day by day").click()
    numbers = page.locator("details.numbers table")
    header = [cell.strip() for cell in numbers.locator("thead th").all_inner_texts()]
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for row in numbers.locator("tbody tr").all():
        cells = [c.strip() for c in row.locator("td").all_inner_texts()]
        for band, value in zip(header[1 : 1 + len(cells) - 2], cells, strict=False):
            totals[band] += Decimal(value.replace(",", ""))
    # The table's headers are the bands' human names (core.charts.band_label), in English here.
    expected_bands = {band_label(band): Decimal(card_hours(seconds)) for band, seconds in by_band.items()}
    assert {b: v for b, v in totals.items() if v} == expected_bands
    left = (Decimal(pack.card_hours * MICROS - drawn) / MICROS).quantize(Decimal("0.01"))
    assert pack_left_text(portal, pack).startswith(f"{left:,}"), pack_left_text(portal, pack)
    shot(page, "journey-05-dashboard")

    # 8. Month end: close the lease's month and read the invoice.
    zone = timezone.get_default_timezone()
    period_start = lease.start_at.astimezone(zone).date().replace(day=1)
    _, period_end = billing_period_bounds(period_start=period_start)
    billing_close_period(period_start=period_start, now=period_end + timedelta(minutes=30))
    invoice = Invoice.objects.get(buyer=buyer, period_start=period_start)
    lines = list(invoice.lines.filter(kind="usage").select_related("cluster"))
    per_band: dict[str, int] = defaultdict(int)
    for line in lines:
        per_band[line.band] += line.card_seconds
    assert dict(per_band) == dict(by_band)
    assert sum(line.card_hours_drawn for line in lines) == Decimal(drawn) / MICROS
    portal.goto("/invoices/")
    page.get_by_role("link", name=invoice.number).first.click()
    page.wait_for_url(re.compile(r"/invoices/"))
    for line in lines:
        assert line.cluster is not None
        row = (
            page.get_by_role("row").filter(has_text=line.cluster.cpi).filter(has_text=line.get_band_display())
        )
        assert card_hours(line.card_seconds) in row.first.inner_text(), (
            line.band,
            card_hours(line.card_seconds),
        )
    shot(page, "journey-06-invoice")


def test_a_declined_card_says_so_and_adds_no_pack(
    portal: Portal, world: dict[str, Any], stripe_to_live_server: Any
) -> None:
    buyer = sign_up(portal, username="dave", organisation_name="Declined Ltd")
    order_pack(portal, world["product"])
    pay_with_test_card(portal, DECLINED_CARD)
    alert = portal.page.get_by_role("alert").filter(has_text="Your card was not charged.")
    alert.wait_for(timeout=WEBHOOK_TIMEOUT_MS)
    assert "declined" in alert.inner_text().lower()
    shot(portal.page, "journey-declined-card")
    assert not Pack.objects.filter(buyer=buyer).exists()
    order = PackOrder.objects.get(buyer=buyer)
    assert order.status in (PackOrder.Status.PENDING, PackOrder.Status.FAILED)


def test_a_job_form_with_bad_input_shows_the_errors_beside_the_fields(
    portal: Portal, world: dict[str, Any]
) -> None:
    sign_up(portal, username="erin", organisation_name="Bad Input Co")
    page = portal.page
    portal.goto("/jobs/new/")
    page.get_by_label("Cards", exact=True).fill("-3")
    page.get_by_label("Latency budget (ms)").fill("-1")
    page.get_by_label("Hours").fill("0")
    page.get_by_label("Minutes").fill("0")
    page.get_by_role("button", name="Place the job and get quotes").click()
    page.wait_for_load_state()
    assert page.url.endswith("/jobs/new/")
    page.get_by_role("alert").first.wait_for()
    for label in ("Cards", "Latency budget (ms)"):
        field = page.locator(".field.has-error").filter(has=page.get_by_label(label, exact=True))
        assert field.count() == 1, f"no error beside {label}"
        assert field.locator(".errorlist").inner_text().strip()
    duration = page.locator("fieldset.has-error").filter(has_text="Duration")
    assert duration.locator(".errorlist").inner_text().strip()
    shot(page, "journey-job-form-errors")
    assert not Job.objects.exists()


def test_an_operator_tariff_with_a_gap_is_refused_with_the_gap_named(
    portal: Portal, world: dict[str, Any], login_user: Any
) -> None:
    operator = world["operators"][0]
    olga = login_user("olga", operator)
    portal.login_as(olga)
    page = portal.page
    portal.goto("/operator/tariffs/new/")
    page.get_by_label("Name", exact=True).fill("Gappy night tariff")
    page.get_by_label("Code", exact=True).fill("gappy-night")
    page.get_by_label("Time zone").fill("Asia/Shanghai")
    page.get_by_label("Valley", exact=True).fill("0.5")
    page.get_by_label("Flat", exact=True).fill("1")
    page.get_by_label("Windows").fill("valley 00:00-08:00\nflat 09:00-24:00")
    page.get_by_role("button", name="Save tariff").click()
    page.wait_for_load_state()
    alert = page.get_by_role("alert").filter(has_text="08:00")
    alert.first.wait_for()
    text = alert.first.inner_text()
    assert "08:00" in text and "09:00" in text and "no band" in text
    shot(page, "journey-tariff-gap")
    assert not Tariff.objects.filter(owner=operator, code="gappy-night").exists()
