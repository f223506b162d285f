"""Permission classes. Object-level scoping is done by querying inside the caller's organisation, so
another organisation's object answers 404 (see federation selectors); these classes gate the role."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from core.api.context import actor_from_request
from core.errors import PermissionDeniedError


class IsOrganisationMember(BasePermission):
    """Authenticated and acting for an organisation; unsafe methods need a write-capable credential."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        actor = actor_from_request(request)
        if request.method not in SAFE_METHODS and not actor.can_write:
            raise PermissionDeniedError(_("This credential is read-only."), code="read_only_credential")
        return True


class IsOperator(IsOrganisationMember):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        if not actor_from_request(request).organisation.is_operator:
            raise PermissionDeniedError(_("Only operator organisations can do this."), code="not_an_operator")
        return True


class IsPlatform(IsOrganisationMember):
    """Cardhour's own organisation (back-office writes through the API)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        if not actor_from_request(request).organisation.is_platform:
            raise PermissionDeniedError(_("Only the platform can do this."), code="not_platform")
        return True
