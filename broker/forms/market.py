"""Marketplace forms: the filters (a GET form) and the home-hub selector (a POST form)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any, cast

from django import forms
from django.utils.translation import gettext_lazy as _

from broker.market import MARKET_SORTS, MarketQuery, MarketSort
from core.models import Organisation
from federation.models import Accelerator, Hub

SORT_LABELS = {
    "price": _("Price per card-hour (lowest first)"),
    "free": _("Free cards (most first)"),
    "latency": _("Latency (lowest first)"),
    "hub": _("Hub"),
    "reliability": _("Reliability (highest first)"),
}


class MarketFilterForm(forms.Form):
    """What a buyer narrows the marketplace to. Every field is optional; an invalid value is reported
    beside its field and ignored."""

    hub = forms.ChoiceField(label=_("Hub"), required=False)
    chip = forms.ChoiceField(label=_("Chip"), required=False)
    operator = forms.ChoiceField(label=_("Operator"), required=False)
    min_free = forms.IntegerField(label=_("Minimum free cards"), required=False, min_value=0)
    max_price = forms.DecimalField(
        label=_("Maximum price per card-hour (CNY)"),
        required=False,
        min_value=Decimal(0),
        max_digits=12,
        decimal_places=4,
    )
    min_reliability = forms.DecimalField(
        label=_("Minimum reliability (%)"),
        required=False,
        min_value=Decimal(0),
        max_value=Decimal(100),
        max_digits=6,
        decimal_places=3,
    )
    include_offline = forms.BooleanField(label=_("Include offline and draining clusters"), required=False)
    sort = forms.ChoiceField(
        label=_("Sort by"), required=False, choices=[(key, SORT_LABELS[key]) for key in MARKET_SORTS]
    )

    def __init__(
        self,
        *args: Any,
        hubs: Sequence[Hub],
        chips: Sequence[Accelerator],
        operators: Sequence[Organisation],
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        any_choice = [("", _("Any"))]
        cast(forms.ChoiceField, self.fields["hub"]).choices = any_choice + [
            (h.code, f"{h.code} — {h.name}") for h in hubs
        ]
        cast(forms.ChoiceField, self.fields["chip"]).choices = any_choice + [
            (c.slug, f"{c.vendor} {c.model}") for c in chips
        ]
        cast(forms.ChoiceField, self.fields["operator"]).choices = any_choice + [
            (o.slug, o.name) for o in operators
        ]
        self.fields["min_free"].widget.attrs.update({"inputmode": "numeric"})
        self.fields["max_price"].widget.attrs.update({"step": "0.01", "inputmode": "decimal"})
        self.fields["min_reliability"].widget.attrs.update({"step": "0.1", "inputmode": "decimal"})

    def market_query(self) -> MarketQuery:
        """The valid part of the filters as a MarketQuery (a field in error counts as not given)."""
        self.is_valid()  # cleaned_data keeps the fields that are valid
        data = self.cleaned_data
        sort = data.get("sort") or "price"
        return MarketQuery(
            hub=data.get("hub") or "",
            chip=data.get("chip") or "",
            operator=data.get("operator") or "",
            min_free_cards=data.get("min_free"),
            max_price=data.get("max_price"),
            min_reliability=data.get("min_reliability"),
            include_offline=bool(data.get("include_offline")),
            sort=cast(MarketSort, sort if sort in MARKET_SORTS else "price"),
        )


class HomeHubForm(forms.Form):
    """The buyer's home hub: where its jobs come from and latency is measured from."""

    home_hub = forms.ChoiceField(label=_("Home hub"))

    def __init__(self, *args: Any, hubs: Sequence[Hub], **kwargs: Any):
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["home_hub"]).choices = [
            (h.code, f"{h.code} — {h.name}") for h in hubs
        ]
