"""The ledger's one write path: named accounts and balanced, idempotent transfers.

Every posting in metering goes through :func:`transfer_post_by_id` — directly for rating's set-based
batches (hundreds of accounts a batch, named by id), through :func:`transfer_post` for callers holding
accounts. It checks the balance per unit, locks the touched accounts in id order (so two postings never
deadlock), writes the transfer and its entries, and moves the accounts' balances in the same transaction;
on PostgreSQL the lock, the entries and the balances are one statement each, whatever the number of
accounts. A pack account is ``non_negative``: the database refuses a negative balance even if a caller
got the arithmetic wrong.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext as _

from core.models import Organisation
from metering.errors import InsufficientBalanceError, LedgerUnbalancedError
from metering.models import (
    CNY_UNIT,
    AccountKind,
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    Pack,
    card_hour_unit,
)


def _account(
    *,
    key: str,
    kind: str,
    unit: str,
    organisation: Organisation | None = None,
    pack: Pack | None = None,
    non_negative: bool = False,
) -> LedgerAccount:
    account, _ = LedgerAccount.objects.get_or_create(
        key=key,
        defaults={
            "kind": kind,
            "unit": unit,
            "organisation": organisation,
            "pack": pack,
            "non_negative": non_negative,
        },
    )
    return account


def account_stripe_clearing() -> LedgerAccount:
    return _account(key="stripe_clearing", kind=AccountKind.STRIPE_CLEARING, unit=CNY_UNIT)


def account_buyer_money(*, buyer: Organisation) -> LedgerAccount:
    return _account(
        key=f"buyer_money:{buyer.pk}", kind=AccountKind.BUYER_MONEY, unit=CNY_UNIT, organisation=buyer
    )


def account_pack(*, pack: Pack) -> LedgerAccount:
    return _account(
        key=f"pack:{pack.pk}",
        kind=AccountKind.PACK,
        unit=card_hour_unit(pack.class_key),
        organisation=pack.buyer,
        pack=pack,
        non_negative=True,
    )


def account_issuance(*, class_key: str) -> LedgerAccount:
    return _account(
        key=f"issuance:{class_key}", kind=AccountKind.CARD_HOUR_ISSUANCE, unit=card_hour_unit(class_key)
    )


def account_arrears(*, buyer: Organisation, class_key: str) -> LedgerAccount:
    return _account(
        key=f"arrears:{buyer.pk}:{class_key}",
        kind=AccountKind.ARREARS,
        unit=card_hour_unit(class_key),
        organisation=buyer,
    )


def account_operator_earnings(*, operator: Organisation) -> LedgerAccount:
    return _account(
        key=f"operator_earnings:{operator.pk}",
        kind=AccountKind.OPERATOR_EARNINGS,
        unit=CNY_UNIT,
        organisation=operator,
    )


def account_platform_commission() -> LedgerAccount:
    return _account(key="platform_commission", kind=AccountKind.PLATFORM_COMMISSION, unit=CNY_UNIT)


def account_platform_spread() -> LedgerAccount:
    return _account(key="platform_spread", kind=AccountKind.PLATFORM_SPREAD, unit=CNY_UNIT)


def account_breakage() -> LedgerAccount:
    return _account(key="breakage", kind=AccountKind.BREAKAGE, unit=CNY_UNIT)


@transaction.atomic
def transfer_post(
    *,
    kind: str,
    idempotency_key: str,
    description: str,
    posted_by: str,
    postings: Iterable[tuple[LedgerAccount, int]],
    posted_at: datetime | None = None,
) -> tuple[LedgerTransfer, bool]:
    """Post one balanced transfer, at most once per ``idempotency_key``.

    ``postings`` are (account, signed micro-units); several for one account are merged, zeros dropped.
    Returns ``(transfer, created)``: a key seen before returns the original transfer and posts nothing.
    Raises LedgerUnbalancedError if a unit does not sum to zero (whatever the key), InsufficientBalanceError
    if a non-negative account would go below zero (nothing is written in either case).
    """
    amounts: dict[int, int] = defaultdict(int)
    units: dict[int, str] = {}
    for account, amount in postings:
        amounts[account.pk] += int(amount)
        units[account.pk] = account.unit
    # Checked before anything is read or locked (the accounts' units are at hand); transfer_post_by_id
    # checks them again against the locked rows.
    _balanced_or_raise(amounts, units, idempotency_key)
    return transfer_post_by_id(
        kind=kind,
        idempotency_key=idempotency_key,
        description=description,
        posted_by=posted_by,
        postings=amounts.items(),
        posted_at=posted_at,
    )


@transaction.atomic
def transfer_post_by_id(
    *,
    kind: str,
    idempotency_key: str,
    description: str,
    posted_by: str,
    postings: Iterable[tuple[int, int]],
    posted_at: datetime | None = None,
) -> tuple[LedgerTransfer, bool]:
    """:func:`transfer_post` for a caller that holds account ids rather than accounts (rating: a batch
    touches hundreds of accounts, which it would otherwise read whole only to pass them here). The same
    checks, the units read from the accounts as they are locked: an unbalanced transfer raises after the
    lock instead of before it, and still writes nothing."""
    existing = LedgerTransfer.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return existing, False
    amounts: dict[int, int] = defaultdict(int)
    for account_id, amount in postings:
        amounts[int(account_id)] += int(amount)
    return _transfer_write(
        kind=kind,
        idempotency_key=idempotency_key,
        description=description,
        posted_by=posted_by,
        moves=_moves_or_raise(amounts, idempotency_key),
        posted_at=posted_at,
    )


def _balanced_or_raise(amounts: dict[int, int], units: dict[int, str], idempotency_key: str) -> None:
    per_unit: dict[str, int] = defaultdict(int)
    for account_id, amount in amounts.items():
        per_unit[units[account_id]] += amount
    unbalanced = {unit: total for unit, total in per_unit.items() if total != 0}
    if unbalanced:
        raise LedgerUnbalancedError(
            f"Transfer {idempotency_key!r} does not balance.", extra={"unbalanced": unbalanced}
        )


def _moves_or_raise(amounts: dict[int, int], idempotency_key: str) -> dict[int, int]:
    moves = {account_id: amount for account_id, amount in amounts.items() if amount != 0}
    if not moves:
        raise LedgerUnbalancedError(f"Transfer {idempotency_key!r} moves nothing.")
    return moves


def _transfer_write(
    *,
    kind: str,
    idempotency_key: str,
    description: str,
    posted_by: str,
    moves: dict[int, int],
    posted_at: datetime | None,
) -> tuple[LedgerTransfer, bool]:
    """Lock the accounts of ``moves`` in id order, check the transfer against them (balanced per unit as
    the accounts' own units say, no non-negative account below zero), write it and its entries and move
    the balances. Inside the caller's transaction."""
    locked = _accounts_lock(sorted(moves))
    missing = set(moves) - set(locked)
    if missing:
        raise LedgerAccount.DoesNotExist(f"No ledger account with id {sorted(missing)}.")
    _balanced_or_raise(moves, {account_id: row[0] for account_id, row in locked.items()}, idempotency_key)
    for account_id, amount in moves.items():
        _unit, non_negative, balance, key = locked[account_id]
        if non_negative and balance + amount < 0:
            raise InsufficientBalanceError(
                _("Account %(account)s holds %(balance)s micro-units; the transfer takes %(amount)s.")
                % {"account": key, "balance": balance, "amount": -amount},
                extra={"account": key, "balance": balance, "amount": amount},
            )

    try:
        with transaction.atomic():
            transfer = LedgerTransfer.objects.create(
                kind=kind,
                idempotency_key=idempotency_key,
                description=description[:500],
                posted_at=posted_at or timezone.now(),
                posted_by=posted_by[:200],
            )
    except IntegrityError:
        # Another transaction posted the same key between our check and our insert (it committed
        # first, since the unique index made us wait for it): the posting happened once, return it.
        return LedgerTransfer.objects.get(idempotency_key=idempotency_key), False

    ordered = sorted(moves.items())
    if connection.vendor == "postgresql":
        # One statement for any number of entries (a rating batch writes hundreds): the rows as three
        # bound arrays, not a model object and a placeholder per value.
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO metering_ledgerentry (transfer_id, account_id, unit, amount)
                SELECT %s, e.account_id, e.unit, e.amount
                  FROM unnest(%s::bigint[], %s::text[], %s::bigint[]) AS e(account_id, unit, amount)
                """,
                [
                    transfer.pk,
                    [account_id for account_id, _ in ordered],
                    [locked[account_id][0] for account_id, _ in ordered],
                    [amount for _, amount in ordered],
                ],
            )
    else:
        LedgerEntry.objects.bulk_create(
            LedgerEntry(transfer=transfer, account_id=account_id, unit=locked[account_id][0], amount=amount)
            for account_id, amount in ordered
        )
    _balances_add(moves)
    return transfer, True


def _accounts_lock(account_ids: list[int]) -> dict[int, tuple[str, bool, int, str]]:
    """Lock the accounts (ids ascending, so two postings never deadlock) and read, by id, each one's
    (unit, non_negative, balance, key) as of the lock."""
    if connection.vendor == "postgresql":
        # The ids as one bound array: a rating batch locks hundreds of accounts.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, unit, non_negative, balance, key FROM metering_ledgeraccount "
                "WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE",
                [account_ids],
            )
            return {row[0]: row[1:] for row in cursor.fetchall()}
    return {
        row[0]: row[1:]
        for row in LedgerAccount.objects.select_for_update()
        .filter(pk__in=account_ids)
        .order_by("pk")
        .values_list("pk", "unit", "non_negative", "balance", "key")
    }


def _balances_add(moves: dict[int, int]) -> None:
    """Add each amount to its account's balance (rows already locked by the caller)."""
    if connection.vendor == "postgresql":
        # One statement for any number of accounts: a rating batch touches hundreds.
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE metering_ledgeraccount AS a SET balance = a.balance + m.amount
                  FROM unnest(%s::bigint[], %s::bigint[]) AS m(id, amount)
                 WHERE a.id = m.id
                """,
                [list(moves), list(moves.values())],
            )
        return
    for account_id, amount in moves.items():
        LedgerAccount.objects.filter(pk=account_id).update(balance=F("balance") + amount)


def account_ids_get_or_create(specs: dict[str, dict[str, object]]) -> dict[str, int]:
    """Account ids by key, creating the missing accounts from ``specs[key]`` (kind, unit, organisation_id…):
    one query of two columns when they all exist, which after the first hour of operation they do (on
    PostgreSQL with the keys as one array parameter). For a caller that posts by id (rating)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT key, id FROM metering_ledgeraccount WHERE key = ANY(%s::text[])", [list(specs)]
            )
            found = dict(cursor.fetchall())
    else:
        found = dict(LedgerAccount.objects.filter(key__in=specs).values_list("key", "pk"))
    for key, fields in specs.items():
        if key not in found:
            found[key] = LedgerAccount.objects.get_or_create(key=key, defaults=fields)[0].pk
    return found
