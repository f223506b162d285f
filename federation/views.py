"""Portal pages (being built)."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
