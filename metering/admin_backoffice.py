"""Back-office pages of billing: close a month, preview a buyer's invoice of the current month.

Kept out of metering/admin.py (already past 2,000 lines, see STYLE.md) and called from the ModelAdmins
that own their URLs (BillingCloseRunAdmin, InvoiceAdmin). Both go through metering.services.billing:
closing is ``billing_close_period`` — the beat task's service, so the same guarantees (one run per period,
each statement issued once, resumable after a crash) — and the preview is ``invoice_preview``, which
writes nothing.
"""

from __future__ import annotations

import logging
from datetime import date
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from core.models import Organisation
from metering import rendering
from metering.errors import BillingPeriodInvalidError, BillingPeriodOpenError
from metering.models import InvoiceLine
from metering.services import billing

logger = logging.getLogger("cardhour.billing")


class CloseMonthForm(forms.Form):
    month = forms.CharField(
        label=gettext_lazy("Month to close"),
        help_text=gettext_lazy("YYYY-MM, in the billing zone. Only a month that has ended can be closed."),
        widget=forms.TextInput(attrs={"type": "month", "placeholder": "2026-10"}),
    )

    def clean_month(self) -> date:
        raw = self.cleaned_data["month"].strip()
        try:
            year, month = (int(part) for part in raw.split("-"))
            return date(year, month, 1)
        except ValueError:
            raise forms.ValidationError(_("Write the month as YYYY-MM, e.g. 2026-10.")) from None


def close_month(request: HttpRequest, *, model_admin: admin.ModelAdmin) -> HttpResponse:
    previous = billing.billing_previous_period_start()
    form = CloseMonthForm(request.POST or None, initial={"month": f"{previous:%Y-%m}"})
    if request.method == "POST" and form.is_valid():
        period_start = form.cleaned_data["month"]
        try:
            run = billing.billing_close_period(period_start=period_start)
        except (BillingPeriodOpenError, BillingPeriodInvalidError) as exc:
            # e.g. "The period 2026-11 ends at 2026-12-01T00:00:00+08:00; it cannot be closed before."
            form.add_error("month", exc.message)
        else:
            logger.info("billing close %s from the admin by %s", f"{period_start:%Y-%m}", request.user)
            messages.success(
                request,
                _(
                    "%(month)s is closed: %(invoices)d invoice(s) and %(settlements)d settlement(s) issued for it "
                    "(closing it again issues nothing)."
                )
                % {
                    "month": f"{period_start:%Y-%m}",
                    "invoices": run.invoices_issued,
                    "settlements": run.settlements_issued,
                },
            )
            return HttpResponseRedirect(reverse("admin:metering_billingcloserun_changelist"))
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": _("Close a month"),
        "intro": _(
            "Issues every buyer's invoice and every operator's settlement for the month, exactly as the "
            "monthly task does on the 1st: once per period, each statement final once issued. A month that "
            "has not ended yet is refused."
        ),
        "form": form,
        "submit_label": _("Close the month"),
        "media": model_admin.media + form.media,
    }
    return TemplateResponse(request, "admin/metering/service_form.html", context)


class PreviewForm(forms.Form):
    buyer = forms.ModelChoiceField(
        queryset=Organisation.objects.filter(is_buyer=True).order_by("slug"), to_field_name="slug"
    )


def invoice_preview_page(request: HttpRequest, *, model_admin: admin.ModelAdmin) -> HttpResponse:
    form = PreviewForm(request.GET or None)
    preview: billing.InvoicePreview | None = None
    if form.is_bound and form.is_valid():
        preview = billing.invoice_preview(buyer=form.cleaned_data["buyer"])
    lines: list[dict[str, Any]] = []
    if preview is not None:
        lines = [
            {
                "line": line,
                "kind": InvoiceLine.Kind(line.kind).label,
                "vat": rendering.vat_percent(line.vat_rate),
            }
            for line in preview.lines
        ]
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": _("Preview a buyer's invoice for this month"),
        "form": form,
        "preview": preview,
        "lines": lines,
        "now": timezone.now(),
        "media": model_admin.media + form.media,
    }
    return TemplateResponse(request, "admin/metering/invoice/preview.html", context)
