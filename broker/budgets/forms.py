"""The budget form of the portal (the API's BudgetInput, as a form)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.utils.translation import gettext_lazy as _

from broker.budgets.models import DEFAULT_THRESHOLDS, Budget, BudgetScope
from broker.models import Job
from core.models import ApiToken, Organisation


class _UserChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        user: User = obj
        return f"{user.get_username()} ({user.email})" if user.email else user.get_username()


class BudgetForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    scope = forms.ChoiceField(
        label=_("Applies to"),
        choices=BudgetScope.choices,
        initial=BudgetScope.ORGANISATION,
        help_text=_("A job's budget covers the job's whole life; the others one calendar month."),
    )
    user = _UserChoice(label=_("Member"), queryset=User.objects.none(), required=False)
    token = forms.ModelChoiceField(label=_("API token"), queryset=ApiToken.objects.none(), required=False)
    job = forms.ModelChoiceField(label=_("Job"), queryset=Job.objects.none(), required=False)
    soft_amount = forms.DecimalField(
        label=_("Soft budget (CNY)"),
        max_digits=16,
        decimal_places=2,
        min_value=0,
        required=False,
        help_text=_("Alerts by e-mail, webhook and notice when spend crosses the thresholds below."),
    )
    thresholds = forms.CharField(
        label=_("Alert thresholds (%)"),
        required=False,
        initial=", ".join(str(t) for t in DEFAULT_THRESHOLDS),
        help_text=_("Percentages of the soft budget, separated by commas."),
    )
    hard_cap = forms.DecimalField(
        label=_("Hard cap (CNY)"),
        max_digits=16,
        decimal_places=2,
        min_value=0,
        required=False,
        help_text=_(
            "Accepting a quote that would take spend plus held past it is refused; running leases are "
            "stopped once spend reaches it."
        ),
    )
    enabled = forms.BooleanField(label=_("Enabled"), required=False, initial=True)

    def __init__(self, *args: Any, buyer: Organisation, budget: Budget | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["user"].queryset = User.objects.filter(memberships__organisation=buyer).order_by(  # type: ignore[attr-defined]
            "username"
        )
        self.fields["token"].queryset = ApiToken.objects.filter(  # type: ignore[attr-defined]
            organisation=buyer, revoked_at__isnull=True
        ).order_by("name")
        live = Job.objects.filter(buyer=buyer, state__in=(Job.State.OPEN, Job.State.PLACED))
        if budget is not None and budget.job_id:
            live = live | Job.objects.filter(pk=budget.job_id)
        self.fields["job"].queryset = Job.objects.filter(  # type: ignore[attr-defined]
            pk__in=list(live.order_by("-created_at").values_list("pk", flat=True)[:200])
        ).order_by("-created_at")

    def clean_thresholds(self) -> list[int]:
        text = self.cleaned_data.get("thresholds") or ""
        values = []
        for part in text.replace("%", "").replace("，", ",").split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit():
                raise forms.ValidationError(_("Whole percentages separated by commas, e.g. 50, 80, 100."))
            values.append(int(part))
        return values

    @classmethod
    def initial_of(cls, budget: Budget) -> dict[str, Any]:
        return {
            "name": budget.name,
            "scope": budget.scope,
            "user": budget.user_id,
            "token": budget.token_id,
            "job": budget.job_id,
            "soft_amount": budget.soft_amount,
            "thresholds": ", ".join(str(t) for t in budget.thresholds),
            "hard_cap": budget.hard_cap,
            "enabled": budget.enabled,
        }
