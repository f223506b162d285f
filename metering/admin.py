"""The metering back office: tariffs and price cards, the pack catalogue, billing profiles, orders, packs,
refunds and Stripe events, the ledger, usage and its rating, month-end statements.

Decisions, so the next person does not have to rediscover them:

- **Writes go through services.** A tariff, a tariff version and a price card are added with small forms
  whose submit calls ``tariff_create``, ``tariff_version_create`` and ``price_card_set``; the service's own
  error message (a tariff's gaps and overlaps, a price card taking effect in the past…) comes back as a
  form error. Those forms are custom admin views rather than ModelForms, because the admin's model-form
  path saves after validation and has no way to show an error raised while saving.
- **Tariffs, versions and price cards are immutable** once written (usage is priced with them for good), so
  their change pages are read-only; a change is a new version. Platform presets come from code
  (``metering.tariffs.PRESETS``, installed by ``tariff_presets_install``) and get no new-version form here.
- **Money rows are read-only**: orders, packs, refunds, Stripe events, the ledger, usage, rated segments,
  exhaustion flags and statements cannot be added, changed or deleted here — not even by a superuser. The
  ledger's amounts are integer micro-units; they are shown as exact decimals with their unit (CNY or
  card-hours of a class).
- **Actions call services**: refunding a pack's unused part (with a confirmation page and a required reason,
  kept in the admin history of the pack), re-processing failed Stripe events and re-running rating for the
  buyers of selected usage records (rating only ever rates unrated records, so a re-run is safe).
- **Statements** (invoices, settlements) are final: read-only with their lines inline, and downloadable as
  CSV and PDF (``metering.rendering``) from the list and the statement's page.
- **The usage CSV import** hands its rows to ``usage_record_create_batch`` (the same service as the API),
  per operator, in chunks of ``CARDHOUR_USAGE_BATCH_MAX``, all in one transaction: one bad row anywhere and
  nothing is written; every bad line is listed with its CSV line number and the service's code.
- **Big tables stay fast**: usage records, rated segments, ledger entries and transfers never count the
  whole table (``show_full_result_count = False``, and on PostgreSQL the unfiltered page count is the
  planner's estimate); their filters list organisations and units from small tables, never with a
  ``DISTINCT`` over the big one; search uses exact matches on indexed keys; every list joins what it shows
  (``list_select_related``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, cast

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Count, Max, Q, QuerySet, Sum
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import format_lazy
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from core.admin_tools import (
    BuyerFilter,
    LimitedInlineFormSet,
    OperatorFilter,
)
from core.admin_tools import EstimatedCountPaginator as _EstimatedCountPaginator
from core.admin_tools import ReadOnlyAdminMixin as _ReadOnlyAdminMixin
from core.admin_tools import changelist_url as _changelist_url
from core.admin_tools import staff_actor as _staff_actor
from core.errors import DomainError
from core.models import Organisation
from core.money import from_micros
from federation.models import Cluster
from metering.errors import UsageBatchInvalidError
from metering.models import (
    ALL_MONTHS,
    ALL_WEEKDAYS,
    CNY_UNIT,
    ArrearsSettlement,
    BillingCloseRun,
    BillingProfile,
    BuyerExhaustion,
    Invoice,
    InvoiceLine,
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    Pack,
    PackOrder,
    PackProduct,
    PackRefund,
    PriceCard,
    RatedSegment,
    ReconciliationRun,
    Settlement,
    SettlementLine,
    StatementDocument,
    StripeEvent,
    Tariff,
    TariffBand,
    TariffVersion,
    TariffWindow,
    UsageRecord,
    card_hour_unit,
)
from metering.models.usage import UsageRecordQuerySet
from metering.tariffs import (
    BANDS,
    WEEKDAY_NAMES,
    TariffSpec,
    WindowSpec,
    minute_label,
    months_label,
    weekdays_label,
)
from metering.types import UsageRecordInput

logger = logging.getLogger(__name__)

# Inlines show at most this many rows (a rating transfer may touch thousands of accounts); the full list is
# one click away.
INLINE_ROW_LIMIT = 200
USAGE_CSV_MAX_BYTES = 64 * 1024 * 1024
USAGE_CSV_MAX_ROWS = 200_000
USAGE_CSV_COLUMNS = (
    "operator",
    "idempotency_key",
    "cluster",
    "buyer",
    "cards",
    "start_at",
    "end_at",
    "price_card_version",
    "reference",
)
USAGE_CSV_OPTIONAL = frozenset({"price_card_version", "reference"})
# Errors listed on the import page; the count says how many there were in all.
USAGE_CSV_ERRORS_SHOWN = 500

_SERVICE_FORM_TEMPLATE = "admin/metering/service_form.html"


# --- Helpers ---------------------------------------------------------------------------------------


def _change_url(obj: Any) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


def _link(url: str, text: object) -> SafeString:
    return format_html('<a href="{}">{}</a>', url, text)


def _local(at: datetime | None) -> str:
    """A timestamp to the second in the site's time zone (money history needs the seconds)."""
    return "—" if at is None else f"{timezone.localtime(at):%Y-%m-%d %H:%M:%S}"


def unit_label(unit: str) -> str:
    """``CNY`` → ``CNY``; ``card_hours:std`` → ``card-hours (std)``."""
    prefix = card_hour_unit("")
    if unit.startswith(prefix):
        return f"card-hours ({unit.removeprefix(prefix)})"
    return unit


def micros_display(amount: int | None, unit: str, *, signed: bool = False) -> str:
    """An integer micro-unit amount as an exact decimal with its unit, e.g. ``12.500000 CNY``."""
    if amount is None:
        return "—"
    value = from_micros(amount)
    return f"{value:+f} {unit_label(unit)}" if signed else f"{value:f} {unit_label(unit)}"


def _amount_cell(amount: int | None, unit: str, *, signed: bool = False) -> SafeString:
    return format_html(
        '<span style="white-space:nowrap">{}</span>', micros_display(amount, unit, signed=signed)
    )


def _cny(value: Decimal | None) -> SafeString:
    return format_html('<span style="white-space:nowrap">{} CNY</span>', "—" if value is None else value)


def _card_hours_of_seconds(card_seconds: int) -> str:
    return f"{(Decimal(card_seconds) / 3600).quantize(Decimal('0.000001'))} card-hours"


def _domain_error_into_form(form: forms.Form, exc: DomainError) -> None:
    """The service's message as a form error, and its per-field details on the fields the form has."""
    fields = exc.extra.get("fields") if isinstance(exc.extra, dict) else None
    if isinstance(fields, dict):
        for name, problems in fields.items():
            if name in form.fields:
                for problem in problems if isinstance(problems, list) else [problems]:
                    form.add_error(name, str(problem))
    form.add_error(None, f"{exc.message} ({exc.code})")


class _LimitedInlineFormSet(LimitedInlineFormSet):
    row_limit = INLINE_ROW_LIMIT


class _ReadOnlyInline(_ReadOnlyAdminMixin, admin.TabularInline):
    extra = 0
    can_delete = False


class UnitFilter(admin.SimpleListFilter):
    """Ledger units, listed from the accounts table (far smaller than the entries)."""

    title = gettext_lazy("unit")
    parameter_name = "unit"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        units = LedgerAccount.objects.order_by("unit").values_list("unit", flat=True).distinct()
        return [(unit, unit_label(unit)) for unit in units]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(unit=self.value()) if self.value() else queryset


# --- Tariffs: the schedule text format --------------------------------------------------------------

_WINDOW_LINE = re.compile(
    r"^(?P<band>[a-z_]+)\s+(?P<start>\d{1,2}:\d{2})\s*[-–]\s*(?P<end>\d{1,2}:\d{2})(?P<rest>.*)$"
)
_MASK_TOKEN = re.compile(r"\[?\s*(?P<key>weekdays|months)\s*=\s*(?P<value>[^\]\s]+)\s*\]?")
_WINDOWS_HELP = format_lazy(
    gettext_lazy(
        "One window per line: <code>band HH:MM-HH:MM [weekdays=mon-fri] [months=7,8,9]</code>, e.g. "
        "<code>peak 10:00-12:00 weekdays=mon,tue months=7-9</code>. Bands: {bands}. The end 24:00 is "
        "midnight; an end at or before the start wraps past midnight (valley 22:30-06:30). Without weekdays "
        "or months a window applies every day of every month. Every minute of every day must belong to "
        "exactly one window. Lines starting with # are ignored."
    ),
    bands=", ".join(BANDS),
)
_MULTIPLIERS_HELP = gettext_lazy(
    "The multiplier on the price card's rate for each band used, e.g. <code>peak=1.7, flat=1, valley=0.38</code>."
)


def _minute(text: str) -> int:
    hours, minutes = (int(part) for part in text.split(":"))
    if minutes > 59 or hours > 24 or (hours == 24 and minutes):
        raise ValueError(_("%(text)s is not a time of day (00:00–24:00)") % {"text": text})
    return hours * 60 + minutes


_WEEKDAY_FULL = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTH_FULL = (
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


def _mask_items(value: str, *, names: Sequence[str], numbers: bool, what: str) -> list[int]:
    """``mon-fri,sun`` / ``7-9,dec`` → 0-based indices into ``names`` (full names, any prefix of three
    letters or more; 1-based numbers where ``numbers``), ranges inclusive."""

    def one(token: str) -> int:
        token = token.strip().lower()
        if numbers and token.isdigit() and 1 <= int(token) <= len(names):
            return int(token) - 1
        for index, name in enumerate(names):
            if len(token) >= 3 and name.startswith(token):
                return index
        raise ValueError(_("%(token)r is not a %(what)s") % {"token": token, "what": what})

    items: list[int] = []
    for part in value.split(","):
        if not part.strip():
            continue
        if "-" in part:
            low, high = (one(bound) for bound in part.split("-", 1))
            if high < low:
                raise ValueError(
                    _("the %(what)s range %(part)s runs backwards") % {"what": what, "part": part}
                )
            items.extend(range(low, high + 1))
        else:
            items.append(one(part))
    if not items:
        raise ValueError(_("no %(what)s given") % {"what": what})
    return items


def parse_windows(text: str) -> tuple[WindowSpec, ...]:
    """The admin's schedule text as window specs; raises ValidationError naming each bad line."""
    windows: list[WindowSpec] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _WINDOW_LINE.match(line.lower())
        if match is None:
            problems.append(
                _("Line %(number)d: %(text)r is not “band HH:MM-HH:MM [weekdays=…] [months=…]”.")
                % {"number": number, "text": raw.strip()}
            )
            continue
        try:
            start, end = _minute(match["start"]), _minute(match["end"])
            weekdays, months = ALL_WEEKDAYS, ALL_MONTHS
            rest = match["rest"]
            for token in _MASK_TOKEN.finditer(rest):
                if token["key"] == "weekdays":
                    days = _mask_items(token["value"], names=_WEEKDAY_FULL, numbers=False, what=_("weekday"))
                    weekdays = sum({1 << day for day in days})
                else:
                    chosen = _mask_items(token["value"], names=_MONTH_FULL, numbers=True, what=_("month"))
                    months = sum({1 << month for month in chosen})
            leftover = _MASK_TOKEN.sub("", rest).strip()
            if leftover:
                raise ValueError(_("unexpected %(text)r") % {"text": leftover})
        except ValueError as exc:
            problems.append(_("Line %(number)d: %(problem)s.") % {"number": number, "problem": exc})
            continue
        windows.append(
            WindowSpec(
                band=match["band"], start_minute=start, end_minute=end, weekdays=weekdays, months=months
            )
        )
    if problems:
        raise forms.ValidationError(problems)
    if not windows:
        raise forms.ValidationError(_("Give at least one window."))
    return tuple(windows)


def parse_multipliers(text: str) -> dict[str, Decimal]:
    """``peak=1.7, flat=1, valley=0.38`` → {band: Decimal}; raises ValidationError on a bad pair."""
    result: dict[str, Decimal] = {}
    problems: list[str] = []
    for part in re.split(r"[,;\n]", text):
        if not part.strip():
            continue
        band, sep, value = part.partition("=")
        band = band.strip().lower()
        if not sep or not band:
            problems.append(_("%(text)r is not “band=multiplier”.") % {"text": part.strip()})
            continue
        try:
            amount = Decimal(value.strip())
        except InvalidOperation:
            problems.append(
                _("The %(band)s multiplier %(value)r is not a number.")
                % {"band": band, "value": value.strip()}
            )
            continue
        if band in result:
            problems.append(_("%(band)s is given twice.") % {"band": band})
        result[band] = amount
    if problems:
        raise forms.ValidationError(problems)
    if not result:
        raise forms.ValidationError(_("Give a multiplier for each band used."))
    return result


def _mask_text(mask: int, *, count: int, names: Sequence[str] | None) -> str:
    items = [i for i in range(count) if mask >> i & 1]
    return ",".join(names[i].lower() if names else str(i + 1) for i in items)


def windows_text(windows: Iterable[TariffWindow] | Iterable[WindowSpec]) -> str:
    """Windows in the admin's text format (the inverse of :func:`parse_windows`)."""
    lines = []
    for window in windows:
        line = f"{window.band} {minute_label(window.start_minute)}-{minute_label(window.end_minute)}"
        if window.weekdays != ALL_WEEKDAYS:
            line += f" weekdays={_mask_text(window.weekdays, count=7, names=WEEKDAY_NAMES)}"
        if window.months != ALL_MONTHS:
            line += f" months={_mask_text(window.months, count=12, names=None)}"
        lines.append(line)
    return "\n".join(lines)


def _window_label(window: TariffWindow) -> str:
    where = []
    if window.weekdays != ALL_WEEKDAYS:
        where.append(weekdays_label(window.weekdays))
    if window.months != ALL_MONTHS:
        where.append(months_label(window.months))
    span = f"{minute_label(window.start_minute)}–{minute_label(window.end_minute)}"
    return f"{window.band} {span}" + (f" ({'; '.join(where)})" if where else "")


class _ScheduleForm(forms.Form):
    windows = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 12, "cols": 80, "style": "font-family:monospace"}),
        help_text=_WINDOWS_HELP,
    )
    multipliers = forms.CharField(
        widget=forms.TextInput(attrs={"size": 80, "style": "font-family:monospace"}),
        help_text=_MULTIPLIERS_HELP,
    )
    effective_from = forms.SplitDateTimeField(
        widget=AdminSplitDateTime,
        required=False,
        help_text=gettext_lazy("Empty: from now. Never in the past; after the tariff's newest version."),
    )

    def clean_windows(self) -> tuple[WindowSpec, ...]:
        return parse_windows(self.cleaned_data["windows"])

    def clean_multipliers(self) -> dict[str, Decimal]:
        return parse_multipliers(self.cleaned_data["multipliers"])


class TariffCreateForm(_ScheduleForm):
    owner = forms.ModelChoiceField(
        queryset=Organisation.objects.filter(is_operator=True).order_by("slug"),
        help_text=gettext_lazy(
            "The operator that uses this tariff on its price cards. Presets come from code."
        ),
    )
    code = forms.CharField(
        max_length=64, help_text=gettext_lazy("a–z, 0–9 and inner hyphens; unique per operator.")
    )
    name = forms.CharField(max_length=200)
    time_zone = forms.CharField(
        max_length=64, initial="Asia/Shanghai", help_text=gettext_lazy("IANA time zone.")
    )
    source = forms.CharField(
        max_length=500,
        required=False,
        help_text=gettext_lazy("The published tariff this schedule is taken from."),
    )

    field_order = ["owner", "code", "name", "time_zone", "source", "windows", "multipliers", "effective_from"]


class TariffVersionCreateForm(_ScheduleForm):
    pass


# --- Tariffs and versions ----------------------------------------------------------------------------


class _ServiceFormMixin:
    """Renders a plain form in the admin's look, for the write paths that go through a service."""

    admin_site: admin.AdminSite
    model: type[Any]

    def _render_service_form(
        self,
        request: HttpRequest,
        *,
        form: forms.Form,
        title: str,
        submit_label: str,
        original: Any = None,
        intro: str = "",
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "form": form,
            "original": original,
            "intro": intro,
            "submit_label": submit_label,
            "media": self.media + form.media,  # type: ignore[attr-defined]
        }
        return TemplateResponse(request, _SERVICE_FORM_TEMPLATE, context)


class PresetFilter(admin.SimpleListFilter):
    title = gettext_lazy("kind")
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("preset", "platform preset"), ("operator", "an operator's own")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "preset":
            return queryset.filter(owner__isnull=True)
        if self.value() == "operator":
            return queryset.filter(owner__isnull=False)
        return queryset


class TariffVersionInline(_ReadOnlyInline):
    model = TariffVersion
    formset = _LimitedInlineFormSet
    fields = readonly_fields = ("version_link", "effective", "bands_summary", "windows_summary", "created_by")
    ordering = ["-version"]
    verbose_name_plural = "versions (immutable; newest first)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[TariffVersion]:
        return super().get_queryset(request).prefetch_related("bands", "windows")

    @admin.display(description=gettext_lazy("Version"))
    def version_link(self, obj: TariffVersion) -> SafeString:
        return _link(_change_url(obj), f"v{obj.version}")

    @admin.display(description=gettext_lazy("In force from"))
    def effective(self, obj: TariffVersion) -> str:
        return _local(obj.effective_from)

    @admin.display(description=gettext_lazy("Bands × multiplier"))
    def bands_summary(self, obj: TariffVersion) -> SafeString:
        return _bands_html(obj)

    @admin.display(description=gettext_lazy("Windows"))
    def windows_summary(self, obj: TariffVersion) -> SafeString:
        return _windows_html(obj)


def _bands_html(version: TariffVersion) -> SafeString:
    bands = sorted(version.bands.all(), key=lambda b: BANDS.index(b.band) if b.band in BANDS else 99)
    return format_html_join(
        "",
        '<div style="white-space:nowrap">{} × {}</div>',
        ((b.band, b.multiplier.normalize()) for b in bands),
    )


def _windows_html(version: TariffVersion) -> SafeString:
    windows = sorted(version.windows.all(), key=lambda w: (w.start_minute, w.pk))
    return format_html_join(
        "",
        '<div style="white-space:nowrap;font-family:monospace">{}</div>',
        ((_window_label(w),) for w in windows),
    )


@admin.register(Tariff)
class TariffAdmin(_ServiceFormMixin, admin.ModelAdmin):
    """Tariffs with their versions. A new tariff and a new version go through the tariff services; nothing
    is edited in place, and presets (owner empty) get no new-version form: they change in code."""

    list_display = ["code", "name", "owner_label", "time_zone", "version_count", "latest_version"]
    list_filter = [PresetFilter, ("owner", admin.RelatedOnlyFieldListFilter), "time_zone"]
    search_fields = ["code", "name", "owner__slug", "owner__name"]
    list_select_related = ["owner"]
    fields = readonly_fields = (
        "code",
        "name",
        "owner_label",
        "time_zone",
        "source",
        "created_at",
        "new_version",
    )
    inlines = [TariffVersionInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tariff]:
        return (
            super()
            .get_queryset(request)
            .annotate(version_count=Count("versions"), latest_version=Max("versions__version"))
        )

    def has_change_permission(self, request: HttpRequest, obj: Tariff | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Tariff | None = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<path:object_id>/new-version/",
                self.admin_site.admin_view(self.new_version_view),
                name="metering_tariff_new_version",
            ),
            *super().get_urls(),
        ]

    @admin.display(description=gettext_lazy("Owner"), ordering="owner__slug")
    def owner_label(self, obj: Tariff) -> str:
        return "platform preset" if obj.owner_id is None else obj.owner.slug  # type: ignore[union-attr]

    @admin.display(description=gettext_lazy("Versions"), ordering="version_count")
    def version_count(self, obj: Tariff) -> int:
        return getattr(obj, "version_count", 0)

    @admin.display(description=gettext_lazy("Newest"), ordering="latest_version")
    def latest_version(self, obj: Tariff) -> str:
        latest = getattr(obj, "latest_version", None)
        return "—" if latest is None else f"v{latest}"

    @admin.display(description=gettext_lazy("New version"))
    def new_version(self, obj: Tariff) -> str | SafeString:
        if obj.owner_id is None:
            return "A preset: it changes in code (metering.tariffs.PRESETS), not here."
        return _link(reverse("admin:metering_tariff_new_version", args=[obj.pk]), _("Add a new version →"))

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        from metering.services.tariffs import tariff_create

        if not self.has_add_permission(request):
            raise PermissionDenied
        form = TariffCreateForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                tariff = tariff_create(
                    owner=data["owner"],
                    code=data["code"],
                    name=data["name"],
                    time_zone=data["time_zone"],
                    source=data["source"],
                    spec=TariffSpec(
                        time_zone=data["time_zone"], multipliers=data["multipliers"], windows=data["windows"]
                    ),
                    effective_from=data["effective_from"],
                    actor=_staff_actor(request),
                )
            except DomainError as exc:
                _domain_error_into_form(form, exc)
            else:
                self.log_addition(request, tariff, "Created in the admin with version 1.")
                messages.success(
                    request, _("Tariff %(code)s created with version 1.") % {"code": tariff.code}
                )
                return HttpResponseRedirect(_change_url(tariff))
        return self._render_service_form(
            request, form=form, title=_("Add an operator's tariff"), submit_label=_("Create tariff")
        )

    def new_version_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        from metering.services.tariffs import tariff_version_create

        if not request.user.has_perm("metering.add_tariffversion"):
            raise PermissionDenied
        tariff = get_object_or_404(Tariff.objects.select_related("owner"), pk=object_id)
        if tariff.owner_id is None:
            messages.error(
                request,
                _("%(code)s is a platform preset: it changes in code, not in the admin.")
                % {"code": tariff.code},
            )
            return HttpResponseRedirect(_change_url(tariff))
        latest = (
            TariffVersion.objects.filter(tariff=tariff)
            .prefetch_related("bands", "windows")
            .order_by("-version")
            .first()
        )
        initial: dict[str, Any] = {}
        if latest is not None:
            initial["windows"] = windows_text(
                sorted(latest.windows.all(), key=lambda w: (w.start_minute, w.pk))
            )
            initial["multipliers"] = ", ".join(
                f"{b.band}={b.multiplier.normalize()}" for b in latest.bands.all()
            )
        form = TariffVersionCreateForm(request.POST or None, initial=initial)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                version = tariff_version_create(
                    tariff=tariff,
                    spec=TariffSpec(
                        time_zone=tariff.time_zone, multipliers=data["multipliers"], windows=data["windows"]
                    ),
                    effective_from=data["effective_from"],
                    actor=_staff_actor(request),
                )
            except DomainError as exc:
                _domain_error_into_form(form, exc)
            else:
                self.log_change(request, tariff, f"Added version {version.version} in the admin.")
                messages.success(
                    request,
                    _("%(code)s v%(version)s in force from %(at)s.")
                    % {"code": tariff.code, "version": version.version, "at": _local(version.effective_from)},
                )
                return HttpResponseRedirect(_change_url(tariff))
        return self._render_service_form(
            request,
            form=form,
            title=_("New version of %(code)s (%(zone)s)") % {"code": tariff.code, "zone": tariff.time_zone},
            submit_label=_("Create version"),
            original=tariff,
            intro=_(
                "The form starts from the newest version. Price cards already set keep the version they "
                "locked; setting a price again picks up the version in force then."
            ),
        )


class TariffBandInline(_ReadOnlyInline):
    model = TariffBand
    fields = readonly_fields = ("band", "multiplier")


class TariffWindowInline(_ReadOnlyInline):
    model = TariffWindow
    fields = readonly_fields = ("band", "start", "end", "days", "in_months")

    @admin.display(description=gettext_lazy("From"))
    def start(self, obj: TariffWindow) -> str:
        return minute_label(obj.start_minute)

    @admin.display(description=gettext_lazy("To"))
    def end(self, obj: TariffWindow) -> str:
        return minute_label(obj.end_minute)

    @admin.display(description=gettext_lazy("Weekdays"))
    def days(self, obj: TariffWindow) -> str:
        return weekdays_label(obj.weekdays)

    @admin.display(description=gettext_lazy("Months"))
    def in_months(self, obj: TariffWindow) -> str:
        return months_label(obj.months)


@admin.register(TariffVersion)
class TariffVersionAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Immutable editions of tariffs; add one from the tariff's page."""

    list_display = ["__str__", "tariff_owner", "effective", "created_by", "created_at"]
    list_filter = [("tariff__owner", admin.RelatedOnlyFieldListFilter), "tariff__time_zone"]
    search_fields = ["tariff__code", "tariff__owner__slug"]
    list_select_related = ["tariff", "tariff__owner"]
    fields = readonly_fields = ("tariff", "version", "effective_from", "created_by", "created_at", "as_text")
    inlines = [TariffBandInline, TariffWindowInline]

    @admin.display(description=gettext_lazy("Owner"), ordering="tariff__owner__slug")
    def tariff_owner(self, obj: TariffVersion) -> str:
        owner = obj.tariff.owner
        return "platform preset" if owner is None else owner.slug

    @admin.display(description=gettext_lazy("In force from"), ordering="effective_from")
    def effective(self, obj: TariffVersion) -> str:
        return _local(obj.effective_from)

    @admin.display(description=gettext_lazy("As text (the new-version form's format)"))
    def as_text(self, obj: TariffVersion) -> SafeString:
        windows = sorted(obj.windows.all(), key=lambda w: (w.start_minute, w.pk))
        multipliers = ", ".join(f"{b.band}={b.multiplier.normalize()}" for b in obj.bands.all())
        return format_html("<pre>{}\n\n{}</pre>", windows_text(windows), multipliers)


# --- Price cards -------------------------------------------------------------------------------------


class PriceCardCreateForm(forms.Form):
    cluster = forms.CharField(
        label=gettext_lazy("Cluster CPI"),
        max_length=200,
        help_text=gettext_lazy("e.g. cpi:cucc:nx:zw-ai01"),
        widget=forms.TextInput({"size": 50}),
    )
    rate_per_card_hour = forms.DecimalField(
        label=gettext_lazy("Rate per card-hour (CNY)"), min_value=Decimal(0), max_digits=12, decimal_places=4
    )
    tariff = forms.ModelChoiceField(
        queryset=Tariff.objects.select_related("owner").order_by("owner__slug", "code"),
        help_text=gettext_lazy("A platform preset or one of the cluster operator's own tariffs."),
    )
    effective_from = forms.SplitDateTimeField(
        widget=AdminSplitDateTime,
        required=False,
        help_text=gettext_lazy("Empty: from now. Never in the past, never before the cluster's newest card."),
    )
    sla_availability_percent = forms.DecimalField(
        label=gettext_lazy("Service level (availability, %)"),
        required=False,
        max_digits=6,
        decimal_places=3,
        help_text=gettext_lazy("Optional, e.g. 99.5. Empty: the card promises nothing."),
    )
    sla_credit_schedule = forms.JSONField(
        label=gettext_lazy("Credit schedule"),
        required=False,
        help_text=gettext_lazy(
            'Optional tiers, e.g. [{"below_percent": "99.5", "credit_percent": "10"}, '
            '{"below_percent": "99", "credit_percent": "25"}].'
        ),
    )

    def clean_cluster(self) -> Cluster:
        cpi = self.cleaned_data["cluster"].strip()
        cluster = Cluster.objects.select_related("operator").filter(cpi=cpi).first()
        if cluster is None:
            raise forms.ValidationError(_("No cluster %(cpi)s.") % {"cpi": cpi})
        return cluster

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        cluster, tariff = cleaned.get("cluster"), cleaned.get("tariff")
        if cluster is not None and tariff is not None and tariff.owner_id not in (None, cluster.operator_id):
            self.add_error("tariff", f"{tariff} belongs to another operator than {cluster.operator.slug}.")
        return cleaned


@admin.register(PriceCard)
class PriceCardAdmin(_ServiceFormMixin, admin.ModelAdmin):
    """Price cards are immutable versions; a new price is a new version through ``price_card_set``."""

    list_display = ["cluster_cpi", "version", "rate", "tariff_version", "sla", "effective", "created_by"]
    list_filter = [
        ("cluster__operator", admin.RelatedOnlyFieldListFilter),
        ("tariff_version__tariff", admin.RelatedOnlyFieldListFilter),
        "cluster__hub",
    ]
    search_fields = ["cluster__cpi"]
    list_select_related = ["cluster", "tariff_version", "tariff_version__tariff"]
    fields = readonly_fields = (
        "cluster",
        "version",
        "rate",
        "tariff_version",
        "effective_from",
        "sla_availability_percent",
        "sla_credit_schedule",
        "created_by",
        "created_at",
        "usage_link",
    )

    def has_change_permission(self, request: HttpRequest, obj: PriceCard | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: PriceCard | None = None) -> bool:
        return False

    @admin.display(description=gettext_lazy("Cluster"), ordering="cluster__cpi")
    def cluster_cpi(self, obj: PriceCard) -> str:
        return obj.cluster.cpi

    @admin.display(description=gettext_lazy("Rate per card-hour"), ordering="rate_per_card_hour")
    def rate(self, obj: PriceCard) -> SafeString:
        return _cny(obj.rate_per_card_hour)

    @admin.display(description=gettext_lazy("In force from"), ordering="effective_from")
    def effective(self, obj: PriceCard) -> str:
        return _local(obj.effective_from)

    @admin.display(description=gettext_lazy("Service level"), ordering="sla_availability_percent")
    def sla(self, obj: PriceCard) -> str:
        if obj.sla_availability_percent is None:
            return "—"
        tiers = ", ".join(f"<{t['below_percent']}→{t['credit_percent']}" for t in obj.sla_credit_schedule)
        return f"{obj.sla_availability_percent.normalize():f} %" + (f" ({tiers})" if tiers else "")

    @admin.display(description=gettext_lazy("Usage"))
    def usage_link(self, obj: PriceCard) -> SafeString:
        return _link(_changelist_url(UsageRecord, price_card__id__exact=obj.pk), _("Usage priced with it →"))

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        from metering.services.tariffs import price_card_set

        if not self.has_add_permission(request):
            raise PermissionDenied
        form = PriceCardCreateForm(request.POST or None, initial={"cluster": request.GET.get("cluster", "")})
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                card = price_card_set(
                    cluster=data["cluster"],
                    rate_per_card_hour=data["rate_per_card_hour"],
                    tariff=data["tariff"],
                    effective_from=data["effective_from"],
                    sla_availability_percent=data["sla_availability_percent"],
                    sla_credit_schedule=data["sla_credit_schedule"],
                    actor=_staff_actor(request),
                )
            except DomainError as exc:
                _domain_error_into_form(form, exc)
            else:
                self.log_addition(request, card, "Set in the admin.")
                messages.success(
                    request,
                    _("%(cpi)s: price card v%(version)s set.")
                    % {"cpi": card.cluster.cpi, "version": card.version},
                )
                return HttpResponseRedirect(_change_url(card))
        return self._render_service_form(
            request, form=form, title=_("Set a cluster's price"), submit_label=_("Set price (new version)")
        )


# --- Catalogue and billing profiles ------------------------------------------------------------------


@admin.register(PackProduct)
class PackProductAdmin(admin.ModelAdmin):
    """The pack catalogue. An order copies the product's figures, so editing a product never changes a sold
    pack; a product with orders cannot be deleted (retire it by unticking *active*)."""

    list_display = [
        "code",
        "name",
        "chip",
        "card_hours",
        "price_cny",
        "validity_days",
        "sort_order",
        "active",
    ]
    list_display_links = ["code", "name"]
    list_editable = ["active"]
    list_filter = ["active", ("accelerator", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["code", "name"]
    list_select_related = ["accelerator"]
    fields = (
        "code",
        "name",
        "accelerator",
        "card_hours",
        "price",
        "currency",
        "validity_days",
        "active",
        "sort_order",
        "created_at",
    )

    def get_readonly_fields(self, request: HttpRequest, obj: PackProduct | None = None) -> list[str]:
        # The code names the product in orders and the portal's links: fixed once created.
        return ["currency", "created_at", *(["code"] if obj is not None else [])]

    @admin.display(description=gettext_lazy("Card-hours of"), ordering="accelerator__slug")
    def chip(self, obj: PackProduct) -> str:
        return "standard cards" if obj.accelerator is None else obj.accelerator.slug

    @admin.display(description=gettext_lazy("Price"), ordering="price")
    def price_cny(self, obj: PackProduct) -> SafeString:
        return _cny(obj.price)


@admin.register(BillingProfile)
class BillingProfileAdmin(admin.ModelAdmin):
    """Invoice details are editable; the Stripe customer is Stripe's and stays read-only."""

    list_display = [
        "organisation",
        "legal_name",
        "tax_id",
        "unified_social_credit_code",
        "billing_email",
        "stripe_customer_id",
        "updated_at",
    ]
    search_fields = [
        "organisation__slug",
        "organisation__name",
        "legal_name",
        "tax_id",
        "billing_email",
        "stripe_customer_id",
    ]
    list_select_related = ["organisation"]
    autocomplete_fields = ["organisation"]
    fields = (
        "organisation",
        "currency",
        "legal_name",
        "tax_id",
        "address",
        "billing_email",
        "unified_social_credit_code",
        "invoice_title",
        "fapiao_email",
        "stripe_customer_id",
        "created_at",
        "updated_at",
    )

    def get_readonly_fields(self, request: HttpRequest, obj: BillingProfile | None = None) -> list[str]:
        fixed = ["currency", "stripe_customer_id", "created_at", "updated_at"]
        return [*fixed, "organisation"] if obj is not None else fixed

    def has_delete_permission(self, request: HttpRequest, obj: BillingProfile | None = None) -> bool:
        return False


# --- Orders, packs, refunds, Stripe events ---------------------------------------------------------


@admin.register(PackOrder)
class PackOrderAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "buyer",
        "product_code",
        "quantity",
        "card_hours",
        "amount_cny",
        "status",
        "stripe_payment_intent_id",
        "created_at",
        "paid_at",
    ]
    list_filter = ["status", "livemode", ("product", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["stripe_payment_intent_id__exact", "idempotency_key__exact", "buyer__slug"]
    list_select_related = ["buyer", "product"]
    readonly_fields = ("pack_link",)
    fields = (
        "buyer",
        "product",
        "quantity",
        "accelerator",
        "card_hours",
        "amount",
        "currency",
        "validity_days",
        "status",
        "idempotency_key",
        "stripe_payment_intent_id",
        "livemode",
        "failure_code",
        "failure_message",
        "created_at",
        "created_by",
        "paid_at",
        "pack_link",
    )
    show_full_result_count = False

    @admin.display(description=gettext_lazy("Product"), ordering="product__code")
    def product_code(self, obj: PackOrder) -> str:
        return obj.product.code

    @admin.display(description=gettext_lazy("Amount"), ordering="amount")
    def amount_cny(self, obj: PackOrder) -> SafeString:
        return _cny(obj.amount)

    @admin.display(description=gettext_lazy("Pack"))
    def pack_link(self, obj: PackOrder) -> str | SafeString:
        pack = Pack.objects.filter(order=obj).first()
        return "none (not paid)" if pack is None else _link(_change_url(pack), pack)


class PackRefundInline(_ReadOnlyInline):
    model = PackRefund
    fk_name = "pack"
    fields = readonly_fields = ("stripe_refund_id", "amount", "debited", "refunded_at")

    @admin.display(description=gettext_lazy("Card-hours debited"))
    def debited(self, obj: PackRefund) -> SafeString:
        return _amount_cell(obj.card_hours_debited, card_hour_unit(obj.pack.class_key))

    def get_queryset(self, request: HttpRequest) -> QuerySet[PackRefund]:
        return super().get_queryset(request).select_related("pack", "pack__accelerator")


class RefundReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=400,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=gettext_lazy("Kept in each pack's admin history with your name."),
    )


@admin.register(Pack)
class PackAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Packs as credited from paid orders. The remaining balance is the pack's ledger account's."""

    list_display = [
        "id",
        "buyer",
        "class_label",
        "card_hours",
        "remaining",
        "price_cny",
        "status",
        "starts_at",
        "expires_at",
    ]
    list_filter = ["status", "accelerator"]
    search_fields = ["buyer__slug", "order__stripe_payment_intent_id__exact"]
    list_select_related = ["buyer", "accelerator", "account"]
    fields = readonly_fields = (
        "buyer",
        "order",
        "class_label",
        "card_hours",
        "remaining",
        "price",
        "status",
        "starts_at",
        "expires_at",
        "closed_at",
        "created_at",
        "ledger_link",
    )
    inlines = [PackRefundInline]
    actions = ["refund_unused"]
    show_full_result_count = False

    @admin.display(description=gettext_lazy("Class"), ordering="accelerator__slug")
    def class_label(self, obj: Pack) -> str:
        return obj.class_key

    @admin.display(description=gettext_lazy("Remaining"))
    def remaining(self, obj: Pack) -> SafeString:
        try:
            account = obj.account
        except LedgerAccount.DoesNotExist:
            return format_html("{}", "—")
        return _amount_cell(account.balance, account.unit)

    @admin.display(description=gettext_lazy("Price"), ordering="price")
    def price_cny(self, obj: Pack) -> SafeString:
        return _cny(obj.price)

    @admin.display(description=gettext_lazy("Ledger"))
    def ledger_link(self, obj: Pack) -> str | SafeString:
        try:
            account = obj.account
        except LedgerAccount.DoesNotExist:
            return "no account"
        return format_html(
            "{} · {}",
            _link(_change_url(account), account.key),
            _link(_changelist_url(LedgerEntry, account__id__exact=account.pk), _("its entries →")),
        )

    def has_refund_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("metering.add_packrefund")

    @admin.action(description=gettext_lazy("Refund the unused part"), permissions=["refund"])
    def refund_unused(self, request: HttpRequest, queryset: QuerySet[Pack]) -> HttpResponse | None:
        packs = list(queryset.select_related("buyer", "accelerator", "account", "order").order_by("pk"))
        form = RefundReasonForm(request.POST if request.POST.get("confirm") == "yes" else None)
        if request.POST.get("confirm") == "yes" and form.is_valid():
            from metering.services.payments import pack_refund_request

            reason = form.cleaned_data["reason"].strip()
            actor = _staff_actor(request)
            done = 0
            for pack in packs:
                try:
                    pack_refund_request(pack=pack, actor=actor)
                except DomainError as exc:
                    messages.warning(
                        request, _("Pack %(pack)s: %(message)s") % {"pack": pack.pk, "message": exc.message}
                    )
                    continue
                self.log_change(request, pack, f"Refund of the unused part requested: {reason}")
                done += 1
            if done:
                messages.success(
                    request,
                    _(
                        "Refund requested for %(n)d pack(s); each pack is debited when Stripe confirms the refund."
                    )
                    % {"n": done},
                )
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Refund the unused part of these packs?"),
            "packs": [(pack, self.remaining(pack)) for pack in packs],
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action": "refund_unused",
            "media": self.media,
        }
        return TemplateResponse(request, "admin/metering/pack/refund_confirm.html", context)


class PackBuyerFilter(BuyerFilter):
    field_name = "pack__buyer"


@admin.register(PackRefund)
class PackRefundAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["stripe_refund_id", "order_link", "pack_link", "amount_cny", "debited", "refunded_at"]
    search_fields = ["stripe_refund_id__exact", "order__stripe_payment_intent_id__exact", "pack__buyer__slug"]
    list_filter = [PackBuyerFilter]
    list_select_related = ["pack", "pack__accelerator"]

    @admin.display(description=gettext_lazy("Order"), ordering="order_id")
    def order_link(self, obj: PackRefund) -> SafeString:
        url = reverse("admin:metering_packorder_change", args=[obj.order_id])
        return _link(url, f"order {obj.order_id}")

    @admin.display(description=gettext_lazy("Pack"), ordering="pack_id")
    def pack_link(self, obj: PackRefund) -> SafeString:
        return _link(_change_url(obj.pack), f"pack {obj.pack_id}")

    @admin.display(description=gettext_lazy("Amount"), ordering="amount")
    def amount_cny(self, obj: PackRefund) -> SafeString:
        return _cny(obj.amount)

    @admin.display(description=gettext_lazy("Card-hours debited"))
    def debited(self, obj: PackRefund) -> SafeString:
        return _amount_cell(obj.card_hours_debited, card_hour_unit(obj.pack.class_key))


@admin.register(StripeEvent)
class StripeEventAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every webhook event as received; a failed one can be re-processed (handlers are idempotent)."""

    list_display = ["event_id", "type", "status", "attempts", "object_id", "received_at", "processed_at"]
    list_filter = ["status", "type", "livemode"]
    search_fields = ["event_id__exact", "object_id__exact"]
    fields = readonly_fields = (
        "event_id",
        "type",
        "livemode",
        "object_id",
        "stripe_created",
        "status",
        "error",
        "attempts",
        "received_at",
        "processed_at",
        "payload_pretty",
    )
    actions = ["reprocess_failed"]
    show_full_result_count = False

    @admin.display(description=gettext_lazy("Payload"))
    def payload_pretty(self, obj: StripeEvent) -> SafeString:
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, indent=2, sort_keys=True, default=str))

    def has_reprocess_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("metering.change_stripeevent")

    @admin.action(description=gettext_lazy("Re-process failed events"), permissions=["reprocess"])
    def reprocess_failed(self, request: HttpRequest, queryset: QuerySet[StripeEvent]) -> None:
        from metering.services.payments import stripe_event_process

        failed = list(queryset.filter(status=StripeEvent.Status.FAILED).order_by("received_at", "pk"))
        skipped = queryset.exclude(status=StripeEvent.Status.FAILED).count()
        for event in failed:
            try:
                stripe_event_process(event=event)
            except DomainError as exc:
                messages.warning(request, f"{event.event_id}: {exc.message}")
        statuses = {
            row["status"]: row["n"]
            for row in StripeEvent.objects.filter(pk__in=[e.pk for e in failed])
            .order_by()
            .values("status")
            .annotate(n=Count("pk"))
        }
        if failed:
            summary = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
            messages.success(
                request,
                _("Re-processed %(n)d failed event(s): now %(summary)s.")
                % {"n": len(failed), "summary": summary},
            )
        if skipped:
            messages.info(request, _("Skipped %(n)d event(s) that had not failed.") % {"n": skipped})


# --- The ledger: strictly read-only ----------------------------------------------------------------


@admin.register(LedgerAccount)
class LedgerAccountAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["key", "kind", "unit_name", "organisation", "balance_display", "non_negative"]
    list_filter = ["kind", UnitFilter, "non_negative"]
    search_fields = ["^key", "organisation__slug"]
    list_select_related = ["organisation"]
    fields = readonly_fields = (
        "key",
        "kind",
        "unit_name",
        "organisation",
        "pack",
        "balance_display",
        "non_negative",
        "created_at",
        "entries_link",
    )

    @admin.display(description=gettext_lazy("Unit"), ordering="unit")
    def unit_name(self, obj: LedgerAccount) -> str:
        return unit_label(obj.unit)

    @admin.display(description=gettext_lazy("Balance"), ordering="balance")
    def balance_display(self, obj: LedgerAccount) -> SafeString:
        return _amount_cell(obj.balance, obj.unit)

    @admin.display(description=gettext_lazy("Entries"))
    def entries_link(self, obj: LedgerAccount) -> SafeString:
        return _link(
            _changelist_url(LedgerEntry, account__id__exact=obj.pk), _("All entries of this account →")
        )


class LedgerEntryInline(_ReadOnlyInline):
    model = LedgerEntry
    formset = _LimitedInlineFormSet
    fields = readonly_fields = ("account_link", "account_kind", "amount_display")
    ordering = ["id"]
    verbose_name_plural = f"entries (first {INLINE_ROW_LIMIT})"

    def get_queryset(self, request: HttpRequest) -> QuerySet[LedgerEntry]:
        return super().get_queryset(request).select_related("account")

    @admin.display(description=gettext_lazy("Account"))
    def account_link(self, obj: LedgerEntry) -> SafeString:
        return _link(_change_url(obj.account), obj.account.key)

    @admin.display(description=gettext_lazy("Kind"))
    def account_kind(self, obj: LedgerEntry) -> str:
        return obj.account.get_kind_display()

    @admin.display(description=gettext_lazy("Amount"))
    def amount_display(self, obj: LedgerEntry) -> SafeString:
        return _amount_cell(obj.amount, obj.unit, signed=True)


@admin.register(LedgerTransfer)
class LedgerTransferAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kind", "idempotency_key", "description", "posted", "posted_by"]
    list_filter = ["kind"]
    search_fields = ["^idempotency_key"]
    fields = readonly_fields = (
        "kind",
        "idempotency_key",
        "description",
        "posted_at",
        "posted_by",
        "totals",
        "entries_link",
    )
    inlines = [LedgerEntryInline]
    ordering = ["-id"]
    paginator = _EstimatedCountPaginator
    show_full_result_count = False

    @admin.display(description=gettext_lazy("Posted at"), ordering="posted_at")
    def posted(self, obj: LedgerTransfer) -> str:
        return _local(obj.posted_at)

    @admin.display(description=gettext_lazy("Totals per unit"))
    def totals(self, obj: LedgerTransfer) -> SafeString:
        rows = (
            LedgerEntry.objects.filter(transfer=obj)
            .order_by("unit")
            .values("unit")
            .annotate(total=Sum("amount"), moved=Sum("amount", filter=Q(amount__gt=0)), n=Count("pk"))
        )
        lines = []
        balanced = True
        for row in rows:
            balanced &= row["total"] == 0
            lines.append(
                (
                    unit_label(row["unit"]),
                    row["n"],
                    micros_display(row["moved"] or 0, row["unit"]),
                    micros_display(row["total"], row["unit"], signed=True),
                )
            )
        verdict = (
            format_html('<strong style="color:{}">{}</strong>', "#15803d", "balanced")
            if balanced
            else format_html('<strong style="color:{}">{}</strong>', "#b91c1c", "NOT BALANCED")
        )
        return format_html(
            "{}{}",
            verdict,
            format_html_join("", "<div>{}: {} entries, {} moved, sum {}</div>", lines),
        )

    @admin.display(description=gettext_lazy("Entries"))
    def entries_link(self, obj: LedgerTransfer) -> SafeString:
        return _link(
            _changelist_url(LedgerEntry, transfer__id__exact=obj.pk), "All entries of this transfer →"
        )


@admin.register(LedgerEntry)
class LedgerEntryAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "transfer_link", "transfer_kind", "account", "amount_display", "posted"]
    list_filter = ["account__kind", UnitFilter, "transfer__kind"]
    search_fields = ["account__key__exact", "transfer__idempotency_key__exact"]
    list_select_related = ["transfer", "account"]
    fields = readonly_fields = ("transfer", "account", "unit_name", "amount_display")
    ordering = ["-id"]
    paginator = _EstimatedCountPaginator
    show_full_result_count = False

    @admin.display(description=gettext_lazy("Transfer"), ordering="transfer_id")
    def transfer_link(self, obj: LedgerEntry) -> SafeString:
        return _link(_change_url(obj.transfer), obj.transfer_id)

    @admin.display(description=gettext_lazy("Kind"))
    def transfer_kind(self, obj: LedgerEntry) -> str:
        return obj.transfer.kind

    @admin.display(description=gettext_lazy("Amount"), ordering="amount")
    def amount_display(self, obj: LedgerEntry) -> SafeString:
        return _amount_cell(obj.amount, obj.unit, signed=True)

    @admin.display(description=gettext_lazy("Unit"))
    def unit_name(self, obj: LedgerEntry) -> str:
        return unit_label(obj.unit)

    @admin.display(description=gettext_lazy("Posted at"))
    def posted(self, obj: LedgerEntry) -> str:
        return _local(obj.transfer.posted_at)


# --- Usage and rating --------------------------------------------------------------------------------


class RatedFilter(admin.SimpleListFilter):
    title = gettext_lazy("rated")
    parameter_name = "rated"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "rated"), ("no", "not rated yet")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        records = cast(UsageRecordQuerySet, queryset)
        if self.value() == "yes":
            return records.rated()
        if self.value() == "no":
            return records.unrated()
        return queryset


class _SegmentAmountColumns:
    """The columns a rated segment shows wherever it is listed: its card-hours and its micro-unit amounts."""

    @admin.display(description=gettext_lazy("Card-hours"))
    def card_hours(self, obj: RatedSegment) -> str:
        return _card_hours_of_seconds(obj.card_seconds)

    @admin.display(description=gettext_lazy("Drawn"))
    def draw(self, obj: RatedSegment) -> SafeString:
        suffix = "" if obj.pack_id else " (arrears)"
        return format_html("{}{}", _amount_cell(obj.pack_draw, card_hour_unit(obj.pack_class)), suffix)

    @admin.display(description=gettext_lazy("Gross"))
    def gross_cny(self, obj: RatedSegment) -> SafeString:
        return _amount_cell(obj.gross, CNY_UNIT)

    @admin.display(description=gettext_lazy("Commission"))
    def commission_cny(self, obj: RatedSegment) -> SafeString:
        return _amount_cell(obj.commission, CNY_UNIT)

    @admin.display(description=gettext_lazy("Buyer value"))
    def value_cny(self, obj: RatedSegment) -> SafeString:
        return _amount_cell(obj.buyer_value, CNY_UNIT)


class RatedSegmentInline(_SegmentAmountColumns, _ReadOnlyInline):
    model = RatedSegment
    formset = _LimitedInlineFormSet
    fields = readonly_fields = (
        "seq",
        "band",
        "start",
        "end",
        "multiplier",
        "card_hours",
        "pack",
        "draw",
        "gross_cny",
        "commission_cny",
        "value_cny",
        "invoice",
        "settlement",
    )
    ordering = ["seq"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[RatedSegment]:
        return (
            super()
            .get_queryset(request)
            .select_related("pack", "pack__buyer", "pack__accelerator", "invoice", "settlement")
        )

    @admin.display(description=gettext_lazy("From"))
    def start(self, obj: RatedSegment) -> str:
        return _local(obj.start_at)

    @admin.display(description=gettext_lazy("To"))
    def end(self, obj: RatedSegment) -> str:
        return _local(obj.end_at)


class UsageImportForm(forms.Form):
    csv_file = forms.FileField(
        label=gettext_lazy("CSV file"),
        help_text=format_lazy(
            gettext_lazy(
                "UTF-8, header <code>{columns}</code>; timestamps ISO-8601 with a UTC offset "
                "(2025-07-01T10:00:00+08:00), whole seconds; price_card_version and reference may be empty."
            ),
            columns=",".join(USAGE_CSV_COLUMNS),
        ),
    )


@dataclass(frozen=True)
class _CsvRow:
    line: int
    operator: str
    record: UsageRecordInput


@dataclass(frozen=True)
class _LineError:
    line: int
    idempotency_key: str
    code: str
    message: str
    field: str = ""


@dataclass
class UsageImportResult:
    rows: int = 0
    operators: int = 0
    created: int = 0
    duplicates: int = 0
    conflicts: list[tuple[int, str]] = field(default_factory=list)
    errors: list[_LineError] = field(default_factory=list)
    error_count: int = 0


def _parse_timestamp(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(_("is not an ISO-8601 timestamp")) from None
    if timezone.is_naive(parsed):
        raise ValueError(_("needs a UTC offset (e.g. +08:00 or Z)"))
    return parsed


def parse_usage_csv(text: str) -> tuple[list[_CsvRow], list[_LineError]]:
    """CSV text as usage inputs with their line numbers, and the lines that could not be read."""
    reader = csv.reader(io.StringIO(text, newline=""))
    errors: list[_LineError] = []
    try:
        header = [name.strip().lower() for name in next(reader)]
    except StopIteration:
        return [], [_LineError(1, "", "empty_file", _("The file is empty."))]
    missing = [c for c in USAGE_CSV_COLUMNS if c not in header and c not in USAGE_CSV_OPTIONAL]
    unknown = [c for c in header if c not in USAGE_CSV_COLUMNS]
    if missing or unknown or len(set(header)) != len(header):
        header_problems = []
        if missing:
            header_problems.append(_("missing %(columns)s") % {"columns": ", ".join(missing)})
        if unknown:
            header_problems.append(_("unknown %(columns)s") % {"columns": ", ".join(unknown)})
        if len(set(header)) != len(header):
            header_problems.append(_("a column is repeated"))
        message = _("The header must be %(columns)s: %(problems)s.") % {
            "columns": ",".join(USAGE_CSV_COLUMNS),
            "problems": "; ".join(header_problems),
        }
        return [], [_LineError(1, "", "bad_header", message)]

    rows: list[_CsvRow] = []
    next_line = 2
    for cells in reader:
        line, next_line = next_line, reader.line_num + 1
        if not any(cell.strip() for cell in cells):
            continue
        if len(rows) + len(errors) >= USAGE_CSV_MAX_ROWS:
            errors.append(
                _LineError(
                    line,
                    "",
                    "too_many_rows",
                    _("At most %(max)d rows per file.") % {"max": USAGE_CSV_MAX_ROWS},
                )
            )
            break
        if len(cells) != len(header):
            errors.append(
                _LineError(
                    line,
                    "",
                    "bad_row",
                    _("%(fields)d fields; the header has %(width)d.")
                    % {"fields": len(cells), "width": len(header)},
                )
            )
            continue
        values = {name: cell.strip() for name, cell in zip(header, cells, strict=True)}
        key = values["idempotency_key"]
        problems: list[tuple[str, str]] = []
        for name in ("operator", "idempotency_key", "cluster", "buyer"):
            if not values[name]:
                problems.append((name, _("%(column)s is empty") % {"column": name}))
        cards = 0
        try:
            cards = int(values["cards"])
        except ValueError:
            problems.append(
                ("cards", _("cards %(value)r is not a whole number") % {"value": values["cards"]})
            )
        stamps: dict[str, datetime] = {}
        for name in ("start_at", "end_at"):
            try:
                stamps[name] = _parse_timestamp(values[name])
            except ValueError as exc:
                problems.append(
                    (
                        name,
                        _("%(column)s %(value)r %(problem)s")
                        % {"column": name, "value": values[name], "problem": exc},
                    )
                )
        version: int | None = None
        if values.get("price_card_version"):
            try:
                version = int(values["price_card_version"])
            except ValueError:
                problems.append(("price_card_version", _("price_card_version is not a whole number")))
        for name, message in problems:
            errors.append(_LineError(line, key, "bad_value", message + ".", name))
        if problems:
            continue
        rows.append(
            _CsvRow(
                line=line,
                operator=values["operator"],
                record=UsageRecordInput(
                    idempotency_key=key,
                    cluster=values["cluster"],
                    buyer=values["buyer"],
                    cards=cards,
                    start_at=stamps["start_at"],
                    end_at=stamps["end_at"],
                    price_card_version=version,
                    reference=values.get("reference", ""),
                ),
            )
        )
    return rows, errors


def usage_csv_import(*, text: str, now: datetime | None = None) -> UsageImportResult:
    """Read a staff usage CSV and store it through ``usage_record_create_batch``: per operator, in chunks
    of ``CARDHOUR_USAGE_BATCH_MAX``, in one transaction. Any bad line (unreadable here, or refused by the
    service) rolls everything back; the result lists each with its line number."""
    from metering.services.usage import usage_record_create_batch

    rows, errors = parse_usage_csv(text)
    result = UsageImportResult(rows=len(rows) + len(errors), errors=errors, error_count=len(errors))
    slugs = {row.operator for row in rows}
    operators = {o.slug: o for o in Organisation.objects.filter(slug__in=slugs, is_operator=True)}
    per_operator: dict[str, list[_CsvRow]] = defaultdict(list)
    for row in rows:
        if row.operator not in operators:
            result.errors.append(
                _LineError(
                    row.line,
                    row.record.idempotency_key,
                    "unknown_operator",
                    _("No operator organisation %(operator)r.") % {"operator": row.operator},
                    "operator",
                )
            )
            result.error_count += 1
        else:
            per_operator[row.operator].append(row)
    result.operators = len(per_operator)
    if result.errors or not rows:
        result.errors.sort(key=lambda e: e.line)
        return result

    limit = settings.CARDHOUR_USAGE_BATCH_MAX
    now = now or timezone.now()
    with transaction.atomic():
        for slug, group in per_operator.items():
            for offset in range(0, len(group), limit):
                chunk = group[offset : offset + limit]
                try:
                    batch = usage_record_create_batch(
                        operator=operators[slug], records=[row.record for row in chunk], now=now
                    )
                except UsageBatchInvalidError as exc:
                    listed = exc.extra.get("errors", [])
                    for fault in listed:
                        row = chunk[fault["index"]]
                        result.errors.append(
                            _LineError(
                                row.line,
                                row.record.idempotency_key,
                                fault["code"],
                                fault["message"],
                                fault.get("field", ""),
                            )
                        )
                    result.error_count += max(int(exc.extra.get("error_count", len(listed))), len(listed))
                    continue
                result.created += batch.created
                result.duplicates += batch.duplicates
                result.conflicts.extend(
                    (chunk[o.index].line, o.idempotency_key) for o in batch.outcomes if o.status == "conflict"
                )
        if result.errors:
            # The service rolled back its own failed chunks; this undoes the chunks that succeeded.
            transaction.set_rollback(True)
            result.created = result.duplicates = 0
            result.conflicts = []
    result.errors.sort(key=lambda e: e.line)
    return result


@admin.register(UsageRecord)
class UsageRecordAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Usage as operators reported it (or staff imported it). Read-only; rating is re-run with the action."""

    list_display = [
        "id",
        "operator_slug",
        "cluster_cpi",
        "buyer_slug",
        "cards",
        "start",
        "end",
        "is_rated",
        "idempotency_key",
    ]
    list_filter = [RatedFilter, OperatorFilter, BuyerFilter]
    search_fields = ["idempotency_key__exact", "reference__exact"]
    list_select_related = ["operator", "cluster", "buyer"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[UsageRecord]:
        return super().get_queryset(request).with_rated()  # type: ignore[attr-defined]

    fields = readonly_fields = (
        "operator",
        "cluster",
        "buyer",
        "cards",
        "start_at",
        "end_at",
        "card_hours",
        "price_card",
        "idempotency_key",
        "reference",
        "body_hash",
        "received_at",
        "rated_at",
        "rating_transfer",
        "segments_link",
    )
    inlines = [RatedSegmentInline]
    actions = ["rerate_buyers"]
    ordering = ["-id"]
    paginator = _EstimatedCountPaginator
    show_full_result_count = False

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "import-csv/",
                self.admin_site.admin_view(self.import_csv_view),
                name="metering_usagerecord_import_csv",
            ),
            *super().get_urls(),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {
            "can_import_usage": request.user.has_perm("metering.add_usagerecord"),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    @admin.display(description=gettext_lazy("Operator"), ordering="operator__slug")
    def operator_slug(self, obj: UsageRecord) -> str:
        return obj.operator.slug

    @admin.display(description=gettext_lazy("Cluster"), ordering="cluster__cpi")
    def cluster_cpi(self, obj: UsageRecord) -> str:
        return obj.cluster.cpi

    @admin.display(description=gettext_lazy("Buyer"), ordering="buyer__slug")
    def buyer_slug(self, obj: UsageRecord) -> str:
        return obj.buyer.slug

    @admin.display(description=gettext_lazy("Start"), ordering="start_at")
    def start(self, obj: UsageRecord) -> str:
        return _local(obj.start_at)

    @admin.display(description=gettext_lazy("End"), ordering="end_at")
    def end(self, obj: UsageRecord) -> str:
        return _local(obj.end_at)

    @admin.display(description=gettext_lazy("Rated"), boolean=True, ordering="is_rated")
    def is_rated(self, obj: UsageRecord) -> bool:
        annotated = getattr(obj, "is_rated", None)  # get_queryset's with_rated(): no query per row
        return obj.rated_at is not None if annotated is None else bool(annotated)

    @admin.display(description=gettext_lazy("Card-hours"))
    def card_hours(self, obj: UsageRecord) -> str:
        return _card_hours_of_seconds(obj.cards * int((obj.end_at - obj.start_at).total_seconds()))

    @admin.display(description=gettext_lazy("Rated segments"))
    def segments_link(self, obj: UsageRecord) -> SafeString:
        return _link(
            _changelist_url(RatedSegment, usage_record__id__exact=obj.pk), _("In the segment list →")
        )

    def has_rate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("metering.change_usagerecord")

    @admin.action(description=gettext_lazy("Re-run rating for these buyers"), permissions=["rate"])
    def rerate_buyers(self, request: HttpRequest, queryset: QuerySet[UsageRecord]) -> None:
        from metering.services.rating import usage_rate_pending

        buyer_ids = queryset.order_by().values_list("buyer_id", flat=True).distinct()
        buyers = list(Organisation.objects.filter(pk__in=buyer_ids).order_by("slug"))
        rated = 0
        for buyer in buyers:
            try:
                rated += usage_rate_pending(buyer=buyer)
            except DomainError as exc:
                messages.warning(request, f"{buyer.slug}: {exc.message}")
        logger.info(
            "admin re-rating by %s for %s: %s record(s)", request.user, [b.slug for b in buyers], rated
        )
        messages.success(
            request,
            _("Rating re-run for %(n)d buyer(s) (%(buyers)s): %(rated)d unrated record(s) rated.")
            % {"n": len(buyers), "buyers": ", ".join(b.slug for b in buyers), "rated": rated},
        )

    def import_csv_view(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm("metering.add_usagerecord"):
            raise PermissionDenied
        form = UsageImportForm(request.POST or None, request.FILES or None)
        result: UsageImportResult | None = None
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["csv_file"]
            text: str | None = None
            if upload.size > USAGE_CSV_MAX_BYTES:
                form.add_error(
                    "csv_file",
                    _("At most %(mb)d MB per file.") % {"mb": USAGE_CSV_MAX_BYTES // (1024 * 1024)},
                )
            else:
                try:
                    text = upload.read().decode("utf-8-sig")
                except UnicodeDecodeError:
                    form.add_error("csv_file", _("The file is not UTF-8 text."))
            if text is not None:
                result = usage_csv_import(text=text)
                logger.info(
                    "usage CSV import by %s: %s rows, %s created, %s duplicates, %s conflicts, %s errors",
                    request.user,
                    result.rows,
                    result.created,
                    result.duplicates,
                    len(result.conflicts),
                    result.error_count,
                )
                if result.error_count:
                    messages.error(
                        request,
                        _("%(n)d bad line(s): nothing was imported. Fix them and retry.")
                        % {"n": result.error_count},
                    )
                else:
                    messages.success(
                        request,
                        _(
                            "Imported %(rows)d row(s): %(created)d created, %(duplicates)d duplicate(s), "
                            "%(conflicts)d conflict(s)."
                        )
                        % {
                            "rows": result.rows,
                            "created": result.created,
                            "duplicates": result.duplicates,
                            "conflicts": len(result.conflicts),
                        },
                    )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Import usage records (CSV)"),
            "form": form,
            "result": result,
            "errors_shown": result.errors[:USAGE_CSV_ERRORS_SHOWN] if result else [],
            "conflicts_shown": result.conflicts[:USAGE_CSV_ERRORS_SHOWN] if result else [],
            "columns": ",".join(USAGE_CSV_COLUMNS),
            "batch_max": settings.CARDHOUR_USAGE_BATCH_MAX,
            "media": self.media,
        }
        return TemplateResponse(request, "admin/metering/usagerecord/import_csv.html", context)


@admin.register(RatedSegment)
class RatedSegmentAdmin(_SegmentAmountColumns, _ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "usage_link",
        "seq",
        "band",
        "start",
        "card_hours",
        "pack_number",
        "draw",
        "gross_cny",
        "commission_cny",
        "invoiced",
        "settled",
    ]
    list_filter = [
        "band",
        ("invoice", admin.EmptyFieldListFilter),
        ("settlement", admin.EmptyFieldListFilter),
        ("pack", admin.EmptyFieldListFilter),
    ]
    search_fields = ["usage_record__idempotency_key__exact"]
    fields = readonly_fields = (
        "usage_record",
        "seq",
        "band",
        "multiplier",
        "start_at",
        "end_at",
        "card_hours",
        "pack",
        "pack_class",
        "standard_factor",
        "draw",
        "gross_cny",
        "commission_cny",
        "value_cny",
        "transfer",
        "invoice",
        "settlement",
    )
    ordering = ["-id"]
    paginator = _EstimatedCountPaginator
    show_full_result_count = False

    @admin.display(description=gettext_lazy("Usage record"), ordering="usage_record_id")
    def usage_link(self, obj: RatedSegment) -> SafeString:
        url = reverse("admin:metering_usagerecord_change", args=[obj.usage_record_id])
        return _link(url, f"usage {obj.usage_record_id}")

    @admin.display(description=gettext_lazy("Start"), ordering="start_at")
    def start(self, obj: RatedSegment) -> str:
        return _local(obj.start_at)

    @admin.display(description=gettext_lazy("Pack"), ordering="pack_id")
    def pack_number(self, obj: RatedSegment) -> str:
        return "arrears" if obj.pack_id is None else str(obj.pack_id)

    @admin.display(description=gettext_lazy("Invoiced"), boolean=True)
    def invoiced(self, obj: RatedSegment) -> bool:
        return obj.invoice_id is not None

    @admin.display(description=gettext_lazy("Settled"), boolean=True)
    def settled(self, obj: RatedSegment) -> bool:
        return obj.settlement_id is not None


@admin.register(BuyerExhaustion)
class BuyerExhaustionAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["buyer", "pack_class", "raised_at", "cleared_at", "shortfall_display", "usage_number"]
    list_filter = [("cleared_at", admin.EmptyFieldListFilter), "pack_class", BuyerFilter]
    search_fields = ["buyer__slug", "pack_class"]
    list_select_related = ["buyer"]
    fields = readonly_fields = (
        "buyer",
        "pack_class",
        "raised_at",
        "cleared_at",
        "usage_record",
        "shortfall_display",
    )

    @admin.display(description=gettext_lazy("Usage record"), ordering="usage_record_id")
    def usage_number(self, obj: BuyerExhaustion) -> str:
        return "—" if obj.usage_record_id is None else str(obj.usage_record_id)

    @admin.display(description=gettext_lazy("Shortfall"), ordering="shortfall")
    def shortfall_display(self, obj: BuyerExhaustion) -> SafeString:
        return _amount_cell(obj.shortfall, card_hour_unit(obj.pack_class))


# --- Month end ----------------------------------------------------------------------------------------


@admin.register(ReconciliationRun)
class ReconciliationRunAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every ledger reconciliation's outcome (the daily task, or "Run now" on the staff dashboard)."""

    list_display = ["checked_at", "ok", "breach_codes"]
    list_filter = ["ok"]
    date_hierarchy = "checked_at"
    fields = readonly_fields = ("checked_at", "ok", "breaches")

    @admin.display(description=gettext_lazy("Breaches"))
    def breach_codes(self, obj: ReconciliationRun) -> str:
        return ", ".join(f"{b.get('code')} ({b.get('count')})" for b in obj.breaches) or "—"


@admin.register(BillingCloseRun)
class BillingCloseRunAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "__str__",
        "period_start",
        "started_at",
        "finished_at",
        "invoices_issued",
        "settlements_issued",
    ]
    list_filter = [("finished_at", admin.EmptyFieldListFilter)]
    date_hierarchy = "period_start"

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "close/",
                self.admin_site.admin_view(self.close_view),
                name="metering_billingcloserun_close",
            ),
            *super().get_urls(),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"can_close": _can_close(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)

    def close_view(self, request: HttpRequest) -> HttpResponse:
        """Close a month with billing_close_period — the beat task's own service, with its guarantees
        (unique run per period, each statement issued once, resumable) — refusing a month not yet over."""
        from metering.admin_backoffice import close_month

        if not _can_close(request):
            raise PermissionDenied
        return close_month(request, model_admin=self)


class InvoiceLineInline(_ReadOnlyInline):
    model = InvoiceLine
    formset = _LimitedInlineFormSet
    fields = readonly_fields = (
        "seq",
        "kind",
        "description",
        "cluster_cpi",
        "band",
        "pack_number",
        "order_number",
        "card_hours",
        "card_hours_drawn",
        "vat_rate",
        "net_amount",
        "tax_amount",
        "amount",
    )
    ordering = ["seq"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[InvoiceLine]:
        return super().get_queryset(request).select_related("cluster")

    @admin.display(description=gettext_lazy("Cluster"))
    def cluster_cpi(self, obj: InvoiceLine) -> str:
        return obj.cluster.cpi if obj.cluster else "—"

    @admin.display(description=gettext_lazy("Pack"))
    def pack_number(self, obj: InvoiceLine) -> str:
        return "—" if obj.pack_id is None else str(obj.pack_id)

    @admin.display(description=gettext_lazy("Order"))
    def order_number(self, obj: InvoiceLine) -> str:
        return "—" if obj.order_id is None else str(obj.order_id)

    @admin.display(description=gettext_lazy("Card-hours used"))
    def card_hours(self, obj: InvoiceLine) -> str:
        return _card_hours_of_seconds(obj.card_seconds) if obj.card_seconds else "—"


class SettlementLineInline(_ReadOnlyInline):
    model = SettlementLine
    formset = _LimitedInlineFormSet
    fields = readonly_fields = (
        "seq",
        "cluster_cpi",
        "band",
        "prior_period",
        "card_hours",
        "gross",
        "commission",
        "payable",
    )
    ordering = ["seq"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[SettlementLine]:
        return super().get_queryset(request).select_related("cluster")

    @admin.display(description=gettext_lazy("Cluster"))
    def cluster_cpi(self, obj: SettlementLine) -> str:
        return obj.cluster.cpi

    @admin.display(description=gettext_lazy("Card-hours"))
    def card_hours(self, obj: SettlementLine) -> str:
        return _card_hours_of_seconds(obj.card_seconds)


class _StatementDownloadsMixin:
    """CSV and PDF downloads of a final statement, rendered by metering.rendering."""

    admin_site: admin.AdminSite
    model: type[Any]
    render_prefix = ""

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.model._meta.app_label}_{self.model._meta.model_name}"
        return [
            path(
                "<path:object_id>/download/<str:fmt>/",
                self.admin_site.admin_view(self.download_view),
                name=f"{name}_download",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]

    @admin.display(description=gettext_lazy("Download"))
    def downloads(self, obj: Any) -> SafeString:
        name = f"admin:{self.model._meta.app_label}_{self.model._meta.model_name}_download"
        return format_html(
            '<a href="{}">CSV</a>&nbsp;·&nbsp;<a href="{}">PDF</a>',
            reverse(name, args=[obj.pk, "csv"]),
            reverse(name, args=[obj.pk, "pdf"]),
        )

    def download_view(self, request: HttpRequest, object_id: str, fmt: str) -> HttpResponse:
        from metering import rendering
        from metering.services import statements

        if fmt not in ("csv", "pdf"):
            raise Http404("CSV or PDF only.")
        obj = self.get_object(request, object_id)  # type: ignore[attr-defined]
        if obj is None:
            raise Http404(f"No {self.model._meta.verbose_name} {object_id}.")
        if not self.has_view_permission(request, obj):  # type: ignore[attr-defined]
            raise PermissionDenied
        if fmt == "csv":
            body = getattr(rendering, f"{self.render_prefix}_csv")(**{self.render_prefix: obj})
            content_type = "text/csv; charset=utf-8"
        else:  # the PDF exactly as stored at issue
            document = getattr(statements, f"{self.render_prefix}_document")(**{self.render_prefix: obj})
            body, content_type = document.content, document.media_type
        response = HttpResponse(body, content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="{obj.number}.{fmt}"'
        return response


@admin.register(Invoice)
class InvoiceAdmin(_StatementDownloadsMixin, _ReadOnlyAdminMixin, admin.ModelAdmin):
    """A buyer's monthly statement: final once issued (corrections are new credit lines)."""

    render_prefix = "invoice"
    list_display = [
        "number",
        "buyer",
        "period_start",
        "packs_amount",
        "usage_value",
        "refunds_amount",
        "arrears_amount",
        "amount_due",
        "currency",
        "issued_at",
        "downloads",
    ]
    list_filter = [BuyerFilter]
    date_hierarchy = "period_start"
    search_fields = ["number", "buyer__slug"]
    list_select_related = ["buyer"]
    fields = readonly_fields = (
        "number",
        "buyer",
        "period_start",
        "period_end",
        "currency",
        "packs_amount",
        "refunds_amount",
        "usage_value",
        "arrears_amount",
        "total_paid",
        "net_amount",
        "tax_amount",
        "arrears_brought_forward",
        "arrears_settled",
        "amount_due",
        "issued_at",
        "frozen_at",
        "downloads",
    )
    inlines = [InvoiceLineInline]
    actions = ["export_fapiao"]

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "preview/",
                self.admin_site.admin_view(self.preview_view),
                name="metering_invoice_preview",
            ),
            *super().get_urls(),
        ]

    def preview_view(self, request: HttpRequest) -> HttpResponse:
        """A buyer's current-month invoice as it stands, issued nowhere: nothing is written or frozen."""
        from metering.admin_backoffice import invoice_preview_page

        if not self.has_view_permission(request):
            raise PermissionDenied
        return invoice_preview_page(request, model_admin=self)

    @admin.action(description=gettext_lazy("Export fapiao data (CSV) — for the issuing system, not a fapiao"))
    def export_fapiao(self, request: HttpRequest, queryset: QuerySet[Invoice]) -> HttpResponse:
        from metering import fapiao
        from metering.services import statements

        invoices = [statements.invoice_frozen(invoice=i) for i in queryset.order_by("period_start", "number")]
        logger.info("fapiao export by %s: %s invoice(s)", request.user, len(invoices))
        response = HttpResponse(fapiao.fapiao_csv(invoices=invoices), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="fapiao-records.csv"'
        return response


def _can_close(request: HttpRequest) -> bool:
    return request.user.has_perm("metering.add_billingcloserun")


@admin.register(ArrearsSettlement)
class ArrearsSettlementAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Arrears paid from a new pack when it was credited (metering.services.packs); never edited."""

    list_display = [
        "id",
        "buyer",
        "arrears_class",
        "owed_card_hours",
        "pack",
        "drawn_card_hours",
        "factor",
        "money",
        "settled_at",
        "invoice",
    ]
    list_filter = [BuyerFilter]
    list_select_related = ["buyer", "pack", "pack__buyer", "pack__accelerator", "invoice"]
    fields = readonly_fields = (
        "buyer",
        "order",
        "pack",
        "arrears_class",
        "owed_card_hours",
        "drawn_card_hours",
        "factor",
        "prepaid_value_cny",
        "money",
        "transfer",
        "settled_at",
        "invoice",
    )

    @admin.display(description=gettext_lazy("Arrears cleared (card-hours of the chip)"))
    def owed_card_hours(self, obj: ArrearsSettlement) -> Decimal:
        return from_micros(obj.arrears_card_hours)

    @admin.display(description=gettext_lazy("Drawn from the pack (its card-hours)"))
    def drawn_card_hours(self, obj: ArrearsSettlement) -> Decimal:
        return from_micros(obj.pack_draw)

    @admin.display(description=gettext_lazy("Prepaid value used (CNY)"))
    def prepaid_value_cny(self, obj: ArrearsSettlement) -> Decimal:
        return from_micros(obj.prepaid_value)

    @admin.display(description=gettext_lazy("Money owed cleared (CNY)"))
    def money(self, obj: ArrearsSettlement) -> Decimal:
        return from_micros(obj.money_cleared)


@admin.register(Settlement)
class SettlementAdmin(_StatementDownloadsMixin, _ReadOnlyAdminMixin, admin.ModelAdmin):
    """An operator's monthly payout statement: final once issued."""

    render_prefix = "settlement"
    list_display = [
        "number",
        "operator",
        "period_start",
        "gross",
        "commission",
        "payable",
        "currency",
        "issued_at",
        "downloads",
    ]
    list_filter = [OperatorFilter]
    date_hierarchy = "period_start"
    search_fields = ["number", "operator__slug"]
    list_select_related = ["operator"]
    fields = readonly_fields = (
        "number",
        "operator",
        "period_start",
        "period_end",
        "currency",
        "gross",
        "commission",
        "payable",
        "issued_at",
        "downloads",
    )
    inlines = [SettlementLineInline]


@admin.register(StatementDocument)
class StatementDocumentAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """The PDF of each issued statement as stored at issue, with its SHA-256 (never changed: a database
    trigger refuses it). Download it from the statement's own page."""

    list_display = ["__str__", "invoice", "settlement", "size", "sha256", "rendered_at"]
    list_select_related = ["invoice", "settlement"]
    search_fields = ["sha256", "invoice__number", "settlement__number"]
    date_hierarchy = "rendered_at"
    fields = readonly_fields = ("invoice", "settlement", "media_type", "size", "sha256", "rendered_at")


from metering import admin_sla  # noqa: E402,F401  (registers the SLA credit admin)
