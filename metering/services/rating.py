"""Rating: price unrated usage records and post them to the ledger, set-based, exactly once.

One batch (default 20,000 records, CARDHOUR_RATING_BATCH_SIZE) is one transaction:

1. claim the oldest records of the pending-rating queue (UsagePending: a narrow copy of what rating reads,
   written with each usage record) ``FOR UPDATE SKIP LOCKED`` and delete them in the same statement (two
   workers never claim the same record; the usage table itself is neither read nor updated);
2. split each record at its tariff's band edges and local midnights (metering.tariffs, daylight-saving safe,
   half-open) into slices, price each slice at the record's *locked* price card —
   ``gross = rate × card-hours × multiplier``, ``commission = gross × CARDHOUR_PLATFORM_COMMISSION`` — and draw
   ``card-hours × multiplier`` (× the chip's standard-card factor for a standard pack) from the buyer's usable
   packs, the one that expires first first; a slice that empties a pack continues on the next as a second
   row; what no pack covers is *arrears*, and the buyer is flagged at once;
3. post one balanced transfer for the batch (per account sums of the rows) and COPY the rated segments
   that explain it row by row (each carries its record's buyer, operator and start: the start is the
   segments' partition column on PostgreSQL, so a record's segments share its month).

A crash anywhere rolls the whole batch back — the queue rows come back with it — so a rerun produces the
same ledger; a record already rated has no queue row and is never claimed again (and the unique
(usage_record, seq) index refuses a second set of its segments). Every amount is an exact integer of micro-units (core.money), rounded half-even once
per row.

Ledger signs (balance = Σ entries): a pack holds +card-hours; issuance starts at −bought and climbs back as
packs are used or expire; buyer money is −prepaid value (positive = owed by the buyer, from arrears);
operator earnings and platform revenues are negative (credits the platform owes or has earned).
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Mod
from django.utils import timezone

from core.models import Organisation
from core.money import MICROS, round_div, scaled_int, to_micros
from federation.models import Cluster, StandardCard
from metering.models import (
    CNY_UNIT,
    STANDARD_CLASS,
    AccountKind,
    BuyerExhaustion,
    LedgerAccount,
    Pack,
    PriceCard,
    RatedSegment,
    TransferKind,
    UsagePending,
    card_hour_unit,
)
from metering.selectors.tariffs import compiled_tariff
from metering.services import ledger
from metering.services.usage import epoch_seconds as _epoch  # one definition of the epoch
from metering.tariffs import CompiledTariff

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECONDS_E4 = 3600 * 10**4  # card-seconds × multiplier (10⁻⁴) → card-hours
_FOREVER = 2**62
_COMMISSION = ("commission", 0, "")
_SPREAD = ("spread", 0, "")
_SEGMENT_COLUMNS = (
    "usage_record_id",
    "buyer_id",
    "operator_id",
    "seq",
    "start_at",
    "end_at",
    "record_start_at",
    "band",
    "multiplier",
    "card_seconds",
    "pack_id",
    "pack_class",
    "standard_factor",
    "pack_draw",
    "gross",
    "commission",
    "buyer_value",
    "transfer_id",
)


def _at(seconds: int) -> datetime:
    return _EPOCH + timedelta(seconds=seconds)


@dataclass(slots=True)
class _PackState:
    pack_id: int
    account_id: int
    class_key: str
    balance: int
    quantity: int
    price: int
    starts: int
    expires: int
    value_drawn: int  # round(drawn so far × price / quantity): the value of the pack used up so far
    drawn: int = 0
    dust: bool = False  # what is left cannot pay for a single card-second any more


@dataclass(frozen=True)
class _StandardCards:
    """Standard-card versions, for the factor in force when a slice starts."""

    starts: list[int]
    tflops: list[Decimal]
    cache: dict[tuple[Decimal, int], int] = field(default_factory=dict)

    @classmethod
    def load(cls) -> _StandardCards:
        rows = sorted(StandardCard.objects.values_list("effective_from", "dense_fp16_tflops"))
        return cls(starts=[_epoch(at) for at, _ in rows], tflops=[tflops for _, tflops in rows])

    def factor_e4(self, chip_tflops: Decimal | None, at: int) -> int | None:
        if chip_tflops is None or not self.starts:
            return None
        index = max(bisect.bisect_right(self.starts, at) - 1, 0)
        return self._factor(chip_tflops, index)

    def factor_span(self, chip_tflops: Decimal | None, at: int) -> tuple[int | None, int, int]:
        """The factor in force at ``at`` and the span ``[from, until)`` it is in force for (open ends as
        far past / future), so rating asks once per cluster and version, not once per slice."""
        if chip_tflops is None or not self.starts:
            return None, -_FOREVER, _FOREVER
        position = bisect.bisect_right(self.starts, at)
        since = self.starts[position - 1] if position > 1 else -_FOREVER
        until = self.starts[position] if position < len(self.starts) else _FOREVER
        return self._factor(chip_tflops, max(position - 1, 0)), since, until

    def _factor(self, chip_tflops: Decimal, index: int) -> int:
        key = (chip_tflops, index)
        factor = self.cache.get(key)
        if factor is None:
            factor = self.cache[key] = int(
                (chip_tflops / self.tflops[index]).quantize(Decimal("0.0001")) * 10**4
            )
        return factor


# A hook for the crash-recovery test: called once per record priced; raising aborts the batch.
_before_record: Callable[[int], None] | None = None

RatedDrawsListener = Callable[..., None]
_rated_draws_listeners: list[RatedDrawsListener] = []


def rated_draws_listener_register(listener: RatedDrawsListener) -> None:
    """Register ``listener(posted=, starts=)`` (once; the broker does, when it loads), called inside each
    batch's transaction with what each rated record drew: ``{usage record id: micro chip card-hours × band
    multiplier}``, whichever pack or arrears paid it, converted once per record, and the earliest and
    latest start of those records (so a lookup reads only their months' partitions). The broker shrinks its
    leases' pending draws with it (broker.services.draw_holds); metering never imports the broker."""
    if listener not in _rated_draws_listeners:
        _rated_draws_listeners.append(listener)


@dataclass(frozen=True)
class Shard:
    """One of ``of`` disjoint parts of the pending queue: the records of the buyers whose id is ``index``
    modulo ``of``.

    Two workers rating the same buyers in parallel would queue on the buyers' pack locks for the whole of
    each other's batch, so a second worker would add nothing; split by buyer, they lock disjoint packs
    and meet only on the few shared ledger accounts (commission, spread, issuance, operators' earnings),
    which ``ledger.transfer_post`` locks late in the batch, after its records are priced. A buyer's
    records therefore stay in one worker's hands, rated in id order as one worker rates them.

    Measured on 2 cores (benchmarks.metering --rating-workers 2), two parts were no faster than one and
    cost more CPU per record: the shared accounts stay locked from the transfer to the commit, across the
    segments' COPY, and each part's claim skips the other's rows. So ``CARDHOUR_RATING_SHARDS`` is 1 by
    default; parts are for workers with cores to spare."""

    index: int
    of: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.of:
            raise ValueError(f"shard {self.index} of {self.of}")


@dataclass(frozen=True)
class RatingRun:
    """What one run of :func:`usage_rate_run` did: records rated, and whether it stopped for its time budget
    with records possibly still pending (its last batch was full)."""

    rated: int
    more: bool


def usage_rate_pending(
    *,
    batch_size: int | None = None,
    max_batches: int | None = None,
    buyer: Organisation | None = None,
    now: datetime | None = None,
    rated_buyers: set[int] | None = None,
    shard: Shard | None = None,
) -> int:
    """Rate unrated usage records batch by batch until none is left (or ``max_batches``); return how many
    were rated. Safe to run concurrently and to re-run after a crash. ``buyer`` limits it to one account
    (the admin's "re-run rating"), ``shard`` to one part of the buyers (metering.tasks fans the minute's
    rating out over ``CARDHOUR_RATING_SHARDS`` parts so the worker's processes rate in parallel).
    ``rated_buyers``, when given, receives the ids of the buyers whose records were rated (enforcement on
    arrival evaluates their budgets, not every buyer's)."""
    return usage_rate_run(
        batch_size=batch_size,
        max_batches=max_batches,
        buyer=buyer,
        now=now,
        rated_buyers=rated_buyers,
        shard=shard,
        seconds=None,
    ).rated


def usage_rate_run(
    *,
    seconds: float | None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    buyer: Organisation | None = None,
    now: datetime | None = None,
    rated_buyers: set[int] | None = None,
    shard: Shard | None = None,
) -> RatingRun:
    """:func:`usage_rate_pending` within a time budget: no new batch is claimed once ``seconds`` have
    passed (None: no budget), so a Celery run ends well inside its time limit however large the backlog —
    a run killed at its soft limit would roll back the batch in hand and leave the worker slot taken for
    minutes. The batch in hand always finishes. ``more`` says the run stopped for its budget after a full
    batch, so its caller queues the next run instead of waiting for the minute's beat."""
    size = batch_size or settings.CARDHOUR_RATING_BATCH_SIZE
    started = time.monotonic()
    rated = batches = 0
    while max_batches is None or batches < max_batches:
        count = _rate_batch(
            batch_size=size,
            buyer_id=buyer.pk if buyer else None,
            now=now,
            rated_buyers=rated_buyers,
            shard=shard,
        )
        batches += 1
        rated += count
        if count < size:
            return RatingRun(rated=rated, more=False)
        if seconds is not None and time.monotonic() - started >= seconds:
            return RatingRun(rated=rated, more=True)
    return RatingRun(rated=rated, more=False)


@transaction.atomic
def _rate_batch(
    *,
    batch_size: int,
    buyer_id: int | None,
    now: datetime | None,
    rated_buyers: set[int] | None = None,
    shard: Shard | None = None,
) -> int:
    if connection.vendor == "postgresql":
        # Rating is recomputable from the usage records, which are durable before they are rated: if the
        # server crashes within the next ~0.6 s, this whole transaction is lost (never half of it) and
        # the records are simply rated again. So the commit need not wait for the WAL flush.
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
    records = _claim(batch_size=batch_size, buyer_id=buyer_id, shard=shard)
    if not records:
        return 0
    now = now or timezone.now()

    price_cards = {
        pk: (scaled_int(rate, 6), tariff_version_id)
        for pk, rate, tariff_version_id in PriceCard.objects.filter(
            pk__in={r[7] for r in records}
        ).values_list("id", "rate_per_card_hour", "tariff_version_id")
    }
    chips = {
        pk: (slug, tflops)
        for pk, slug, tflops in Cluster.objects.filter(pk__in={r[2] for r in records}).values_list(
            "id", "accelerator__slug", "accelerator__dense_fp16_tflops"
        )
    }
    standard = _StandardCards.load()
    commission_e6 = to_micros(settings.CARDHOUR_PLATFORM_COMMISSION)
    buyer_ids = {r[3] for r in records}
    packs = _lock_packs(buyer_ids=buyer_ids)
    if rated_buyers is not None:
        rated_buyers.update(buyer_ids)

    rows: list[tuple] = []
    # Per-account sums, keyed by ("kind", owner, class) until the accounts are resolved below; the
    # per-segment ones (buyer money, operator earnings, commission, spread) in int-keyed dicts and locals
    # first, merged after the loop (a tuple key hashed four times per segment showed in the profile).
    sums: dict[tuple, int] = defaultdict(int)
    money: dict[int, int] = defaultdict(int)
    earnings: dict[int, int] = defaultdict(int)
    commission_sum = spread_sum = 0
    shortfalls: dict[tuple[int, str], tuple[int, int]] = {}
    hook = _before_record
    tariffs: dict[int, CompiledTariff] = {}
    factor_spans: dict[int, tuple[int | None, int, int]] = {}
    rdiv = round_div
    record_draws: dict[int, int] = {}
    # What a record's rating depends on besides its own figures, by (buyer, cluster, price card): a batch
    # holds a few hundred such triples for its thousands of records. The packs are the buyer's that can pay
    # for the cluster's chip (its chip class and standard cards), in drawing order.
    contexts: dict[tuple[int, int, int], tuple] = {}
    for record_id, operator_id, cluster_id, buyer_id_, cards, start_at, end_at, price_card_id in records:
        if hook is not None:
            hook(record_id)
        context = contexts.get((buyer_id_, cluster_id, price_card_id))
        if context is None:
            rate_e6, tariff_version_id = price_cards[price_card_id]
            tariff = tariffs.get(tariff_version_id)
            if tariff is None:
                tariff = tariffs[tariff_version_id] = compiled_tariff(tariff_version_id=tariff_version_id)
            chip_slug, chip_tflops = chips[cluster_id]
            context = contexts[(buyer_id_, cluster_id, price_card_id)] = (
                rate_e6,
                tariff,
                tariff.multipliers_e4,
                tariff.bands,
                chip_slug,
                chip_tflops,
                [p for p in packs.get(buyer_id_, ()) if p.class_key in (chip_slug, STANDARD_CLASS)],
            )
        rate_e6, tariff, multipliers_e4, bands, chip_slug, chip_tflops, buyer_packs = context
        factor_span = factor_spans.get(cluster_id)
        if factor_span is None or not factor_span[1] <= start_at < factor_span[2]:
            factor_span = factor_spans[cluster_id] = standard.factor_span(chip_tflops, start_at)
        record_factor_e4, _since, factor_until = factor_span
        seq = 0
        record_e4 = 0
        for slice_start, slice_end, band_index in tariff.slices(start_at, end_at):
            m_e4 = multipliers_e4[band_index]
            record_e4 += cards * (slice_end - slice_start) * m_e4
            band = bands[band_index]
            left = cards * (slice_end - slice_start)
            factor_e4: int | None = None
            for pack in buyer_packs:
                if left == 0:
                    break
                if pack.balance <= 0 or not (pack.starts <= slice_start < pack.expires):
                    continue
                if pack.class_key == STANDARD_CLASS:
                    if factor_e4 is None:
                        factor_e4 = (
                            record_factor_e4
                            if slice_start < factor_until
                            else standard.factor_e4(chip_tflops, slice_start)
                        )
                    if not factor_e4:
                        continue
                    per_second_num, per_second_den = m_e4 * factor_e4 * MICROS, _SECONDS_E4 * 10**4
                else:  # the chip's own class (the context's packs are of these two classes only)
                    per_second_num, per_second_den = m_e4 * MICROS, _SECONDS_E4
                balance = pack.balance
                draw = rdiv(left * per_second_num, per_second_den)
                covered = left
                if draw > balance:
                    # The pack runs out inside this slice: it pays for the card-seconds it fully covers.
                    covered = balance * per_second_den // per_second_num
                    if covered == 0:
                        pack.dust = True
                        continue
                    draw = rdiv(covered * per_second_num, per_second_den)
                # packs.pack_value_of_draw, inlined (a keyword call per segment showed in the profile):
                # the value of the pack drawn so far after this draw, less before it, each rounded once
                # (the one before is the pack's value_drawn, kept as it is drawn).
                quantity = pack.quantity
                value_after = rdiv((quantity - balance + draw) * pack.price, quantity)
                value = value_after - pack.value_drawn
                pack.value_drawn = value_after
                pack.balance = balance = balance - draw
                if balance * per_second_den // per_second_num == 0:
                    # What is left cannot pay for one more card-second at this rate: the pack is spent
                    # (so the buyer is flagged now, not when a later record finds it empty).
                    pack.dust = True
                pack.drawn += draw
                gross = rdiv(rate_e6 * covered * m_e4, _SECONDS_E4)
                commission = rdiv(gross * commission_e6, MICROS)
                rows.append(
                    (
                        record_id,
                        buyer_id_,
                        operator_id,
                        seq,
                        slice_start,
                        slice_end,
                        start_at,
                        band,
                        m_e4,
                        covered,
                        pack.pack_id,
                        pack.class_key,
                        factor_e4 if pack.class_key == STANDARD_CLASS else None,
                        draw,
                        gross,
                        commission,
                        value,
                    )
                )
                seq += 1
                money[buyer_id_] += value
                earnings[operator_id] += gross - commission
                commission_sum += commission
                spread_sum += value - gross
                left -= covered
            if left:
                draw = rdiv(left * m_e4 * MICROS, _SECONDS_E4)
                gross = rdiv(rate_e6 * left * m_e4, _SECONDS_E4)
                commission = rdiv(gross * commission_e6, MICROS)
                rows.append(
                    (
                        record_id,
                        buyer_id_,
                        operator_id,
                        seq,
                        slice_start,
                        slice_end,
                        start_at,
                        band,
                        m_e4,
                        left,
                        None,
                        chip_slug,
                        None,
                        draw,
                        gross,
                        commission,
                        gross,
                    )
                )
                seq += 1
                sums[("arrears", buyer_id_, chip_slug)] -= draw
                sums[("issuance", 0, chip_slug)] += draw
                money[buyer_id_] += gross
                earnings[operator_id] += gross - commission
                commission_sum += commission
                previous = shortfalls.get((buyer_id_, chip_slug), (record_id, 0))
                shortfalls[(buyer_id_, chip_slug)] = (previous[0], previous[1] + draw)
        record_draws[record_id] = rdiv(record_e4 * MICROS, _SECONDS_E4)

    for owner, amount in money.items():
        sums[("buyer_money", owner, "")] += amount
    for owner, amount in earnings.items():
        sums[("operator", owner, "")] -= amount
    sums[_COMMISSION] -= commission_sum
    sums[_SPREAD] -= spread_sum
    for buyer_packs in packs.values():
        for pack in buyer_packs:
            if pack.drawn:
                sums[("pack", pack.account_id, "")] -= pack.drawn
                sums[("issuance", 0, pack.class_key)] += pack.drawn

    first_id = records[0][0]
    transfer, _ = ledger.transfer_post_by_id(
        kind=TransferKind.USAGE,
        idempotency_key=f"usage:{first_id}",
        description=f"Rating of {len(records)} usage records from {first_id}",
        posted_by="rating",
        postings=_resolve_accounts(sums),
        posted_at=now,
    )
    _insert_segments(rows, transfer_id=transfer.pk)
    if _rated_draws_listeners:
        # A second either side: the claim's epoch seconds are rounded from the stored instants.
        starts = (_at(min(r[5] for r in records) - 1), _at(max(r[5] for r in records) + 1))
        for listener in _rated_draws_listeners:
            listener(posted=record_draws, starts=starts)

    emptied = [p.pack_id for ps in packs.values() for p in ps if p.drawn and p.balance == 0]
    if emptied:
        Pack.objects.filter(pk__in=emptied, status=Pack.Status.ACTIVE).update(
            status=Pack.Status.EXHAUSTED, closed_at=now
        )
    _flag_exhaustion(packs=packs, records=records, chips=chips, shortfalls=shortfalls, now=now)
    return len(records)


def _claim(*, batch_size: int, buyer_id: int | None, shard: Shard | None = None) -> list[tuple]:
    """Take the oldest pending records off the queue (of one buyer, of one shard's buyers), skipping those
    another worker holds; times as epoch seconds, in record id order. The rows are deleted by this
    transaction: if it rolls back they are pending again.

    On PostgreSQL the locked rows are deleted by their tuple ids (a TID scan, not a second descent of the
    primary key per record; a locked row cannot move), and the times come back as ``date_part`` doubles
    (exact for whole seconds, which is all a usage record holds) rather than ``extract``'s numerics."""
    shard_of, shard_index = (shard.of, shard.index) if shard else (None, None)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                """
                DELETE FROM metering_usagepending
                 WHERE ctid = ANY(ARRAY(
                        SELECT ctid FROM metering_usagepending
                         WHERE (%s::bigint IS NULL OR buyer_id = %s::bigint)
                           AND (%s::bigint IS NULL OR buyer_id %% %s::bigint = %s::bigint)
                         ORDER BY usage_record_id
                         LIMIT %s
                           FOR UPDATE SKIP LOCKED))
                RETURNING usage_record_id, operator_id, cluster_id, buyer_id, cards,
                          date_part('epoch', start_at)::bigint, date_part('epoch', end_at)::bigint,
                          price_card_id
                """,
                [buyer_id, buyer_id, shard_of, shard_of, shard_index, batch_size],
            )
            return sorted(cursor.fetchall())
    claim = UsagePending.objects.select_for_update(skip_locked=True)
    if buyer_id is not None:
        claim = claim.filter(buyer_id=buyer_id)
    if shard is not None:
        claim = claim.alias(shard=Mod("buyer_id", shard.of)).filter(shard=shard.index)
    rows = list(
        claim.order_by("usage_record_id").values_list(
            "usage_record_id",
            "operator_id",
            "cluster_id",
            "buyer_id",
            "cards",
            "start_at",
            "end_at",
            "price_card_id",
        )[:batch_size]
    )
    ids = [row[0] for row in rows]
    for offset in range(0, len(ids), 500):
        UsagePending.objects.filter(pk__in=ids[offset : offset + 500]).delete()
    return [(*row[:5], _epoch(row[5]), _epoch(row[6]), row[7]) for row in rows]


def _lock_packs(*, buyer_ids: set[int]) -> dict[int, list[_PackState]]:
    """The buyers' packs with a balance, locked (account rows, in id order), expiring first first."""
    packs: dict[int, list[_PackState]] = defaultdict(list)
    for (
        account_id,
        balance,
        pack_id,
        buyer_id,
        slug,
        card_hours,
        price,
        starts_at,
        expires_at,
    ) in _packs_locked(buyer_ids):
        packs[buyer_id].append(
            _PackState(
                pack_id=pack_id,
                account_id=account_id,
                class_key=slug or STANDARD_CLASS,
                balance=balance,
                quantity=card_hours * MICROS,
                price=to_micros(price),
                value_drawn=round_div(
                    (card_hours * MICROS - balance) * to_micros(price), card_hours * MICROS
                ),
                starts=_epoch(starts_at),
                expires=_epoch(expires_at),
            )
        )
    for buyer_packs in packs.values():
        buyer_packs.sort(key=lambda p: (p.expires, p.pack_id))
    return packs


def _packs_locked(buyer_ids: set[int]) -> list[tuple]:
    """(account, balance, pack, buyer, chip slug or None, card-hours, price, starts, expires) of the buyers'
    pack accounts with a balance, the accounts locked in id order. On PostgreSQL one statement (the lock
    and the read together, the buyers as one array parameter); elsewhere the lock, then the read."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT a.id, a.balance, a.pack_id, p.buyer_id, c.slug, p.card_hours, p.price, p.starts_at,
                       p.expires_at
                  FROM metering_ledgeraccount a
                  JOIN metering_pack p ON p.id = a.pack_id
                  LEFT JOIN federation_accelerator c ON c.id = p.accelerator_id
                 WHERE a.kind = %s AND a.organisation_id = ANY(%s::bigint[]) AND a.balance > 0
                 ORDER BY a.id
                   FOR UPDATE OF a
                """,
                [AccountKind.PACK.value, sorted(buyer_ids)],
            )
            return cursor.fetchall()
    locked = list(
        LedgerAccount.objects.select_for_update()
        .filter(kind=AccountKind.PACK, organisation_id__in=buyer_ids, balance__gt=0)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    accounts = LedgerAccount.objects.filter(pk__in=locked).values_list(
        "pk",
        "balance",
        "pack_id",
        "pack__buyer_id",
        "pack__accelerator__slug",
        "pack__card_hours",
        "pack__price",
        "pack__starts_at",
        "pack__expires_at",
    )
    return list(accounts)


def _resolve_accounts(sums: dict[tuple, int]) -> list[tuple[int, int]]:
    """Turn the batch's per-account sums into (account id, amount) postings, with one query for the named
    accounts (the same keys as metering.services.ledger's helpers); the packs' are keyed by account id."""
    specs: dict[str, dict[str, object]] = {}
    fields: dict[str, object]
    keyed: list[tuple[str, int]] = []
    pack_moves: list[tuple[int, int]] = []
    for (kind, owner, class_key), amount in sums.items():
        if amount == 0:
            continue
        if kind == "pack":
            pack_moves.append((owner, amount))
            continue
        if kind == "buyer_money":
            key, fields = f"buyer_money:{owner}", {"kind": AccountKind.BUYER_MONEY, "unit": CNY_UNIT}
        elif kind == "operator":
            key, fields = (
                f"operator_earnings:{owner}",
                {"kind": AccountKind.OPERATOR_EARNINGS, "unit": CNY_UNIT},
            )
        elif kind == "arrears":
            key = f"arrears:{owner}:{class_key}"
            fields = {"kind": AccountKind.ARREARS, "unit": card_hour_unit(class_key)}
        elif kind == "issuance":
            key = f"issuance:{class_key}"
            fields = {"kind": AccountKind.CARD_HOUR_ISSUANCE, "unit": card_hour_unit(class_key)}
        elif kind == "commission":
            key, fields = "platform_commission", {"kind": AccountKind.PLATFORM_COMMISSION, "unit": CNY_UNIT}
        else:
            key, fields = "platform_spread", {"kind": AccountKind.PLATFORM_SPREAD, "unit": CNY_UNIT}
        if kind in {"buyer_money", "operator", "arrears"}:
            fields["organisation_id"] = owner
        specs[key] = fields
        keyed.append((key, amount))
    accounts = ledger.account_ids_get_or_create(specs)
    # A pack's account id is its key here already (from _lock_packs): no read.
    return [(accounts[key], amount) for key, amount in keyed] + pack_moves


def _insert_segments(rows: list[tuple], *, transfer_id: int) -> None:
    """Write the batch's segments: one COPY on PostgreSQL (timestamps sent as text, formatted once per
    distinct instant: neighbouring records share band edges), bulk_create elsewhere. A row carries its
    multiplier and standard-card factor as integers of 10⁻⁴ (exact, and cheaper to carry and format than
    Decimals)."""
    if connection.vendor == "postgresql":
        columns = ", ".join(_SEGMENT_COLUMNS)
        with (
            connection.wrap_database_errors,  # COPY's errors as Django's (IntegrityError, OperationalError)
            connection.cursor() as cursor,
            cursor.copy(f"COPY metering_ratedsegment ({columns}) FROM STDIN") as copy,
        ):
            instants: dict[int, str] = {}
            for offset in range(0, len(rows), 5000):
                copy.write(
                    _copy_text(rows[offset : offset + 5000], transfer_id=transfer_id, instants=instants)
                )
        return
    RatedSegment.objects.bulk_create(
        [
            RatedSegment(
                **dict(
                    zip(
                        _SEGMENT_COLUMNS,
                        [
                            *row[:4],
                            _at(row[4]),
                            _at(row[5]),
                            _at(row[6]),
                            row[7],
                            _e4(row[8]),
                            *row[9:12],
                            None if row[12] is None else _e4(row[12]),
                            *row[13:],
                            transfer_id,
                        ],
                        strict=True,
                    )
                )
            )
            for row in rows
        ],
        batch_size=1000,
    )


def _e4(value: int) -> Decimal:
    """An integer of 10⁻⁴ as the exact Decimal (17000 → 1.7000)."""
    return Decimal(value).scaleb(-4)


def _copy_text(rows: list[tuple], *, transfer_id: int, instants: dict[int, str]) -> str:
    """Segment rows in COPY's text format, formatted here rather than value by value by the driver (the
    costliest part of writing them): integers as digits, NULL as ``\\N``, each timestamp formatted once
    per distinct instant (kept in ``instants`` across the batch's chunks: a record's end is often the next
    record's start) from a per-day date text and two small tables (strftime per instant cost more than
    the rest of the row). The text values are band codes and pack class keys (slugs), escaped all the
    same; multipliers and factors (integers of 10⁻⁴) formatted once per distinct value."""
    texts: dict[str, str] = {}
    lines: list[str] = []
    append = lines.append
    for (
        record_id,
        buyer_id,
        operator_id,
        seq,
        start,
        end,
        record_start,
        band,
        multiplier_e4,
        card_seconds,
        pack_id,
        pack_class,
        factor_e4,
        draw,
        gross,
        commission,
        value,
    ) in rows:
        start_text = instants.get(start)
        if start_text is None:
            start_text = instants[start] = _iso(start)
        end_text = instants.get(end)
        if end_text is None:
            end_text = instants[end] = _iso(end)
        record_start_text = start_text if record_start == start else instants.get(record_start)
        if record_start_text is None:
            record_start_text = instants[record_start] = _iso(record_start)
        band_text = texts.get(band)
        if band_text is None:
            band_text = texts[band] = _copy_escape(band)
        class_text = texts.get(pack_class)
        if class_text is None:
            class_text = texts[pack_class] = _copy_escape(pack_class)
        multiplier_text = _E4_TEXTS.get(multiplier_e4)
        if multiplier_text is None:
            multiplier_text = _E4_TEXTS[multiplier_e4] = str(_e4(multiplier_e4))
        factor_text: str | None = _NULL if factor_e4 is None else _E4_TEXTS.get(factor_e4)
        if factor_text is None:
            factor_text = _E4_TEXTS[factor_e4] = str(_e4(factor_e4))
        append(
            f"{record_id}\t{buyer_id}\t{operator_id}\t{seq}\t{start_text}\t{end_text}\t{record_start_text}\t"
            f"{band_text}\t{multiplier_text}\t{card_seconds}\t{_NULL if pack_id is None else pack_id}\t"
            f"{class_text}\t{factor_text}\t{draw}\t{gross}\t{commission}\t{value}\t{transfer_id}\n"
        )
    return "".join(lines)


_NULL = "\\N"
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_E4_TEXTS: dict[int, str] = {}  # multipliers and factors as COPY text, by integer of 10⁻⁴ (a few dozen)


def _copy_escape(text: str) -> str:
    return text.translate(_COPY_ESCAPES)


def _iso(seconds: int) -> str:
    """UTC epoch seconds as the text PostgreSQL's COPY reads into a timestamptz: the date from a small
    cache of day texts, the time of day from two tables."""
    day, second = divmod(seconds, 86_400)
    date_text = _DAY_TEXTS.get(day)
    if date_text is None:
        if len(_DAY_TEXTS) > 100_000:
            _DAY_TEXTS.clear()
        date_text = _DAY_TEXTS[day] = (_EPOCH + timedelta(days=day)).strftime("%Y-%m-%d ")
    minute, second = divmod(second, 60)
    return f"{date_text}{_MINUTES[minute]}{_SECONDS[second]}+00"


_DAY_TEXTS: dict[int, str] = {}
_MINUTES = tuple(f"{m // 60:02d}:{m % 60:02d}:" for m in range(1440))
_SECONDS = tuple(f"{s:02d}" for s in range(60))


def _flag_exhaustion(
    *,
    packs: dict[int, list[_PackState]],
    records: list[tuple],
    chips: dict[int, tuple[str, Decimal | None]],
    shortfalls: dict[tuple[int, str], tuple[int, int]],
    now: datetime,
) -> None:
    """Raise a flag for every (buyer, chip class) whose usable packs are now empty — at once, whether or not
    this batch already ran into arrears — so the broker stops the buyer's leases."""
    # The first record of each (buyer, cluster) — records are in id order, so in a reversed pass the last
    # write wins — then of each (buyer, chip class), in record order as before.
    first_of = {(r[3], r[2]): r[0] for r in reversed(records)}
    used: dict[tuple[int, str], int] = {}
    for (buyer_id, cluster_id), record_id in sorted(first_of.items(), key=lambda item: item[1]):
        used.setdefault((buyer_id, chips[cluster_id][0]), record_id)
    now_s = _epoch(now)
    # A standard-card pack cannot pay for a chip with no dense FP16 figure (no standard-card factor): it
    # must not count as something left, or a buyer holding only such a pack would run into arrears unflagged.
    factorless = {slug for slug, tflops in chips.values() if tflops is None}
    dry: dict[tuple[int, str], tuple[int, int]] = {}
    for (buyer_id, chip_slug), first_record in used.items():
        usable = (chip_slug,) if chip_slug in factorless else (chip_slug, STANDARD_CLASS)
        left = any(
            p.balance > 0 and not p.dust and p.expires > now_s and p.class_key in usable
            for p in packs.get(buyer_id, ())
        )
        if not left:
            dry[(buyer_id, chip_slug)] = shortfalls.get((buyer_id, chip_slug), (first_record, 0))
    if not dry:
        return
    # One query for the open flags of every dry (buyer, class) of the batch, not one per pair.
    open_flags = {
        (flag.buyer_id, flag.pack_class): flag
        for flag in BuyerExhaustion.objects.select_for_update()
        .filter(buyer_id__in={buyer_id for buyer_id, _ in dry}, cleared_at__isnull=True)
        .order_by("pk")
    }
    raised = []
    grown = []
    for (buyer_id, chip_slug), (record_id, shortfall) in dry.items():
        open_flag = open_flags.get((buyer_id, chip_slug))
        if open_flag is None:
            raised.append(
                BuyerExhaustion(
                    buyer_id=buyer_id,
                    pack_class=chip_slug,
                    raised_at=now,
                    usage_record_id=record_id,
                    shortfall=shortfall,
                )
            )
        elif shortfall:
            open_flag.shortfall += shortfall
            grown.append(open_flag)
    BuyerExhaustion.objects.bulk_create(raised)
    BuyerExhaustion.objects.bulk_update(grown, ["shortfall"])
