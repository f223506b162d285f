"""Accounts: log in and log out (signup, password reset and invitations are added by the portal issue)."""

from django.contrib.auth import views as auth_views
from django.urls import URLPattern, path

urlpatterns: list[URLPattern] = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="registration/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]
