"""The usage dashboard's period filter (GET): from / to local dates, a chip, a cluster."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, timedelta
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from metering.selectors.usage_dashboard import DEFAULT_PERIOD_DAYS, UsagePeriod, UsedCluster

MAX_PERIOD_DAYS = 366


class UsageFilterForm(forms.Form):
    """``from`` and ``to`` are local dates (both included; the last 30 days by default), ``chip`` and
    ``cluster`` narrow to what the buyer has used. An empty field takes its default, so ``?to=…`` alone
    is a valid filter."""

    chip = forms.ChoiceField(label=_("Chip"), required=False)
    cluster = forms.TypedChoiceField(label=_("Cluster"), required=False, coerce=int, empty_value=None)

    def __init__(
        self, data: Any = None, *, clusters: Sequence[UsedCluster], today: date, **kwargs: Any
    ) -> None:
        super().__init__(data, **kwargs)
        self.today = today
        # "from" is a Python keyword: the fields are added by name so the query string reads ?from=…&to=….
        date_widget = {"type": "date"}
        self.fields = {
            "from": forms.DateField(
                label=_("From"),
                required=False,
                initial=today - timedelta(days=DEFAULT_PERIOD_DAYS - 1),
                widget=forms.DateInput(attrs=date_widget, format="%Y-%m-%d"),
            ),
            "to": forms.DateField(
                label=_("To"),
                required=False,
                initial=today,
                widget=forms.DateInput(attrs=date_widget, format="%Y-%m-%d"),
            ),
            **self.fields,
        }
        chips = sorted({(c.chip, c.chip_name) for c in clusters}, key=lambda c: c[1])
        self.fields["chip"].choices = [("", _("All chips")), *chips]  # type: ignore[attr-defined]
        self.fields["cluster"].choices = [  # type: ignore[attr-defined]
            ("", _("All clusters")),
            *((str(c.id), f"{c.name} · {c.cpi}") for c in clusters),
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        start = cleaned.get("from")
        end = cleaned.get("to")
        if "from" in self.errors or "to" in self.errors:
            return cleaned
        end = end or self.today
        start = start or end - timedelta(days=DEFAULT_PERIOD_DAYS - 1)
        if end < start:
            self.add_error("to", _("The end date is before the start date."))
        elif (end - start).days + 1 > MAX_PERIOD_DAYS:
            self.add_error("from", _("Choose at most %(days)d days.") % {"days": MAX_PERIOD_DAYS})
        cleaned["from"], cleaned["to"] = start, end
        return cleaned

    def period(self) -> UsagePeriod:
        """The period of a valid bound form, or the default one of an unbound form."""
        if not self.is_bound:
            return UsagePeriod(
                start_date=self.today - timedelta(days=DEFAULT_PERIOD_DAYS - 1), end_date=self.today
            )
        data = self.cleaned_data
        return UsagePeriod(
            start_date=data["from"],
            end_date=data["to"],
            chip=data.get("chip") or "",
            cluster_id=data.get("cluster"),
        )
