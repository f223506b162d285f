"""Money and quantities: Decimal at the edges, integer micro-units inside the ledger.

The ledger stores every amount as a signed integer count of *micro-units* (10⁻⁶ of the unit): micro-yuan
for CNY, micro-card-hours for card-hours. Integers keep sums exact on every database (SQLite would turn a
NUMERIC into a 15-digit float) and make ``SUM`` over millions of rows exact and fast. Services convert to
``Decimal`` at the boundary; an invoice or a Stripe amount is quantised once, to the fen, from the exact
integer total.

**The rounding rule** (one rule, every page, CSV, API answer and statement):

1. Amounts are kept exact, in integer micro-units, from rating to the moment they are shown.
2. A *line* is the exact sum of the rated segments of one (cluster, band, pack class, covered by a pack
   or not) — an invoice line — and is rounded to the fen once, half to even (``line_to_fen``).
3. Every total is the sum of its rounded lines (``lines_total``), never a re-rounded exact total; a subtotal
   (a cluster, a day) is the sum of the rounded lines it holds.

So ``/usage/`` for a calendar month, its CSVs and the month's invoice group the same segments into the same
lines and print the same totals, to the fen. What a buyer pays for usage (*spend*) is the segments'
``buyer_value``: the prepaid value of the pack card-hours drawn, plus, for usage no pack covered (arrears,
the amount due), the operator's gross — its list price.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import ROUND_HALF_EVEN, Decimal

MICROS = 1_000_000
FEN = Decimal("0.01")
CURRENCY = "CNY"


def round_div(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded half to even, in exact integer arithmetic."""
    if denominator <= 0:
        raise ValueError("denominator must be positive")
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def to_micros(value: Decimal | int | str) -> int:
    """An exact Decimal (or int / numeric string) as integer micro-units; more than 6 places is an error."""
    amount = Decimal(value)
    scaled = amount * MICROS
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{value!r} has more than 6 decimal places")
    return int(scaled)


def from_micros(micros: int) -> Decimal:
    """Integer micro-units as an exact Decimal with 6 places."""
    return (Decimal(micros) / MICROS).quantize(Decimal("0.000001"))


def micros_to_fen(micros: int) -> Decimal:
    """Quantise an exact micro-unit amount to the fen (0.01), half to even: the one rounding of a total."""
    return (Decimal(micros) / MICROS).quantize(FEN, rounding=ROUND_HALF_EVEN)


def scaled_int(value: Decimal, places: int) -> int:
    """A Decimal with at most ``places`` decimals as an integer scaled by 10**places (exact)."""
    scaled = Decimal(value) * (10**places)
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{value!r} has more than {places} decimal places")
    return int(scaled)


def line_to_fen(micros: int) -> Decimal:
    """One statement line's exact micro-unit sum, rounded to the fen once (the rule above, step 2)."""
    return micros_to_fen(micros)


def lines_total(lines_micros: Iterable[int]) -> Decimal:
    """A total by the rule: each line's exact micro-units rounded to the fen, then summed."""
    return sum((line_to_fen(micros) for micros in lines_micros), Decimal("0.00"))
