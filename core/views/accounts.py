"""Accounts: sign up as a buyer, log in and out, reset a forgotten password by e-mail."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods

from core import lockout, services
from core.errors import DomainError
from core.forms.accounts import (
    PASSWORD_ALIASES,
    SignupForm,
    ThrottledAuthenticationForm,
    ThrottledPasswordResetForm,
    form_add_domain_error,
)
from core.portal import portal_organisation_choose


def _after_signup_url() -> str:
    return reverse("market")


@sensitive_post_parameters("password1", "password2")
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    """A new buyer: a person, their organisation (they own it), and a session, in one go."""
    if request.user.is_authenticated:
        return redirect("home")
    form = SignupForm(request.POST or None)
    if request.method == "POST":
        address, budget = lockout.client_address(request), lockout.signup_address_budget()
        if lockout.spent(budget, address):
            form.is_valid()
            form.add_error(None, _("Too many sign-ups from your network. Please try again in an hour."))
            return render(request, "registration/signup.html", {"form": form}, status=429)
        lockout.count(budget, address)
    if request.method == "POST" and form.is_valid():
        try:
            user, organisation = services.buyer_signup(
                username=form.cleaned_data["username"],
                email=form.cleaned_data["email"],
                password=form.cleaned_data["password1"],
                organisation_name=form.cleaned_data["organisation_name"],
            )
        except DomainError as exc:
            form_add_domain_error(form, exc, aliases=PASSWORD_ALIASES)
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            portal_organisation_choose(request, slug=organisation.slug)
            messages.success(
                request,
                _("Welcome to Cardhour. %(organisation)s is ready: buy card-hours, then place a job.")
                % {"organisation": organisation.name},
            )
            return redirect(_after_signup_url())
    return render(request, "registration/signup.html", {"form": form})


class _PasswordResetView(auth_views.PasswordResetView):
    """Password reset with budgets per address and per e-mail address (core.lockout)."""

    form_class = ThrottledPasswordResetForm

    def get_form(self, form_class: Any = None) -> Any:
        form: Any = super().get_form(form_class)
        form.request = self.request
        return form


urlpatterns: list[URLPattern] = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="registration/login.html",
            redirect_authenticated_user=True,
            authentication_form=ThrottledAuthenticationForm,
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/signup/", signup, name="signup"),
    path(
        "accounts/password-reset/",
        _PasswordResetView.as_view(
            template_name="registration/password_reset_form.html",
            email_template_name="registration/password_reset_email.txt",
            subject_template_name="registration/password_reset_subject.txt",
        ),
        name="password_reset",
    ),
    path(
        "accounts/password-reset/sent/",
        auth_views.PasswordResetDoneView.as_view(template_name="registration/password_reset_done.html"),
        name="password_reset_done",
    ),
    path(
        "accounts/reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(template_name="registration/password_reset_confirm.html"),
        name="password_reset_confirm",
    ),
    path(
        "accounts/reset/done/",
        auth_views.PasswordResetCompleteView.as_view(
            template_name="registration/password_reset_complete.html"
        ),
        name="password_reset_complete",
    ),
]
