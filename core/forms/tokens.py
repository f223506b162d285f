"""Form of the API tokens page: issue a token."""

from __future__ import annotations

from django import forms
from django.utils.translation import gettext_lazy as _

from core.models import ApiToken


class ApiTokenForm(forms.Form):
    name = forms.CharField(
        label=_("Name"),
        max_length=100,
        help_text=_("What uses it, e.g. “training scheduler” or “cluster agent zw-ai01”."),
        widget=forms.TextInput(attrs={"autocomplete": "off"}),
    )
    scope = forms.ChoiceField(
        label=_("Scope"),
        choices=ApiToken.Scope.choices,
        initial=ApiToken.Scope.READ_WRITE,
        help_text=_("A read-only token can list and fetch, never change anything."),
    )
    can_manage_tokens = forms.BooleanField(
        label=_("May manage tokens"),
        required=False,
        help_text=_("Lets this token create and revoke tokens through the API. Leave it off for agents."),
    )


class ApiTokenFilterForm(forms.Form):
    state = forms.ChoiceField(
        label=_("Show"),
        required=False,
        choices=[("", _("All tokens")), ("active", _("Active")), ("revoked", _("Revoked"))],
    )
