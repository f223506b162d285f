"""Operator pages of metering: tariffs (list, detail, new tariff, new version, with a preview strip), a
cluster's price cards, earnings by month, cluster, band and day, and settlements with their CSV and PDF.

Thin views: reads through metering.selectors (scoped to the operator, so another operator's tariff,
cluster or settlement is a 404), writes through metering.services.tariffs with the portal actor. A schedule
is checked by metering.tariffs.tariff_spec_validate, whose faults (each gap and overlap named) are shown
beside the windows; "Preview" runs the same check and draws the strip, and writes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from core.charts import Bar, band_sort_key, band_strip_svg, stacked_bars_svg
from core.portal import portal_view
from federation import selectors as federation_selectors
from federation.errors import ClusterNotFoundError
from metering import rendering
from metering.errors import (
    PriceCardInvalidError,
    PriceCardNotFoundError,
    TariffCodeTakenError,
    TariffInvalidError,
    TariffNotFoundError,
)
from metering.forms.operator import (
    PriceCardForm,
    ScheduleForm,
    TariffCreateForm,
    TariffVersionForm,
    plain_decimal,
    schedule_initial,
    windows_format,
)
from metering.models import Band, PriceCard, Settlement, Tariff, TariffVersion
from metering.selectors import billing as billing_selectors
from metering.selectors import operator as selectors
from metering.selectors import tariffs as tariff_selectors
from metering.services import statements
from metering.services import tariffs as services
from metering.tariffs import (
    CompiledTariff,
    TariffSpec,
    minute_label,
    months_label,
    tariff_compile,
    tariff_spec_validate,
    weekdays_label,
)

PAGE_SIZE = 50


# --- Strips -----------------------------------------------------------------------------------------


def _local_today(time_zone: str) -> date:
    return timezone.now().astimezone(ZoneInfo(time_zone)).date()


def _now_minute(time_zone: str) -> int:
    local = timezone.now().astimezone(ZoneInfo(time_zone))
    return local.hour * 60 + local.minute


def _compiled(version: TariffVersion) -> CompiledTariff:
    """A version's schedule compiled from its prefetched bands and windows (no query)."""
    return tariff_compile(tariff_selectors.tariff_version_spec(version=version))


def _multipliers(version: TariffVersion) -> dict[str, Decimal]:
    return {row.band: plain_decimal(row.multiplier) for row in version.bands.all()}


def _strip(
    compiled: CompiledTariff,
    *,
    day: date,
    multipliers: dict[str, Decimal],
    title: str,
    now_minute: int | None = None,
) -> SafeString:
    return band_strip_svg(
        compiled.day_strip(day), title=title, multipliers=multipliers, now_minute=now_minute
    )


@dataclass(frozen=True)
class StripRun:
    """One run of a day strip as text, for the table under a strip (the numbers behind the picture)."""

    start: str
    end: str
    band: str
    multiplier: Decimal | None


def _runs(compiled: CompiledTariff, day: date, multipliers: dict[str, Decimal]) -> list[StripRun]:
    return [
        StripRun(minute_label(s), minute_label(e), band, multipliers.get(band))
        for s, e, band in compiled.day_strip(day)
    ]


# --- Tariff list and detail -------------------------------------------------------------------------


@dataclass(frozen=True)
class TariffRow:
    tariff: Tariff
    version: TariffVersion | None  # in force now, else the first one (not yet in force)
    in_force: bool
    scheduled: TariffVersion | None  # a later version already published
    multipliers: dict[str, Decimal]
    strip: SafeString | None
    used_by: list[selectors.ClusterPrice]


def _tariff_row(tariff: Tariff, *, now: datetime, used_by: list[selectors.ClusterPrice]) -> TariffRow:
    versions = list(tariff.versions.all())
    current = selectors.tariff_version_in_force(versions=versions, at=now)
    shown = current or (versions[0] if versions else None)
    scheduled = next((v for v in versions if v.effective_from > now), None)
    if shown is None:
        return TariffRow(tariff, None, False, scheduled, {}, None, used_by)
    multipliers = _multipliers(shown)
    today = _local_today(tariff.time_zone)
    strip = _strip(
        _compiled(shown),
        day=today,
        multipliers=multipliers,
        title=_("%(code)s v%(version)d on %(day)s")
        % {"code": tariff.code, "version": shown.version, "day": today.isoformat()},
        now_minute=_now_minute(tariff.time_zone) if current else None,
    )
    return TariffRow(tariff, shown, current is not None, scheduled, multipliers, strip, used_by)


@portal_view("operator")
def tariff_list(request: HttpRequest) -> HttpResponse:
    organisation = request.portal.organisation  # type: ignore[attr-defined]
    now = timezone.now()
    overview = selectors.operator_price_overview(operator=organisation, at=now)
    used_by: dict[int, list[selectors.ClusterPrice]] = defaultdict(list)
    for row in overview:
        if row.card is not None:
            used_by[row.card.tariff_version.tariff_id].append(row)
    page = Paginator(selectors.operator_tariffs(organisation=organisation), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    rows = [_tariff_row(t, now=now, used_by=used_by.get(t.pk, [])) for t in page]
    clusters = Paginator(overview, PAGE_SIZE).get_page(request.GET.get("clusters_page"))
    return render(
        request,
        "metering/operator/tariff_list.html",
        {
            "page": page,
            "own_rows": [r for r in rows if r.tariff.owner_id is not None],
            "preset_rows": [r for r in rows if r.tariff.owner_id is None],
            "clusters": clusters,
            "bands": [b.value for b in Band],
        },
    )


@dataclass(frozen=True)
class WindowRow:
    band: str
    start: str
    end: str
    weekdays: str
    months: str


@dataclass(frozen=True)
class VersionRow:
    version: TariffVersion
    until: datetime | None
    in_force: bool
    multipliers: dict[str, Decimal]
    windows: list[WindowRow]
    windows_text: str
    strip: SafeString
    runs: list[StripRun]


def _parse_day(value: str | None, *, default: date) -> date:
    try:
        day = date.fromisoformat(value) if value else default
    except ValueError:
        return default
    return day if date(1971, 1, 1) <= day <= date(2199, 12, 31) else default


@portal_view("operator")
def tariff_detail(request: HttpRequest, tariff_id: int) -> HttpResponse:
    organisation = request.portal.organisation  # type: ignore[attr-defined]
    tariff = tariff_selectors.tariff_get_for(organisation=organisation, tariff_id=tariff_id)
    now = timezone.now()
    day = _parse_day(request.GET.get("date"), default=_local_today(tariff.time_zone))
    versions = list(tariff.versions.all())
    current = selectors.tariff_version_in_force(versions=versions, at=now)
    rows = []
    for index, version in enumerate(versions):
        compiled = _compiled(version)
        multipliers = _multipliers(version)
        windows = list(version.windows.all())
        rows.append(
            VersionRow(
                version=version,
                until=versions[index + 1].effective_from if index + 1 < len(versions) else None,
                in_force=current is not None and version.pk == current.pk,
                multipliers=multipliers,
                windows=[
                    WindowRow(
                        w.band,
                        minute_label(w.start_minute),
                        minute_label(w.end_minute),
                        weekdays_label(w.weekdays),
                        months_label(w.months),
                    )
                    for w in windows
                ],
                windows_text=windows_format(windows),
                strip=_strip(
                    compiled,
                    day=day,
                    multipliers=multipliers,
                    title=_("%(code)s v%(version)d on %(day)s")
                    % {"code": tariff.code, "version": version.version, "day": day.isoformat()},
                ),
                runs=_runs(compiled, day, multipliers),
            )
        )
    rows.reverse()
    used_by = [
        row
        for row in selectors.operator_price_overview(operator=organisation, at=now)
        if row.card is not None and row.card.tariff_version.tariff_id == tariff.pk
    ]
    return render(
        request,
        "metering/operator/tariff_detail.html",
        {
            "tariff": tariff,
            "is_own": tariff.owner_id is not None,
            "versions": rows,
            "day": day,
            "now": now,
            "used_by": used_by,
        },
    )


# --- New tariff, new version ------------------------------------------------------------------------


@dataclass(frozen=True)
class Preview:
    day: date
    strip: SafeString
    runs: list[StripRun]
    week: list[tuple[date, SafeString]]


def _preview(form: ScheduleForm, spec: TariffSpec, *, default_day: date) -> Preview | None:
    """Validate ``spec`` (faults onto the form) and, when it is valid, draw the preview day and its week."""
    try:
        tariff_spec_validate(spec)
    except TariffInvalidError as exc:
        form.apply_tariff_error(exc)
        return None
    compiled = tariff_compile(spec)
    multipliers = {band: plain_decimal(value) for band, value in spec.multipliers.items()}
    day = form.preview_day(default=default_day)
    monday = day - timedelta(days=day.weekday())
    week = [monday + timedelta(days=i) for i in range(7)]
    return Preview(
        day=day,
        strip=_strip(
            compiled, day=day, multipliers=multipliers, title=_("Preview of %(day)s") % {"day": day}
        ),
        runs=_runs(compiled, day, multipliers),
        week=[
            (d, _strip(compiled, day=d, multipliers=multipliers, title=_("Preview of %(day)s") % {"day": d}))
            for d in week
        ],
    )


def _wants_preview(request: HttpRequest) -> bool:
    return request.POST.get("action") == "preview"


@portal_view("operator", write=True)
def tariff_create(request: HttpRequest) -> HttpResponse:
    portal = request.portal  # type: ignore[attr-defined]
    organisation = portal.organisation
    preview: Preview | None = None
    source_tariff: Tariff | None = None
    if request.method == "POST":
        form = TariffCreateForm(request.POST)
        if form.is_valid() and form.cleaned_spec is not None:
            spec = form.cleaned_spec
            if _wants_preview(request):
                preview = _preview(form, spec, default_day=_local_today(spec.time_zone))
            else:
                try:
                    tariff = services.tariff_create(
                        owner=organisation,
                        code=form.cleaned_data["code"],
                        name=form.cleaned_data["name"],
                        time_zone=spec.time_zone,
                        source=form.cleaned_data["source"],
                        spec=spec,
                        effective_from=form.cleaned_data["effective_from"],
                        actor=portal.actor,
                    )
                except (TariffInvalidError, TariffCodeTakenError) as exc:
                    form.apply_tariff_error(exc)
                else:
                    messages.success(request, _("Tariff %(code)s created.") % {"code": tariff.code})
                    return redirect("operator-tariff-detail", tariff_id=tariff.pk)
    else:
        initial: dict[str, Any] = {"time_zone": "Asia/Shanghai"}
        source_id = request.GET.get("from", "")
        if source_id.isdigit():
            source_tariff = tariff_selectors.tariff_get_for(
                organisation=organisation, tariff_id=int(source_id)
            )
            latest = list(source_tariff.versions.all())[-1:]
            if latest:
                initial.update(
                    schedule_initial(multipliers=_multipliers(latest[0]), windows=latest[0].windows.all())
                )
                initial["time_zone"] = source_tariff.time_zone
        form = TariffCreateForm(initial=initial)
    return render(
        request,
        "metering/operator/tariff_form.html",
        {
            "form": form,
            "preview": preview,
            "tariff": None,
            "source_tariff": source_tariff,
            "time_zones": sorted(available_timezones()),
        },
    )


@portal_view("operator", write=True)
def tariff_version_create(request: HttpRequest, tariff_id: int) -> HttpResponse:
    portal = request.portal  # type: ignore[attr-defined]
    tariff = tariff_selectors.tariff_get_for(organisation=portal.organisation, tariff_id=tariff_id)
    if tariff.owner_id is None:
        raise PermissionDenied(
            _("%(code)s is a platform preset: start your own tariff from it instead.") % {"code": tariff.code}
        )
    versions = list(tariff.versions.all())
    preview: Preview | None = None
    if request.method == "POST":
        form = TariffVersionForm(request.POST, time_zone=tariff.time_zone)
        if form.is_valid() and form.cleaned_spec is not None:
            spec = form.cleaned_spec
            if _wants_preview(request):
                preview = _preview(form, spec, default_day=_local_today(tariff.time_zone))
            else:
                try:
                    version = services.tariff_version_create(
                        tariff=tariff,
                        spec=spec,
                        effective_from=form.cleaned_data["effective_from"],
                        actor=portal.actor,
                    )
                except TariffInvalidError as exc:
                    form.apply_tariff_error(exc)
                else:
                    messages.success(
                        request,
                        _("Version %(version)d of %(code)s published.")
                        % {"version": version.version, "code": tariff.code},
                    )
                    return redirect("operator-tariff-detail", tariff_id=tariff.pk)
    else:
        initial = (
            schedule_initial(multipliers=_multipliers(versions[-1]), windows=versions[-1].windows.all())
            if versions
            else {}
        )
        form = TariffVersionForm(initial=initial, time_zone=tariff.time_zone)
    return render(
        request,
        "metering/operator/tariff_form.html",
        {
            "form": form,
            "preview": preview,
            "tariff": tariff,
            "latest_version": versions[-1] if versions else None,
        },
    )


# --- Price cards ------------------------------------------------------------------------------------


@portal_view("operator", write=True)
def price_cards(request: HttpRequest, cpi: str) -> HttpResponse:
    portal = request.portal  # type: ignore[attr-defined]
    organisation = portal.organisation
    cluster = federation_selectors.cluster_get_for_operator(operator=organisation, cpi=cpi)
    tariffs = tariff_selectors.tariff_list_for(organisation=organisation)
    now = timezone.now()
    try:
        current: PriceCard | None = tariff_selectors.price_card_current(cluster=cluster, at=now)
    except PriceCardNotFoundError:
        current = None
    if request.method == "POST":
        form = PriceCardForm(request.POST, tariffs=tariffs)
        if form.is_valid():
            try:
                card = services.price_card_set(
                    cluster=cluster,
                    rate_per_card_hour=form.cleaned_data["rate_per_card_hour"],
                    tariff=form.cleaned_data["tariff"],
                    effective_from=form.cleaned_data["effective_from"],
                    sla_availability_percent=form.cleaned_data["sla_availability_percent"],
                    sla_credit_schedule=form.cleaned_data["sla_credit_schedule"],
                    actor=portal.actor,
                )
            except (PriceCardInvalidError, TariffNotFoundError, ClusterNotFoundError) as exc:
                form.apply_error(exc)
            else:
                messages.success(
                    request,
                    _("Price card version %(version)d set: %(rate)s CNY per card-hour on %(tariff)s v%(tv)d.")
                    % {
                        "version": card.version,
                        "rate": card.rate_per_card_hour,
                        "tariff": card.tariff_version.tariff.code,
                        "tv": card.tariff_version.version,
                    },
                )
                return redirect("operator-price-cards", cpi=cluster.cpi)
    else:
        initial: dict[str, Any] = {}
        if current is not None:
            initial = {
                "rate_per_card_hour": current.rate_per_card_hour,
                "tariff": current.tariff_version.tariff_id,
                "sla_availability_percent": current.sla_availability_percent,
                "sla_credit_schedule": PriceCardForm.schedule_text(current.sla_credit_schedule),
            }
        form = PriceCardForm(initial=initial, tariffs=tariffs)
    page = Paginator(selectors.price_card_history(cluster=cluster), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    strip = None
    if current is not None:
        version = current.tariff_version
        compiled = tariff_selectors.compiled_tariff(tariff_version_id=version.pk)
        multipliers = {
            band: plain_decimal(Decimal(value).scaleb(-4))
            for band, value in zip(compiled.bands, compiled.multipliers_e4, strict=True)
        }
        zone = version.tariff.time_zone
        today = _local_today(zone)
        strip = _strip(
            compiled,
            day=today,
            multipliers=multipliers,
            title=_("%(code)s v%(version)d on %(day)s")
            % {"code": version.tariff.code, "version": version.version, "day": today.isoformat()},
            now_minute=_now_minute(zone),
        )
        strip_rates = [
            (band, multipliers[band], current.rate_per_card_hour * multipliers[band])
            for band in sorted(multipliers, key=band_sort_key)
        ]
    else:
        strip_rates = []
    return render(
        request,
        "metering/operator/price_cards.html",
        {
            "cluster": cluster,
            "form": form,
            "page": page,
            "current": current,
            "strip": strip,
            "strip_rates": strip_rates,
            "now": now,
        },
    )


# --- Earnings and settlements -----------------------------------------------------------------------


def _period_param(value: str | None) -> date | None:
    try:
        return date.fromisoformat(f"{value}-01") if value else None
    except ValueError:
        return None


@portal_view("operator")
def earnings(request: HttpRequest) -> HttpResponse:
    organisation = request.portal.organisation  # type: ignore[attr-defined]
    now = timezone.now()
    open_periods = selectors.operator_open_earnings(operator=organisation, now=now)
    current = open_periods[-1]
    wanted = _period_param(request.GET.get("period"))
    selected = next((p for p in open_periods if p.period_start == wanted), None)
    if selected is None and wanted is not None:
        selected = selectors.settlement_of_period(operator=organisation, period_start=wanted)
    selected = selected or current
    days = selectors.operator_earnings_by_day(operator=organisation, period_start=selected.period_start)
    series = sorted({band for d in days for band in d.payable_by_band}, key=band_sort_key)
    chart = stacked_bars_svg(
        [Bar(label=str(d.day.day), values=d.payable_by_band) for d in days],
        series=series,
        title=_("Your share by day and band, %(month)s (CNY)")
        % {"month": selected.period_start.strftime("%Y-%m")},
        unit="CNY",
    )
    settlements = Paginator(
        billing_selectors.settlement_list_for(operator=organisation).prefetch_related(None), PAGE_SIZE
    ).get_page(request.GET.get("page"))
    return render(
        request,
        "metering/operator/earnings.html",
        {
            "current": current,
            "open_periods": list(reversed(open_periods)),
            "selected": selected,
            "days": [(d, [d.payable_by_band.get(b) for b in series]) for d in days if d.payable_by_band],
            "series": series,
            "chart": chart,
            "settlements": settlements,
        },
    )


@portal_view("operator")
def settlement_detail(request: HttpRequest, settlement_id: int) -> HttpResponse:
    organisation = request.portal.organisation  # type: ignore[attr-defined]
    settlement = billing_selectors.settlement_get_for(operator=organisation, settlement_id=settlement_id)
    lines = list(settlement.lines.all())
    return render(
        request,
        "metering/operator/settlement_detail.html",
        {
            "settlement": settlement,
            "lines": [(line, Decimal(line.card_seconds) / 3600) for line in lines],
            "card_seconds": sum(line.card_seconds for line in lines),
            "card_hours": Decimal(sum(line.card_seconds for line in lines)) / 3600,
        },
    )


def _download(content: bytes, *, settlement: Settlement, extension: str, content_type: str) -> HttpResponse:
    response = HttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{settlement.number}.{extension}"'
    return response


@portal_view("operator")
def settlement_csv(request: HttpRequest, settlement_id: int) -> HttpResponse:
    organisation = request.portal.organisation  # type: ignore[attr-defined]
    settlement = billing_selectors.settlement_get_for(operator=organisation, settlement_id=settlement_id)
    return _download(
        rendering.settlement_csv(settlement=settlement),
        settlement=settlement,
        extension="csv",
        content_type="text/csv; charset=utf-8",
    )


@portal_view("operator")
def settlement_pdf(request: HttpRequest, settlement_id: int) -> HttpResponse:
    organisation = request.portal.organisation  # type: ignore[attr-defined]
    settlement = billing_selectors.settlement_get_for(operator=organisation, settlement_id=settlement_id)
    document = statements.settlement_document(settlement=settlement)
    response = _download(
        document.content, settlement=settlement, extension="pdf", content_type=document.media_type
    )
    response["ETag"] = f'"{document.sha256}"'
    return response


urlpatterns: list[URLPattern] = [
    path("operator/tariffs/", tariff_list, name="operator-tariff-list"),
    path("operator/tariffs/new/", tariff_create, name="operator-tariff-create"),
    path("operator/tariffs/<int:tariff_id>/", tariff_detail, name="operator-tariff-detail"),
    path(
        "operator/tariffs/<int:tariff_id>/versions/new/",
        tariff_version_create,
        name="operator-tariff-version-create",
    ),
    path("operator/clusters/<str:cpi>/price-cards/", price_cards, name="operator-price-cards"),
    path("operator/earnings/", earnings, name="operator-earnings"),
    path("operator/settlements/<int:settlement_id>/", settlement_detail, name="operator-settlement-detail"),
    path("operator/settlements/<int:settlement_id>/csv/", settlement_csv, name="operator-settlement-csv"),
    path("operator/settlements/<int:settlement_id>/pdf/", settlement_pdf, name="operator-settlement-pdf"),
]
