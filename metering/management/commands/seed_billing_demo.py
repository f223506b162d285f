"""``manage.py seed_billing_demo``: the metering half of the demo that ``make run`` starts with.

Run after ``seed_demo``. Idempotent, and it touches only what the seeds created (core.demo): each thing
below is made once, recorded, and never changed, reverted or re-made after (a demo cluster whose operator
priced it, or a pack product staff edited, stays as they left it); nothing of any other organisation is
read for a change or written.

- a price card on every demo cluster (seed_demo's) that has none, once: a rate per card-hour from the
  chip's standard-card factor (11 CNY per standard card-hour, western hubs 15 % cheaper — their power is),
  on the preset its hub offers by default (``preset_default_code``: an official provincial preset where
  one is confirmed, else ``flat``; never an unconfirmed one), flat for the unknown-spec chips. A cluster
  any operator left unpriced outside the demo stays unpriced;
- the pack catalogue (standard cards and a few chips), each product once by code;
- a demo buyer, ``demo-buyer`` (log-in ``buyer`` / the demo password), holding two packs granted by this
  seed — labelled as such in the ledger, no payment behind them — and, once, the day before the first run's
  usage on two demo clusters on a time-of-use tariff, reported through the usage batch service and rated,
  so the admin's ledger, usage and segments have rows;
- a tax profile for the demo buyer (the unified social credit code is GB 32100-2015's own worked example,
  not a real company's) and **one closed month** to open: last month, the demo buyer used A800 cards with no
  pack (arrears), a standard pack granted the next day paid them (an ``arrears_settlement``), and the demo
  buyer's invoice and that operator's settlement are issued with the monthly close's own services (only
  theirs: the month's close for everyone else is beat's) — so ``/invoices/`` has an invoice with its VAT,
  the amount due and what settled it, and the admin an operator settlement. Once.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.demo import demo_object, demo_record_add, demo_record_exists
from core.models import DemoRecord, Organisation
from core.services import organisation_create
from core.types import Actor
from federation.models import Accelerator, Cluster
from federation.selectors import standard_card_current, standard_card_factor
from metering.models import BillingProfile, Invoice, PackOrder, PackProduct, PriceCard, Tariff
from metering.services.billing import (
    billing_period_end,
    billing_previous_period_start,
    billing_zone,
    invoice_issue,
    settlement_issue,
)
from metering.services.packs import pack_issue
from metering.services.rating import usage_rate_pending
from metering.services.tariffs import price_card_set, tariff_presets_install
from metering.services.usage import usage_record_create_batch
from metering.tariffs import preset_default_code
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


SEED = "seed_billing_demo"


class Command(BaseCommand):
    help = "Price the demo clusters, fill the pack catalogue, and give a demo buyer packs and usage (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        self._notes: list[str] = []
        with transaction.atomic():
            # Platform reference data (the presets the code defines), through its own idempotent service,
            # as the migrations install it: not demo data.
            tariff_presets_install()
            priced = self._price_cards()
            self._catalogue()
            buyer = self._buyer()
            granted = self._packs(buyer) if buyer is not None else 0
        reported = self._usage(buyer) if buyer is not None else 0
        rated = usage_rate_pending(buyer=buyer) if buyer is not None else 0
        closed = self._closed_month(buyer) if buyer is not None else "no demo buyer"
        for note in self._notes:
            self.stdout.write(self.style.WARNING(note))
        self.stdout.write(
            f"billing demo: {priced} price cards set, {PackProduct.objects.count()} pack products, "
            f"buyer {BUYER_SLUG!r} (log-in {BUYER_USERNAME} / {DEMO_PASSWORD}) with {granted} new packs, "
            f"{reported} usage records reported, {rated} rated, {closed}"
        )

    def _price_cards(self) -> int:
        """A price card on each demo cluster that has none, once, on its hub's default preset."""
        standard = standard_card_current()
        tariffs: dict[str, Tariff] = {}
        cluster_ids = [
            int(pk)
            for pk in DemoRecord.objects.filter(key__startswith="seed_demo:cluster:").values_list(
                "object_pk", flat=True
            )
        ]
        priced = 0
        for cluster in (
            Cluster.objects.filter(pk__in=cluster_ids)
            .select_related("accelerator", "hub", "operator")
            .order_by("pk")
        ):
            key = f"{SEED}:price_card:{cluster.cpi}"
            if demo_record_exists(key=key) or PriceCard.objects.filter(cluster=cluster).exists():
                continue  # priced once already, or by its operator: left as it is
            factor = standard_card_factor(tflops=cluster.accelerator.dense_fp16_tflops, standard=standard)
            rate = (factor or Decimal("0.5")) * STANDARD_RATE
            if cluster.hub.code in WESTERN_HUBS:
                rate *= WEST_DISCOUNT
            code = "flat" if factor is None else preset_default_code(hub=cluster.hub.code)
            if code not in tariffs:
                tariffs[code] = Tariff.objects.get(code=code, owner__isnull=True)
            card = price_card_set(
                cluster=cluster,
                rate_per_card_hour=rate.quantize(Decimal("0.0001")),
                tariff=tariffs[code],
                effective_from=None,
                actor=Actor(organisation=cluster.operator, system_label=SEED),
            )
            demo_record_add(key=key, obj=card)
            priced += 1
        return priced

    def _catalogue(self) -> None:
        for order, (code, name, slug, card_hours, price, validity) in enumerate(CATALOGUE):
            key = f"{SEED}:pack_product:{code}"
            if demo_record_exists(key=key):
                continue
            if PackProduct.objects.filter(code=code).exists():
                self._notes.append(f"  pack product {code!r} exists and is not demo data: left as it is.")
                continue
            product = PackProduct.objects.create(
                code=code,
                name=name,
                accelerator=Accelerator.objects.get(slug=slug) if slug else None,
                card_hours=card_hours,
                price=Decimal(price),
                validity_days=validity,
                sort_order=order,
            )
            demo_record_add(key=key, obj=product)

    def _buyer(self) -> Organisation | None:
        """The demo buyer with its owner log-in and billing profile, created once (None when the slug or
        the user name belongs to something the seed did not create, or it was deleted)."""
        key = f"{SEED}:organisation:{BUYER_SLUG}"
        if demo_record_exists(key=key):
            return demo_object(key=key, model=Organisation)
        user_model = get_user_model()
        if Organisation.objects.filter(slug=BUYER_SLUG).exists():
            self._notes.append(f"  organisation {BUYER_SLUG!r} exists and is not demo data: left as it is.")
            return None
        if user_model.objects.filter(username=BUYER_USERNAME).exists():
            self._notes.append(f"  user {BUYER_USERNAME!r} exists and is not demo data: no demo buyer.")
            return None
        user = user_model.objects.create_user(
            username=BUYER_USERNAME, email="buyer@example.com", password=DEMO_PASSWORD
        )
        demo_record_add(key=f"{SEED}:user:{BUYER_USERNAME}", obj=user)
        buyer = organisation_create(slug=BUYER_SLUG, name="Demo Buyer AI Lab", is_buyer=True, owner=user)
        demo_record_add(key=key, obj=buyer)
        BillingProfile.objects.create(
            organisation=buyer,
            legal_name="演示买家人工智能实验室（示例）",
            address="上海市浦东新区示例路 8 号 (demo address)",
            billing_email="buyer@example.com",
            # GB 32100-2015's worked example: a valid code that belongs to no real company.
            unified_social_credit_code="91350100M000100Y43",
            invoice_title="演示买家人工智能实验室（示例）",
            fapiao_email="fapiao@example.com",
        )
        return buyer

    def _packs(self, buyer: Organisation) -> int:
        granted = 0
        paid_at = timezone.now() - timedelta(days=7)
        for code in ("std-1000", "a800-100"):
            key = f"{SEED}:pack_order:{code}"
            product = PackProduct.objects.filter(code=code).first()
            if demo_record_exists(key=key) or product is None:
                continue
            order, _ = PackOrder.objects.get_or_create(
                buyer=buyer,
                idempotency_key=f"demo-seed-{code}",
                defaults={
                    "product": product,
                    "accelerator": product.accelerator,
                    "card_hours": product.card_hours,
                    "amount": product.price,
                    "validity_days": product.validity_days,
                    "created_by": SEED,
                },
            )
            _, issued = pack_issue(order=order, paid_at=paid_at, posted_by=f"{SEED} (demo grant, no payment)")
            demo_record_add(key=key, obj=order)
            granted += int(issued)
        return granted

    def _demo_clusters(self) -> QuerySet[Cluster]:
        """Demo clusters this seed priced, with a chip of known figures, in id order."""
        card_ids = DemoRecord.objects.filter(key__startswith=f"{SEED}:price_card:").values_list(
            "object_pk", flat=True
        )
        return (
            Cluster.objects.filter(
                price_cards__pk__in=[int(pk) for pk in card_ids],
                accelerator__dense_fp16_tflops__isnull=False,
            )
            .select_related("operator")
            .distinct()
            .order_by("pk")
        )

    def _usage(self, buyer: Organisation) -> int:
        """Once: the day before the first run, 06:00–22:00 in Asia/Shanghai, hourly reports on two demo
        clusters on a time-of-use tariff (valley, flat and peak), against the cards the seed set."""
        key = f"{SEED}:usage"
        if demo_record_exists(key=key):
            return 0
        zone = timezone.get_default_timezone()
        yesterday = timezone.now().astimezone(zone).date() - timedelta(days=1)
        clusters = list(self._demo_clusters().exclude(price_cards__tariff_version__tariff__code="flat")[:2])
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
        demo_record_add(key=key, obj=buyer)
        return reported

    def _closed_month(self, buyer: Organisation) -> str:
        """Once: last month, 4 A800 cards for 4 hours with no pack two days before its end (arrears,
        reported and rated as they happened), a 100-card-hour standard pack granted the next morning (which
        pays them), then the demo buyer's invoice and the operator's settlement for the month, issued by the
        monthly close's own services (invoice_issue, settlement_issue) for those two only."""
        key = f"{SEED}:closed_month"
        if demo_record_exists(key=key):
            return "a closed month already there"
        period_start = billing_previous_period_start()
        zone = billing_zone()
        end = billing_period_end(period_start=period_start)
        day: date = end - timedelta(days=2)
        cluster = self._demo_clusters().filter(accelerator__slug="nvidia-a800-sxm4-80gb").first()
        if cluster is None:
            return "no demo A800 cluster to close a month on"
        if Invoice.objects.filter(buyer=buyer, period_start=period_start).exists():
            return "the demo buyer's last month is already invoiced"
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
        product = PackProduct.objects.filter(code="std-100").first()
        if product is not None:
            order, _ = PackOrder.objects.get_or_create(
                buyer=buyer,
                idempotency_key=f"demo-seed-arrears-{period_start:%Y%m}",
                defaults={
                    "product": product,
                    "accelerator": None,
                    "card_hours": product.card_hours,
                    "amount": product.price,
                    "validity_days": product.validity_days,
                    "created_by": SEED,
                },
            )
            pack_issue(
                order=order,
                paid_at=datetime.combine(day + timedelta(days=1), time(9), tzinfo=zone),
                posted_by=f"{SEED} (demo grant, no payment)",
            )
        invoice, _ = invoice_issue(buyer=buyer, period_start=period_start)
        settlement, _ = settlement_issue(operator=cluster.operator, period_start=period_start)
        demo_record_add(key=key, obj=invoice)
        return f"{period_start:%Y-%m} closed for the demo buyer (invoice {invoice.number}, settlement {settlement.number})"
