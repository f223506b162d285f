from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from core.models import ApiToken


class OrganisationRateThrottle(SimpleRateThrottle):
    """One budget per organisation for tokens, per user for sessions; anonymous calls fall through to
    AnonRateThrottle."""

    scope = "organisation"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if isinstance(request.auth, ApiToken):
            ident = f"org:{request.auth.organisation_id}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            return None
        return self.cache_format % {"scope": self.scope, "ident": ident}
