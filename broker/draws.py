"""Which of a buyer's packs would pay a draw, in the unit of each pack, and what the buyer would pay.

A quote or lease knows its *expected draw*: the chip's card-hours × band multiplier. What leaves the
buyer's packs is that amount in the unit of the pack that pays it: the chip's card-hours for a pack of that
chip, standard card-hours (× the chip's standard-card factor) for a standard pack. Rating draws the usable
packs earliest expiry first (metering.services.rating), so a plan follows the same order: the buyer's live
leases' *pending draws* are drawn first, then the draw asked about. What no pack covers is arrears, billed
at the operator's rate (its list price).

**Pending draws: expected less posted.** A live lease (reserved, running or stopping) holds its expected
draw less what rating has posted for its usage so far, never below zero (broker.services.draw_holds keeps
it as a DrawHold and the buyer's sum per chip as DrawPending, in the transactions that accept, rate and end
leases), so a quote reads one row per chip, not one per live lease. The sum is drawn from the packs valid at
``at``, chip by chip in chip order, each rating's way (earliest expiry first). That is the closest honest
rule a kept sum allows, and where it differs from setting each lease aside at its own start: a sum has no
start, so a reserved lease's draw is set aside from the packs valid now (one expiring before the lease
starts included), and when two chips compete for the same standard packs the chip first in order takes the
packs expiring first. The totals per class are the same; only which of two packs of a class a lease is set
against can differ, which changes a later draw's plan only when a pack expires between now and its start.

The plan is made before usage arrives — the ledger decides at rating time — by the rule rating applies,
so a page never shows a draw in a unit no pack of the buyer is drawn in. It is also the one affordability
rule: a quote is "covered" and its acceptance is allowed exactly when its plan leaves nothing uncovered
(broker.services.quotes, broker.services.leases), and a refusal names the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext as _

from broker.models import DrawHold, Lease, LeaseState
from broker.selectors import draw_pending_for, pack_balances_and_pending
from core.models import Organisation
from core.money import FEN, from_micros, to_micros
from federation.selectors import accelerator_list, standard_card_current, standard_card_factor
from metering.models import STANDARD_CLASS
from metering.selectors.payments import pack_balances_usable
from metering.selectors.usage_dashboard import ReservedDraw

_MICRO = Decimal("0.000001")
# A draw is shown to two places (exact figures stay in CSVs and the API's ``extra``).
DISPLAY = Decimal("0.01")


def draw_display(amount: Decimal) -> Decimal:
    """A card-hour figure for a sentence: two places, half-even."""
    return amount.quantize(DISPLAY, rounding=ROUND_HALF_EVEN)


def unit_label(class_key: str) -> str:
    """The unit of a pack class, as a page names it: "standard card-hours" or "<chip> card-hours"."""
    if class_key == STANDARD_CLASS:
        return _("standard card-hours")
    return _("%(chip)s card-hours") % {"chip": class_key}


@dataclass(frozen=True)
class DrawPart:
    """One pack class paying part of a draw: ``amount`` in the class's unit, covering ``chip_card_hours``
    of the chip (card-hours × band multiplier), at ``price_per_card_hour`` of that unit (the paying
    packs' price ÷ card-hours, weighted by what each pays)."""

    class_key: str
    amount: Decimal
    chip_card_hours: Decimal
    factor: Decimal | None
    price_per_card_hour: Decimal

    @property
    def unit(self) -> str:
        return unit_label(self.class_key)

    @property
    def display(self) -> Decimal:
        return draw_display(self.amount)

    @property
    def value(self) -> Decimal:
        """The prepaid value of this part, CNY to the fen."""
        return (self.amount * self.price_per_card_hour).quantize(FEN, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True)
class DrawPlan:
    """How a draw of ``draw`` chip card-hours (× band multiplier) of ``chip`` would be paid."""

    chip: str
    factor: Decimal | None
    draw: Decimal
    parts: tuple[DrawPart, ...]
    uncovered: Decimal  # chip card-hours × multiplier no pack covers: arrears
    rate_per_card_hour: Decimal  # the operator's rate, what arrears cost

    @property
    def covered(self) -> bool:
        return self.uncovered == 0

    @property
    def class_key(self) -> str:
        """The unit the draw is named in: the first paying class, else (no pack pays) the chip's own."""
        return self.parts[0].class_key if self.parts else self.chip

    def describe(self) -> str:
        """The draw in words, each part in the unit of the pack class that pays it, to two places:
        "1.18 standard card-hours (6.08 nvidia-a800 card-hours × factor 0.195)"."""
        words = []
        for part in self.parts:
            text = f"{part.display} {part.unit}"
            if part.factor is not None:
                text += " " + _("(%(hours)s %(chip)s card-hours × factor %(factor)s)") % {
                    "hours": draw_display(part.chip_card_hours),
                    "chip": self.chip,
                    "factor": part.factor.normalize(),
                }
            words.append(text)
        if self.uncovered:
            words.append(
                _("%(hours)s %(chip)s card-hours with no pack, at the operator's rate")
                % {"hours": draw_display(self.uncovered), "chip": self.chip}
            )
        return " + ".join(words) if words else f"0.00 {unit_label(self.chip)}"

    def total_in_unit(self) -> tuple[str, Decimal]:
        """The whole draw in the unit of the first paying pack class (the chip's, when no pack pays):
        ``(class key, amount)``, exact to the micro-card-hour."""
        key = self.class_key
        if key == STANDARD_CLASS and self.factor:
            return key, (self.draw * self.factor).quantize(_MICRO, rounding=ROUND_HALF_EVEN)
        return key, self.draw

    def shortfall_text(self) -> str:
        """A refusal's words: the whole draw in the paying unit, to two places, and what the packs can
        pay of it. "177.84 standard card-hours (228.00 huawei-ascend-910b3 card-hours × factor 0.78);
        your packs have 100.00 of it free"."""
        key, total = self.total_in_unit()
        text = f"{draw_display(total)} {unit_label(key)}"
        if key == STANDARD_CLASS and self.factor:
            text += " " + _("(%(hours)s %(chip)s card-hours × factor %(factor)s)") % {
                "hours": draw_display(self.draw),
                "chip": self.chip,
                "factor": self.factor.normalize(),
            }
        if self.parts:
            free = sum((part.amount for part in self.parts if part.class_key == key), Decimal(0))
            text += "; " + _("your packs have %(free)s of it free") % {"free": draw_display(free)}
        else:
            text += "; " + _("none of your packs can pay it")
        return text

    @property
    def arrears_value(self) -> Decimal:
        return (self.uncovered * self.rate_per_card_hour).quantize(FEN, rounding=ROUND_HALF_EVEN)

    @property
    def value(self) -> Decimal:
        """What the buyer would pay: the prepaid value of the parts plus arrears at the operator's rate."""
        return sum((part.value for part in self.parts), Decimal("0.00")) + self.arrears_value

    @property
    def effective_price_per_card_hour(self) -> Decimal:
        """The buyer's price per chip card-hour (× band multiplier), to the fen: ``value`` ÷ ``draw``."""
        if not self.draw:
            return self.first_price
        return (self.value / self.draw).quantize(FEN, rounding=ROUND_HALF_EVEN)

    @property
    def first_price(self) -> Decimal:
        """The price per chip card-hour of the first paying pack (× factor for a standard one)."""
        if not self.parts:
            return self.rate_per_card_hour
        part = self.parts[0]
        per_chip_hour = part.price_per_card_hour * (part.factor if part.factor else Decimal(1))
        return per_chip_hour.quantize(FEN, rounding=ROUND_HALF_EVEN)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DrawPlan:
        """The plan ``as_json`` stored (a quote keeps the plan it was made with)."""
        factor = data.get("standard_card_factor")
        return cls(
            chip=str(data["chip"]),
            factor=Decimal(factor) if factor is not None else None,
            draw=Decimal(data["expected_draw_chip_card_hours"]),
            parts=tuple(
                DrawPart(
                    class_key=str(part["pack_class"]),
                    amount=Decimal(part["card_hours"]),
                    chip_card_hours=Decimal(part["chip_card_hours"]),
                    factor=Decimal(part["standard_card_factor"])
                    if part.get("standard_card_factor") is not None
                    else None,
                    price_per_card_hour=Decimal(part["price_per_card_hour"]),
                )
                for part in data.get("paid_by", [])
            ),
            uncovered=Decimal(data["uncovered_chip_card_hours"]),
            rate_per_card_hour=Decimal(data["operator_rate_per_card_hour"]),
        )

    def as_json(self) -> dict[str, Any]:
        """The plan with exact figures, for the API and an error's ``extra``."""
        return {
            "chip": self.chip,
            "expected_draw_chip_card_hours": str(self.draw),
            "standard_card_factor": str(self.factor) if self.factor is not None else None,
            "paid_by": [
                {
                    "pack_class": part.class_key,
                    "unit": "standard_card_hours" if part.class_key == STANDARD_CLASS else "chip_card_hours",
                    "card_hours": str(part.amount),
                    "chip_card_hours": str(part.chip_card_hours),
                    "standard_card_factor": str(part.factor) if part.factor is not None else None,
                    "price_per_card_hour": str(part.price_per_card_hour),
                    "value": str(part.value),
                }
                for part in self.parts
            ],
            "uncovered_chip_card_hours": str(self.uncovered),
            "arrears_value": str(self.arrears_value),
            "value": str(self.value),
            "effective_price_per_card_hour": str(self.effective_price_per_card_hour),
            "operator_rate_per_card_hour": str(self.rate_per_card_hour),
        }


@dataclass(frozen=True)
class EffectivePrice:
    """The buyer's price for one card-hour of a chip at band multiplier 1: the paying pack's price per
    card-hour of its unit, × the chip's standard-card factor from a standard pack."""

    class_key: str
    pack_price_per_card_hour: Decimal
    factor: Decimal | None
    price_per_card_hour: Decimal


@dataclass
class _Slot:
    pack_id: int
    class_key: str
    starts_at: datetime
    expires_at: datetime
    remaining: Decimal
    price_per_card_hour: Decimal


@dataclass
class BuyerPacks:
    """The buyer's usable packs with what is left of each (earliest expiry first) once its live leases'
    expected draws are set aside; ``plan`` asks how a further draw would be paid, without changing it."""

    slots: list[_Slot]
    factors: dict[str, Decimal | None] = field(default_factory=dict)

    def take(
        self, *, chip: str, factor: Decimal | None, draw: Decimal, at: datetime, commit: bool
    ) -> tuple[list[tuple[_Slot, Decimal, Decimal]], Decimal]:
        """Draw ``draw`` chip card-hours (× multiplier) from the usable slots, rating's way; return the
        pieces (slot, amount in the slot's unit, chip card-hours it covers) and what is left uncovered.
        Only with ``commit`` are the slots drawn down."""
        left = draw
        taken: list[tuple[_Slot, Decimal, Decimal]] = []
        for slot in self.slots:
            if left <= 0:
                break
            if slot.remaining <= 0 or not (slot.starts_at <= at < slot.expires_at):
                continue
            if slot.class_key == STANDARD_CLASS:
                if not factor:
                    continue
                per_chip = factor
            elif slot.class_key == chip:
                per_chip = Decimal(1)
            else:
                continue
            need = (left * per_chip).quantize(_MICRO, rounding=ROUND_HALF_EVEN)
            amount = min(need, slot.remaining)
            covers = (
                left if amount == need else (amount / per_chip).quantize(_MICRO, rounding=ROUND_HALF_EVEN)
            )
            taken.append((slot, amount, covers))
            if commit:
                slot.remaining -= amount
            left -= covers
        return taken, max(left, Decimal(0))

    def effective_price(self, *, chip: str, factor: Decimal | None, at: datetime) -> EffectivePrice | None:
        """What one card-hour of ``chip`` (× band multiplier) would cost the buyer from the pack rating
        would draw first at ``at``, or None when no pack of the buyer can pay it (arrears: the
        operator's rate)."""
        taken, _uncovered = self.take(chip=chip, factor=factor, draw=_MICRO, at=at, commit=False)
        if not taken:
            return None
        slot = taken[0][0]
        std = slot.class_key == STANDARD_CLASS
        per_chip_hour = slot.price_per_card_hour * (factor if std and factor else Decimal(1))
        return EffectivePrice(
            class_key=slot.class_key,
            pack_price_per_card_hour=slot.price_per_card_hour.quantize(FEN, rounding=ROUND_HALF_EVEN),
            factor=factor if std else None,
            price_per_card_hour=per_chip_hour.quantize(FEN, rounding=ROUND_HALF_EVEN),
        )

    def plan(
        self, *, chip: str, factor: Decimal | None, draw: Decimal, rate: Decimal, at: datetime
    ) -> DrawPlan:
        taken, uncovered = self.take(chip=chip, factor=factor, draw=draw, at=at, commit=False)
        by_class: dict[str, list[tuple[_Slot, Decimal, Decimal]]] = {}
        for slot, amount, covers in taken:
            by_class.setdefault(slot.class_key, []).append((slot, amount, covers))
        parts = []
        for class_key, pieces in by_class.items():
            amount = sum((a for _, a, _ in pieces), Decimal(0))
            value = sum((a * s.price_per_card_hour for s, a, _ in pieces), Decimal(0))
            parts.append(
                DrawPart(
                    class_key=class_key,
                    amount=amount,
                    chip_card_hours=sum((c for _, _, c in pieces), Decimal(0)),
                    factor=factor if class_key == STANDARD_CLASS else None,
                    price_per_card_hour=(value / amount).quantize(_MICRO, rounding=ROUND_HALF_EVEN)
                    if amount
                    else pieces[0][0].price_per_card_hour,
                )
            )
        return DrawPlan(
            chip=chip,
            factor=factor,
            draw=draw,
            parts=tuple(parts),
            uncovered=uncovered,
            rate_per_card_hour=rate,
        )


def chip_factors(slugs: Iterable[str]) -> dict[str, Decimal | None]:
    slugs = set(slugs)
    if not slugs:
        return {}
    standard = standard_card_current()
    return {
        accelerator.slug: standard_card_factor(tflops=accelerator.dense_fp16_tflops, standard=standard)
        for accelerator in accelerator_list().filter(slug__in=slugs)
    }


def _buyer_packs(*, buyer: Organisation, at: datetime) -> list[_Slot]:
    return _slots(pack_balances_usable(buyer_id=buyer.pk, at=at))


def _slots(rows: list[tuple[int, str, datetime, datetime, int, Decimal, int]]) -> list[_Slot]:
    return [
        _Slot(
            pack_id=pk,
            class_key=class_key,
            starts_at=starts_at,
            expires_at=expires_at,
            remaining=from_micros(left),
            price_per_card_hour=(price / card_hours).quantize(_MICRO, rounding=ROUND_HALF_EVEN),
        )
        for pk, class_key, starts_at, expires_at, left, price, card_hours in rows
        if left > 0
    ]


def buyer_packs_after_leases(
    *,
    buyer: Organisation,
    at: datetime | None = None,
    exclude_lease_ids: Sequence[int] = (),
    known_factors: Mapping[str, Decimal | None] | None = None,
) -> BuyerPacks:
    """The buyer's usable packs less its live leases' pending draws (each lease's expected draw less what
    rating has posted for it: broker.selectors.draw_pending_for, one row per draw class), drawn rating's
    way at ``at``: per class in class order, from the packs expiring first. One round trip on PostgreSQL
    without ``exclude_lease_ids`` (a quote's case: broker.selectors.pack_balances_and_pending), two with
    them; whatever the number of live leases. When a live lease's chip could draw a standard pack, its
    standard-card factor comes from ``known_factors`` (a quote passes its catalogue's, which its placements
    carry: broker.catalog.Catalogue.standard_card_factors), else from the database (two queries more, as
    for a chip ``known_factors`` lacks)."""
    at = at or timezone.now()
    if exclude_lease_ids:
        slots = _buyer_packs(buyer=buyer, at=at)
        pending = draw_pending_for(buyer_id=buyer.pk, exclude_lease_ids=exclude_lease_ids) if slots else {}
    else:
        rows, pending = pack_balances_and_pending(buyer_id=buyer.pk, at=at)
        slots = _slots(rows)
        pending = pending if slots else {}
    packs = BuyerPacks(slots=slots, factors=_factors_if_standard(slots, pending, known_factors))
    for chip, amount in pending.items():
        packs.take(chip=chip, factor=packs.factors.get(chip), draw=amount, at=at, commit=True)
    return packs


def _factors_if_standard(
    slots: list[_Slot], chips: Iterable[str], known: Mapping[str, Decimal | None] | None = None
) -> dict[str, Decimal | None]:
    """The chips' standard-card factors when a standard pack could pay them (none asked otherwise): from
    ``known`` when it has every chip, else from the database."""
    chips = list(chips)
    if not chips or not any(slot.class_key == STANDARD_CLASS for slot in slots):
        return dict.fromkeys(chips)
    if known is not None and all(chip in known for chip in chips):
        return {chip: known[chip] for chip in chips}
    return chip_factors(chips)


def lease_draw_plan(*, lease: Lease, at: datetime | None = None) -> DrawPlan:
    """How the lease's whole expected draw would be paid by the buyer's packs as they stand now, once the
    buyer's *other* live leases are set aside."""
    at = at or timezone.now()
    packs = buyer_packs_after_leases(buyer=lease.buyer, at=at, exclude_lease_ids=[lease.pk])
    factor = chip_factors([lease.draw_class]).get(lease.draw_class)
    return packs.plan(
        chip=lease.draw_class,
        factor=factor,
        draw=lease.expected_draw,
        rate=lease.price_card.rate_per_card_hour,
        at=max(lease.start_at, at),
    )


def _pending_of(lease: Lease) -> Decimal:
    """The lease's pending draw: its hold's open amount (expected less posted, broker.services.draw_holds)."""
    try:
        hold = lease.draw_hold
    except DrawHold.DoesNotExist:
        return lease.expected_draw
    return from_micros(hold.open_micros)


def reserved_draws_for(*, buyer: Organisation, now: datetime) -> list[ReservedDraw]:
    """What the buyer's reserved leases (accepted, not started) are expected to draw from its packs — their
    pending draws, expected less posted, as a quote sets them aside — per pack class in that class's
    unit, drawn rating's way in the order the leases start (the forecast needs when); the part no pack
    covers is left out (it is arrears, not a draw). The run-out forecast of ``/usage/`` counts these
    (registered with metering in BrokerConfig.ready). Running leases are not counted: their draw is in
    the trailing rate already."""
    reserved = list(
        Lease.objects.filter(buyer=buyer, state=LeaseState.RESERVED, end_at__gt=now)
        .select_related("draw_hold")
        .order_by("start_at", "id")
    )
    if not reserved:
        return []
    packs = BuyerPacks(
        slots=_buyer_packs(buyer=buyer, at=now), factors=chip_factors(r.draw_class for r in reserved)
    )
    draws: list[ReservedDraw] = []
    for lease in reserved:
        factor = packs.factors.get(lease.draw_class)
        at = max(lease.start_at, now)
        taken, _uncovered = packs.take(
            chip=lease.draw_class, factor=factor, draw=_pending_of(lease), at=at, commit=True
        )
        for slot, amount, _covers in taken:
            draws.append(
                ReservedDraw(
                    pack_id=slot.pack_id, class_key=slot.class_key, micros=to_micros(amount), starts_at=at
                )
            )
    return draws
