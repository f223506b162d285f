from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy, ngettext

from core import services
from core.admin_tools import ReadOnlyAdminMixin
from core.errors import ConflictError
from core.models import ApiToken, DemoRecord, Invitation, Membership, Organisation


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_operator", "is_buyer", "is_platform", "suspended_at", "created_at"]
    list_filter = ["is_operator", "is_buyer", "is_platform", ("suspended_at", admin.EmptyFieldListFilter)]
    search_fields = ["slug", "name"]
    readonly_fields = ["created_at", "suspended_at", "suspension_reason"]
    inlines = [MembershipInline]
    actions = ["suspend", "reinstate"]

    @admin.action(description=gettext_lazy("Suspend selected organisations"))
    def suspend(self, request: HttpRequest, queryset: QuerySet[Organisation]) -> None:
        for organisation in queryset:
            services.organisation_suspend(
                organisation=organisation, reason=f"suspended by {request.user} in admin"
            )
        count = queryset.count()
        messages.success(
            request,
            ngettext("Suspended %(n)d organisation.", "Suspended %(n)d organisations.", count) % {"n": count},
        )

    @admin.action(description=gettext_lazy("Reinstate selected organisations"))
    def reinstate(self, request: HttpRequest, queryset: QuerySet[Organisation]) -> None:
        for organisation in queryset:
            services.organisation_reinstate(organisation=organisation)
        count = queryset.count()
        messages.success(
            request,
            ngettext("Reinstated %(n)d organisation.", "Reinstated %(n)d organisations.", count)
            % {"n": count},
        )


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "organisation", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "user__email", "organisation__slug"]
    autocomplete_fields = ["user", "organisation"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued through the API or portal (the secret is shown once there); the back office
    can only see and revoke them."""

    list_display = ["name", "prefix", "organisation", "scope", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["scope", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "organisation__slug"]
    readonly_fields = [f.name for f in ApiToken._meta.fields]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description=gettext_lazy("Revoke selected tokens"))
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            services.api_token_revoke(organisation=token.organisation, token_id=token.pk)
        count = queryset.count()
        messages.success(
            request, ngettext("Revoked %(n)d token.", "Revoked %(n)d tokens.", count) % {"n": count}
        )


@admin.register(Invitation)
class InvitationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Invitations are sent from the portal's team page (the link's token exists only in the e-mail); the
    back office sees them and can revoke pending ones."""

    list_display = [
        "email",
        "organisation",
        "role",
        "invited_by",
        "created_at",
        "expires_at",
        "accepted_at",
        "revoked_at",
    ]
    list_filter = [
        "role",
        ("accepted_at", admin.EmptyFieldListFilter),
        ("revoked_at", admin.EmptyFieldListFilter),
    ]
    search_fields = ["email", "organisation__slug"]
    list_select_related = ["organisation", "invited_by"]
    exclude = ["token_hash"]
    actions = ["revoke"]

    @admin.action(description=gettext_lazy("Revoke selected pending invitations"))
    def revoke(self, request: HttpRequest, queryset: QuerySet[Invitation]) -> None:
        revoked = 0
        for invitation in queryset.filter(accepted_at__isnull=True, revoked_at__isnull=True):
            try:
                services.invitation_revoke_by_staff(invitation_id=invitation.pk)
            except ConflictError:  # accepted since the list was shown
                continue
            revoked += 1
        messages.success(
            request,
            ngettext("Revoked %(n)d invitation.", "Revoked %(n)d invitations.", revoked) % {"n": revoked},
        )


@admin.register(DemoRecord)
class DemoRecordAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """What the demo seeds created (core.demo): the only objects a seed may create, and never touches again."""

    list_display = ["key", "model", "object_pk", "created_at"]
    list_filter = ["model"]
    search_fields = ["key"]
