"""Pack expiry: the unused card-hours go back to issuance and their prepaid value to breakage, once."""

from __future__ import annotations

from decimal import Decimal

import pytest

from core.money import to_micros
from metering.models import LedgerEntry, LedgerTransfer, Pack
from metering.services.maintenance import ledger_reconcile, packs_expire_due
from tests.metering.factories import make_paid_pack
from tests.metering.test_billing_close import A800, World, report_and_rate, sh

pytestmark = pytest.mark.django_db
M = 1_000_000


def balance(key: str) -> int:
    from metering.models import LedgerAccount

    return LedgerAccount.objects.get(key=key).balance


def test_unused_pack_expires_whole(db: None) -> None:
    world = World()
    pack = world.pack
    assert (
        packs_expire_due(now=sh(2027, 3, 2, 8, 59)) == 0
    )  # not yet (expires 365 days after 2026-03-02 09:00)

    assert packs_expire_due(now=sh(2027, 3, 2, 9)) == 1

    pack.refresh_from_db()
    assert pack.status == Pack.Status.EXPIRED and pack.closed_at == sh(2027, 3, 2, 9)
    transfer = LedgerTransfer.objects.get(idempotency_key=f"pack_expiry:{pack.pk}")
    entries = dict(transfer.entries.values_list("account__key", "amount"))
    assert entries == {
        f"pack:{pack.pk}": -100 * M,
        f"issuance:{A800}": 100 * M,
        f"buyer_money:{world.acme.pk}": 1000 * M,
        "breakage": -1000 * M,
    }
    assert balance(f"pack:{pack.pk}") == 0
    assert balance(f"buyer_money:{world.acme.pk}") == 0
    assert ledger_reconcile().ok


def test_partly_used_pack_breaks_exactly_the_unused_value(db: None) -> None:
    world = World()
    world.march_usage()  # acme draws from its pack
    pack = world.pack
    remaining = balance(f"pack:{pack.pk}")
    used_value = sum(pack.segments.values_list("buyer_value", flat=True))
    assert 0 < remaining < 100 * M

    assert packs_expire_due(now=sh(2027, 4, 1)) == 1

    breakage = -balance("breakage")
    # Value used + value broken = the price, to the micro-yuan (telescoping draws).
    assert used_value + breakage == to_micros(Decimal("1000.00"))
    assert balance(f"pack:{pack.pk}") == 0
    assert balance(f"buyer_money:{world.acme.pk}") == 0
    assert ledger_reconcile().ok


def test_expiry_is_idempotent(db: None) -> None:
    world = World()
    assert packs_expire_due(now=sh(2027, 4, 1)) == 1
    entries = LedgerEntry.objects.count()
    assert packs_expire_due(now=sh(2027, 4, 2)) == 0
    assert LedgerEntry.objects.count() == entries
    assert LedgerTransfer.objects.filter(kind="pack_expiry").count() == 1
    world.pack.refresh_from_db()
    assert world.pack.status == Pack.Status.EXPIRED


def test_empty_and_other_packs(db: None) -> None:
    world = World()
    later = make_paid_pack(
        buyer=world.beta, accelerator=A800, card_hours=1, price="10.00", paid_at=sh(2026, 3, 20)
    )
    # Use up beta's 1 card-hour pack entirely (2 cards × 30 min flat), then it is exhausted, not expired.
    report_and_rate(
        world.operator, ("b1", "beta", 2, sh(2026, 3, 21, 20), sh(2026, 3, 21, 20, 30)), now=sh(2026, 3, 22)
    )
    later.refresh_from_db()
    assert later.status == Pack.Status.EXHAUSTED

    assert packs_expire_due(now=sh(2027, 3, 21)) == 1  # acme's pack only
    later.refresh_from_db()
    assert later.status == Pack.Status.EXHAUSTED
    assert not LedgerTransfer.objects.filter(idempotency_key=f"pack_expiry:{later.pk}").exists()
    assert ledger_reconcile().ok
