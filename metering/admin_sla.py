"""Back office for SLA credit notes (issue 16 item 3): read-only notes, and the operator's dispute decided by an
action that writes a decision row and, when accepted, a reversing transfer — never an edit of the note.

Kept beside metering/admin.py (already over 2,000 lines) rather than in it; imported from there.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from core.admin_tools import ReadOnlyAdminMixin, staff_actor
from core.errors import DomainError
from core.money import from_micros
from metering.models import SlaCredit, SlaCreditDispute
from metering.services.sla import sla_credit_dispute_decide, sla_credit_reason


def _transfer_link(transfer_id: int | None) -> SafeString | str:
    if transfer_id is None:
        return "—"
    return format_html(
        '<a href="{}">#{}</a>',
        reverse("admin:metering_ledgertransfer_change", args=[transfer_id]),
        transfer_id,
    )


class DisputeDecisionForm(forms.Form):
    reason = forms.CharField(
        max_length=480,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=gettext_lazy("What the operator claimed and why you decided so; shown with the decision."),
    )


@admin.register(SlaCredit)
class SlaCreditAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Credit notes as issued. An operator disputes one by writing to staff; staff decide here."""

    list_display = [
        "pk",
        "issued_at",
        "buyer",
        "operator",
        "lease_id",
        "availability_percent",
        "service_level_percent",
        "credit_percent",
        "credit_cny",
        "transfer_link",
        "dispute_outcome",
    ]
    list_filter = ["issued_at", ("operator", admin.RelatedOnlyFieldListFilter), ("dispute__outcome")]
    search_fields = ["reference", "buyer__slug", "operator__slug", "cluster__cpi"]
    list_select_related = ["buyer", "operator", "dispute"]
    readonly_fields = ["reason", "transfer_link", "dispute_outcome"]
    actions = ["dispute_accept", "dispute_reject"]

    @admin.display(description=gettext_lazy("Credited (CNY, of the charge)"))
    def credit_cny(self, obj: SlaCredit) -> str:
        return f"{from_micros(obj.credit_gross)} / {from_micros(obj.charge_gross)}"

    @admin.display(description=gettext_lazy("Transfer"))
    def transfer_link(self, obj: SlaCredit) -> SafeString | str:
        return _transfer_link(obj.transfer_id)

    @admin.display(description=gettext_lazy("Reason shown to the buyer"))
    def reason(self, obj: SlaCredit) -> str:
        return sla_credit_reason(obj)

    @admin.display(description=gettext_lazy("Dispute"))
    def dispute_outcome(self, obj: SlaCredit) -> SafeString | str:
        dispute = getattr(obj, "dispute", None)
        if dispute is None:
            return "—"
        if dispute.reversal_transfer_id:
            return format_html(
                "{} ({})", dispute.get_outcome_display(), _transfer_link(dispute.reversal_transfer_id)
            )
        return str(dispute.get_outcome_display())

    def has_decide_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("metering.add_slacreditdispute")

    @admin.action(
        description=gettext_lazy("Accept the operator's dispute (reverse the credit)"), permissions=["decide"]
    )
    def dispute_accept(self, request: HttpRequest, queryset: QuerySet[SlaCredit]) -> HttpResponse | None:
        return self._decide(request, queryset, accepted=True)

    @admin.action(
        description=gettext_lazy("Reject the operator's dispute (the credit stands)"), permissions=["decide"]
    )
    def dispute_reject(self, request: HttpRequest, queryset: QuerySet[SlaCredit]) -> HttpResponse | None:
        return self._decide(request, queryset, accepted=False)

    def _decide(
        self, request: HttpRequest, queryset: QuerySet[SlaCredit], *, accepted: bool
    ) -> HttpResponse | None:
        credits = list(queryset.select_related("buyer", "operator", "cluster").order_by("pk"))
        form = DisputeDecisionForm(request.POST if request.POST.get("confirm") == "yes" else None)
        if request.POST.get("confirm") == "yes" and form.is_valid():
            actor = staff_actor(request)
            done = 0
            for credit in credits:
                try:
                    dispute = sla_credit_dispute_decide(
                        credit=credit,
                        accepted=accepted,
                        reason=form.cleaned_data["reason"].strip(),
                        actor=actor,
                    )
                except DomainError as exc:
                    messages.warning(
                        request,
                        _("Credit %(credit)s: %(message)s") % {"credit": credit.pk, "message": exc.message},
                    )
                    continue
                self.log_change(request, credit, f"Dispute {dispute.outcome}: {dispute.reason}")
                done += 1
            if done:
                messages.success(
                    request,
                    (
                        _("%(n)d credit(s) reversed by a new transfer each.")
                        if accepted
                        else _("%(n)d dispute(s) rejected; the credits stand.")
                    )
                    % {"n": done},
                )
            return None
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Accept the operator's dispute of these credits?")
            if accepted
            else _("Reject the operator's dispute of these credits?"),
            "accepted": accepted,
            "credits": credits,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action": "dispute_accept" if accepted else "dispute_reject",
            "media": self.media,
        }
        return TemplateResponse(request, "admin/metering/slacredit/dispute_confirm.html", context)


@admin.register(SlaCreditDispute)
class SlaCreditDisputeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["pk", "credit", "outcome", "decided_at", "decided_by", "reversal"]
    list_filter = ["outcome", "decided_at"]
    search_fields = ["credit__reference", "reason"]

    @admin.display(description=gettext_lazy("Reversal transfer"))
    def reversal(self, obj: SlaCreditDispute) -> SafeString | str:
        return _transfer_link(obj.reversal_transfer_id)
