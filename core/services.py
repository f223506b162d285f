"""Writes for organisations, memberships, invitations and API tokens."""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.mail import EmailMultiAlternatives
from django.core.validators import validate_email
from django.db import IntegrityError, connection, transaction
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from core.db import bound_cursor
from core.errors import ConflictError, InvalidInputError, NotFoundError, PermissionDeniedError
from core.models import ApiToken, Invitation, Membership, Organisation
from core.selectors import invitation_token_hash
from core.types import Actor

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
            _("The organisation slug %(slug)r is taken.") % {"slug": slug},
            code="slug_taken",
            extra={"slug": slug},
        ) from exc
    if owner is not None:
        Membership.objects.create(organisation=organisation, user=owner, role=Membership.Role.OWNER)
    return organisation


@transaction.atomic
def membership_set(*, organisation: Organisation, user: User, role: str) -> Membership:
    """Add ``user`` to ``organisation`` with ``role``, or change the role of an existing member."""
    if role not in Membership.Role.values:
        raise InvalidInputError(
            _("Unknown role %(role)r.") % {"role": role}, code="invalid_role", extra={"role": role}
        )
    membership, _created = Membership.objects.update_or_create(
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


def api_token_manage_authorise(*, actor: Actor) -> None:
    """The one rule for managing API tokens, in the portal and the API alike: a person who is an owner or
    administrator of the organisation, or a token created with ``can_manage_tokens`` (which only such a
    person grants). Raises PermissionDeniedError (``not_a_token_manager``) otherwise — a plain member, a
    viewer, or any other token, so a leaked agent token cannot leave credentials behind."""
    if actor.token is not None:
        if actor.token.can_manage_tokens and actor.can_write:
            return
        raise PermissionDeniedError(
            _("This token cannot manage tokens; an owner or administrator can issue one that may."),
            code="not_a_token_manager",
        )
    membership = None
    if actor.user is not None and actor.organisation is not None:
        membership = Membership.objects.filter(organisation=actor.organisation, user=actor.user).first()
    if membership is None or membership.role not in _MANAGER_ROLES:
        raise PermissionDeniedError(
            _("Only owners and administrators manage API tokens."), code="not_a_token_manager"
        )


@transaction.atomic
def api_token_create(
    *,
    organisation: Organisation,
    name: str,
    scope: str = ApiToken.Scope.READ_WRITE,
    can_manage_tokens: bool = False,
    actor: Actor | None = None,
    created_by: User | None = None,
) -> tuple[ApiToken, str]:
    """Issue a token for ``organisation``. Returns the token and its secret, which is never stored and
    cannot be shown again.

    ``actor`` is who asks (the portal and the API always pass one; ``None`` is the platform itself, e.g. the
    demo seed): it must pass api_token_manage_authorise, and only a person may grant ``can_manage_tokens``
    (``scope_not_grantable``). The new token records who is accountable for it: the person, or for a token
    made by a token, that token and the person who made it."""
    creator_token = None
    if actor is not None:
        api_token_manage_authorise(actor=actor)
        if actor.token is not None:
            if can_manage_tokens:
                raise PermissionDeniedError(
                    _("A token cannot grant the right to manage tokens; an owner or administrator can."),
                    code="scope_not_grantable",
                )
            creator_token = actor.token
            created_by = actor.token.created_by
        else:
            created_by = actor.user
    name = name.strip()
    if not name:
        raise InvalidInputError(
            _("A token needs a name."), code="invalid", extra={"fields": {"name": [_("required")]}}
        )
    if scope not in ApiToken.Scope.values:
        raise InvalidInputError(
            _("Unknown scope %(scope)r.") % {"scope": scope}, code="invalid_scope", extra={"scope": scope}
        )
    if can_manage_tokens and scope != ApiToken.Scope.READ_WRITE:
        raise InvalidInputError(
            _("A read-only token cannot manage tokens."),
            code="invalid_scope",
            extra={"fields": {"can_manage_tokens": [_("A read-only token cannot manage tokens.")]}},
        )
    prefix = secrets.token_hex(4)
    raw = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        organisation=organisation,
        name=name,
        prefix=prefix,
        key_hash=_hash_secret(raw),
        scope=scope,
        can_manage_tokens=can_manage_tokens,
        created_by=created_by if created_by is not None and created_by.is_authenticated else None,
        created_by_token=creator_token,
    )
    return token, raw


@transaction.atomic
def api_token_revoke(*, organisation: Organisation, token_id: int, actor: Actor | None = None) -> ApiToken:
    """Revoke one of ``organisation``'s tokens. Revoking twice is a no-op; another organisation's token
    answers NotFoundError. ``actor`` (the portal and the API pass one) must pass
    api_token_manage_authorise; a token may always revoke itself."""
    if actor is not None and not (actor.token is not None and actor.token.pk == token_id):
        api_token_manage_authorise(actor=actor)
    try:
        token = ApiToken.objects.select_for_update().get(pk=token_id, organisation=organisation)
    except ApiToken.DoesNotExist as exc:
        raise NotFoundError(_("No such token."), code="token_not_found") from exc
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


@functools.cache
def _token_lookup_plan(vendor: str) -> tuple[str, list[list[tuple[Any, Any]]], list[str], list[str]]:
    """The SQL of :func:`_active_token_by_prefix`, each column's converters, and the two models' attnames,
    built once per process and database vendor."""
    token_fields = list(ApiToken._meta.concrete_fields)
    org_fields = list(Organisation._meta.concrete_fields)
    columns = ", ".join([f't."{f.column}"' for f in token_fields] + [f'o."{f.column}"' for f in org_fields])
    sql = (
        f'SELECT {columns} FROM "{ApiToken._meta.db_table}" t '  # noqa: S608 - names from the models, values bound
        f'JOIN "{Organisation._meta.db_table}" o ON o."id" = t."organisation_id" '
        'WHERE t."prefix" = %s AND t."revoked_at" IS NULL'
    )
    converters = []
    field: Any
    for field in [*token_fields, *org_fields]:
        col = field.get_col(field.model._meta.db_table)
        converters.append([(c, col) for c in connection.ops.get_db_converters(col)])
        converters[-1] += [(c, col) for c in field.get_db_converters(connection)]
    return sql, converters, [f.attname for f in token_fields], [f.attname for f in org_fields]


def _active_token_by_prefix(*, prefix: str) -> ApiToken | None:
    """The unrevoked token with ``prefix`` and its organisation, in one indexed read.

    Every API request makes this read, so it is written as SQL and the two rows are built with
    ``Model.from_db``: the ORM's query compilation (``select_related(...).filter(...).first()``) cost about
    0.9 ms of CPU per request, this about a fifth of that. The columns come from the models' own field lists,
    so a new field is read without touching this function. Revocation is unchanged: the row is read on
    every request, nothing is cached.
    """
    sql, converters, token_attnames, org_attnames = _token_lookup_plan(connection.vendor)
    with bound_cursor() as cursor:  # prepared once per connection in production (core.db)
        cursor.execute(sql, [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    values = []
    for value, field_converters in zip(row, converters, strict=True):
        for converter, col in field_converters:
            value = converter(value, col, connection)
        values.append(value)
    n = len(token_attnames)
    token = ApiToken.from_db("default", token_attnames, values[:n])
    token.organisation = Organisation.from_db("default", org_attnames, values[n:])
    return token


def api_token_authenticate(*, raw: str, touch: bool = True) -> ApiToken | None:
    """Return the active token for the wire value ``raw``, or None. Touches ``last_used_at`` at most once
    per CARDHOUR_TOKEN_LAST_USED_RESOLUTION_SECONDS (never with ``touch=False``: a check, not a use)."""
    parts = raw.split("_", 2)
    # Check the prefix's shape before it reaches SQL: PostgreSQL rejects NUL bytes with a DataError.
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not _PREFIX_RE.fullmatch(parts[1]):
        return None
    token = _active_token_by_prefix(prefix=parts[1])
    if token is None or not hmac.compare_digest(token.key_hash, _hash_secret(raw)):
        return None
    now = timezone.now()
    resolution = timedelta(seconds=settings.CARDHOUR_TOKEN_LAST_USED_RESOLUTION_SECONDS)
    if touch and (token.last_used_at is None or now - token.last_used_at >= resolution):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


# --- Sign-up ----------------------------------------------------------------------------------------

_SLUG_BASE_MAX = 24  # leaves room for a "-<n>" suffix within the 32 characters of a slug
_SLUG_ATTEMPTS = 20


def _slug_base(name: str) -> str:
    """The slug a name suggests: ASCII letters, digits and inner hyphens; "org" when nothing is left (a name
    written only in Chinese characters, say)."""
    base = slugify(name)[:_SLUG_BASE_MAX].strip("-").replace("_", "-")
    base = "-".join(part for part in base.split("-") if part)
    return base or "org"


def _slug_candidates(base: str) -> list[str]:
    """Free slugs for ``base`` in order of preference: ``base``, then ``base-2``, ``base-3``, …"""
    taken = set(Organisation.objects.filter(slug__startswith=base).values_list("slug", flat=True))
    candidates: list[str] = []
    n = 1
    while len(candidates) < _SLUG_ATTEMPTS:
        slug = base if n == 1 else f"{base}-{n}"
        if slug not in taken:
            candidates.append(slug)
        n += 1
    return candidates


def _password_check(*, password: str, user: User, field: str = "password") -> None:
    try:
        validate_password(password, user=user)
    except ValidationError as exc:
        raise InvalidInputError(
            " ".join(exc.messages), code="invalid_password", extra={"fields": {field: exc.messages}}
        ) from exc


def _username_check(*, username: str) -> None:
    if User.objects.filter(username__iexact=username).exists():
        message = _("That username is taken.")
        raise ConflictError(message, code="username_taken", extra={"fields": {"username": [message]}})


def _user_create(*, username: str, email: str, password: str) -> User:
    """A new person; the username is unique regardless of case, the password passes AUTH_PASSWORD_VALIDATORS."""
    username = username.strip()
    _username_check(username=username)
    user = User(username=username, email=email)
    try:
        user.full_clean(exclude=["password"], validate_unique=False)
    except ValidationError as exc:
        fields = {key: [str(m) for m in messages] for key, messages in exc.message_dict.items()}
        raise InvalidInputError(" ".join(exc.messages), code="invalid", extra={"fields": fields}) from exc
    _password_check(password=password, user=user)
    user.set_password(password)
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError as exc:  # a concurrent sign-up took the name between the check and the insert
        message = _("That username is taken.")
        raise ConflictError(
            message, code="username_taken", extra={"fields": {"username": [message]}}
        ) from exc
    return user


@transaction.atomic
def buyer_signup(
    *, username: str, email: str, password: str, organisation_name: str
) -> tuple[User, Organisation]:
    """Create a person and the buyer organisation they own, in one transaction: any fault leaves neither.

    The organisation's slug is derived from its name and made unique with a numeric suffix. Raises
    ConflictError (``username_taken``) and InvalidInputError (``invalid_password``, ``invalid``) with the
    faulty fields in ``extra["fields"]``.
    """
    email = email.strip()
    organisation_name = organisation_name.strip()
    if not organisation_name:
        message = _("Name your organisation.")
        raise InvalidInputError(message, code="invalid", extra={"fields": {"organisation_name": [message]}})
    try:
        validate_email(email)
    except ValidationError as exc:
        message = _("Enter a valid e-mail address.")
        raise InvalidInputError(message, code="invalid", extra={"fields": {"email": [message]}}) from exc
    user = _user_create(username=username, email=email, password=password)
    for slug in _slug_candidates(_slug_base(organisation_name)):
        try:
            organisation = organisation_create(
                slug=slug, name=organisation_name[:200], is_buyer=True, owner=user
            )
        except ConflictError:  # taken by a concurrent sign-up since the candidates were listed
            continue
        return user, organisation
    raise ConflictError(
        _("Could not find a free identifier for that organisation name; try another name."),
        code="slug_taken",
        extra={"fields": {"organisation_name": [_("Try another name.")]}},
    )


# --- Members and invitations --------------------------------------------------------------------

INVITATION_TTL = timedelta(days=7)
_MANAGER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN)


def _organisation_of(actor: Actor) -> Organisation:
    if actor.organisation is None:
        raise PermissionDeniedError(_("Act for an organisation to manage its team."), code="no_organisation")
    return actor.organisation


def _manager_role(*, actor: Actor) -> str:
    """The role of the person behind ``actor`` in its organisation; refuses anyone but owners and admins."""
    membership = None
    if actor.user is not None and actor.organisation is not None:
        membership = Membership.objects.filter(organisation=actor.organisation, user=actor.user).first()
    if membership is None or membership.role not in _MANAGER_ROLES:
        raise PermissionDeniedError(
            _("Only owners and administrators manage the team."), code="not_a_manager"
        )
    return membership.role


def _owner_rule(*, actor_role: str, roles: tuple[str, ...]) -> None:
    """Only an owner grants, changes or takes away ownership."""
    if Membership.Role.OWNER in roles and actor_role != Membership.Role.OWNER:
        raise PermissionDeniedError(
            _("Only an owner can grant or take away ownership."), code="owner_required"
        )


def _role_check(role: str) -> None:
    if role not in Membership.Role.values:
        message = _("Choose a valid role.")
        raise InvalidInputError(message, code="invalid_role", extra={"fields": {"role": [message]}})


def _locked_members(*, organisation: Organisation) -> list[Membership]:
    """Every membership of ``organisation``, locked: two owners demoting each other at once must not leave
    the organisation without one."""
    return list(Membership.objects.select_for_update().filter(organisation=organisation).order_by("pk"))


def _last_owner_guard(*, members: list[Membership], target: Membership) -> None:
    owners = [m for m in members if m.role == Membership.Role.OWNER]
    if target.role == Membership.Role.OWNER and len(owners) == 1:
        raise ConflictError(
            _("%(user)s is the last owner of %(organisation)s; make someone else an owner first.")
            % {"user": target.user.get_username(), "organisation": target.organisation.name},
            code="last_owner",
        )


def _member_of(*, members: list[Membership], membership_id: int) -> Membership:
    target = next((m for m in members if m.pk == membership_id), None)
    if target is None:
        raise NotFoundError(_("No such member."), code="membership_not_found")
    return target


@transaction.atomic
def membership_role_change(*, actor: Actor, membership_id: int, role: str) -> Membership:
    """Change the role of a member of the actor's organisation.

    Owners and administrators may change roles; only an owner touches ownership; the last owner cannot be
    demoted (ConflictError ``last_owner``). Another organisation's member answers NotFoundError.
    """
    organisation = _organisation_of(actor)
    actor_role = _manager_role(actor=actor)
    _role_check(role)
    members = _locked_members(organisation=organisation)
    target = _member_of(members=members, membership_id=membership_id)
    if target.role == role:
        return target
    _owner_rule(actor_role=actor_role, roles=(target.role, role))
    _last_owner_guard(members=members, target=target)
    return membership_set(organisation=organisation, user=target.user, role=role)


@transaction.atomic
def membership_remove(*, actor: Actor, membership_id: int) -> Membership:
    """Remove a member from the actor's organisation (the removed row is returned, unsaved).

    Same rules as :func:`membership_role_change`: managers only, owners only for owners, never the last
    owner. Another organisation's member answers NotFoundError.
    """
    organisation = _organisation_of(actor)
    actor_role = _manager_role(actor=actor)
    members = _locked_members(organisation=organisation)
    target = _member_of(members=members, membership_id=membership_id)
    _owner_rule(actor_role=actor_role, roles=(target.role,))
    _last_owner_guard(members=members, target=target)
    target.delete()
    return target


@transaction.atomic
def invitation_create(*, actor: Actor, email: str, role: str) -> tuple[Invitation, str]:
    """Invite ``email`` into the actor's organisation with ``role``, for :data:`INVITATION_TTL`.

    Returns the invitation and the link token, which is not stored (only its hash) and goes out once, in
    the e-mail (:func:`invitation_email_send`). A lapsed pending invitation of the same address is retired.
    Raises PermissionDeniedError (not a manager; an admin inviting an owner), ConflictError
    (``already_member``, ``already_invited``), InvalidInputError (a bad address or role).
    """
    organisation = _organisation_of(actor)
    actor_role = _manager_role(actor=actor)
    _role_check(role)
    _owner_rule(actor_role=actor_role, roles=(role,))
    email = email.strip().lower()
    try:
        validate_email(email)
    except ValidationError as exc:
        message = _("Enter a valid e-mail address.")
        raise InvalidInputError(message, code="invalid", extra={"fields": {"email": [message]}}) from exc
    # Serialise invitations of one organisation, so the pending check below holds until commit.
    Organisation.objects.select_for_update().filter(pk=organisation.pk).first()
    if Membership.objects.filter(organisation=organisation, user__email__iexact=email).exists():
        message = _("Someone with that e-mail address is already a member.")
        raise ConflictError(message, code="already_member", extra={"fields": {"email": [message]}})
    now = timezone.now()
    pending = Invitation.objects.filter(
        organisation=organisation, email=email, accepted_at__isnull=True, revoked_at__isnull=True
    ).first()
    if pending is not None:
        if not pending.is_expired(now=now):
            message = _("That address already has a pending invitation; revoke it to invite again.")
            raise ConflictError(message, code="already_invited", extra={"fields": {"email": [message]}})
        pending.revoked_at = now
        pending.save(update_fields=["revoked_at"])
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        organisation=organisation,
        email=email,
        role=role,
        token_hash=invitation_token_hash(token),
        invited_by=actor.user,
        expires_at=now + INVITATION_TTL,
    )
    return invitation, token


def invitation_email_send(*, invitation: Invitation, accept_url: str) -> None:
    """E-mail the invitation's link (``accept_url`` carries the token). Call after the invitation is
    committed, so no link goes out for an invitation that was rolled back."""
    context = {
        "invitation": invitation,
        "organisation": invitation.organisation,
        "invited_by": invitation.invited_by,
        "accept_url": accept_url,
    }
    subject = " ".join(render_to_string("core/team/invitation_email_subject.txt", context).split())
    body = render_to_string("core/team/invitation_email.txt", context)
    message = EmailMultiAlternatives(subject=subject, body=body, to=[invitation.email])
    message.send()


@transaction.atomic
def invitation_revoke(*, actor: Actor, invitation_id: int) -> Invitation:
    """Revoke a pending invitation of the actor's organisation; revoking twice is a no-op. Another
    organisation's invitation answers NotFoundError; an accepted one ConflictError ``invitation_accepted``."""
    organisation = _organisation_of(actor)
    actor_role = _manager_role(actor=actor)
    try:
        invitation = Invitation.objects.select_for_update().get(pk=invitation_id, organisation=organisation)
    except Invitation.DoesNotExist as exc:
        raise NotFoundError(_("No such invitation."), code="invitation_not_found") from exc
    _owner_rule(actor_role=actor_role, roles=(invitation.role,))
    return _invitation_withdraw(invitation=invitation)


def _invitation_withdraw(*, invitation: Invitation) -> Invitation:
    if invitation.accepted_at is not None:
        raise ConflictError(_("That invitation has already been accepted."), code="invitation_accepted")
    if invitation.revoked_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
    return invitation


@transaction.atomic
def invitation_revoke_by_staff(*, invitation_id: int) -> Invitation:
    """Revoke any pending invitation (the back office); accepted ones are left alone (ConflictError)."""
    try:
        invitation = Invitation.objects.select_for_update().get(pk=invitation_id)
    except Invitation.DoesNotExist as exc:
        raise NotFoundError(_("No such invitation."), code="invitation_not_found") from exc
    return _invitation_withdraw(invitation=invitation)


def _invitation_for_update(*, token: str) -> Invitation:
    """The pending, unexpired invitation behind ``token``, locked. NotFoundError for an unknown token;
    ConflictError ``invitation_accepted`` / ``invitation_revoked`` / ``invitation_expired`` otherwise."""
    invitation = (
        Invitation.objects.select_for_update()
        .select_related("organisation")
        .filter(token_hash=invitation_token_hash(token))
        .first()
    )
    if invitation is None:
        raise NotFoundError(_("No such invitation."), code="invitation_not_found")
    state = invitation.state
    if state == "accepted":
        raise ConflictError(_("This invitation has already been used."), code="invitation_accepted")
    if state == "revoked":
        raise ConflictError(_("This invitation was withdrawn."), code="invitation_revoked")
    if state == "expired":
        raise ConflictError(_("This invitation has expired."), code="invitation_expired")
    return invitation


def _invitation_join(*, invitation: Invitation, user: User) -> Membership:
    if Membership.objects.filter(organisation=invitation.organisation, user=user).exists():
        raise ConflictError(
            _("You are already a member of %(organisation)s.")
            % {"organisation": invitation.organisation.name},
            code="already_member",
        )
    membership = Membership.objects.create(
        organisation=invitation.organisation, user=user, role=invitation.role
    )
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    return membership


@transaction.atomic
def invitation_accept(*, token: str, user: User) -> Membership:
    """Join the invitation's organisation as ``user`` with the invited role; the invitation is used up.

    Whoever holds the link may accept it (the link is the credential, as for a password-reset link).
    Raises NotFoundError (unknown token) and ConflictError (``invitation_accepted``, ``invitation_revoked``,
    ``invitation_expired``, ``already_member``).
    """
    invitation = _invitation_for_update(token=token)
    return _invitation_join(invitation=invitation, user=user)


@transaction.atomic
def invitation_accept_with_signup(*, token: str, username: str, password: str) -> tuple[User, Membership]:
    """Create a person with the invited address and accept the invitation for them, in one transaction.

    Raises what :func:`invitation_accept` raises, and ConflictError ``username_taken`` / InvalidInputError
    ``invalid_password`` with the faulty field in ``extra["fields"]``.
    """
    invitation = _invitation_for_update(token=token)
    user = _user_create(username=username, email=invitation.email, password=password)
    return user, _invitation_join(invitation=invitation, user=user)
