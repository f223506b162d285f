"""The quote answer (``POST /jobs/<id>/quotes``) rendered by hand: what ``QuoteSetOutput`` gives, at a
fraction of the cost.

DRF's serializers walk every declared field of every nested serializer for each quote (about 80 field
objects per quote, each with its ``get_attribute`` and ``to_representation``): a third of a quote request's
CPU outside the matcher. The serializers in broker.api.buyer stay the declaration of the answer (the
OpenAPI schema is generated from them); this module writes the same JSON directly: the same keys in the
same order, each value converted the way its serializer field converts it (``DecimalField`` quantises in a
copy of the thread's decimal context with ``max_digits`` as its precision and formats with ``:f``;
``DateTimeField`` converts an aware time to the current time zone, gives ISO 8601 with ``Z`` for UTC and
passes a string through; a missing nullable value is null). tests/broker/test_quote_render.py renders
varied quote sets both ways and asserts that the results are equal, so a field added to one and not the
other fails there.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Context, Decimal, getcontext
from typing import Any

from django.http import HttpResponse
from django.utils import timezone
from pydantic_core import to_json
from rest_framework import status
from rest_framework.fields import BooleanField
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from broker.matching import REASONS
from broker.models import Quote
from broker.services.quotes import QuoteSet
from broker.types import RELAXATION_KINDS

_MISSING: Any = object()
_TRUE = BooleanField.TRUE_VALUES
_FALSE = BooleanField.FALSE_VALUES
# The fields' decimal places. DecimalField's quantum is 10 ** -decimal_places (only its exponent matters to
# ``quantize``): one per number of places, made once.
_Q2, _Q3, _Q4, _Q6 = 2, 3, 4, 6
_QUANTA = {places: Decimal(1).scaleb(-places) for places in (_Q2, _Q3, _Q4, _Q6)}
_RELAXATION_KINDS = {kind: kind for kind in RELAXATION_KINDS}
_DRAW_UNITS = {"standard_card_hours": "standard_card_hours", "chip_card_hours": "chip_card_hours"}


class _Render:
    """One answer's conversions: the thread's decimal context and time zone read once per answer."""

    __slots__ = ("c6", "c8", "c12", "c14", "c16", "c20", "decimals", "parts", "times", "zone")

    def __init__(self) -> None:
        base = getcontext()
        self.c6, self.c8, self.c12, self.c14, self.c16, self.c20 = (
            _context(base, 6),
            _context(base, 8),
            _context(base, 12),
            _context(base, 14),
            _context(base, 16),
            _context(base, 20),
        )
        self.zone = timezone.get_current_timezone()
        # What this answer has already written, by value: ten quotes repeat most of their figures (the
        # bands' multipliers and hours, the draw plan's prices, the expiry), ~300 decimal conversions of
        # ~40 distinct values. Only values equal exactly when they convert alike: decimal strings and
        # Decimals (equal Decimals quantise to the same digits), ISO strings and aware times (equal
        # instants are written in the same zone).
        self.decimals: dict[tuple[Any, int, int], str | None] = {}
        self.times: dict[datetime | str, str | None] = {}
        # Parts of the breakdowns that are one object in several quotes (broker.services.quotes shares a
        # request's draw plans and bands between its quotes), rendered once: by the object's id, with the
        # object kept so that the id stays its own.
        self.parts: dict[int, tuple[Any, Any]] = {}

    def part(self, value: Any, render: Any) -> Any:
        """``render(value)``, remembered within this answer for this very object."""
        known = self.parts.get(id(value))
        if known is None or known[0] is not value:
            known = self.parts[id(value)] = (value, render(value))
        return known[1]

    def dec(self, value: Any, places: int, context: Context) -> str | None:
        """``_dec(value, places, context)``, remembered within this answer."""
        cls = value.__class__
        if cls is not str and cls is not Decimal:
            return _dec(value, places, context)
        key = (value, places, context.prec)
        text = self.decimals.get(key, _MISSING)
        if text is _MISSING:
            text = self.decimals[key] = _dec(value, places, context)
        return text

    def time(self, value: datetime | str | None) -> str | None:
        if not value:
            return None
        text = self.times.get(value, _MISSING)
        if text is not _MISSING:
            return text
        key = value
        if isinstance(value, str):  # an instant stored as ISO text (a breakdown's): shown in this zone too
            value = datetime.fromisoformat(value)
        if timezone.is_aware(value):
            text = value.astimezone(self.zone).isoformat()
        else:  # not remembered: a naive time's fold is not part of its equality
            text = timezone.make_aware(value, self.zone).isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        text = self.times[key] = text[:-6] + "Z" if text.endswith("+00:00") else text
        return text

    def quote(self, quote: Quote) -> dict[str, Any]:
        extra = quote.breakdown
        c16, c20, dec = self.c16, self.c20, self.dec
        plan = extra.get("draw_plan")
        reliability = extra.get("reliability")
        earliest_cost = extra.get("earliest_feasible_cost", quote.cost + quote.saving)
        return {
            "id": _int(quote.pk),
            "rank": _int(quote.rank),
            "cluster": _str(extra["cluster"]),
            "hub": _str(extra["hub"]),
            "accelerator": _str(extra["accelerator"]),
            "islands": [_allocation(item) for item in extra["islands"]],
            "islands_available": 1 + len(quote.alternatives or ()),
            "alternatives": [_allocation(item) for item in extra.get("alternatives", [])],
            "cards": _int(quote.cards),
            "start_at": self.time(quote.start_at),
            "end_at": self.time(quote.end_at),
            "cost": dec(quote.cost, _Q2, c16),
            "currency": "CNY",
            "bands": self.part(extra["bands"], self.bands),
            "latency_ms": dec(quote.latency_ms, _Q3, self.c8),
            "price_card": {
                "version": _int(extra["price_card_version"]),
                "rate_per_card_hour": dec(extra["rate_per_card_hour"], _Q4, self.c12),
                "tariff": _str(extra["tariff"]),
            },
            "earliest_feasible_start_at": self.time(extra.get("earliest_feasible_start_at")),
            "earliest_feasible_cost": dec(earliest_cost, _Q2, c16),
            "saving": dec(quote.saving, _Q2, c16),
            "expected_draw": dec(quote.expected_draw, _Q6, c20),
            "draw_class": _str(quote.draw_class),
            "standard_card_factor": dec(extra["standard_card_factor"], _Q4, self.c8),
            "expected_standard_draw": dec(extra["expected_standard_draw"], _Q6, c20),
            "draw_plan": None if plan is None else self.part(plan, self.draw_plan),
            "balance_sufficient": _bool(quote.balance_sufficient),
            "reliability": None
            if reliability is None
            else {
                "percent": dec(reliability.get("percent"), _Q3, self.c6),
                "prior": _bool(reliability["prior"]),
                "interruptions_per_1000_card_hours": dec(
                    reliability.get("interruptions_per_1000_card_hours"), _Q3, self.c14
                ),
            },
            "expected_credit": dec(extra.get("expected_credit"), _Q2, c16),
            "adjusted_cost": dec(extra.get("adjusted_cost"), _Q2, c16),
            "expires_at": self.time(quote.expires_at),
        }

    def bands(self, bands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        c16, c20, dec = self.c16, self.c20, self.dec
        return [
            {
                "band": _str(band["band"]),
                "multiplier": dec(band["multiplier"], _Q4, self.c8),
                "card_seconds": _int(band["card_seconds"]),
                "card_hours": dec(band["card_hours"], _Q6, c20),
                "cost": dec(band["cost"], _Q2, c16),
            }
            for band in bands
        ]

    def draw_plan(self, plan: dict[str, Any]) -> dict[str, Any]:
        c16, c20, dec = self.c16, self.c20, self.dec
        return {
            "chip": _str(plan["chip"]),
            "expected_draw_chip_card_hours": dec(plan["expected_draw_chip_card_hours"], _Q6, c20),
            "standard_card_factor": dec(plan.get("standard_card_factor"), _Q4, self.c8),
            "paid_by": [
                {
                    "pack_class": _str(part["pack_class"]),
                    "unit": _choice(part["unit"], _DRAW_UNITS),
                    "card_hours": dec(part["card_hours"], _Q6, c20),
                    "chip_card_hours": dec(part["chip_card_hours"], _Q6, c20),
                    "standard_card_factor": dec(part.get("standard_card_factor"), _Q4, self.c8),
                    "price_per_card_hour": dec(part["price_per_card_hour"], _Q6, c16),
                    "value": dec(part["value"], _Q2, c16),
                }
                for part in plan["paid_by"]
            ],
            "uncovered_chip_card_hours": dec(plan["uncovered_chip_card_hours"], _Q6, c20),
            "arrears_value": dec(plan["arrears_value"], _Q2, c16),
            "value": dec(plan["value"], _Q2, c16),
            "effective_price_per_card_hour": dec(plan["effective_price_per_card_hour"], _Q2, c16),
            "operator_rate_per_card_hour": dec(plan["operator_rate_per_card_hour"], _Q6, c16),
        }


def quote_set_render(quote_set: QuoteSet) -> dict[str, Any]:
    """The answer to a quote request, as ``QuoteSetOutput`` renders it (JSON-ready: str, int, bool, None,
    lists and dicts)."""
    render = _Render()
    result = quote_set.result
    rejections = result.rejections
    return {
        "job": _int(quote_set.job.pk),
        "quotes": [render.quote(quote) for quote in quote_set.quotes],
        "rejections": {reason: _int(rejections[reason]) for reason in REASONS},
        "considered": _int(result.considered),
        "feasible": _int(result.feasible),
        "window": {
            "start_at": render.time(result.window_start_at),
            "end_at": render.time(result.window_end_at),
        },
        "expires_at": render.time(quote_set.expires_at),
        "relaxations": [
            {
                "kind": _choice(relaxation.kind, _RELAXATION_KINDS),
                "changes": _json_dict(relaxation.changes),
                "cluster": _str(relaxation.cluster_cpi),
                "accelerator": _str(relaxation.accelerator),
                "start_at": render.time(relaxation.start_at),
                "cost": _dec(relaxation.cost, _Q2, render.c16),
            }
            for relaxation in quote_set.relaxations
        ],
    }


def quote_set_json(quote_set: QuoteSet) -> bytes:
    """quote_set_render's answer as JSON bytes: what the API's JSONRenderer writes for it (compact, UTF-8,
    non-ASCII as itself, U+2028 and U+2029 escaped as DRF escapes them), encoded by pydantic-core (a
    fraction of json.dumps' CPU for the ~20 KB of ten quotes). The answer holds only str, int, bool, None,
    lists and dicts, which both encoders write alike (tests/broker/test_quote_render.py compares the
    bytes)."""
    return _json_bytes(quote_set_render(quote_set))


def _json_bytes(data: Any) -> bytes:
    """``JSONRenderer().render(data)`` with the API's settings, for JSON-ready data."""
    text = to_json(data)
    if b"\xe2\x80\xa8" in text or b"\xe2\x80\xa9" in text:
        text = text.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
    return text


def quote_set_response(quote_set: QuoteSet, request: Request) -> HttpResponse | Response:
    """The 201 answer to a quote request: the bytes of quote_set_json when the negotiated renderer is the
    plain compact JSONRenderer with no ``indent`` asked for in the Accept header (DRF adds its Allow and
    Vary headers to either response); otherwise a DRF Response rendered by whatever was negotiated."""
    renderer = getattr(request, "accepted_renderer", None)
    media_type = getattr(request, "accepted_media_type", "") or ""
    if (
        renderer is not None
        and type(renderer) is JSONRenderer
        and ";" not in media_type
        and renderer.compact
        and not renderer.ensure_ascii
        and renderer.strict
    ):
        return HttpResponse(
            quote_set_json(quote_set), content_type="application/json", status=status.HTTP_201_CREATED
        )
    return Response(quote_set_render(quote_set), status=status.HTTP_201_CREATED)


def _context(base: Context, precision: int) -> Context:
    context = base.copy()
    context.prec = precision
    return context


# A decimal string as ``str(Decimal)`` writes one in plain notation: sign, integer part without leading
# zeros, an optional fraction (ASCII digits only: ``\d`` would take other scripts' digits, which Decimal
# reads).
_PLAIN = re.compile(r"-?(0|[1-9][0-9]*)(?:\.([0-9]+))?")
# What quantizing an exact string to more places appends, by the number of places missing ("" for none).
_ZEROS = ["", *("." + "0" * count for count in range(1, 8))]


def _dec(value: Any, places: int, context: Context) -> str | None:
    """``DecimalField(decimal_places=places).to_representation(value)`` in ``context`` (the field's
    max_digits as its precision)."""
    if value is None:
        return None
    cls = value.__class__
    if cls is str:
        # Most of a quote's decimals are stored in its breakdown as exact strings with at most the field's
        # places ("12.50" or "12.5" for a cost, "1" for a factor): quantizing one rounds nothing, only
        # appends zeros, and ``:f`` writes the digits back, so the string is returned with the missing
        # zeros appended — when it has no more places than the field and no more digits than the
        # precision allows (counting leading fraction zeros, which only sends a few strings the long way
        # round, where quantize raises as the field raises).
        plain = _PLAIN.fullmatch(value)
        if plain is not None and len(plain[1].lstrip("0")) + places <= context.prec:
            fraction = plain[2]
            if fraction is None:
                if places < len(_ZEROS):
                    return value + _ZEROS[places]
            else:
                missing = places - len(fraction)
                if missing == 0:
                    return value
                if 0 < missing < len(_ZEROS):
                    return value + _ZEROS[missing][1:]
        value = Decimal(value.strip())
    elif cls is not Decimal and not isinstance(value, Decimal):
        value = Decimal(str(value).strip())
    quantum = _QUANTA.get(places)
    if quantum is None:
        quantum = Decimal(1).scaleb(-places)
    return f"{value.quantize(quantum, context=context):f}"


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _bool(value: Any) -> bool | None:
    if value is None:
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return bool(value)


def _choice(value: Any, choices: dict[str, str]) -> Any:
    if value in ("", None):
        return value
    return choices.get(str(value), value)


def _allocation(item: Any) -> dict[str, Any]:
    return {"cpi": _str(item["cpi"]), "cards": _int(item["cards"])}


def _json_dict(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    return {str(key): item for key, item in value.items()}
