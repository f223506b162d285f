"""Statements as files: invoices and settlements to CSV and PDF.

CSV: UTF-8 *with* a byte-order mark. Buyers and operators here open statements in Excel or WPS, which read
a BOM-less file as GBK and garble Chinese names; every CSV library reads the BOM (Python's ``utf-8-sig``,
pandas). One header row, one row per line, then one row per total (``kind`` = ``total:<name>``). Amounts are
the statement's stored, already quantised values: the file adds up exactly like the statement.

PDF: ReportLab, A4, a statement's header (seller, number, period, the other party's details as frozen at
issue), its lines and its totals; a long statement continues on further pages. Every glyph is set in one
embedded TrueType font: ``CARDHOUR_PDF_FONT`` when set, else WenQuanYi Micro Hei, which ships inside this
package (metering/fonts, Apache-2.0), so Chinese names, the minus sign and ¥ render the same in every viewer
on every host — no font is merely referenced. ReportLab embeds only the glyphs used (a subset), so a
statement stays a few tens of kB.

The parties shown come from the statement's ``parties`` snapshot (metering.services.statements freezes it at
issue), never from the organisation as it is today: renaming a buyer does not change an issued invoice.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from reportlab.lib import colors
from reportlab.lib.enums import TA_RIGHT
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.ttfonts import TTFError, TTFont
from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle
from reportlab.platypus.flowables import Flowable

from metering.models import Band, Invoice, InvoiceLine, Settlement

PLATFORM_NAME = "Cardhour"
CSV_ENCODING = "utf-8-sig"

BUNDLED_FONT = Path(__file__).resolve().parent / "fonts" / "wqy-microhei.ttc"
FONT_NAME = "CardhourCJK"


# --- CSV --------------------------------------------------------------------------------------------


def _csv(rows: Iterable[Sequence[Any]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    for row in rows:
        writer.writerow(["" if value is None else value for value in row])
    return buffer.getvalue().encode(CSV_ENCODING)


def csv_bytes(rows: Iterable[Sequence[Any]]) -> bytes:
    """Rows as a statement CSV (UTF-8 with BOM, CRLF): the one CSV dialect every export here uses."""
    return _csv(rows)


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
            "vat_rate",
            "net_amount",
            "tax_amount",
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
                line.vat_rate,
                line.net_amount,
                line.tax_amount,
            ]
        )
    for name, label, amount in _invoice_totals(invoice):
        rows.append(
            [invoice.number, "", f"total:{name}", label, "", "", "", "", amount, currency, "", "", ""]
        )
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


def _with_vat(invoice: Invoice) -> bool:
    """Whether the invoice was issued with VAT on its lines (invoices issued before carry none)."""
    return invoice.net_amount is not None


def _invoice_totals(invoice: Invoice) -> list[tuple[str, str, Decimal]]:
    paid: list[tuple[str, str, Decimal]] = [
        ("packs_amount", "Packs bought", invoice.packs_amount),
        ("refunds_amount", "Refunds (credit)", invoice.refunds_amount),
        ("total_paid", "Paid through Stripe, net of refunds", invoice.total_paid),
    ]
    if _with_vat(invoice):
        paid += [
            ("net_amount", "of which net of VAT", invoice.net_amount or Decimal("0.00")),
            ("tax_amount", "of which VAT", invoice.tax_amount or Decimal("0.00")),
        ]
    paid.append(("usage_value", "Prepaid value used (informational)", invoice.usage_value))
    if _with_vat(invoice):
        return [
            *paid,
            ("arrears_brought_forward", "Owed from the previous invoice", invoice.arrears_brought_forward),
            ("arrears_amount", "Card-hours used with no pack", invoice.arrears_amount),
            ("arrears_settled", "Arrears paid from new packs", invoice.arrears_settled),
            ("amount_due", "Amount due", invoice.amount_due),
        ]
    return [
        *paid,
        ("arrears_amount", "Card-hours used with no pack", invoice.arrears_amount),
        ("amount_due", "Amount due", invoice.amount_due),
    ]


# --- PDF --------------------------------------------------------------------------------------------


@cache
def _font() -> str:
    """Register the one font every PDF is set in (see the module docstring) and return its name."""
    configured = getattr(settings, "CARDHOUR_PDF_FONT", "") or ""
    path = configured or str(BUNDLED_FONT)
    kwargs = {"subfontIndex": 0} if path.lower().endswith(".ttc") else {}
    try:
        pdfmetrics.registerFont(TTFont(FONT_NAME, path, **kwargs))
    except (TTFError, OSError) as exc:  # e.g. a CFF-outline OpenType font, which ReportLab cannot embed
        raise ImproperlyConfigured(f"The statement font {path} cannot be embedded: {exc}") from exc
    return FONT_NAME


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
        font = _font()
        # One weight only (the font has no bold face): emphasis is a larger size, never a fake bold.
        size = style.fontSize + (1 if bold else 0)
        return Paragraph(
            _escape(value),
            ParagraphStyle(
                f"{style.name}-{bold}", parent=style, fontName=font, fontSize=size, leading=size * 1.25
            ),
        )


def _party_lines(party: dict[str, Any]) -> list[str]:
    """A frozen party (see metering.services.statements) as the lines a statement prints."""
    name = party.get("name", "")
    lines = [f"{name} ({party['slug']})" if party.get("slug") else name]
    lines += [
        value
        for value in (
            party.get("legal_name", "") if party.get("legal_name") != name else "",
            f"Tax id: {party['tax_id']}" if party.get("tax_id") else "",
            f"USCC: {party['unified_social_credit_code']}" if party.get("unified_social_credit_code") else "",
            f"Invoice title: {party['invoice_title']}" if party.get("invoice_title") else "",
            f"Fapiao e-mail: {party['fapiao_email']}" if party.get("fapiao_email") else "",
            *(str(party.get("address") or "").splitlines()),
            party.get("phone", ""),
            f"Bank: {party['bank']}" if party.get("bank") else "",
            f"Account: {party['bank_account']}" if party.get("bank_account") else "",
            party.get("billing_email", ""),
        )
        if value
    ]
    return [line for line in lines if line]


def _money(amount: Decimal) -> str:
    return f"{amount:,.2f}"


def _header(
    styles: _Styles,
    *,
    kind: str,
    number: str,
    period: str,
    seller_label: str,
    seller: list[str],
    party_label: str,
    party: list[str],
    issued: str,
) -> list[Flowable]:
    left = [styles.para(f"{PLATFORM_NAME} — {kind}", styles.title, bold=True)]
    left += [styles.para(f"{party_label}:", styles.normal, bold=True)]
    left += [styles.para(line, styles.normal) for line in party]
    right = [
        styles.para(f"{kind} {number}", styles.right, bold=True),
        styles.para(f"Period: {period}", styles.right),
        styles.para(f"Issued: {issued}", styles.right),
        styles.para(f"{seller_label}:", styles.right, bold=True),
        *(styles.para(line, styles.right) for line in seller),
    ]
    table = Table([[left, right]], colWidths=[110 * mm, 70 * mm])
    table.setStyle(_style([("VALIGN", (0, 0), (-1, -1), "TOP"), ("LEFTPADDING", (0, 0), (-1, -1), 0)]))
    return [table, Spacer(1, 6 * mm)]


_TABLE_STYLE = [
    ("LINEBELOW", (0, 0), (-1, 0), 0.6, colors.black),
    ("VALIGN", (0, 0), (-1, -1), "TOP"),
    ("ROWBACKGROUNDS", (0, 1), (-1, -1), [colors.white, colors.HexColor("#f4f4f4")]),
    ("LEFTPADDING", (0, 0), (-1, -1), 3),
    ("RIGHTPADDING", (0, 0), (-1, -1), 3),
]


def _style(commands: list[Any]) -> TableStyle:
    """A table style whose cells (even empty ones) are set in the embedded font, never in Helvetica."""
    return TableStyle([("FONTNAME", (0, 0), (-1, -1), _font()), *commands])


def _period(start: Any, end: Any) -> str:
    return f"{start:%Y-%m-%d} to {end:%Y-%m-%d} (exclusive), {settings.CARDHOUR_BILLING_TIME_ZONE}"


def _issued(at: Any) -> str:
    """An instant with an unambiguous zone: "CST" is also US Central, so the IANA name and the offset."""
    zone = settings.CARDHOUR_BILLING_TIME_ZONE
    local = timezone.localtime(at, ZoneInfo(zone))
    offset = local.strftime("%z")
    return f"{local:%Y-%m-%d %H:%M} {zone} (UTC{offset[:3]}:{offset[3:]})"


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


def invoice_pdf(*, invoice: Invoice, parties: dict[str, Any]) -> bytes:
    """The invoice as a PDF: header (seller, number, period, buyer as frozen in ``parties``), lines, totals.
    Only metering.services.statements calls this, once, at issue; downloads serve the stored bytes."""
    styles = _Styles()
    story = _header(
        styles,
        kind="Invoice",
        number=invoice.number,
        period=_period(invoice.period_start, invoice.period_end),
        seller_label="Issued by",
        seller=_party_lines(parties.get("seller", {})),
        party_label="Billed to",
        party=_party_lines(parties.get("buyer", {})),
        issued=_issued(invoice.issued_at),
    )
    rows, widths = (_vat_rows if _with_vat(invoice) else _plain_rows)(styles, invoice)
    table = Table(rows, colWidths=widths, repeatRows=1)
    table.setStyle(_style(_TABLE_STYLE))
    story += [table, Spacer(1, 6 * mm)]

    totals = [
        [
            styles.para(label, styles.right, bold=name == "amount_due"),
            styles.para(_money(amount), styles.right, bold=name == "amount_due"),
        ]
        for name, label, amount in _invoice_totals(invoice)
    ]
    totals_table = Table(totals, colWidths=[80 * mm, 30 * mm], hAlign="RIGHT")
    totals_table.setStyle(_style([("LINEABOVE", (0, -1), (-1, -1), 0.6, colors.black)]))
    story += [
        totals_table,
        Spacer(1, 6 * mm),
        styles.para(
            "Packs are paid through Stripe when bought; usage drawn from packs is shown at the prepaid value "
            "it used and is not charged again. The amount due is card-hours used with no pack, at the "
            "operator's price"
            + (
                ", plus what the previous invoice left due, less arrears paid from new packs (a new pack "
                "pays arrears before it can be used). Amounts include VAT; each line's net is rounded once "
                "to the fen (half to even) and its VAT is the rest. This is a statement, not a fapiao: the "
                "fapiao data is exported for the platform's issuing system"
                if _with_vat(invoice)
                else ""
            )
            + ". Lines are rounded to the fen (half to even); totals are sums of the lines.",
            styles.small,
        ),
    ]
    return _document(f"Invoice {invoice.number}", story)


def _head_row(styles: _Styles, head: Sequence[tuple[str, bool]]) -> list[Any]:
    return [
        styles.para(text, styles.right if numeric else styles.normal, bold=True) for text, numeric in head
    ]


def _plain_rows(styles: _Styles, invoice: Invoice) -> tuple[list[list[Any]], list[float]]:
    """The lines of an invoice issued before VAT (frozen late): the layout it was issued with."""
    rows: list[list[Any]] = [
        _head_row(
            styles,
            (
                ("#", False),
                ("Description", False),
                ("Card-seconds", True),
                ("Card-hours drawn", True),
                (f"Amount ({invoice.currency})", True),
            ),
        )
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
    return rows, [10 * mm, 94 * mm, 24 * mm, 26 * mm, 26 * mm]


def _vat_rows(styles: _Styles, invoice: Invoice) -> tuple[list[list[Any]], list[float]]:
    """The lines with their VAT: rate, net, tax and gross amount; card-seconds go under the description."""
    rows: list[list[Any]] = [
        _head_row(
            styles,
            (
                ("#", False),
                ("Description", False),
                ("Card-hours drawn", True),
                ("VAT", True),
                ("Net", True),
                ("Tax", True),
                (f"Amount ({invoice.currency})", True),
            ),
        )
    ]
    for line in _invoice_lines(invoice):
        description = line.description + (
            f" · {line.card_seconds:,} card-seconds" if line.card_seconds else ""
        )
        rows.append(
            [
                styles.para(line.seq, styles.normal),
                styles.para(description, styles.normal),
                styles.para(f"{line.card_hours_drawn:,.6f}" if line.card_hours_drawn else "", styles.right),
                styles.para(vat_percent(line.vat_rate), styles.right),
                styles.para(_money(line.net_amount) if line.net_amount is not None else "", styles.right),
                styles.para(_money(line.tax_amount) if line.tax_amount is not None else "", styles.right),
                styles.para(_money(line.amount), styles.right),
            ]
        )
    if len(rows) == 1:
        rows.append(["", styles.para("Nothing to state for this period.", styles.normal), "", "", "", "", ""])
    return rows, [8 * mm, 70 * mm, 22 * mm, 12 * mm, 22 * mm, 20 * mm, 26 * mm]


def vat_percent(rate: Decimal | None) -> str:
    """A VAT rate as a percentage without trailing zeros: 0.0600 → "6%", 0.0550 → "5.5%"."""
    if rate is None:
        return ""
    percent = (rate * 100).normalize()
    return f"{percent:f}%"


def settlement_pdf(*, settlement: Settlement, parties: dict[str, Any]) -> bytes:
    """The settlement as a PDF: header (platform, number, period, operator as frozen in ``parties``), lines
    by cluster and band, totals of gross, commission and payable. Rendered once, at issue."""
    styles = _Styles()
    story = _header(
        styles,
        kind="Settlement",
        number=settlement.number,
        period=_period(settlement.period_start, settlement.period_end),
        seller_label="Settled by",
        seller=_party_lines(parties.get("seller", {})),
        party_label="Payable to",
        party=_party_lines(parties.get("operator", {})),
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
    table.setStyle(_style([*_TABLE_STYLE, ("LINEABOVE", (0, -1), (-1, -1), 0.6, colors.black)]))
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
