"""Reads for organisations and tokens."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet

from core.models import ORGANISATION_SLUG_RE, ApiToken, Membership, Organisation


def api_token_list(*, organisation: Organisation) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(organisation=organisation).select_related("created_by")


def membership_for_user(
    *, user: User | AnonymousUser, organisation_slug: str | None = None
) -> Membership | None:
    """The membership a signed-in person acts through: the named organisation's, or their first one."""
    if not user.is_authenticated:
        return None
    memberships = (
        Membership.objects.select_related("organisation").filter(user=user).order_by("created_at", "pk")
    )
    if organisation_slug:
        # A value that cannot be a slug matches nothing (and never reaches SQL: NUL bytes break PostgreSQL).
        if not ORGANISATION_SLUG_RE.fullmatch(organisation_slug):
            return None
        memberships = memberships.filter(organisation__slug=organisation_slug)
    return memberships.first()


def organisation_get(*, slug: str) -> Organisation | None:
    return Organisation.objects.filter(slug=slug).first()
