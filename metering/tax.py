"""VAT on invoice lines and the buyer's unified social credit code: pure functions, no database.

**VAT rates** come from ``CARDHOUR_VAT_RATES``, one rate per product kind (:class:`ProductKind`). The
defaults are 6 %: compute rented by the card-hour is, in our reading, an "information technology service"
among the modern services taxed at 6 % for general VAT taxpayers (财税〔2016〕36号, 附件1《营业税改征增值税试点实施
办法》, 第十五条 (一) and the 销售服务、无形资产、不动产注释 on 信息技术服务). Packs are prepaid compute and
carry the same rate. These are defaults, not tax advice: the platform's tax adviser must confirm them (a
small-scale taxpayer, an export of services, or a classification as leasing of tangible movable property —
13 % — would each change them), and production sets them per kind.

**The split.** Every amount on a statement is tax-included (pack prices are gross). A line's net is its
gross divided by ``1 + rate`` and quantised once, to the fen, half to even (the rule of core.money); its tax
is gross − net, so ``net + tax = gross`` exactly on every line, and a statement's tax totals are sums of its
lines, never re-rounded.

**Unified social credit code** (统一社会信用代码, GB 32100-2015): 18 characters from the 31-character set
``0-9 A-H J-N P-R T-U W-Y`` (no I, O, S, V, Z):

* 1: the registering authority (登记管理部门代码), 2: the kind of entity within it (机构类别代码) — both from
  the same character set (the standard's tables list them; new ones are added, so only the set is checked);
* 3–8: the administrative division code (GB/T 2260), six digits;
* 9–17: the organisation code (GB 11714), whose ninth character is its own check character (weights
  3 7 9 10 5 8 4 2, modulus 11, ``X`` for 10);
* 18: the check character over the first 17: weights ``3^(i−1) mod 31``, ``C18 = 31 − (Σ mod 31)``, 31 → ``0``.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils.translation import gettext_lazy as _

from core.money import FEN

USCC_CHARSET = "0123456789ABCDEFGHJKLMNPQRTUWXY"
_USCC_VALUES = {char: value for value, char in enumerate(USCC_CHARSET)}
_USCC_WEIGHTS = [pow(3, i, 31) for i in range(17)]  # 1 3 9 27 19 26 16 17 20 29 25 13 8 24 10 30 28
_ORG_CODE_WEIGHTS = [3, 7, 9, 10, 5, 8, 4, 2]
_ORG_CODE_CHARSET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # GB 11714: digits 0–9, letters A=10 … Z=35


class ProductKind(models.TextChoices):
    """What a statement line sells, as far as VAT is concerned (the keys of ``CARDHOUR_VAT_RATES``)."""

    PACK_PURCHASE = "pack_purchase", _("Prepaid card-hour pack")
    COMPUTE_SERVICE = "compute_service", _("Compute service (card-hours used)")


DEFAULT_VAT_RATES = {
    ProductKind.PACK_PURCHASE.value: "0.06",
    ProductKind.COMPUTE_SERVICE.value: "0.06",
}


def vat_rate(*, kind: str) -> Decimal:
    """The VAT rate configured for a product kind (a fraction: ``0.06`` is 6 %)."""
    rates = getattr(settings, "CARDHOUR_VAT_RATES", None) or DEFAULT_VAT_RATES
    return Decimal(str(rates.get(kind, DEFAULT_VAT_RATES[kind])))


def vat_split(*, gross: Decimal, rate: Decimal) -> tuple[Decimal, Decimal]:
    """``(net, tax)`` of a tax-included amount: net rounded once to the fen, half to even; tax the rest.

    A negative gross (a credit) splits symmetrically: ``vat_split(-g) == (-net, -tax)`` of ``vat_split(g)``.
    """
    net = (gross / (1 + rate)).quantize(FEN, rounding=ROUND_HALF_EVEN)
    return net, gross - net


def uscc_check_character(code17: str) -> str:
    """The 18th character of a unified social credit code whose first 17 are ``code17`` (GB 32100-2015)."""
    total = sum(_USCC_VALUES[char] * weight for char, weight in zip(code17, _USCC_WEIGHTS, strict=True))
    return USCC_CHARSET[(31 - total % 31) % 31]


def _org_code_check_character(code8: str) -> str:
    total = sum(
        _ORG_CODE_CHARSET.index(char) * weight for char, weight in zip(code8, _ORG_CODE_WEIGHTS, strict=True)
    )
    value = 11 - total % 11
    return "X" if value == 10 else "0" if value == 11 else str(value)


def uscc_problem(code: str) -> str | None:
    """Why ``code`` is not a valid unified social credit code, or None when it is. Upper case only: the
    standard has no lower-case form (callers normalise input before asking)."""
    if len(code) != 18:
        return f"A unified social credit code has 18 characters; this one has {len(code)}."
    bad = sorted({char for char in code if char not in _USCC_VALUES})
    if bad:
        return (
            f"A unified social credit code uses only 0–9 and the letters A–Y except I, O, S, V and Z; "
            f"found {', '.join(bad)}."
        )
    if not code[2:8].isdigit():
        return "Characters 3–8 (the administrative division code) must be digits."
    if _org_code_check_character(code[8:16]) != code[16]:
        return "Characters 9–17 (the organisation code) fail their own check character."
    expected = uscc_check_character(code[:17])
    if expected != code[17]:
        return f"The check character is wrong (the first 17 characters give {expected})."
    return None


def uscc_normalise(code: str) -> str:
    """Trimmed and upper-cased, as buyers paste codes with spaces and in lower case."""
    return "".join(code.split()).upper()


def validate_uscc(value: str) -> None:
    """Model and form validator: a unified social credit code as stored (already normalised)."""
    problem = uscc_problem(value)
    if problem is not None:
        raise ValidationError(problem, code="uscc_invalid")
