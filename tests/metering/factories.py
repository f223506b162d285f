"""Metering test data: pack products, paid packs, price cards. Money through the real services."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from core.models import Organisation
from core.types import Actor
from federation.models import Accelerator, Cluster
from metering.models import Pack, PackOrder, PackProduct, PriceCard, Tariff


def make_pack_product(
    *,
    code: str = "a800-100",
    accelerator: Accelerator | str | None = None,
    card_hours: int = 100,
    price: Decimal | str = "1000.00",
    validity_days: int = 365,
    **extra: Any,
) -> PackProduct:
    if isinstance(accelerator, str):
        accelerator = Accelerator.objects.get(slug=accelerator)
    product, _ = PackProduct.objects.get_or_create(
        code=code,
        defaults={
            "name": extra.pop("name", code),
            "accelerator": accelerator,
            "card_hours": card_hours,
            "price": Decimal(price),
            "validity_days": validity_days,
            **extra,
        },
    )
    return product


def make_paid_pack(
    *,
    buyer: Organisation,
    accelerator: Accelerator | str | None = None,
    card_hours: int = 100,
    price: Decimal | str = "1000.00",
    paid_at: datetime | None = None,
    validity_days: int = 365,
    key: str | None = None,
) -> Pack:
    """A pack credited through metering.services.packs.pack_issue, as the Stripe webhook would."""
    from metering.services.packs import pack_issue

    if isinstance(accelerator, str):
        accelerator = Accelerator.objects.get(slug=accelerator)
    slug = accelerator.slug if accelerator else "std"
    product = make_pack_product(
        code=f"{slug}-{card_hours}-{Decimal(price):.0f}"[:64],
        accelerator=accelerator,
        card_hours=card_hours,
        price=price,
        validity_days=validity_days,
    )
    order = PackOrder.objects.create(
        buyer=buyer,
        product=product,
        quantity=1,
        accelerator=accelerator,
        card_hours=card_hours,
        amount=Decimal(price),
        validity_days=validity_days,
        idempotency_key=key or f"test-{PackOrder.objects.count() + 1}",
    )
    pack, _ = pack_issue(order=order, paid_at=paid_at or timezone.now(), posted_by="test")
    return pack


def make_price_card(
    *,
    cluster: Cluster,
    rate: Decimal | str = "10.0000",
    tariff_code: str = "flat",
    effective_from: datetime | None = None,
    sla_availability_percent: Decimal | str | None = None,
    sla_credit_schedule: list[dict[str, str]] | None = None,
) -> PriceCard:
    """A price card on a preset tariff (or an operator tariff with that code), through the service; with a
    service level and credit schedule if given."""
    from metering.services.tariffs import price_card_set

    tariff = Tariff.objects.get(code=tariff_code, owner__isnull=True)
    return price_card_set(
        cluster=cluster,
        rate_per_card_hour=Decimal(rate),
        tariff=tariff,
        effective_from=effective_from,
        sla_availability_percent=sla_availability_percent,
        sla_credit_schedule=sla_credit_schedule,
        actor=Actor(organisation=cluster.operator, system_label="test"),
    )
