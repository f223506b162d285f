"""``manage.py seed_broker_demo``: the broker half of the demo that ``make run`` starts with.

Run after ``seed_demo`` and ``seed_billing_demo``. Idempotent, and it touches only what the seeds created
(core.demo): only the demo buyer's jobs, each submitted once and recorded — a job the buyer has cancelled,
re-quoted or left since stays as it is, and nothing is done for a ``demo-buyer`` the seeds did not create.
The demo buyer submits, through the same services as the API:

- ``demo: pretrain 8×A800`` — 8 A800 cards from the Yangtze River Delta, 30 ms budget, 4 hours within the
  next day: quoted and accepted, so it holds a reserved lease (shifted into a valley when the cheapest
  island is on a time-of-use tariff);
- ``demo: fine-tune 12 standard cards`` — any chip, counted by its standard-card factor, may span the
  islands of one cluster: quoted and accepted;
- ``demo: inference burst`` — 4 cards, 10 ms budget from the Greater Bay Area, left open for the portal to
  quote.

Before the jobs, the demo buyer gets an organisation budget (``Demo monthly``: 2,000 CNY soft with alerts at
50/80/100 %, a 5,000 CNY hard cap), so the leases placed hold their expected cost against it and the Budgets
page has something to show.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from broker.budgets.models import DEFAULT_THRESHOLDS, Budget
from broker.errors import BudgetCapExceededError, CapacityTakenError, ClusterUnavailableError
from broker.models import Job
from broker.services.jobs import JobInput, job_create
from broker.services.leases import lease_accept
from broker.services.quotes import quote_create
from core.demo import demo_object, demo_record_add, demo_record_exists
from core.models import Organisation
from core.types import Actor
from metering.errors import InsufficientBalanceError

BUYER_SLUG = "demo-buyer"


def _jobs(now: Any) -> list[tuple[JobInput, bool]]:
    day = now + timedelta(hours=24)
    return [
        (
            JobInput(
                name="demo: pretrain 8×A800",
                idempotency_key="demo-pretrain",
                cards=8,
                accelerators=("nvidia-a800-sxm4-80gb",),
                origin_hub="yrd",
                latency_budget_ms=30,
                deadline_at=day,
                duration_seconds=4 * 3600,
                checkpointable=True,
            ),
            True,
        ),
        (
            JobInput(
                name="demo: fine-tune 12 standard cards",
                idempotency_key="demo-finetune",
                standard_cards=Decimal("12"),
                gang="cluster",
                origin_hub="jjj",
                latency_budget_ms=30,
                deadline_at=day,
                duration_seconds=2 * 3600,
                max_price_per_card_hour=Decimal("20"),
            ),
            True,
        ),
        (
            JobInput(
                name="demo: inference burst",
                idempotency_key="demo-inference",
                cards=4,
                origin_hub="gba",
                latency_budget_ms=10,
                deadline_at=now + timedelta(hours=6),
                duration_seconds=3600,
                preference="latency",
            ),
            False,
        ),
    ]


class Command(BaseCommand):
    help = "Give the demo buyer a few jobs, two of them placed on leases (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        buyer = demo_object(key=f"seed_billing_demo:organisation:{BUYER_SLUG}", model=Organisation)
        if buyer is None:
            self.stderr.write("No demo buyer (created by seed_billing_demo): nothing to do.")
            return
        actor = Actor(organisation=buyer, system_label="seed_broker_demo")
        now = timezone.now().replace(microsecond=0)
        self._budget(buyer)
        placed = 0
        for data, place in _jobs(now):
            key = f"seed_broker_demo:job:{data.idempotency_key}"
            if demo_record_exists(key=key):
                continue
            if Job.objects.filter(buyer=buyer, idempotency_key=data.idempotency_key).exists():
                continue  # the buyer's own job under that key: not the seed's
            with transaction.atomic():
                job, _ = job_create(buyer=buyer, data=data, actor=actor, now=now)
                demo_record_add(key=key, obj=job)
            if not place:
                continue
            for quote in quote_create(job=job, limit=5).quotes:
                try:
                    lease_accept(quote=quote, actor=actor)
                except (
                    CapacityTakenError,
                    ClusterUnavailableError,
                    InsufficientBalanceError,
                    BudgetCapExceededError,
                ):
                    continue
                placed += 1
                break
        self.stdout.write(
            f"Broker demo: {Job.objects.filter(buyer=buyer).count()} jobs, {placed} newly placed."
        )

    def _budget(self, buyer: Organisation) -> None:
        """The demo buyer's monthly budget, once. Written directly, as the platform (no person of the buyer's
        acts here; the budget service asks for an owner or administrator)."""
        key = "seed_broker_demo:budget:monthly"
        if demo_record_exists(key=key) or Budget.objects.filter(buyer=buyer, scope="organisation").exists():
            return
        with transaction.atomic():
            budget = Budget.objects.create(
                buyer=buyer,
                name="Demo monthly",
                soft_amount=Decimal("2000.00"),
                thresholds=DEFAULT_THRESHOLDS,
                hard_cap=Decimal("5000.00"),
            )
            demo_record_add(key=key, obj=budget)
