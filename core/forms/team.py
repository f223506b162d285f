"""Forms of the team page: invite someone, change a member's role."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.utils.translation import gettext_lazy as _

from core.models import Membership


def role_choices(*, actor_role: str) -> list[tuple[str, str]]:
    """The roles a manager may hand out: an owner any, an administrator any but owner."""
    return [
        (value, str(label))
        for value, label in Membership.Role.choices
        if actor_role == Membership.Role.OWNER or value != Membership.Role.OWNER
    ]


class InvitationForm(forms.Form):
    email = forms.EmailField(
        label=_("E-mail address"),
        max_length=254,
        widget=forms.EmailInput(attrs={"autocomplete": "off", "placeholder": "name@example.com"}),
    )
    role = forms.ChoiceField(
        label=_("Role"),
        initial=Membership.Role.MEMBER,
        help_text=_(
            "Members place jobs and buy card-hours; viewers only look; administrators also manage the team and tokens."
        ),
    )

    def __init__(self, *args: Any, actor_role: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        role = cast(forms.ChoiceField, self.fields["role"])
        role.choices = role_choices(actor_role=actor_role)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Membership.Role.choices)
