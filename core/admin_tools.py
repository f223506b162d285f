"""Back-office building blocks every app's admin shares: read-only rows, bounded inlines, estimated counts
for big tables, organisation filters that never scan the big table, and the staff actor."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.translation import gettext_lazy

from core.models import Organisation
from core.types import Actor


def staff_actor(request: HttpRequest) -> Actor:
    """Staff act for the platform (no organisation), as themselves."""
    return Actor(organisation=None, user=request.user if request.user.is_authenticated else None)


def changelist_url(model: type[Any], **params: object) -> str:
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    return f"{url}?{urlencode(params)}" if params else url


class EstimatedCountPaginator(Paginator):
    """On PostgreSQL, an unfiltered list of a big table takes its row count from the planner's statistics
    instead of ``COUNT(*)`` over millions of rows; anything filtered, or small, is counted exactly."""

    threshold = 100_000

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if connection.vendor == "postgresql" and query is not None and not query.where:
            table = query.model._meta.db_table
            with connection.cursor() as cursor:
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table])
                row = cursor.fetchone()
            estimate = int(row[0]) if row and row[0] is not None else -1
            if estimate >= self.threshold:
                return estimate
        return super().count


class ReadOnlyAdminMixin:
    """View-only: rows written by services alone (money, history, immutable versions)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LimitedInlineFormSet(BaseInlineFormSet):
    """Shows at most ``row_limit`` rows of the (already ordered) inline queryset."""

    row_limit = 200

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_limited_queryset"):
            self._limited_queryset = super().get_queryset()[: self.row_limit]
        return self._limited_queryset


class OrganisationFilter(admin.SimpleListFilter):
    """Organisations of one role, listed from the (small) organisation table, never with a DISTINCT over
    the filtered model's (big) table."""

    role_field = "is_operator"
    field_name = "operator"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        rows = (
            Organisation.objects.filter(**{self.role_field: True}).order_by("slug").values_list("pk", "slug")
        )
        return [(str(pk), slug) for pk, slug in rows]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value and value.isdigit():
            return queryset.filter(**{f"{self.field_name}_id": int(value)})
        return queryset


class OperatorFilter(OrganisationFilter):
    title = gettext_lazy("operator")
    parameter_name = "operator"


class BuyerFilter(OrganisationFilter):
    title = gettext_lazy("buyer")
    parameter_name = "buyer"
    role_field = "is_buyer"
    field_name = "buyer"
