"""Reads for organisations, members, invitations and tokens."""

from __future__ import annotations

import hashlib

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Case, IntegerField, Q, QuerySet, Value, When
from django.utils.translation import gettext as _

from core.errors import NotFoundError
from core.models import ORGANISATION_SLUG_RE, ApiToken, Invitation, Membership, Organisation


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


def api_token_list_filtered(*, organisation: Organisation, state: str = "") -> QuerySet[ApiToken]:
    """The organisation's tokens, newest first; ``state`` "active" or "revoked" narrows them."""
    tokens = api_token_list(organisation=organisation)
    if state == "active":
        tokens = tokens.filter(revoked_at__isnull=True)
    elif state == "revoked":
        tokens = tokens.filter(revoked_at__isnull=False)
    return tokens


_ROLE_RANK = Case(
    *(When(role=role, then=Value(rank)) for rank, role in enumerate(Membership.Role.values)),
    output_field=IntegerField(),
)


def membership_list(*, organisation: Organisation, query: str = "") -> QuerySet[Membership]:
    """The organisation's members with their people, owners first, then by username; ``query`` matches a
    username or e-mail address."""
    members = Membership.objects.filter(organisation=organisation).select_related("user", "organisation")
    if query:
        members = members.filter(Q(user__username__icontains=query) | Q(user__email__icontains=query))
    return members.annotate(role_rank=_ROLE_RANK).order_by("role_rank", "user__username", "pk")


def membership_owner_count(*, organisation: Organisation) -> int:
    return Membership.objects.filter(organisation=organisation, role=Membership.Role.OWNER).count()


def invitation_list_pending(*, organisation: Organisation) -> QuerySet[Invitation]:
    """Invitations neither accepted nor revoked (lapsed ones included, flagged by ``is_expired``), newest
    first, with who sent them."""
    return Invitation.objects.filter(
        organisation=organisation, accepted_at__isnull=True, revoked_at__isnull=True
    ).select_related("invited_by", "organisation")


def invitation_token_hash(token: str) -> str:
    """What an invitation stores of its link token (the token itself is only ever in the e-mail)."""
    return hashlib.sha256(f"invitation:{token}".encode()).hexdigest()


def invitation_get_by_token(*, token: str) -> Invitation:
    """The invitation behind a link token, whatever its state. Raises NotFoundError for an unknown one."""
    invitation = (
        Invitation.objects.select_related("organisation", "invited_by")
        .filter(token_hash=invitation_token_hash(token))
        .first()
    )
    if invitation is None:
        raise NotFoundError(_("No such invitation."), code="invitation_not_found")
    return invitation
