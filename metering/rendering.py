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

Every label of a PDF is printed in English and Simplified Chinese ("Amount due 应付金额"): a statement is
rendered once, at issue, often by a task with no reader's language, and is then frozen, so it cannot follow
whoever downloads it; both languages make it readable by every buyer and operator and keep the bytes
independent of the issuing context. The labels are marked with gettext_noop and translated here, under a
fixed language, from the metering catalogue. CSV files stay English and machine-readable.

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
from django.utils import timezone, translation
from django.utils.functional import Promise
from django.utils.translation import gettext_noop
from reportlab.lib import colors
from reportlab.lib.enums import TA_RIGHT
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.ttfonts import TTFError, TTFont
from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle
from reportlab.platypus.flowables import Flowable

from metering.models import Band, Invoice, InvoiceLine, Settlement, SettlementLine

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
    return _both(Band(value).label) if value else ""


def _settlement_line_label(line: SettlementLine) -> str:
    """A settlement line's band, or for an SLA credit note (or its reversal) what it is and the note."""
    if line.kind == SettlementLine.Kind.USAGE:
        return _band(line.band)
    return f"{_both(SettlementLine.Kind(line.kind).label)} SLA-{line.sla_credit_id}"


def _in(language: str, text: str | Promise) -> str:
    with translation.override(language):
        return translation.gettext(str(text)) if not isinstance(text, Promise) else str(text)


def _both(text: str | Promise) -> str:
    """A PDF label in English then Simplified Chinese ("Amount due 应付金额"), whatever language is active
    (see the module docstring); a label the catalogue leaves as it is (a code, "#") is printed once."""
    english, chinese = _in("en", text), _in("zh-hans", text)
    return english if chinese == english else f"{english} {chinese}"


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
                line.band
                if line.kind == SettlementLine.Kind.USAGE
                else f"{line.kind}:SLA-{line.sla_credit_id}",
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
        ("packs_amount", gettext_noop("Packs bought"), invoice.packs_amount),
        ("refunds_amount", gettext_noop("Refunds (credit)"), invoice.refunds_amount),
        ("total_paid", gettext_noop("Paid through Stripe, net of refunds"), invoice.total_paid),
    ]
    if _with_vat(invoice):
        paid += [
            ("net_amount", gettext_noop("of which net of VAT"), invoice.net_amount or Decimal("0.00")),
            ("tax_amount", gettext_noop("of which VAT"), invoice.tax_amount or Decimal("0.00")),
        ]
    paid.append(("usage_value", gettext_noop("Prepaid value used (informational)"), invoice.usage_value))
    if _with_vat(invoice):
        return [
            *paid,
            (
                "arrears_brought_forward",
                gettext_noop("Owed from the previous invoice"),
                invoice.arrears_brought_forward,
            ),
            ("arrears_amount", gettext_noop("Card-hours used with no pack"), invoice.arrears_amount),
            ("arrears_settled", gettext_noop("Arrears paid from new packs"), invoice.arrears_settled),
            ("amount_due", gettext_noop("Amount due"), invoice.amount_due),
        ]
    return [
        *paid,
        ("arrears_amount", gettext_noop("Card-hours used with no pack"), invoice.arrears_amount),
        ("amount_due", gettext_noop("Amount due"), invoice.amount_due),
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


# PDF labels used inside f-strings (xgettext does not look into f-strings, so they are marked here).
_TAX_ID = gettext_noop("Tax id")
_USCC = gettext_noop("USCC")
_INVOICE_TITLE = gettext_noop("Invoice title")
_FAPIAO_EMAIL = gettext_noop("Fapiao e-mail")
_BANK = gettext_noop("Bank")
_ACCOUNT = gettext_noop("Account")
_PERIOD = gettext_noop("Period")
_ISSUED = gettext_noop("Issued")
_AMOUNT = gettext_noop("Amount")
_CARD_SECONDS = gettext_noop("card-seconds")
_LATE = gettext_noop("late, earlier period")


def _party_lines(party: dict[str, Any]) -> list[str]:
    """A frozen party (see metering.services.statements) as the lines a statement prints."""
    name = party.get("name", "")
    lines = [f"{name} ({party['slug']})" if party.get("slug") else name]
    lines += [
        value
        for value in (
            party.get("legal_name", "") if party.get("legal_name") != name else "",
            f"{_both(_TAX_ID)}: {party['tax_id']}" if party.get("tax_id") else "",
            f"{_both(_USCC)}: {party['unified_social_credit_code']}"
            if party.get("unified_social_credit_code")
            else "",
            f"{_both(_INVOICE_TITLE)}: {party['invoice_title']}" if party.get("invoice_title") else "",
            f"{_both(_FAPIAO_EMAIL)}: {party['fapiao_email']}" if party.get("fapiao_email") else "",
            *(str(party.get("address") or "").splitlines()),
            party.get("phone", ""),
            f"{_both(_BANK)}: {party['bank']}" if party.get("bank") else "",
            f"{_both(_ACCOUNT)}: {party['bank_account']}" if party.get("bank_account") else "",
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
    left = [styles.para(f"{PLATFORM_NAME} — {_both(kind)}", styles.title, bold=True)]
    left += [styles.para(f"{_both(party_label)}:", styles.normal, bold=True)]
    left += [styles.para(line, styles.normal) for line in party]
    right = [
        styles.para(f"{kind} {number}", styles.right, bold=True),
        styles.para(f"{_both(_PERIOD)}: {period}", styles.right),
        styles.para(f"{_both(_ISSUED)}: {issued}", styles.right),
        styles.para(f"{_both(seller_label)}:", styles.right, bold=True),
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
        kind=gettext_noop("Invoice"),
        number=invoice.number,
        period=_period(invoice.period_start, invoice.period_end),
        seller_label=gettext_noop("Issued by"),
        seller=_party_lines(parties.get("seller", {})),
        party_label=gettext_noop("Billed to"),
        party=_party_lines(parties.get("buyer", {})),
        issued=_issued(invoice.issued_at),
    )
    rows, widths = (_vat_rows if _with_vat(invoice) else _plain_rows)(styles, invoice)
    table = Table(rows, colWidths=widths, repeatRows=1)
    table.setStyle(_style(_TABLE_STYLE))
    story += [table, Spacer(1, 6 * mm)]

    totals = [
        [
            styles.para(_both(label), styles.right, bold=name == "amount_due"),
            styles.para(_money(amount), styles.right, bold=name == "amount_due"),
        ]
        for name, label, amount in _invoice_totals(invoice)
    ]
    totals_table = Table(totals, colWidths=[80 * mm, 30 * mm], hAlign="RIGHT")
    totals_table.setStyle(_style([("LINEABOVE", (0, -1), (-1, -1), 0.6, colors.black)]))
    story += [
        totals_table,
        Spacer(1, 6 * mm),
        *_note(styles, _INVOICE_NOTE_VAT if _with_vat(invoice) else _INVOICE_NOTE),
    ]
    return _document(f"Invoice {invoice.number}", story)


_INVOICE_NOTE = gettext_noop(
    "Packs are paid through Stripe when bought; usage drawn from packs is shown at the prepaid value it used "
    "and is not charged again. The amount due is card-hours used with no pack, at the operator's price. Lines "
    "are rounded to the fen (half to even); totals are sums of the lines."
)
_INVOICE_NOTE_VAT = gettext_noop(
    "Packs are paid through Stripe when bought; usage drawn from packs is shown at the prepaid value it used "
    "and is not charged again. The amount due is card-hours used with no pack, at the operator's price, plus "
    "what the previous invoice left due, less arrears paid from new packs (a new pack pays arrears before it "
    "can be used). Amounts include VAT; each line's net is rounded once to the fen (half to even) and its VAT "
    "is the rest. This is a statement, not a fapiao: the fapiao data is exported for the platform's issuing "
    "system. Lines are rounded to the fen (half to even); totals are sums of the lines."
)
_SETTLEMENT_NOTE = gettext_noop(
    "Amounts in %(currency)s. Payable = gross − platform commission. Lines are rounded to the fen (half to "
    "even); totals are sums of the lines."
)


def _note(styles: _Styles, note: str, **values: str) -> list[Flowable]:
    """A statement's closing note, in English, then in Simplified Chinese."""
    return [
        styles.para(_in("en", note) % values if values else _in("en", note), styles.small),
        styles.para(_in("zh-hans", note) % values if values else _in("zh-hans", note), styles.small),
    ]


def _head_row(styles: _Styles, head: Sequence[tuple[str, bool]]) -> list[Any]:
    return [
        styles.para(_both(text), styles.right if numeric else styles.normal, bold=True)
        for text, numeric in head
    ]


def _plain_rows(styles: _Styles, invoice: Invoice) -> tuple[list[list[Any]], list[float]]:
    """The lines of an invoice issued before VAT (frozen late): the layout it was issued with."""
    rows: list[list[Any]] = [
        _head_row(
            styles,
            (
                ("#", False),
                (gettext_noop("Description"), False),
                (gettext_noop("Card-seconds"), True),
                (gettext_noop("Card-hours drawn"), True),
                (f"{_both(_AMOUNT)} ({invoice.currency})", True),
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
        rows.append(
            [
                "",
                styles.para(_both(gettext_noop("Nothing to state for this period.")), styles.normal),
                "",
                "",
                "",
            ]
        )
    return rows, [10 * mm, 94 * mm, 24 * mm, 26 * mm, 26 * mm]


def _vat_rows(styles: _Styles, invoice: Invoice) -> tuple[list[list[Any]], list[float]]:
    """The lines with their VAT: rate, net, tax and gross amount; card-seconds go under the description."""
    rows: list[list[Any]] = [
        _head_row(
            styles,
            (
                ("#", False),
                (gettext_noop("Description"), False),
                (gettext_noop("Card-hours drawn"), True),
                (gettext_noop("VAT"), True),
                (gettext_noop("Net"), True),
                (gettext_noop("Tax"), True),
                (f"{_both(_AMOUNT)} ({invoice.currency})", True),
            ),
        )
    ]
    for line in _invoice_lines(invoice):
        description = line.description + (
            f" · {line.card_seconds:,} {_both(_CARD_SECONDS)}" if line.card_seconds else ""
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
        rows.append(
            [
                "",
                styles.para(_both(gettext_noop("Nothing to state for this period.")), styles.normal),
                "",
                "",
                "",
                "",
                "",
            ]
        )
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
        kind=gettext_noop("Settlement"),
        number=settlement.number,
        period=_period(settlement.period_start, settlement.period_end),
        seller_label=gettext_noop("Settled by"),
        seller=_party_lines(parties.get("seller", {})),
        party_label=gettext_noop("Payable to"),
        party=_party_lines(parties.get("operator", {})),
        issued=_issued(settlement.issued_at),
    )
    head = (
        "#",
        gettext_noop("Cluster"),
        gettext_noop("Band"),
        gettext_noop("Card-seconds"),
        gettext_noop("Gross"),
        gettext_noop("Commission"),
        gettext_noop("Payable"),
    )
    rows: list[list[Any]] = [
        [
            styles.para(_both(text), styles.right if index >= 3 else styles.normal, bold=True)
            for index, text in enumerate(head)
        ]
    ]
    lines = list(settlement.lines.all())
    for line in lines:
        cluster = line.cluster.cpi + (f" ({_both(_LATE)})" if line.prior_period else "")
        rows.append(
            [
                styles.para(line.seq, styles.normal),
                styles.para(cluster, styles.normal),
                styles.para(_settlement_line_label(line), styles.normal),
                styles.para(f"{line.card_seconds:,}", styles.right),
                styles.para(_money(line.gross), styles.right),
                styles.para(_money(line.commission), styles.right),
                styles.para(_money(line.payable), styles.right),
            ]
        )
    rows.append(
        [
            "",
            styles.para(_both(gettext_noop("Total")), styles.normal, bold=True),
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
        *_note(styles, _SETTLEMENT_NOTE, currency=settlement.currency),
    ]
    return _document(f"Settlement {settlement.number}", story)
