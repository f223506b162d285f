"""Money and quantities: Decimal at the edges, integer micro-units inside the ledger.

The ledger stores every amount as a signed integer count of *micro-units* (10⁻⁶ of the unit): micro-yuan
for CNY, micro-card-hours for card-hours. Integers keep sums exact on every database (SQLite would turn a
NUMERIC into a 15-digit float) and make ``SUM`` over millions of rows exact and fast. Services convert to
``Decimal`` at the boundary; an invoice or a Stripe amount is quantised once, to the fen, from the exact
integer total.
"""

from __future__ import annotations

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
