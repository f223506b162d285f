"""Operator forms: a tariff's schedule (new tariff, new version) and a cluster's price card.

Windows are written one per line, as a published tariff notice reads — ``peak 10:00-12:00 Mon-Fri
Jan-Jun,Oct-Dec`` — rather than as a formset: a schedule like Guangdong's has eleven windows, and eleven
rows of a band select, two times and nineteen checkboxes are slow to fill in, hard to review and awkward on
a phone, while eleven short lines can be read at a glance, copied from one tariff to the next and fixed by
line number when validation names a fault. Multipliers are one field per band: the bands are a closed set
of five, so a formset would add nothing but "add row" buttons.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

from django import forms
from django.db.models import QuerySet
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from core.errors import DomainError
from metering.models import Band, Tariff
from metering.tariffs import (
    ALL_MONTHS,
    ALL_WEEKDAYS,
    BANDS,
    MAX_WINDOWS,
    MINUTES_PER_DAY,
    MONTH_NAMES,
    WEEKDAY_NAMES,
    TariffSpec,
    WindowSpec,
    minute_label,
    months_label,
    time_zone_is_valid,
    weekdays_label,
)

# The bands as the form lists them, dearest first.
FORM_BANDS: tuple[str, ...] = BANDS
_MAX_LISTED_FAULTS = 20

_LINE_RE = re.compile(
    r"^(?P<band>[A-Za-z][A-Za-z_ -]*?)\s+(?P<start>\d{1,2}:\d{2})\s*-\s*(?P<end>\d{1,2}:\d{2})"
    r"(?:\s+(?P<rest>.*))?$"
)
_TIME_RE = re.compile(r"^(\d{1,2}):(\d{2})$")
_FULL_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_FULL_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)


def plain_decimal(value: Decimal | int | str) -> Decimal:
    """``Decimal("1.5000")`` → ``1.5``, ``Decimal("10.0000")`` → ``10`` (never ``1E+1``): for display and
    for a form's initial value."""
    number = Decimal(value).normalize()
    return number.quantize(Decimal(1)) if number.as_tuple().exponent > 0 else number  # type: ignore[operator]


def multiplier_field_name(band: str) -> str:
    return f"multiplier_{band}"


# --- The window syntax ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedWindows:
    """Windows read from the text, each with the line it came from (1-based), and the faults found."""

    windows: tuple[WindowSpec, ...]
    lines: tuple[int, ...]
    errors: tuple[str, ...]


def _normalise(text: str) -> str:
    return text.replace("–", "-").replace("—", "-").replace("−", "-").strip()


def _minute(text: str, *, is_end: bool) -> int | None:
    match = _TIME_RE.match(text)
    if match is None:
        return None
    hours, minutes = int(match.group(1)), int(match.group(2))
    if minutes > 59 or hours > 24 or (hours == 24 and minutes):
        return None
    value = hours * 60 + minutes
    if is_end and value == 0:
        return MINUTES_PER_DAY  # "-00:00" ends at midnight, as 24:00 does
    if not is_end and value == MINUTES_PER_DAY:
        return None
    return value


def _index_of(word: str, short: Sequence[str], full: Sequence[str]) -> int | None:
    lowered = word.lower()
    for index, (abbr, name) in enumerate(zip(short, full, strict=True)):
        if lowered in (abbr.lower(), name):
            return index
    return None


def _expand(first: int, last: int, size: int) -> list[int]:
    """``first``…``last`` inclusive, wrapping past the end (``Nov-Feb``, ``Sat-Mon``)."""
    out = [first]
    while out[-1] != last:
        out.append((out[-1] + 1) % size)
    return out


def _masks(rest: str) -> tuple[int, int, list[str]]:
    """Weekdays and months named in ``rest`` (``Mon-Fri Jan-Jun,Oct-Dec``) as masks; all when unnamed."""
    weekdays = months = 0
    faults: list[str] = []
    text = re.sub(r"\s*-\s*", "-", rest)
    for item in filter(None, re.split(r"[\s,;]+", text)):
        ends = item.split("-")
        if len(ends) > 2:
            faults.append(
                _("“%(item)s” is not a day or month range such as Mon-Fri or Jul-Sep.") % {"item": item}
            )
            continue
        days = [_index_of(end, WEEKDAY_NAMES, _FULL_WEEKDAYS) for end in ends]
        month_numbers = [_index_of(end, MONTH_NAMES, _FULL_MONTHS) for end in ends]
        if all(d is not None for d in days):
            for d in _expand(days[0], days[-1], 7):  # type: ignore[arg-type]
                weekdays |= 1 << d
        elif all(m is not None for m in month_numbers):
            for m in _expand(month_numbers[0], month_numbers[-1], 12):  # type: ignore[arg-type]
                months |= 1 << m
        else:
            faults.append(
                _("“%(item)s” is not a weekday (Mon…Sun) or a month (Jan…Dec), or a range of them.")
                % {"item": item}
            )
    return weekdays or ALL_WEEKDAYS, months or ALL_MONTHS, faults


def windows_parse(text: str) -> ParsedWindows:
    """Read windows written one per line: ``band HH:MM-HH:MM [weekdays] [months]``. Blank lines and lines
    starting with ``#`` are skipped. Every fault is named with its line number."""
    windows: list[WindowSpec] = []
    lines: list[int] = []
    errors: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _normalise(raw)
        if not line or line.startswith("#"):
            continue
        match = _LINE_RE.match(line)
        if match is None:
            errors.append(
                _("Line %(line)d: write a window as “band HH:MM-HH:MM [days] [months]”, e.g. %(example)s.")
                % {"line": number, "example": "valley 00:00-08:00 Mon-Sun Jan-Dec"}
            )
            continue
        band = re.sub(r"[\s-]+", "_", match.group("band").strip().lower())
        faults = []
        if band not in BANDS:
            faults.append(
                _("“%(band)s” is not a band; the bands are %(bands)s.")
                % {"band": match.group("band").strip(), "bands": ", ".join(BANDS)}
            )
        start = _minute(match.group("start"), is_end=False)
        end = _minute(match.group("end"), is_end=True)
        if start is None:
            faults.append(_("%(time)s is not a start time (00:00–23:59).") % {"time": match.group("start")})
        if end is None:
            faults.append(_("%(time)s is not an end time (00:01–24:00).") % {"time": match.group("end")})
        weekdays, months, mask_faults = _masks(match.group("rest") or "")
        faults.extend(mask_faults)
        if faults:
            errors.extend(_("Line %(line)d: %(error)s") % {"line": number, "error": f} for f in faults)
            continue
        assert start is not None and end is not None
        windows.append(
            WindowSpec(band=band, start_minute=start, end_minute=end, weekdays=weekdays, months=months)
        )
        lines.append(number)
    if not windows and not errors:
        errors.append(_("Write at least one window."))
    if len(windows) > MAX_WINDOWS:
        errors.append(_("At most %(n)d windows.") % {"n": MAX_WINDOWS})
    return ParsedWindows(windows=tuple(windows), lines=tuple(lines), errors=tuple(errors))


def _mask_text(label: str) -> str:
    return label.replace("–", "-").replace(", ", ",")


def windows_format(windows: Iterable[Any]) -> str:
    """Windows (WindowSpec or TariffWindow rows) in the syntax windows_parse reads, one per line."""
    return "\n".join(
        f"{w.band} {minute_label(w.start_minute)}-{minute_label(w.end_minute)} "
        f"{_mask_text(weekdays_label(w.weekdays))} {_mask_text(months_label(w.months))}"
        for w in windows
    )


WINDOWS_HELP = gettext_lazy(
    "One window per line: band, start-end (HH:MM, local time), then optionally the days and months it "
    "applies to (all when left out). Bands: critical_peak, peak, flat, valley, deep_valley. An end of 24:00 "
    "(or 00:00) is midnight; an end before the start runs past midnight (valley 22:30-06:30). Days Mon…Sun "
    "and months Jan…Dec, single or as ranges, separated by commas: peak 10:00-12:00 Mon-Fri Jan-Jun,Oct-Dec. "
    "Every minute of every day must fall in exactly one window. Lines starting with # are ignored."
)


# --- Forms ------------------------------------------------------------------------------------------


class _DateTimeLocal(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M")


class _DateInput(forms.DateInput):
    input_type = "date"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%d")


class ScheduleForm(forms.Form):
    """The schedule of a tariff version: a multiplier per band used, the windows, when it takes effect,
    and the day to preview. ``cleaned_spec`` is the TariffSpec once the fields parse (not yet validated
    against gaps and overlaps: that is metering.tariffs.tariff_spec_validate's job)."""

    windows = forms.CharField(
        label=gettext_lazy("Windows"),
        widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false", "autocapitalize": "off"}),
        help_text=WINDOWS_HELP,
        max_length=20_000,
    )
    effective_from = forms.DateTimeField(
        label=gettext_lazy("Takes effect"),
        required=False,
        widget=_DateTimeLocal(),
        help_text=gettext_lazy("Leave blank to take effect now. Never in the past."),
    )
    preview_date = forms.DateField(
        label=gettext_lazy("Preview day"),
        required=False,
        widget=_DateInput(),
        help_text=gettext_lazy("The day the preview strip shows (the windows of its weekday and month)."),
    )

    def __init__(self, *args: Any, time_zone: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._time_zone = time_zone
        self.window_lines: tuple[int, ...] = ()
        self.cleaned_spec: TariffSpec | None = None
        self._parsed: ParsedWindows | None = None
        for band in FORM_BANDS:
            self.fields[multiplier_field_name(band)] = forms.DecimalField(
                label=Band(band).label,
                required=False,
                max_digits=8,
                decimal_places=4,
                min_value=Decimal("0.0001"),
                widget=forms.NumberInput(attrs={"step": "0.0001", "inputmode": "decimal"}),
            )

    def multiplier_fields(self) -> list[forms.BoundField]:
        return [self[multiplier_field_name(band)] for band in FORM_BANDS]

    def clean_windows(self) -> str:
        text: str = self.cleaned_data["windows"]
        parsed = windows_parse(text)
        if parsed.errors:
            raise forms.ValidationError(list(parsed.errors))
        self._parsed = parsed
        return text

    def schedule_time_zone(self) -> str | None:
        return self._time_zone

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        time_zone = self.schedule_time_zone()
        parsed = self._parsed
        multipliers = {
            band: cleaned[multiplier_field_name(band)]
            for band in FORM_BANDS
            if cleaned.get(multiplier_field_name(band)) is not None
        }
        bad_multiplier = any(multiplier_field_name(band) in self.errors for band in FORM_BANDS)
        if parsed is not None and time_zone and not bad_multiplier:
            self.window_lines = parsed.lines
            self.cleaned_spec = TariffSpec(
                time_zone=time_zone, multipliers=multipliers, windows=parsed.windows
            )
        return cleaned

    def preview_day(self, *, default: date) -> date:
        value = self.cleaned_data.get("preview_date") if hasattr(self, "cleaned_data") else None
        return value or default

    def apply_tariff_error(self, exc: DomainError) -> None:
        """Put a TariffInvalidError (or another tariff error) beside the fields it names."""
        extra = exc.extra
        placed = False

        def add(field: str | None, message: str) -> None:
            nonlocal placed
            self.add_error(field if field in self.fields else None, message)
            placed = True

        if exc.code == "tariff_code_taken":
            add("code", exc.message)
        for name, messages in (extra.get("fields") or {}).items():
            for message in messages:
                add(name, str(message))
        if "time_zone" in extra and not extra.get("fields", {}).get("time_zone"):
            add(
                "time_zone",
                _("%(zone)s is not an IANA time zone (e.g. Asia/Shanghai).") % {"zone": extra["time_zone"]},
            )
        for band, fault in (extra.get("multipliers") or {}).items():
            add(multiplier_field_name(band), str(fault))
        for row in extra.get("windows") or []:
            index = row.get("index")
            for fault in row.get("errors", []):
                if index is not None and index < len(self.window_lines):
                    add(
                        "windows",
                        _("Line %(line)d: %(error)s") % {"line": self.window_lines[index], "error": fault},
                    )
                else:
                    add("windows", str(fault))
        for band in extra.get("unknown_bands") or []:
            add("windows", _("“%(band)s” is not a band.") % {"band": band})
        for band in extra.get("missing_multipliers") or []:
            add(multiplier_field_name(band), _("A window uses this band: give it a multiplier."))
        for band in extra.get("unused_bands") or []:
            add(
                multiplier_field_name(band),
                _("No window uses this band: leave the multiplier blank or add a window."),
            )
        coverage = [
            _("%(from)s–%(to)s on %(weekdays)s in %(months)s has no band")
            % {"from": g["from"], "to": g["to"], "weekdays": g["weekdays"], "months": g["months"]}
            for g in extra.get("gaps") or []
        ] + [
            _("%(from)s–%(to)s on %(weekdays)s in %(months)s is in both %(bands)s")
            % {
                "from": o["from"],
                "to": o["to"],
                "weekdays": o["weekdays"],
                "months": o["months"],
                "bands": _(" and ").join(o["bands"]),
            }
            for o in extra.get("overlaps") or []
        ]
        if coverage:
            add("windows", _("Every minute of every day must be in exactly one window:"))
            for message in coverage[:_MAX_LISTED_FAULTS]:
                add("windows", message)
            if len(coverage) > _MAX_LISTED_FAULTS:
                add("windows", _("… and %(n)d more.") % {"n": len(coverage) - _MAX_LISTED_FAULTS})
        if not placed:
            add(None, exc.message)


class TariffVersionForm(ScheduleForm):
    """A new version of an existing tariff: its zone is the tariff's."""


class TariffCreateForm(ScheduleForm):
    """A new tariff with its first version."""

    name = forms.CharField(label=gettext_lazy("Name"), max_length=200)
    code = forms.RegexField(
        label=gettext_lazy("Code"),
        regex=r"^[a-z0-9]+(?:-[a-z0-9]+)*$",
        max_length=64,
        help_text=gettext_lazy("Lower-case letters, digits and inner hyphens, e.g. sh-industrial-2026."),
        error_messages={"invalid": gettext_lazy("Use lower-case letters, digits and inner hyphens only.")},
    )
    time_zone = forms.CharField(
        label=gettext_lazy("Time zone"),
        max_length=64,
        initial="Asia/Shanghai",
        help_text=gettext_lazy("The IANA zone the windows' clock times are in, e.g. Asia/Shanghai."),
        widget=forms.TextInput(attrs={"list": "time-zones", "autocomplete": "off", "spellcheck": "false"}),
    )
    source = forms.CharField(
        label=gettext_lazy("Source"),
        max_length=500,
        required=False,
        help_text=gettext_lazy("The published tariff this follows, if any (a notice number, a link)."),
        widget=forms.Textarea(attrs={"rows": 2}),
    )

    field_order = ["name", "code", "time_zone", "source"]

    def clean_time_zone(self) -> str:
        value = str(self.cleaned_data["time_zone"]).strip()
        if not time_zone_is_valid(value):
            raise forms.ValidationError(
                _("%(zone)s is not an IANA time zone (e.g. Asia/Shanghai).") % {"zone": value}
            )
        return value

    def schedule_time_zone(self) -> str | None:
        return self.cleaned_data.get("time_zone")


def schedule_initial(*, multipliers: dict[str, Decimal], windows: Iterable[Any]) -> dict[str, Any]:
    """Initial data for a ScheduleForm copied from an existing schedule."""
    initial: dict[str, Any] = {"windows": windows_format(windows)}
    for band, value in multipliers.items():
        initial[multiplier_field_name(band)] = plain_decimal(value)
    return initial


class _TariffChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Tariff) -> str:
        owner = _("preset") if obj.owner_id is None else _("yours")
        return f"{obj.code} — {obj.name} ({owner})"


class PriceCardForm(forms.Form):
    """A new price for a cluster: rate per card-hour, tariff, start."""

    rate_per_card_hour = forms.DecimalField(
        label=gettext_lazy("Rate per card-hour (CNY)"),
        max_digits=12,
        decimal_places=4,
        help_text=gettext_lazy("The flat-band price; each band multiplies it. At most 4 decimal places."),
        widget=forms.NumberInput(attrs={"step": "0.0001", "min": "0.0001", "inputmode": "decimal"}),
    )
    tariff = _TariffChoiceField(
        label=gettext_lazy("Tariff"),
        queryset=Tariff.objects.none(),
        empty_label=None,
        help_text=gettext_lazy("The version in force when the price takes effect is locked with it."),
    )
    effective_from = forms.DateTimeField(
        label=gettext_lazy("Takes effect"),
        required=False,
        widget=_DateTimeLocal(),
        help_text=gettext_lazy("Leave blank to take effect now. Never in the past."),
    )
    sla_availability_percent = forms.DecimalField(
        label=gettext_lazy("Service level (availability, %)"),
        required=False,
        max_digits=6,
        decimal_places=3,
        help_text=gettext_lazy(
            "Optional: the availability over each lease's window you promise, e.g. 99.5. Leave blank to promise "
            "nothing."
        ),
        widget=forms.NumberInput(attrs={"step": "0.001", "min": "0", "max": "100", "inputmode": "decimal"}),
    )
    sla_credit_schedule = forms.CharField(
        label=gettext_lazy("Credit schedule"),
        required=False,
        max_length=300,
        help_text=gettext_lazy(
            "Optional tiers “availability below X % : credit Y % of the lease's charge”, separated by commas, "
            "e.g. 99.5:10, 99:25, 90:50. Credits are issued automatically."
        ),
    )

    def __init__(self, *args: Any, tariffs: QuerySet[Tariff], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tariff"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = tariffs

    def clean_rate_per_card_hour(self) -> Decimal:
        value: Decimal = self.cleaned_data["rate_per_card_hour"]
        if value <= 0:
            raise forms.ValidationError(_("Enter a rate greater than 0."))
        return value

    def clean_sla_credit_schedule(self) -> list[tuple[str, str]]:
        """ "99.5:10, 99:25" → [("99.5", "10"), ("99", "25")]; the rules are checked by the service."""
        text: str = self.cleaned_data["sla_credit_schedule"] or ""
        tiers: list[tuple[str, str]] = []
        for part in text.replace("；", ",").replace("，", ",").replace(";", ",").split(","):
            part = part.strip().replace("%", "").replace("：", ":")
            if not part:
                continue
            below, sep, credit = part.partition(":")
            if not sep or not below.strip() or not credit.strip():
                raise forms.ValidationError(
                    _("Write each tier as “below : credit”, e.g. 99.5:10 (not %(part)r).") % {"part": part}
                )
            tiers.append((below.strip(), credit.strip()))
        return tiers

    @staticmethod
    def schedule_text(schedule: list[dict[str, str]]) -> str:
        return ", ".join(f"{tier['below_percent']}:{tier['credit_percent']}" for tier in schedule)

    def apply_error(self, exc: DomainError) -> None:
        """A price-card or tariff error beside the field it names (rate, tariff, start)."""
        fields = exc.extra.get("fields") or {}
        for name, messages in fields.items():
            for message in messages:
                self.add_error(name if name in self.fields else None, str(message))
        if not fields:
            self.add_error("tariff" if exc.code == "tariff_not_found" else None, exc.message)
