"""Template helpers every portal page uses: money and quantity formatting, ages, band strips and legends."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django import template
from django.http import QueryDict
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from core.charts import band_colour, band_label, band_sort_key

register = template.Library()


def _decimal(value: Any) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


@register.filter
def money(value: Any, currency: str = "CNY") -> str:
    """``Decimal('1234.5')`` → ``"¥1,234.50"`` (CNY) or ``"1,234.50 USD"``; rounded half-even to the cent
    for display only."""
    amount = _decimal(value)
    if amount is None:
        return "—"
    text = f"{amount.quantize(Decimal('0.01')):,}"
    return f"¥{text}" if currency == "CNY" else f"{text} {currency}"


@register.filter
def quantity(value: Any, places: int = 2) -> str:
    """A card-hour or similar quantity with thousands separators and ``places`` decimals."""
    number = _decimal(value)
    if number is None:
        return "—"
    return f"{number.quantize(Decimal(1).scaleb(-int(places))):,}"


@register.filter
def count(value: Any) -> str:
    """A whole number of things (cards, records) with the active language's thousands separators:
    ``12800`` → ``"12,800"``. For pages only: CSV files and the API print plain integers."""
    if value is None or value == "":
        return "—"
    try:
        number = int(value)
    except (TypeError, ValueError):
        return str(value)
    return formats.number_format(number, force_grouping=True)


def utc_offset_label(value: datetime) -> str:
    """``"UTC+08:00"`` for a time in Shanghai: unlike the abbreviation "CST" (also US Central and Cuba), an
    offset names one zone-instant without doubt, in every language."""
    offset = value.utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset is not None else 0
    sign = "+" if minutes >= 0 else "-"
    hours, rest = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours:02d}:{rest:02d}"


@register.filter
def zoned(value: datetime | None, fmt: str = "Y-m-d H:i") -> str:
    """A time in the current zone with its UTC offset: ``"2026-11-26 01:50 (UTC+08:00)"``. Use instead of
    the ``T`` date format, which prints the ambiguous "CST"."""
    if value is None or value == "":
        return "—"
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    local = timezone.localtime(value)
    return f"{formats.date_format(local, fmt)} ({utc_offset_label(local)})"


@register.simple_tag
def zone_label() -> str:
    """The current zone as a person should read it: ``"Asia/Shanghai (UTC+08:00)"``."""
    return zone_name(timezone.now())


@register.filter
def zone_name(value: datetime | None) -> str:
    """The current zone's IANA name and its offset at ``value``: ``"Asia/Shanghai (UTC+08:00)"``; the
    ``e`` and ``T`` date formats print the zone's abbreviation ("CST"), which names three zones."""
    local = timezone.localtime(value if isinstance(value, datetime) else timezone.now())
    return f"{timezone.get_current_timezone_name()} ({utc_offset_label(local)})"


@register.filter
def age(value: datetime | None) -> str:
    """How long ago ``value`` was, briefly: "12 s ago", "3 min ago", "2 h ago", "5 days ago", or "never"."""
    if value is None:
        return _("never")
    seconds = int((timezone.now() - value).total_seconds())
    if seconds < 0:
        return _("just now")
    if seconds < 90:
        return _("%(n)d s ago") % {"n": seconds}
    if seconds < 90 * 60:
        return _("%(n)d min ago") % {"n": seconds // 60}
    if seconds < 36 * 3600:
        return _("%(n)d h ago") % {"n": seconds // 3600}
    days = seconds // 86400
    return ngettext("%(n)d day ago", "%(n)d days ago", days) % {"n": days}


@register.filter
def band_colour_of(band: str) -> str:
    return band_colour(band)


@register.filter(name="band_label")
def band_label_of(band: Any) -> str:
    """The human name of a band in the active language (``critical_peak`` → "Critical peak" / "尖峰")."""
    return band_label(str(band))


@register.simple_tag
def band_legend(bands: Any, multipliers: Any = None) -> SafeString:
    """A legend (swatch and name, with the multiplier if given) for ``bands``, cheapest first."""
    names = sorted({str(b) for b in bands}, key=band_sort_key)
    multipliers = multipliers or {}
    return format_html(
        '<ul class="legend">{}</ul>',
        format_html_join(
            "",
            '<li><span class="swatch" style="background:{}"></span>{}{}</li>',
            (
                (band_colour(name), band_label(name), f" ×{multipliers[name]}" if name in multipliers else "")
                for name in names
            ),
        ),
    )


@register.filter
def state_class(state: str) -> str:
    """A CSS class for a state badge: good, warn, bad or neutral."""
    good = {
        "running",
        "active",
        "completed",
        "paid",
        "succeeded",
        "healthy",
        "placed",
        "issued",
        "online",
        "processed",
        "accepted",
        "ok",
    }
    warn = {
        "reserved",
        "pending",
        "stop_requested",
        "degraded",
        "draining",
        "open",
        "requires_payment",
        "unknown",
        "received",
        "exhausted",
        "refunded",
        "partially_refunded",
    }
    bad = {
        "failed",
        "interrupted",
        "offline",
        "cancelled",
        "canceled",
        "declined",
        "expired",
        "retired",
        "overdue",
        "revoked",
        "unhealthy",
        "breach",
    }
    state = str(state)
    if state in good:
        return "badge good"
    if state in warn:
        return "badge warn"
    if state in bad:
        return "badge bad"
    return "badge"


@register.simple_tag(takes_context=True)
def page_url(context: template.Context, number: int, parameter: str = "page", anchor: str = "") -> str:
    """``?…`` for page ``number`` of a paginated list: the request's other query parameters (filters,
    sorting, another list's page) kept, ``parameter`` set, then ``#anchor`` if given."""
    request = context.get("request")
    query = request.GET.copy() if request is not None else QueryDict(mutable=True)
    query[parameter or "page"] = str(number)
    return f"?{query.urlencode()}" + (f"#{anchor}" if anchor else "")
