"""Forms of the account pages: sign up, and sign up to accept an invitation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import password_validators_help_text_html, validate_password
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from core.errors import DomainError


def form_add_domain_error(
    form: forms.BaseForm, exc: DomainError, *, aliases: Mapping[str, str] | None = None
) -> None:
    """Put a service's error beside the fields it names (``extra["fields"]``), or above the form.

    ``aliases`` maps a service's field name onto the form's (``password`` → ``password2``).
    """
    fields = exc.extra.get("fields") if isinstance(exc.extra.get("fields"), dict) else None
    placed = False
    for name, messages in (fields or {}).items():
        field = (aliases or {}).get(name, name)
        if field in form.fields:
            for message in messages if isinstance(messages, list) else [messages]:
                form.add_error(field, str(message))
            placed = True
    if not placed:
        form.add_error(None, exc.message)


class _PasswordPairMixin(forms.Form):
    """Two password fields checked against each other and AUTH_PASSWORD_VALIDATORS."""

    password1 = forms.CharField(
        label=_("Password"),
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text=password_validators_help_text_html(),
    )
    password2 = forms.CharField(
        label=_("Password again"),
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text=_("Type the same password, to be sure of it."),
    )

    def _user_for_validation(self) -> User:
        return User(username=self.cleaned_data.get("username", ""))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        password1 = cleaned.get("password1")
        password2 = cleaned.get("password2")
        if password1 and password2:
            if password1 != password2:
                self.add_error("password2", _("The two passwords differ."))
            else:
                try:
                    validate_password(password2, user=self._user_for_validation())
                except ValidationError as exc:
                    self.add_error("password2", exc)
        return cleaned


class _UsernameMixin(forms.Form):
    username = forms.CharField(
        label=_("Username"),
        max_length=150,
        validators=[User.username_validator],
        help_text=_("Letters, digits and @ . + - _ only; up to 150 characters."),
        widget=forms.TextInput(attrs={"autocomplete": "username", "autocapitalize": "none"}),
    )

    def clean_username(self) -> str:
        username = str(self.cleaned_data["username"]).strip()
        if User.objects.filter(username__iexact=username).exists():
            raise ValidationError(_("That username is taken."), code="username_taken")
        return username


class SignupForm(_UsernameMixin, _PasswordPairMixin):
    """A new buyer: the person and their organisation."""

    field_order = ["username", "email", "password1", "password2", "organisation_name"]

    email = forms.EmailField(
        label=_("E-mail address"),
        max_length=254,
        help_text=_("For password resets and invitations."),
        widget=forms.EmailInput(attrs={"autocomplete": "email"}),
    )
    organisation_name = forms.CharField(
        label=_("Organisation name"),
        max_length=200,
        help_text=_("The company you buy compute for. You can invite your colleagues once you are in."),
        widget=forms.TextInput(attrs={"autocomplete": "organization"}),
    )

    def _user_for_validation(self) -> User:
        return User(username=self.cleaned_data.get("username", ""), email=self.cleaned_data.get("email", ""))


class InvitationSignupForm(_UsernameMixin, _PasswordPairMixin):
    """A new person accepting an invitation; their e-mail address is the invited one."""

    field_order = ["username", "password1", "password2"]

    def __init__(self, *args: Any, email: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.email = email

    def _user_for_validation(self) -> User:
        return User(username=self.cleaned_data.get("username", ""), email=self.email)


PASSWORD_ALIASES = {"password": "password2"}
