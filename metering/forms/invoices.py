"""The invoice list's filter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _


class InvoiceFilterForm(forms.Form):
    """Invoices of one year (the years the buyer has invoices in)."""

    year = forms.TypedChoiceField(label=_("Year"), coerce=int, required=False, empty_value=None)

    def __init__(self, *args: Any, years: Sequence[int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        year_field = self.fields["year"]
        assert isinstance(year_field, forms.TypedChoiceField)
        year_field.choices = [("", _("All years")), *((year, str(year)) for year in years)]
