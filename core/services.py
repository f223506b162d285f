"""Writes for organisations, memberships and API tokens."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.errors import ConflictError, InvalidInputError, NotFoundError
from core.models import ApiToken, Membership, Organisation

_PREFIX_RE = re.compile(r"[0-9a-f]{8}")
TOKEN_PREFIX = "chk"  # noqa: S105 (a public marker, not a secret)


def _hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@transaction.atomic
def organisation_create(
    *,
    slug: str,
    name: str,
    is_operator: bool = False,
    is_buyer: bool = False,
    is_platform: bool = False,
    owner: User | None = None,
) -> Organisation:
    """Create an organisation (and its owner membership). Raises ConflictError if the slug is taken."""
    organisation = Organisation(
        slug=slug, name=name, is_operator=is_operator, is_buyer=is_buyer, is_platform=is_platform
    )
    organisation.full_clean(validate_unique=False)
    try:
        with transaction.atomic():
            organisation.save()
    except IntegrityError as exc:
        raise ConflictError(
            f"The organisation slug {slug!r} is taken.", code="slug_taken", extra={"slug": slug}
        ) from exc
    if owner is not None:
        Membership.objects.create(organisation=organisation, user=owner, role=Membership.Role.OWNER)
    return organisation


@transaction.atomic
def membership_set(*, organisation: Organisation, user: User, role: str) -> Membership:
    """Add ``user`` to ``organisation`` with ``role``, or change the role of an existing member."""
    if role not in Membership.Role.values:
        raise InvalidInputError(f"Unknown role {role!r}.", code="invalid_role", extra={"role": role})
    membership, _ = Membership.objects.update_or_create(
        organisation=organisation, user=user, defaults={"role": role}
    )
    return membership


@transaction.atomic
def organisation_suspend(*, organisation: Organisation, reason: str) -> Organisation:
    """Suspend an organisation: its tokens and members are refused by the API (reads and writes)."""
    organisation = Organisation.objects.select_for_update().get(pk=organisation.pk)
    if organisation.suspended_at is None:
        organisation.suspended_at = timezone.now()
        organisation.suspension_reason = reason
        organisation.save(update_fields=["suspended_at", "suspension_reason"])
    return organisation


@transaction.atomic
def organisation_reinstate(*, organisation: Organisation) -> Organisation:
    organisation = Organisation.objects.select_for_update().get(pk=organisation.pk)
    organisation.suspended_at = None
    organisation.suspension_reason = ""
    organisation.save(update_fields=["suspended_at", "suspension_reason"])
    return organisation


@transaction.atomic
def api_token_create(
    *,
    organisation: Organisation,
    name: str,
    scope: str = ApiToken.Scope.READ_WRITE,
    created_by: User | None = None,
) -> tuple[ApiToken, str]:
    """Issue a token for ``organisation``. Returns the token and its secret, which is never stored and
    cannot be shown again."""
    name = name.strip()
    if not name:
        raise InvalidInputError(
            "A token needs a name.", code="invalid", extra={"fields": {"name": ["required"]}}
        )
    if scope not in ApiToken.Scope.values:
        raise InvalidInputError(f"Unknown scope {scope!r}.", code="invalid_scope", extra={"scope": scope})
    prefix = secrets.token_hex(4)
    raw = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        organisation=organisation,
        name=name,
        prefix=prefix,
        key_hash=_hash_secret(raw),
        scope=scope,
        created_by=created_by if created_by is not None and created_by.is_authenticated else None,
    )
    return token, raw


@transaction.atomic
def api_token_revoke(*, organisation: Organisation, token_id: int) -> ApiToken:
    """Revoke one of ``organisation``'s tokens. Revoking twice is a no-op; another organisation's token
    answers NotFoundError."""
    try:
        token = ApiToken.objects.select_for_update().get(pk=token_id, organisation=organisation)
    except ApiToken.DoesNotExist as exc:
        raise NotFoundError("No such token.", code="token_not_found") from exc
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    """Return the active token for the wire value ``raw``, or None. Touches ``last_used_at`` at most once
    per CARDHOUR_TOKEN_LAST_USED_RESOLUTION_SECONDS."""
    parts = raw.split("_", 2)
    # Check the prefix's shape before it reaches SQL: PostgreSQL rejects NUL bytes with a DataError.
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not _PREFIX_RE.fullmatch(parts[1]):
        return None
    token = (
        ApiToken.objects.select_related("organisation")
        .filter(prefix=parts[1], revoked_at__isnull=True)
        .first()
    )
    if token is None or not hmac.compare_digest(token.key_hash, _hash_secret(raw)):
        return None
    now = timezone.now()
    resolution = timedelta(seconds=settings.CARDHOUR_TOKEN_LAST_USED_RESOLUTION_SECONDS)
    if token.last_used_at is None or now - token.last_used_at >= resolution:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
