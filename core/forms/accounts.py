"""Forms of the account pages: sign up, sign up to accept an invitation, log in and password reset with
budgets against guessing (core.lockout)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm, PasswordResetForm
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import password_validators_help_text_html, validate_password
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from core import lockout
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


def _pause_message(seconds: int) -> str:
    minutes = max(1, round(seconds / 60))
    return str(
        _(
            "Too many attempts. For your security this is paused for up to %(minutes)d minutes; try again "
            "later, or reset your password if you have forgotten it."
        )
        % {"minutes": minutes}
    )


class ThrottledAuthenticationForm(AuthenticationForm):
    """Django's log-in form, refusing an account or address that has failed too often (core.lockout)
    before the password is even checked, and counting each failure against both."""

    def clean(self) -> dict[str, Any]:
        username = str(self.data.get("username", "") or "")
        address = lockout.client_address(self.request) if self.request is not None else "unknown"
        account_budget, address_budget = lockout.login_account_budget(), lockout.login_address_budget()
        if lockout.spent(account_budget, username) or lockout.spent(address_budget, address):
            raise ValidationError(_pause_message(account_budget.window_seconds), code="locked_out")
        try:
            cleaned = super().clean()
        except ValidationError:
            lockout.count(account_budget, username)
            lockout.count(address_budget, address)
            raise
        lockout.clear(account_budget, username)
        return cleaned


class ThrottledPasswordResetForm(PasswordResetForm):
    """Django's password-reset form, with a budget per address and per e-mail address (core.lockout)."""

    request: HttpRequest | None = None

    def clean_email(self) -> str:
        email = str(self.cleaned_data["email"])
        if self.request is not None:
            address = lockout.client_address(self.request)
            by_address, by_email = lockout.reset_address_budget(), lockout.reset_email_budget()
            if lockout.spent(by_address, address) or lockout.spent(by_email, email):
                raise ValidationError(_pause_message(by_email.window_seconds), code="locked_out")
            lockout.count(by_address, address)
            lockout.count(by_email, email)
        return email
