"""Broker test data: jobs and leases through the real services (no matcher involved)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from broker.models import ClusterReliability, Job, Lease
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster, Hub
from metering.selectors.tariffs import price_card_current


def make_job(*, buyer: Organisation, **overrides: Any) -> Job:
    """A job row with sensible defaults (8 cards, any chip, from yrd, 100 ms, 2 h within 48 h)."""
    now = timezone.now().replace(microsecond=0)
    values: dict[str, Any] = {
        "name": "train",
        "cards": 8,
        "standard_cards": None,
        "accelerators": [],
        "fabrics": [],
        "gang": "island",
        "origin_hub": Hub.objects.get(code="yrd"),
        "latency_budget_ms": 100,
        "earliest_start_at": now,
        "deadline_at": now + timedelta(hours=48),
        "duration_seconds": 7200,
        "checkpointable": False,
        "preference": "price",
    }
    values.update(overrides)
    if isinstance(values["origin_hub"], str):
        values["origin_hub"] = Hub.objects.get(code=values["origin_hub"])
    return Job.objects.create(buyer=buyer, **values)


def make_lease(
    *,
    job: Job,
    cluster: Cluster,
    cards: int | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    island: str | None = None,
    check_balance: bool = False,
    expected_draw: Decimal | str = "0",
) -> Lease:
    """A reserved lease on one island of ``cluster`` (its first island unless named), through
    broker.services.leases.lease_create with its capacity check."""
    from django.db import transaction

    from broker.services.leases import lease_create

    start_at = start_at or timezone.now().replace(microsecond=0)
    end_at = end_at or start_at + timedelta(seconds=job.duration_seconds)
    cards = cards or job.cards or 1
    islands = cluster.islands.order_by("name")
    target = islands.get(name=island) if island else islands.first()
    assert target is not None
    card = price_card_current(cluster=cluster)  # the card in force now, as an acceptance would lock
    with transaction.atomic():
        return lease_create(
            job=job,
            cluster_id=cluster.pk,
            allocation=[(target.pk, cards)],
            start_at=start_at,
            end_at=end_at,
            price_card_id=card.pk,
            expected_cost=Decimal("0.00"),
            expected_draw=Decimal(expected_draw),
            draw_class=cluster.accelerator.slug,
            standard_card_factor=None,
            actor=Actor.system("test"),
            check_balance=check_balance,
        )


def make_reliability(
    *, cluster: Cluster, percent: str, sold_card_seconds: int = 3_600_000, interruptions: int = 0
) -> ClusterReliability:
    """A stored reliability score for ``cluster`` (as the hourly refresh would leave it), with inputs that
    fit it. The score itself is taken as given: its computation is tested in test_reliability.py."""
    delivered = int(sold_card_seconds * Decimal(percent) / 100)
    now = timezone.now().replace(microsecond=0)
    row, _ = ClusterReliability.objects.update_or_create(
        cluster=cluster,
        defaults={
            "window_start_at": now - timedelta(days=30),
            "computed_at": now,
            "sold_card_seconds": sold_card_seconds,
            "delivered_card_seconds": delivered,
            "interruptions": interruptions,
            "card_hours": Decimal(sold_card_seconds) / 3600,
            "prior_card_hours": Decimal(1000),
            "prior_percent": Decimal("99.000"),
            "reliability_percent": Decimal(percent),
            "interruptions_per_1000_card_hours": (
                Decimal(interruptions) * 1000 * 3600 / sold_card_seconds if sold_card_seconds else None
            ),
        },
    )
    return row
