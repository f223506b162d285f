"""Who is acting: the organisation a request acts for, and through which credential."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.utils.translation import gettext as _
from rest_framework.request import Request

from core.errors import PermissionDeniedError
from core.models import ApiToken
from core.selectors import membership_for_user
from core.types import RequestActor

ORGANISATION_HEADER = "HTTP_X_CARDHOUR_ORGANISATION"


def actor_from_request(request: Request) -> RequestActor:
    """Resolve (and cache on the request) the acting organisation.

    A token acts for its own organisation. A person acts for the organisation named in the
    ``X-Cardhour-Organisation`` header, or their first membership. Raises PermissionDeniedError when
    there is none, or when the organisation is suspended.
    """
    cached = getattr(request, "_cardhour_actor", None)
    if cached is not None:
        return cached
    token = request.auth if isinstance(request.auth, ApiToken) else None
    if token is not None:
        actor = RequestActor(
            organisation=token.organisation,
            user=None,
            token=token,
            can_write=token.scope == ApiToken.Scope.READ_WRITE,
        )
    else:
        membership = membership_for_user(
            user=request.user, organisation_slug=request.META.get(ORGANISATION_HEADER)
        )
        if membership is None:
            raise PermissionDeniedError(
                _("This account does not belong to an organisation."), code="no_organisation"
            )
        actor = RequestActor(
            organisation=membership.organisation,
            user=request.user if isinstance(request.user, User) else None,
            token=None,
            can_write=membership.can_write,
        )
    if actor.organisation.is_suspended:
        raise PermissionDeniedError(
            _("The organisation %(organisation)s is suspended.") % {"organisation": actor.organisation.slug},
            code="organisation_suspended",
            extra={"reason": actor.organisation.suspension_reason},
        )
    request._cardhour_actor = actor  # type: ignore[attr-defined]
    return actor
