"""The ledger's write path by account id (metering.services.ledger.transfer_post_by_id, what rating posts
with) against the one by account (transfer_post): the same rows, the same refusals, nothing half-written.
Runs on SQLite and, with DATABASE_URL, on PostgreSQL (where the lock, the entries and the balances are
set-based statements)."""

from __future__ import annotations

import pytest

from metering.errors import InsufficientBalanceError, LedgerUnbalancedError
from metering.models import LedgerAccount, LedgerEntry, LedgerTransfer
from metering.services import ledger
from tests.factories import BuyerFactory
from tests.metering.factories import make_paid_pack

pytestmark = pytest.mark.django_db

A800 = "nvidia-a800-sxm4-80gb"


def _entries(transfer: LedgerTransfer) -> list[tuple[int, str, int]]:
    return list(
        LedgerEntry.objects.filter(transfer=transfer)
        .order_by("account_id")
        .values_list("account_id", "unit", "amount")
    )


def _balances(*accounts: LedgerAccount) -> list[int]:
    return [LedgerAccount.objects.get(pk=account.pk).balance for account in accounts]


def test_posting_by_id_writes_what_posting_by_account_writes():
    buyer = BuyerFactory(slug="ids-lab")
    pack = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00")
    account = ledger.account_pack(pack=pack)
    issuance = ledger.account_issuance(class_key=A800)
    money = ledger.account_buyer_money(buyer=buyer)
    spread = ledger.account_platform_spread()
    before = _balances(account, issuance, money, spread)

    by_account, created = ledger.transfer_post(
        kind="usage",
        idempotency_key="by-account",
        description="test",
        posted_by="test",
        postings=[(account, -2_000_000), (issuance, 2_000_000), (money, -30_000_000), (spread, 30_000_000)],
    )
    assert created
    # Several postings to one account merge, a zero drops out; ids in any order.
    by_id, created = ledger.transfer_post_by_id(
        kind="usage",
        idempotency_key="by-id",
        description="test",
        posted_by="test",
        postings=[
            (spread.pk, 30_000_000),
            (account.pk, -1_500_000),
            (money.pk, -30_000_000),
            (issuance.pk, 2_000_000),
            (account.pk, -500_000),
            (money.pk, 0),
        ],
    )
    assert created

    assert _entries(by_id) == _entries(by_account)
    assert [unit for _, unit, _ in _entries(by_id)] == [
        LedgerAccount.objects.get(pk=pk).unit for pk, _, _ in _entries(by_id)
    ]
    assert _balances(account, issuance, money, spread) == [
        before[0] - 4_000_000,
        before[1] + 4_000_000,
        before[2] - 60_000_000,
        before[3] + 60_000_000,
    ]

    # The same key again: the first transfer, nothing posted twice.
    again, created = ledger.transfer_post_by_id(
        kind="usage",
        idempotency_key="by-id",
        description="test",
        posted_by="test",
        postings=[(account.pk, -1), (issuance.pk, 1)],
    )
    assert (again.pk, created) == (by_id.pk, False)
    assert LedgerAccount.objects.get(pk=account.pk).balance == before[0] - 4_000_000


def test_posting_by_id_refuses_what_does_not_balance_in_the_accounts_own_units_and_writes_nothing():
    buyer = BuyerFactory(slug="units-lab")
    pack = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00")
    account = ledger.account_pack(pack=pack)
    money = ledger.account_buyer_money(buyer=buyer)
    before = _balances(account, money)
    transfers = LedgerTransfer.objects.count()

    # The amounts sum to zero, but across two units (card-hours and CNY): the caller passed ids, so the
    # units can only come from the accounts themselves.
    with pytest.raises(LedgerUnbalancedError) as raised:
        ledger.transfer_post_by_id(
            kind="usage",
            idempotency_key="mixed-units",
            description="test",
            posted_by="test",
            postings=[(account.pk, -1_000_000), (money.pk, 1_000_000)],
        )
    assert raised.value.extra["unbalanced"] == {account.unit: -1_000_000, "CNY": 1_000_000}
    with pytest.raises(LedgerUnbalancedError):
        ledger.transfer_post_by_id(
            kind="usage",
            idempotency_key="nothing",
            description="test",
            posted_by="test",
            postings=[(account.pk, 0)],
        )
    with pytest.raises(LedgerAccount.DoesNotExist):
        ledger.transfer_post_by_id(
            kind="usage",
            idempotency_key="no-such-account",
            description="test",
            posted_by="test",
            postings=[(account.pk, -1), (10**12, 1)],
        )
    assert LedgerTransfer.objects.count() == transfers
    assert _balances(account, money) == before


def test_posting_by_id_refuses_to_take_a_pack_below_zero_and_writes_nothing():
    buyer = BuyerFactory(slug="empty-lab")
    pack = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1, price="10.00")
    account = ledger.account_pack(pack=pack)
    issuance = ledger.account_issuance(class_key=A800)
    before = _balances(account, issuance)

    with pytest.raises(InsufficientBalanceError) as raised:
        ledger.transfer_post_by_id(
            kind="usage",
            idempotency_key="too-much",
            description="test",
            posted_by="test",
            postings=[(account.pk, -(before[0] + 1)), (issuance.pk, before[0] + 1)],
        )
    assert raised.value.extra == {"account": account.key, "balance": before[0], "amount": -(before[0] + 1)}
    assert not LedgerTransfer.objects.filter(idempotency_key="too-much").exists()
    assert _balances(account, issuance) == before


def test_account_ids_are_the_accounts_keys_name_creating_the_missing_ones():
    buyer = BuyerFactory(slug="keys-lab")
    money = ledger.account_buyer_money(buyer=buyer)
    specs = {
        money.key: {"kind": money.kind, "unit": money.unit, "organisation_id": buyer.pk},
        "issuance:brand-new-chip": {"kind": "card_hour_issuance", "unit": "card_hours:brand-new-chip"},
    }

    ids = ledger.account_ids_get_or_create(specs)

    created = LedgerAccount.objects.get(key="issuance:brand-new-chip")
    assert ids == {money.key: money.pk, created.key: created.pk}
    assert created.unit == "card_hours:brand-new-chip"
    assert ledger.account_ids_get_or_create(specs) == ids
