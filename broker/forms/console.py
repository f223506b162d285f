"""Filter forms of the operator console (GET forms: an invalid value is ignored, not an error page)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from broker.models import LeaseState
from core.models import Organisation
from federation.models import ClusterStatus
from federation.selectors import cluster_list_for_operator, hub_list


class ClusterFilterForm(forms.Form):
    status = forms.ChoiceField(
        label=_("Status"), required=False, choices=[("", _("Any status")), *ClusterStatus.choices]
    )
    hub = forms.ChoiceField(label=_("Hub"), required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["hub"].choices = [("", _("Any hub")), *((h.code, str(h)) for h in hub_list())]  # type: ignore[attr-defined]

    def value(self, name: str) -> str | None:
        """The cleaned value of filter ``name``, or None when it is empty or not a valid choice."""
        self.is_valid()
        return self.cleaned_data.get(name) or None


class LeaseFilterForm(forms.Form):
    state = forms.ChoiceField(
        label=_("State"), required=False, choices=[("", _("Any state")), *LeaseState.choices]
    )
    cluster = forms.ChoiceField(label=_("Cluster"), required=False)

    def __init__(self, *args: Any, operator: Organisation, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cpis = cluster_list_for_operator(operator=operator).order_by("cpi").values_list("cpi", flat=True)
        self.fields["cluster"].choices = [("", _("Any cluster")), *((cpi, cpi) for cpi in cpis)]  # type: ignore[attr-defined]

    def value(self, name: str) -> str | None:
        self.is_valid()
        return self.cleaned_data.get(name) or None
