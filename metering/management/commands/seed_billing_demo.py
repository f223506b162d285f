"""``manage.py seed_billing_demo``: the metering half of the demo that ``make run`` starts with.

Run after ``seed_demo``. Idempotent: a second run finds everything in place and changes nothing.

- a price card on every demo cluster that has none: a rate per card-hour from the chip's standard-card
  factor (11 CNY per standard card-hour, western hubs 15 % cheaper — their power is), on the Ningxia tariff
  in the western hubs, Guangdong's in the east, flat for the unknown-spec chips;
- the pack catalogue (standard cards and a few chips);
- a demo buyer, ``demo-buyer`` (log-in ``buyer`` / the demo password), holding two packs granted by this
  seed — labelled as such in the ledger, no payment behind them — and yesterday's usage on two clusters,
  reported through the usage batch service and rated, so the admin's ledger, usage and segments have rows;
- a tax profile for the demo buyer (the unified social credit code is GB 32100-2015's own worked example,
  not a real company's) and **one closed month** to open: last month, the demo buyer used A800 cards with no
  pack (arrears), a standard pack granted the next day paid them (an ``arrears_settlement``), and the month
  is closed with the monthly task's service — so ``/invoices/`` has an invoice with its VAT, the amount due
  and what settled it, and the admin an operator settlement. Seeded once: skipped when the demo buyer
  already has an invoice.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from core.models import Membership, Organisation
from core.types import Actor
from federation.models import Accelerator, Cluster
from federation.selectors import standard_card_current, standard_card_factor
from metering.models import BillingProfile, Invoice, PackOrder, PackProduct, PriceCard, Tariff
from metering.services.billing import (
    billing_close_period,
    billing_period_end,
    billing_previous_period_start,
    billing_zone,
)
from metering.services.packs import pack_issue
from metering.services.rating import usage_rate_pending
from metering.services.tariffs import price_card_set, tariff_presets_install
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput

DEMO_PASSWORD = "demo-pass-2026"  # noqa: S105 - the published demo log-in (see seed_demo)
BUYER_SLUG = "demo-buyer"
BUYER_USERNAME = "buyer"
STANDARD_RATE = Decimal("11")  # CNY per standard card-hour, before the western discount
WEST_DISCOUNT = Decimal("0.85")
WESTERN_HUBS = {"nx", "gs", "nmg", "gz"}

CATALOGUE = [
    # code, name, accelerator slug (None = standard cards), card-hours, price CNY, validity days
    ("std-100", "100 standard card-hours", None, 100, "1100.00", 365),
    ("std-1000", "1,000 standard card-hours", None, 1000, "10500.00", 365),
    ("a800-100", "100 A800 card-hours", "nvidia-a800-sxm4-80gb", 100, "850.00", 180),
    ("h800-100", "100 H800 card-hours", "nvidia-h800-sxm5-80gb", 100, "2600.00", 180),
    ("910b-100", "100 Ascend 910B card-hours", "huawei-ascend-910b3", 100, "820.00", 180),
]


class Command(BaseCommand):
    help = "Price the demo clusters, fill the pack catalogue, and give a demo buyer packs and usage (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            tariff_presets_install()
            priced = self._price_cards()
            self._catalogue()
            buyer = self._buyer()
            granted = self._packs(buyer)
        reported = self._usage(buyer)
        rated = usage_rate_pending()
        closed = self._closed_month(buyer)
        self.stdout.write(
            f"billing demo: {priced} price cards set, {PackProduct.objects.count()} pack products, "
            f"buyer {BUYER_SLUG!r} (log-in {BUYER_USERNAME} / {DEMO_PASSWORD}) with {granted} new packs, "
            f"{reported} usage records reported, {rated} rated, {closed}"
        )

    def _price_cards(self) -> int:
        standard = standard_card_current()
        tariffs = {
            code: Tariff.objects.get(code=code, owner__isnull=True) for code in ("cn-nx", "cn-gd", "flat")
        }
        priced = 0
        for cluster in Cluster.objects.select_related("accelerator", "hub", "operator").order_by("pk"):
            if PriceCard.objects.filter(cluster=cluster).exists():
                continue
            factor = standard_card_factor(tflops=cluster.accelerator.dense_fp16_tflops, standard=standard)
            rate = (factor or Decimal("0.5")) * STANDARD_RATE
            west = cluster.hub.code in WESTERN_HUBS
            if west:
                rate *= WEST_DISCOUNT
            tariff = tariffs["flat"] if factor is None else tariffs["cn-nx" if west else "cn-gd"]
            price_card_set(
                cluster=cluster,
                rate_per_card_hour=rate.quantize(Decimal("0.0001")),
                tariff=tariff,
                effective_from=None,
                actor=Actor(organisation=cluster.operator, system_label="seed_billing_demo"),
            )
            priced += 1
        return priced

    def _catalogue(self) -> None:
        for order, (code, name, slug, card_hours, price, validity) in enumerate(CATALOGUE):
            PackProduct.objects.get_or_create(
                code=code,
                defaults={
                    "name": name,
                    "accelerator": Accelerator.objects.get(slug=slug) if slug else None,
                    "card_hours": card_hours,
                    "price": Decimal(price),
                    "validity_days": validity,
                    "sort_order": order,
                },
            )

    def _buyer(self) -> Organisation:
        buyer, _ = Organisation.objects.get_or_create(
            slug=BUYER_SLUG, defaults={"name": "Demo Buyer AI Lab", "is_buyer": True}
        )
        user_model = get_user_model()
        user = user_model.objects.filter(username=BUYER_USERNAME).first()
        if user is None:
            user = user_model.objects.create_user(
                username=BUYER_USERNAME, email="buyer@example.com", password=DEMO_PASSWORD
            )
        Membership.objects.get_or_create(
            organisation=buyer, user=user, defaults={"role": Membership.Role.OWNER}
        )
        BillingProfile.objects.get_or_create(
            organisation=buyer,
            defaults={
                "legal_name": "演示买家人工智能实验室（示例）",
                "address": "上海市浦东新区示例路 8 号 (demo address)",
                "billing_email": "buyer@example.com",
                # GB 32100-2015's worked example: a valid code that belongs to no real company.
                "unified_social_credit_code": "91350100M000100Y43",
                "invoice_title": "演示买家人工智能实验室（示例）",
                "fapiao_email": "fapiao@example.com",
            },
        )
        return buyer

    def _packs(self, buyer: Organisation) -> int:
        granted = 0
        paid_at = timezone.now() - timedelta(days=7)
        for code in ("std-1000", "a800-100"):
            product = PackProduct.objects.get(code=code)
            order, _ = PackOrder.objects.get_or_create(
                buyer=buyer,
                idempotency_key=f"demo-seed-{code}",
                defaults={
                    "product": product,
                    "accelerator": product.accelerator,
                    "card_hours": product.card_hours,
                    "amount": product.price,
                    "validity_days": product.validity_days,
                    "created_by": "seed_billing_demo",
                },
            )
            _, issued = pack_issue(
                order=order, paid_at=paid_at, posted_by="seed_billing_demo (demo grant, no payment)"
            )
            granted += int(issued)
        return granted

    def _usage(self, buyer: Organisation) -> int:
        """Yesterday, 06:00–22:00 in Asia/Shanghai, hourly reports on two clusters: valley, flat and peak."""
        zone = timezone.get_default_timezone()
        yesterday = timezone.now().astimezone(zone).date() - timedelta(days=1)
        clusters = list(
            Cluster.objects.filter(price_cards__isnull=False, accelerator__dense_fp16_tflops__isnull=False)
            .select_related("operator")
            .distinct()
            .order_by("pk")[:2]
        )
        reported = 0
        for cluster in clusters:
            # The card the seed set takes effect "now"; the demo's usage of yesterday names it explicitly,
            # as a lease locked on it would.
            version = (
                PriceCard.objects.filter(cluster=cluster)
                .order_by("-version")
                .values_list("version", flat=True)[0]
            )
            records = []
            for hour in range(6, 22):
                start = datetime.combine(yesterday, time(hour), tzinfo=zone)
                records.append(
                    UsageRecordInput(
                        idempotency_key=f"demo-{yesterday:%Y%m%d}-{cluster.pk}-{hour:02d}",
                        cluster=cluster.cpi,
                        buyer=buyer.slug,
                        cards=8,
                        start_at=start,
                        end_at=start + timedelta(hours=1),
                        price_card_version=version,
                        reference="demo",
                    )
                )
            result = usage_record_create_batch(operator=cluster.operator, records=records)
            reported += result.created
        return reported

    def _closed_month(self, buyer: Organisation) -> str:
        """Last month: 4 A800 cards for 4 hours with no pack two days before its end (arrears, reported and
        rated as they happened), a 100-card-hour standard pack granted the next morning (which pays them),
        then the month closed by billing_close_period. Once: skipped when the buyer has an invoice."""
        if Invoice.objects.filter(buyer=buyer).exists():
            return "a closed month already there"
        period_start = billing_previous_period_start()
        zone = billing_zone()
        end = billing_period_end(period_start=period_start)
        day: date = end - timedelta(days=2)
        cluster = (
            Cluster.objects.filter(price_cards__isnull=False, accelerator__slug="nvidia-a800-sxm4-80gb")
            .select_related("operator")
            .order_by("pk")
            .first()
        )
        if cluster is None:
            return "no A800 cluster to close a month on"
        version = (
            PriceCard.objects.filter(cluster=cluster).order_by("version").values_list("version", flat=True)[0]
        )
        start = datetime.combine(day, time(10), tzinfo=zone)
        reported_at = start + timedelta(hours=4, minutes=1)
        usage_record_create_batch(
            operator=cluster.operator,
            records=[
                UsageRecordInput(
                    idempotency_key=f"demo-closed-{day:%Y%m%d}-{cluster.pk}-{hour:02d}",
                    cluster=cluster.cpi,
                    buyer=buyer.slug,
                    cards=4,
                    start_at=start + timedelta(hours=hour),
                    end_at=start + timedelta(hours=hour + 1),
                    price_card_version=version,
                    reference="demo: last month, no pack",
                )
                for hour in range(4)
            ],
            now=reported_at,
        )
        usage_rate_pending(buyer=buyer, now=reported_at)
        product = PackProduct.objects.get(code="std-100")
        order, _ = PackOrder.objects.get_or_create(
            buyer=buyer,
            idempotency_key=f"demo-seed-arrears-{period_start:%Y%m}",
            defaults={
                "product": product,
                "accelerator": None,
                "card_hours": product.card_hours,
                "amount": product.price,
                "validity_days": product.validity_days,
                "created_by": "seed_billing_demo",
            },
        )
        pack_issue(
            order=order,
            paid_at=datetime.combine(day + timedelta(days=1), time(9), tzinfo=zone),
            posted_by="seed_billing_demo (demo grant, no payment)",
        )
        run = billing_close_period(period_start=period_start)
        return f"{period_start:%Y-%m} closed ({run.invoices_issued} invoices, {run.settlements_issued} settlements)"
