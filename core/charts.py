"""Charts drawn on the server as SVG: no JavaScript, no CDN, readable by screen readers (each chart has a
``<title>`` and the numbers are always on the page or in a CSV beside it).

Three shapes cover the portal: a 24-hour band strip (a tariff's valley / flat / peak day), stacked bars
(card-hours per day by band, revenue by band) and a line or area series (utilisation over time, a
balance's forecast). Values are Decimal or int; coordinates are rounded to 0.1 px.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from html import escape

from django.utils.functional import Promise
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

# Band colours. The common bands have fixed colours everywhere (strips, bars, legends) so a person learns
# them once; any other band name gets the next colour of the fallback palette. All pass 3:1 against white.
BAND_COLOURS: dict[str, str] = {
    "valley": "#1b7f5a",
    "deep_valley": "#0f5c40",
    "flat": "#c28a00",
    "shoulder": "#c28a00",
    "peak": "#c2410c",
    "critical": "#8f1d1d",
    "critical_peak": "#8f1d1d",
    "sharp": "#8f1d1d",
}
_FALLBACK = ("#4455aa", "#7a4fa8", "#2f7f9f", "#8a6d3b", "#5f6b7a")
BAND_ORDER = ("deep_valley", "valley", "flat", "shoulder", "peak", "critical_peak", "critical", "sharp")

# What a person reads for a band, in their language; the stored names (``critical_peak``) stay in the
# database, the API and CSV files. metering.models.Band carries the same labels for its choices (core cannot
# import metering); a band name outside this table is an operator's own and is shown as written.
BAND_LABELS: dict[str, Promise] = {
    "critical_peak": _("Critical peak"),
    "peak": _("Peak"),
    "flat": _("Flat"),
    "valley": _("Valley"),
    "deep_valley": _("Deep valley"),
}


def band_label(band: str) -> str:
    """The human name of ``band`` in the active language: "Critical peak" / "尖峰" for ``critical_peak``."""
    label = BAND_LABELS.get(band)
    return str(label) if label is not None else band


def band_colour(band: str, *, _seen: dict[str, str] = {}) -> str:  # noqa: B006 (a deliberate memo)
    if band in BAND_COLOURS:
        return BAND_COLOURS[band]
    if band not in _seen:
        _seen[band] = _FALLBACK[len(_seen) % len(_FALLBACK)]
    return _seen[band]


def band_sort_key(band: str) -> tuple[int, str]:
    return (BAND_ORDER.index(band) if band in BAND_ORDER else len(BAND_ORDER), band)


def _n(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _svg(width: int, height: int, title: str, body: list[str], *, css_class: str) -> SafeString:
    return mark_safe(  # noqa: S308 (every interpolated text is escaped below)
        f'<svg class="chart {css_class}" viewBox="0 0 {width} {height}" role="img" '
        f'preserveAspectRatio="none" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>{''.join(body)}</svg>"
    )


def band_strip_svg(
    runs: Sequence[tuple[int, int, str]],
    *,
    title: str,
    multipliers: Mapping[str, Decimal] | None = None,
    width: int = 480,
    height: int = 28,
    now_minute: int | None = None,
) -> SafeString:
    """A 24-hour strip: ``runs`` are (start_minute, end_minute, band) over 0–1440 (what
    ``CompiledTariff.day_strip`` returns). Each run has a tooltip with its hours, band and multiplier; hour
    ticks every 6 h; ``now_minute`` draws a marker."""
    body: list[str] = []
    chart_height = height - 10
    for start, end, band in runs:
        x = start / 1440 * width
        w = (end - start) / 1440 * width
        label = f"{start // 60:02d}:{start % 60:02d}–{end // 60:02d}:{end % 60:02d} {band_label(band)}"
        if multipliers and band in multipliers:
            label += f" ×{multipliers[band]}"
        body.append(
            f'<rect x="{_n(x)}" y="0" width="{_n(w)}" height="{chart_height}" fill="{band_colour(band)}">'
            f"<title>{escape(label)}</title></rect>"
        )
    for hour in (6, 12, 18):
        x = hour / 24 * width
        body.append(
            f'<line x1="{_n(x)}" y1="{chart_height}" x2="{_n(x)}" y2="{height}" stroke="#555" '
            'stroke-width="1"/>'
        )
    if now_minute is not None:
        x = now_minute / 1440 * width
        body.append(
            f'<line class="now" x1="{_n(x)}" y1="0" x2="{_n(x)}" y2="{chart_height}" stroke="#111" '
            'stroke-width="2"/>'
        )
    return _svg(width, height, title, body, css_class="band-strip")


@dataclass(frozen=True)
class Bar:
    """One bar of a stacked chart: its label (shown under it) and its value per series."""

    label: str
    values: Mapping[str, Decimal]


def stacked_bars_svg(
    bars: Sequence[Bar],
    *,
    title: str,
    series: Sequence[str],
    unit: str = "",
    colours: Mapping[str, str] | None = None,
    width: int = 720,
    height: int = 240,
) -> SafeString:
    """Vertical stacked bars, one per ``bars`` entry, stacked in ``series`` order from the bottom, with a
    y axis (0 and the maximum) and every bar's total in its tooltip."""
    left, bottom, top = 48, 22, 8
    plot_w, plot_h = width - left - 4, height - bottom - top
    totals = [sum((b.values.get(s, Decimal(0)) for s in series), Decimal(0)) for b in bars]
    peak = max(totals, default=Decimal(0)) or Decimal(1)
    body = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 4}" y2="{top + plot_h}" stroke="#777"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" class="axis">{escape(_short(peak))}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="axis">0</text>',
    ]
    if not bars:
        return _svg(width, height, title, body, css_class="stacked-bars")
    slot = plot_w / len(bars)
    bar_w = max(slot * 0.72, 1.0)
    label_every = max(1, round(len(bars) / 12))
    for i, (bar, total) in enumerate(zip(bars, totals, strict=True)):
        x = left + i * slot + (slot - bar_w) / 2
        y = float(top + plot_h)
        parts = []
        for name in series:
            value = bar.values.get(name, Decimal(0))
            if value <= 0:
                continue
            h = float(value / peak) * plot_h
            y -= h
            colour = (colours or {}).get(name) or band_colour(name)
            parts.append(
                f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(bar_w)}" height="{_n(h)}" fill="{colour}">'
                f"<title>{escape(f'{bar.label} {band_label(name)}: {value} {unit}'.strip())}</title></rect>"
            )
        body.append(f"<g><title>{escape(f'{bar.label}: {total} {unit}'.strip())}</title>{''.join(parts)}</g>")
        if i % label_every == 0:
            body.append(
                f'<text x="{_n(x + bar_w / 2)}" y="{height - 6}" text-anchor="middle" class="axis">'
                f"{escape(bar.label)}</text>"
            )
    return _svg(width, height, title, body, css_class="stacked-bars")


def line_svg(
    points: Sequence[tuple[str, Decimal]],
    *,
    title: str,
    unit: str = "",
    maximum: Decimal | None = None,
    width: int = 720,
    height: int = 200,
    area: bool = True,
    colour: str = "#2f5fb3",
) -> SafeString:
    """A line (shaded beneath when ``area``) through ``points`` (label, value), evenly spaced, on an axis
    from 0 to ``maximum`` (default: the largest value)."""
    left, bottom, top = 48, 22, 8
    plot_w, plot_h = width - left - 4, height - bottom - top
    peak = maximum if maximum is not None else max((v for _, v in points), default=Decimal(0))
    peak = peak or Decimal(1)
    body = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 4}" y2="{top + plot_h}" stroke="#777"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" class="axis">{escape(_short(peak))}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="axis">0</text>',
    ]
    if points:
        step = plot_w / max(len(points) - 1, 1)
        coords = [
            (left + i * step, top + plot_h - float(min(v, peak) / peak) * plot_h)
            for i, (_, v) in enumerate(points)
        ]
        path = " ".join(f"{_n(x)},{_n(y)}" for x, y in coords)
        if area:
            body.append(
                f'<polygon points="{_n(coords[0][0])},{top + plot_h} {path} '
                f'{_n(coords[-1][0])},{top + plot_h}" fill="{colour}" fill-opacity="0.18"/>'
            )
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        label_every = max(1, round(len(points) / 8))
        for i, ((label, value), (x, y)) in enumerate(zip(points, coords, strict=True)):
            body.append(
                f'<circle cx="{_n(x)}" cy="{_n(y)}" r="2.5" fill="{colour}">'
                f"<title>{escape(f'{label}: {value} {unit}'.strip())}</title></circle>"
            )
            if i % label_every == 0:
                body.append(
                    f'<text x="{_n(x)}" y="{height - 6}" text-anchor="middle" class="axis">'
                    f"{escape(label)}</text>"
                )
    return _svg(width, height, title, body, css_class="line")


def _short(value: Decimal) -> str:
    value = Decimal(str(value))
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 10_000:
        return f"{value / 1_000:.0f}k"
    if value == value.to_integral_value():
        return f"{value:.0f}"
    return f"{value:.2f}"


@dataclass(frozen=True)
class Series:
    """One line of a :func:`series_svg` chart: a value per x position (None leaves a gap), and marks
    (position, kind, tooltip) drawn on it: ``"chosen"`` a filled dot, ``"earliest"`` a ring."""

    label: str
    colour: str
    values: Sequence[Decimal | None]
    marks: Sequence[tuple[int, str, str]] = ()


SERIES_COLOURS = ("#2f5fb3", "#c2410c", "#1b7f5a", "#7a4fa8")


def series_svg(
    series: Sequence[Series],
    *,
    title: str,
    ticks: Sequence[tuple[int, str]],
    prefix: str = "",
    width: int = 720,
    height: int = 200,
) -> SafeString:
    """Lines over a shared x axis of evenly spaced positions (every series has the same number of values),
    on a y axis from 0 to the largest value (labelled with ``prefix``, e.g. "¥"), with ``ticks``
    (position, label) under the axis. The chart
    keeps its aspect ratio when scaled, so its text stays legible on a phone."""
    left, bottom, top, right = 52, 22, 10, 8
    plot_w, plot_h = width - left - right, height - bottom - top
    count = max((len(s.values) for s in series), default=0)
    values = [v for s in series for v in s.values if v is not None]
    peak = max(values, default=Decimal(0)) or Decimal(1)

    def x(i: int) -> float:
        return left + (i / max(count - 1, 1)) * plot_w

    def y(value: Decimal) -> float:
        return top + plot_h - float(value / peak) * plot_h

    body = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" stroke="#777"/>',
        f'<line x1="{left}" y1="{top}" x2="{width - right}" y2="{top}" stroke="#e3e7ee"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" class="axis">'
        f"{escape(prefix + _short(peak))}</text>",
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="axis">0</text>',
    ]
    for position, label in ticks:
        # A label near either end is anchored inside the chart, not cut off by its edge.
        anchor = (
            "start" if x(position) < left + 20 else "end" if x(position) > width - right - 20 else "middle"
        )
        body.append(
            f'<line x1="{_n(x(position))}" y1="{top + plot_h}" x2="{_n(x(position))}" y2="{top + plot_h + 4}" '
            'stroke="#777"/>'
            f'<text x="{_n(x(position))}" y="{height - 6}" text-anchor="{anchor}" class="axis">'
            f"{escape(label)}</text>"
        )
    for line in series:
        runs: list[list[str]] = [[]]
        for i, value in enumerate(line.values):
            if value is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append(f"{_n(x(i))},{_n(y(value))}")
        parts = [
            f'<polyline points="{" ".join(run)}" fill="none" stroke="{line.colour}" stroke-width="2"/>'
            for run in runs
            if run
        ]
        for position, kind, text in line.marks:
            value = line.values[position] if 0 <= position < len(line.values) else None
            if value is None:
                continue
            fill = line.colour if kind == "chosen" else "#fff"
            parts.append(
                f'<circle class="mark-{escape(kind)}" cx="{_n(x(position))}" cy="{_n(y(value))}" r="4.5" '
                f'fill="{fill}" stroke="{line.colour}" stroke-width="2"><title>{escape(text)}</title></circle>'
            )
        body.append(f"<g><title>{escape(line.label)}</title>{''.join(parts)}</g>")
    return mark_safe(  # noqa: S308 (every interpolated text is escaped)
        f'<svg class="chart series" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>{"".join(body)}</svg>'
    )
