"""Budgets in the back office. Budgets, holds, alerts, breaches and lease origins are written by services
alone (the buyer's settings and money limits): staff read them here. Staff may retry an alert's delivery."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from broker.budgets.models import (
    Budget,
    BudgetAlert,
    BudgetBreach,
    BudgetHold,
    BuyerEndpoint,
    DeliveryStatus,
    LeaseOrigin,
)
from core.admin_tools import OrganisationFilter, ReadOnlyAdminMixin, staff_actor


class _BudgetBuyerFilter(OrganisationFilter):
    title = gettext_lazy("buyer")
    parameter_name = "buyer"
    role_field = "is_buyer"
    field_name = "budget__buyer"


class _BuyerFilter(OrganisationFilter):
    title = gettext_lazy("buyer")
    parameter_name = "buyer"
    role_field = "is_buyer"
    field_name = "buyer"


@admin.register(Budget)
class BudgetAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "name", "buyer", "scope", "soft_amount", "hard_cap", "enabled", "updated_at"]
    list_filter = [_BuyerFilter, "scope", "enabled"]
    list_select_related = ["buyer"]
    search_fields = ["name", "buyer__slug"]
    fields = readonly_fields = (
        "buyer",
        "name",
        "scope",
        "user",
        "token",
        "job",
        "soft_amount",
        "thresholds",
        "hard_cap",
        "enabled",
        "created_at",
        "updated_at",
    )


@admin.register(BudgetHold)
class BudgetHoldAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Pending holds of leases' expected costs against budgets (open until voided by the lease's end)."""

    list_display = ["id", "budget", "lease_id", "period_key", "amount", "created_at", "voided_at"]
    list_filter = [_BudgetBuyerFilter, ("voided_at", admin.EmptyFieldListFilter)]
    list_select_related = ["budget"]
    search_fields = ["budget__name", "=lease__id"]
    fields = readonly_fields = ("budget", "lease", "period_key", "amount", "created_at", "voided_at")
    raw_id_fields = ("lease",)


@admin.action(description=gettext_lazy("Retry delivery now"))
def _retry(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[BudgetAlert]) -> None:
    revived = queryset.filter(email_status=DeliveryStatus.GAVE_UP).update(email_status=DeliveryStatus.PENDING)
    revived += queryset.filter(webhook_status=DeliveryStatus.GAVE_UP).update(
        webhook_status=DeliveryStatus.PENDING
    )
    queryset.update(attempts=0, next_attempt_at=timezone.now())
    modeladmin.message_user(
        request,
        _("Delivery retried (%(n)d channels revived) by %(who)s.")
        % {"n": revived, "who": staff_actor(request).label},
        messages.SUCCESS,
    )


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Alerts, once per (budget, period, threshold), and the state of their e-mail and webhook."""

    list_display = [
        "id",
        "budget",
        "period_key",
        "kind",
        "percent",
        "spent",
        "created_at",
        "email_status",
        "webhook_status",
        "attempts",
    ]
    list_filter = [_BudgetBuyerFilter, "kind", "email_status", "webhook_status"]
    list_select_related = ["budget"]
    search_fields = ["budget__name", "period_key"]
    actions = [_retry]
    fields = readonly_fields = (
        "budget",
        "period_key",
        "kind",
        "percent",
        "limit_amount",
        "spent",
        "created_at",
        "email_status",
        "email_sent_at",
        "webhook_status",
        "webhook_delivered_at",
        "attempts",
        "next_attempt_at",
        "last_error",
    )

    def has_delete_permission(self, request: HttpRequest, obj: BudgetAlert | None = None) -> bool:
        return False


@admin.register(BudgetBreach)
class BudgetBreachAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Budgets whose posted spend reached the hard cap: their scope's running leases are stopped while open."""

    list_display = ["id", "budget", "period_key", "spent", "cap", "raised_at", "cleared_at"]
    list_filter = [_BudgetBuyerFilter, ("cleared_at", admin.EmptyFieldListFilter)]
    list_select_related = ["budget"]
    fields = readonly_fields = ("budget", "period_key", "spent", "cap", "raised_at", "cleared_at")


@admin.register(LeaseOrigin)
class LeaseOriginAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Who accepted each lease (what member and token budgets count)."""

    list_display = ["lease_id", "user", "token"]
    list_select_related = ["user", "token"]
    search_fields = ["=lease__id", "user__username", "token__name"]
    fields = readonly_fields = ("lease", "user", "token")


@admin.register(BuyerEndpoint)
class BuyerEndpointAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Where a buyer's budget alerts are POSTed. The secret is never shown here."""

    list_display = ["buyer", "url", "enabled", "updated_at"]
    list_filter = ["enabled"]
    list_select_related = ["buyer"]
    search_fields = ["buyer__slug", "url"]
    fields = readonly_fields = ("buyer", "url", "enabled", "created_at", "updated_at")
