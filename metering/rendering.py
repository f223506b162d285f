"""Statements as files: invoices and settlements to CSV and PDF.

CSV: UTF-8 *with* a byte-order mark. Buyers and operators here open statements in Excel or WPS, which read
a BOM-less file as GBK and garble Chinese names; every CSV library reads the BOM (Python's ``utf-8-sig``,
pandas). One header row, one row per line, then one row per total (``kind`` = ``total:<name>``). Amounts are
the statement's stored, already quantised values: the file adds up exactly like the statement.

PDF: ReportLab, A4, a statement's header (platform, number, period, party and billing details), its lines
and its totals; a long statement continues on further pages. Chinese text needs a CJK font: the first of
``CARDHOUR_PDF_FONT`` (a setting, optional) and a few well-known system paths that ReportLab can load is
embedded. When none is installed, Latin text is set in Helvetica and any text outside Latin-1 in Adobe's
STSong-Light CID font, which is referenced but *not embedded*: PDF viewers substitute their own Simplified
Chinese font (Acrobat, pdf.js, Preview and Chrome all do), so the file stays small and still legible.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone
from reportlab.lib import colors
from reportlab.lib.enums import TA_RIGHT
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.cidfonts import UnicodeCIDFont
from reportlab.pdfbase.ttfonts import TTFError, TTFont
from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle
from reportlab.platypus.flowables import Flowable

from metering.models import Band, Invoice, InvoiceLine, Settlement

PLATFORM_NAME = "Cardhour"
CSV_ENCODING = "utf-8-sig"

_CJK_FONT_CANDIDATES = (
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/wqy-microhei/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/arphic/uming.ttc",
    "/usr/share/fonts/truetype/noto/NotoSansSC-Regular.ttf",
    "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf",
    "/System/Library/Fonts/STHeiti Light.ttc",
    "C:/Windows/Fonts/simhei.ttf",
)
_CID_FALLBACK = "STSong-Light"


# --- CSV --------------------------------------------------------------------------------------------


def _csv(rows: Iterable[Sequence[Any]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    for row in rows:
        writer.writerow(["" if value is None else value for value in row])
    return buffer.getvalue().encode(CSV_ENCODING)


def _band(value: str) -> str:
    return str(Band(value).label) if value else ""


def invoice_csv(*, invoice: Invoice) -> bytes:
    """The invoice as CSV (UTF-8 with BOM): header, lines, totals."""
    currency = invoice.currency
    rows: list[Sequence[Any]] = [
        [
            "invoice",
            "seq",
            "kind",
            "description",
            "cluster",
            "band",
            "card_seconds",
            "card_hours_drawn",
            "amount",
            "currency",
        ]
    ]
    for line in _invoice_lines(invoice):
        rows.append(
            [
                invoice.number,
                line.seq,
                line.kind,
                line.description,
                line.cluster.cpi if line.cluster_id and line.cluster else "",
                line.band,
                line.card_seconds,
                line.card_hours_drawn,
                line.amount,
                currency,
            ]
        )
    for name, label, amount in _invoice_totals(invoice):
        rows.append([invoice.number, "", f"total:{name}", label, "", "", "", "", amount, currency])
    return _csv(rows)


def settlement_csv(*, settlement: Settlement) -> bytes:
    """The settlement as CSV (UTF-8 with BOM): header, lines, totals."""
    currency = settlement.currency
    rows: list[Sequence[Any]] = [
        [
            "settlement",
            "seq",
            "cluster",
            "band",
            "prior_period",
            "card_seconds",
            "gross",
            "commission",
            "payable",
            "currency",
        ]
    ]
    for line in settlement.lines.all():
        rows.append(
            [
                settlement.number,
                line.seq,
                line.cluster.cpi,
                line.band,
                "yes" if line.prior_period else "no",
                line.card_seconds,
                line.gross,
                line.commission,
                line.payable,
                currency,
            ]
        )
    card_seconds = sum(line.card_seconds for line in settlement.lines.all())
    rows.append(
        [
            settlement.number,
            "",
            "total",
            "",
            "",
            card_seconds,
            settlement.gross,
            settlement.commission,
            settlement.payable,
            currency,
        ]
    )
    return _csv(rows)


def _invoice_lines(invoice: Invoice) -> list[InvoiceLine]:
    return list(invoice.lines.all())


def _invoice_totals(invoice: Invoice) -> list[tuple[str, str, Decimal]]:
    return [
        ("packs_amount", "Packs bought", invoice.packs_amount),
        ("refunds_amount", "Refunds (credit)", invoice.refunds_amount),
        ("total_paid", "Paid through Stripe, net", invoice.total_paid),
        ("usage_value", "Prepaid value used (informational)", invoice.usage_value),
        ("arrears_amount", "Card-hours used with no pack", invoice.arrears_amount),
        ("amount_due", "Amount due", invoice.amount_due),
    ]


# --- PDF --------------------------------------------------------------------------------------------


@cache
def _fonts() -> tuple[str, str | None]:
    """(font for all text, font for non-Latin-1 text or None when the first covers it)."""
    configured = getattr(settings, "CARDHOUR_PDF_FONT", "") or ""
    for candidate in (configured, *_CJK_FONT_CANDIDATES):
        if not candidate or not Path(candidate).is_file():
            continue
        try:
            kwargs = {"subfontIndex": 0} if candidate.lower().endswith(".ttc") else {}
            pdfmetrics.registerFont(TTFont("CardhourCJK", candidate, **kwargs))
        except (TTFError, OSError, ValueError):
            continue  # e.g. CFF-outline OpenType, which ReportLab cannot embed
        return "CardhourCJK", None
    pdfmetrics.registerFont(UnicodeCIDFont(_CID_FALLBACK))
    return "Helvetica", _CID_FALLBACK


def _font_for(text: str) -> str:
    base, wide = _fonts()
    if wide is not None and any(ord(ch) > 0xFF for ch in text):
        return wide
    return base


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Styles:
    def __init__(self) -> None:
        sample = getSampleStyleSheet()
        self.title = ParagraphStyle("title", parent=sample["Title"], alignment=0, fontSize=16, spaceAfter=2)
        self.normal = ParagraphStyle("normal", parent=sample["Normal"], fontSize=9, leading=11)
        self.small = ParagraphStyle("small", parent=self.normal, fontSize=7.5, leading=9)
        self.right = ParagraphStyle("right", parent=self.normal, alignment=TA_RIGHT)
        self.bold_right = ParagraphStyle("bold_right", parent=self.right)

    def para(self, text: object, style: ParagraphStyle, *, bold: bool = False) -> Paragraph:
        value = "" if text is None else str(text)
        font = _font_for(value)
        if bold and font == "Helvetica":
            font = "Helvetica-Bold"
        return Paragraph(_escape(value), ParagraphStyle(f"{style.name}-{font}", parent=style, fontName=font))


def _party_details(organisation: Any, *, with_billing_profile: bool) -> list[str]:
    lines = [f"{organisation.name} ({organisation.slug})"]
    profile = getattr(organisation, "billing_profile", None) if with_billing_profile else None
    if profile is not None:
        lines += [
            value
            for value in (
                profile.legal_name,
                f"Tax id: {profile.tax_id}" if profile.tax_id else "",
                *(profile.address.splitlines() if profile.address else ()),
                profile.billing_email,
            )
            if value
        ]
    return lines


def _money(amount: Decimal) -> str:
    return f"{amount:,.2f}"


def _header(
    styles: _Styles, *, kind: str, number: str, period: str, party_label: str, party: list[str], issued: str
) -> list[Flowable]:
    left = [styles.para(f"{PLATFORM_NAME} — {kind}", styles.title, bold=True)]
    left += [styles.para(f"{party_label}:", styles.normal, bold=True)]
    left += [styles.para(line, styles.normal) for line in party]
    right = [
        styles.para(f"{kind} {number}", styles.right, bold=True),
        styles.para(f"Period: {period}", styles.right),
        styles.para(f"Issued: {issued}", styles.right),
    ]
    table = Table([[left, right]], colWidths=[110 * mm, 70 * mm])
    table.setStyle(TableStyle([("VALIGN", (0, 0), (-1, -1), "TOP"), ("LEFTPADDING", (0, 0), (-1, -1), 0)]))
    return [table, Spacer(1, 6 * mm)]


_TABLE_STYLE = [
    ("LINEBELOW", (0, 0), (-1, 0), 0.6, colors.black),
    ("VALIGN", (0, 0), (-1, -1), "TOP"),
    ("ROWBACKGROUNDS", (0, 1), (-1, -1), [colors.white, colors.HexColor("#f4f4f4")]),
    ("LEFTPADDING", (0, 0), (-1, -1), 3),
    ("RIGHTPADDING", (0, 0), (-1, -1), 3),
]


def _period(start: Any, end: Any) -> str:
    return f"{start:%Y-%m-%d} to {end:%Y-%m-%d} (exclusive), {settings.CARDHOUR_BILLING_TIME_ZONE}"


def _issued(at: Any) -> str:
    return f"{timezone.localtime(at):%Y-%m-%d %H:%M %Z}"


def _document(title: str, story: list[Flowable]) -> bytes:
    buffer = io.BytesIO()
    doc = SimpleDocTemplate(
        buffer,
        pagesize=A4,
        leftMargin=15 * mm,
        rightMargin=15 * mm,
        topMargin=15 * mm,
        bottomMargin=15 * mm,
        title=title,
        author=PLATFORM_NAME,
        subject=title,
    )
    doc.build(story)
    return buffer.getvalue()


def invoice_pdf(*, invoice: Invoice) -> bytes:
    """The invoice as a PDF: header (platform, number, period, buyer and billing profile), lines, totals."""
    styles = _Styles()
    story = _header(
        styles,
        kind="Invoice",
        number=invoice.number,
        period=_period(invoice.period_start, invoice.period_end),
        party_label="Billed to",
        party=_party_details(invoice.buyer, with_billing_profile=True),
        issued=_issued(invoice.issued_at),
    )
    rows: list[list[Any]] = [
        [
            styles.para(text, styles.right if numeric else styles.normal, bold=True)
            for text, numeric in (
                ("#", False),
                ("Description", False),
                ("Card-seconds", True),
                ("Card-hours drawn", True),
                (f"Amount ({invoice.currency})", True),
            )
        ]
    ]
    for line in _invoice_lines(invoice):
        rows.append(
            [
                styles.para(line.seq, styles.normal),
                styles.para(line.description, styles.normal),
                styles.para(f"{line.card_seconds:,}" if line.card_seconds else "", styles.right),
                styles.para(f"{line.card_hours_drawn:,.6f}" if line.card_hours_drawn else "", styles.right),
                styles.para(_money(line.amount), styles.right),
            ]
        )
    if len(rows) == 1:
        rows.append(["", styles.para("Nothing to state for this period.", styles.normal), "", "", ""])
    table = Table(rows, colWidths=[10 * mm, 94 * mm, 24 * mm, 26 * mm, 26 * mm], repeatRows=1)
    table.setStyle(TableStyle(_TABLE_STYLE))
    story += [table, Spacer(1, 6 * mm)]

    totals = [
        [
            styles.para(label, styles.right, bold=name == "amount_due"),
            styles.para(_money(amount), styles.right, bold=name == "amount_due"),
        ]
        for name, label, amount in _invoice_totals(invoice)
    ]
    totals_table = Table(totals, colWidths=[80 * mm, 30 * mm], hAlign="RIGHT")
    totals_table.setStyle(TableStyle([("LINEABOVE", (0, -1), (-1, -1), 0.6, colors.black)]))
    story += [
        totals_table,
        Spacer(1, 6 * mm),
        styles.para(
            "Packs are paid through Stripe when bought; usage drawn from packs is shown at the prepaid value "
            "it used and is not charged again. The amount due is card-hours used with no pack, at the "
            "operator's price. Lines are rounded to the fen (half to even); totals are sums of the lines.",
            styles.small,
        ),
    ]
    return _document(f"Invoice {invoice.number}", story)


def settlement_pdf(*, settlement: Settlement) -> bytes:
    """The settlement as a PDF: header (platform, number, period, operator), lines by cluster and band,
    totals of gross, commission and payable."""
    styles = _Styles()
    story = _header(
        styles,
        kind="Settlement",
        number=settlement.number,
        period=_period(settlement.period_start, settlement.period_end),
        party_label="Payable to",
        party=_party_details(settlement.operator, with_billing_profile=False),
        issued=_issued(settlement.issued_at),
    )
    head = ("#", "Cluster", "Band", "Card-seconds", "Gross", "Commission", "Payable")
    rows: list[list[Any]] = [
        [
            styles.para(text, styles.right if index >= 3 else styles.normal, bold=True)
            for index, text in enumerate(head)
        ]
    ]
    lines = list(settlement.lines.all())
    for line in lines:
        cluster = line.cluster.cpi + (" (late, earlier period)" if line.prior_period else "")
        rows.append(
            [
                styles.para(line.seq, styles.normal),
                styles.para(cluster, styles.normal),
                styles.para(_band(line.band), styles.normal),
                styles.para(f"{line.card_seconds:,}", styles.right),
                styles.para(_money(line.gross), styles.right),
                styles.para(_money(line.commission), styles.right),
                styles.para(_money(line.payable), styles.right),
            ]
        )
    rows.append(
        [
            "",
            styles.para("Total", styles.normal, bold=True),
            "",
            styles.para(f"{sum(line.card_seconds for line in lines):,}", styles.right, bold=True),
            styles.para(_money(settlement.gross), styles.right, bold=True),
            styles.para(_money(settlement.commission), styles.right, bold=True),
            styles.para(_money(settlement.payable), styles.right, bold=True),
        ]
    )
    table = Table(
        rows, colWidths=[10 * mm, 62 * mm, 22 * mm, 24 * mm, 22 * mm, 22 * mm, 22 * mm], repeatRows=1
    )
    table.setStyle(TableStyle([*_TABLE_STYLE, ("LINEABOVE", (0, -1), (-1, -1), 0.6, colors.black)]))
    story += [
        table,
        Spacer(1, 6 * mm),
        styles.para(
            f"Amounts in {settlement.currency}. Payable = gross − platform commission. Lines are rounded to "
            "the fen (half to even); totals are sums of the lines.",
            styles.small,
        ),
    ]
    return _document(f"Settlement {settlement.number}", story)
