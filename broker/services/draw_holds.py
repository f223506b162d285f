"""Pending draws: each live lease's hold on its buyer's packs, and the buyer's sum of them per draw class.

A quote asks what the buyer's packs can still pay once its live leases are set aside (broker.draws). Rather
than recompute every live lease's remaining draw per quote, the figure is kept as leases are accepted and
end and as their usage is rated (the pending holds of a budget, broker.budgets, kept in the draw's unit):

- ``draw_hold_place``, at acceptance (lease_create, under the buyer's row lock): a DrawHold of the lease's
  whole expected draw, and DrawPending(buyer, draw class) += it;
- ``draws_posted``, inside each rating batch (registered with metering in BrokerConfig.ready): a lease's
  hold counts what rating posted for its usage (chip card-hours × band multiplier, whichever pack or
  arrears paid it), and the pending sum drops by what that took off the hold's open amount;
- ``draw_hold_void``, when the lease reaches a final state (lease_transition): the hold's open amount
  leaves the pending sum and the hold is voided.

A hold's open amount is ``max(expected − posted, 0)``; DrawPending is the sum of its buyer's open holds of a
class, and ``draw_pending_recompute`` derives it from scratch (live leases, rated segments) to prove it.

Lock order (no deadlock with acceptance, failover or a rating worker): the buyer's DrawPending rows in
draw-class order, then DrawHold rows in lease order. Rating locks the buyers' packs first; nothing here
locks a pack.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime

from django.db import connections, router
from django.db.models import F

from broker.models import DrawHold, DrawPending, Lease
from core.money import to_micros
from metering.selectors.spend import usage_record_references

_LEASE_PREFIX = "lease:"


def lease_id_of_reference(reference: str) -> int | None:
    """The lease a usage reference names (``lease:<id>``, Lease.reference), or None."""
    if not reference.startswith(_LEASE_PREFIX):
        return None
    tail = reference[len(_LEASE_PREFIX) :]
    return int(tail) if tail.isdigit() else None


def _pending_lock(*, buyer_ids: Iterable[int]) -> dict[tuple[int, str], DrawPending]:
    """Lock the buyers' DrawPending rows, in (buyer, class) order."""
    rows = DrawPending.objects.select_for_update().filter(buyer_id__in=sorted(set(buyer_ids)))
    return {(row.buyer_id, row.draw_class): row for row in rows.order_by("buyer_id", "draw_class")}


def draw_hold_place(*, lease: Lease, now: datetime) -> DrawHold:
    """Hold ``lease``'s whole expected draw on its buyer's packs and add it to the buyer's pending sum of
    its class. Runs in lease_create's transaction, after the buyer's organisation row is locked (so two
    acceptances of one buyer cannot both read the pending sum before either adds to it)."""
    expected = to_micros(lease.expected_draw)
    pending = _pending_lock(buyer_ids=[lease.buyer_id])
    row = pending.get((lease.buyer_id, lease.draw_class))
    if row is None:
        # The buyer row lock serialises every creation of the buyer's rows.
        DrawPending.objects.create(buyer_id=lease.buyer_id, draw_class=lease.draw_class, open_micros=expected)
    elif expected:
        DrawPending.objects.filter(pk=row.pk).update(open_micros=F("open_micros") + expected)
    return DrawHold.objects.create(
        lease=lease,
        buyer_id=lease.buyer_id,
        draw_class=lease.draw_class,
        expected_micros=expected,
        created_at=now,
    )


def draw_hold_void(*, lease: Lease, at: datetime) -> None:
    """Void the lease's hold (it ended, was cancelled, interrupted or failed): its open amount leaves the
    buyer's pending sum. What it posted stays posted in the packs. Idempotent."""
    _pending_lock(buyer_ids=[lease.buyer_id])
    hold = DrawHold.objects.select_for_update().filter(lease_id=lease.pk, voided_at__isnull=True).first()
    if hold is None:
        return
    open_micros = hold.open_micros
    DrawHold.objects.filter(pk=hold.pk).update(voided_at=at)
    if open_micros:
        DrawPending.objects.filter(buyer_id=hold.buyer_id, draw_class=hold.draw_class).update(
            open_micros=F("open_micros") - open_micros
        )


def draws_posted(*, posted: Mapping[int, int], starts: tuple[datetime, datetime] | None = None) -> None:
    """Rating's listener: ``posted`` maps each usage record rated in the batch to what it drew, in micro
    chip card-hours × band multiplier. Records reported against a lease (reference ``lease:<id>``) add to
    its hold's posted amount; its buyer's pending sum drops by what that took off the hold's open amount
    (never below zero: usage over the expected draw takes nothing further). Runs inside the rating batch's
    transaction, so a rolled-back batch posts nothing here either."""
    if not posted:
        return
    by_lease: dict[int, int] = defaultdict(int)
    references = usage_record_references(record_ids=list(posted), starts=starts, prefix=_LEASE_PREFIX)
    # A batch's records name a few leases many times over: each reference is parsed once.
    leases: dict[str, int | None] = {}
    for record_id, reference in references.items():
        draw = posted[record_id]
        if not draw:
            continue
        if reference in leases:
            lease_id = leases[reference]
        else:
            lease_id = leases[reference] = lease_id_of_reference(reference)
        if lease_id is not None:
            by_lease[lease_id] += draw
    if not by_lease:
        return
    holds = _open_holds_lock(lease_ids=sorted(by_lease))
    if not holds:
        return
    hold_deltas: list[tuple[int, int]] = []
    pending_deltas: dict[tuple[int, str], int] = defaultdict(int)
    for lease_id, buyer_id, draw_class, expected, before in holds:
        delta = by_lease[lease_id]
        hold_deltas.append((lease_id, delta))
        taken = max(expected - before, 0) - max(expected - before - delta, 0)
        if taken:
            pending_deltas[(buyer_id, draw_class)] += taken
    _apply(hold_deltas=hold_deltas, pending_deltas=pending_deltas)


def _open_holds_lock(*, lease_ids: list[int]) -> list[tuple[int, int, str, int, int]]:
    """The open holds of ``lease_ids`` (ascending) as (lease, buyer, draw class, expected, posted), locked in
    lock order: their buyers' DrawPending rows first, then the holds in lease order.

    On PostgreSQL each statement takes the leases as one array parameter: a rating batch names up to one
    lease per record (a minute's usage of a thousand leases), and the ORM's ``lease_id__in`` spelled a
    thousand placeholders, which Django composed and psycopg re-parsed (too long for its query cache) twice
    per batch: a sixth of a rating run's CPU in the design-load soak (issue 14)."""
    alias = router.db_for_write(DrawHold)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        open_holds = DrawHold.objects.filter(lease_id__in=lease_ids, voided_at__isnull=True)
        buyer_ids = set(open_holds.values_list("buyer_id", flat=True))
        if not buyer_ids:
            return []
        _pending_lock(buyer_ids=buyer_ids)
        return list(
            open_holds.select_for_update()
            .order_by("lease_id")
            .values_list("lease_id", "buyer_id", "draw_class", "expected_micros", "posted_micros")
        )
    hold_table = connection.ops.quote_name(DrawHold._meta.db_table)
    pending_table = connection.ops.quote_name(DrawPending._meta.db_table)
    with connection.cursor() as cursor:
        # Table names from the models' metadata; the ids are one bound array.
        cursor.execute(
            f"SELECT DISTINCT buyer_id FROM {hold_table} "  # noqa: S608
            "WHERE lease_id = ANY(%s::bigint[]) AND voided_at IS NULL",
            [lease_ids],
        )
        buyers = sorted(row[0] for row in cursor.fetchall())
        if not buyers:
            return []
        # _pending_lock's rows and order, without building them (only the lock matters here).
        cursor.execute(
            f"SELECT 1 FROM {pending_table} WHERE buyer_id = ANY(%s::bigint[]) "  # noqa: S608
            "ORDER BY buyer_id, draw_class FOR UPDATE",
            [buyers],
        )
        cursor.execute(
            "SELECT lease_id, buyer_id, draw_class, expected_micros, posted_micros "  # noqa: S608
            f"FROM {hold_table} WHERE lease_id = ANY(%s::bigint[]) AND voided_at IS NULL "
            "ORDER BY lease_id FOR UPDATE",
            [lease_ids],
        )
        return cursor.fetchall()


def _apply(*, hold_deltas: list[tuple[int, int]], pending_deltas: dict[tuple[int, str], int]) -> None:
    alias = router.db_for_write(DrawHold)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        for lease_id, delta in hold_deltas:
            DrawHold.objects.filter(pk=lease_id).update(posted_micros=F("posted_micros") + delta)
        for (buyer_id, draw_class), taken in sorted(pending_deltas.items()):
            DrawPending.objects.filter(buyer_id=buyer_id, draw_class=draw_class).update(
                open_micros=F("open_micros") - taken
            )
        return
    # A rating batch touches up to one hold per record: one statement each, not one per row.
    hold_table = connection.ops.quote_name(DrawHold._meta.db_table)
    pending_table = connection.ops.quote_name(DrawPending._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {hold_table} AS h SET posted_micros = h.posted_micros + v.delta "  # noqa: S608
            "FROM unnest(%s::bigint[], %s::bigint[]) AS v(lease_id, delta) WHERE h.lease_id = v.lease_id",
            [[lease_id for lease_id, _ in hold_deltas], [delta for _, delta in hold_deltas]],
        )
        if pending_deltas:
            keys = sorted(pending_deltas)
            cursor.execute(
                f"UPDATE {pending_table} AS p SET open_micros = p.open_micros - v.taken "  # noqa: S608
                "FROM unnest(%s::bigint[], %s::text[], %s::bigint[]) AS v(buyer_id, draw_class, taken) "
                "WHERE p.buyer_id = v.buyer_id AND p.draw_class = v.draw_class",
                [[k[0] for k in keys], [k[1] for k in keys], [pending_deltas[k] for k in keys]],
            )
