"""Token authentication for machines: ``Authorization: Bearer chk_<prefix>_<secret>``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from core.models import ApiToken
from core.services import api_token_authenticate


class TokenPrincipal:
    """Stands in for ``request.user`` when a machine authenticates with a token.

    It is deliberately not a Django user: a token acts for its organisation and has no staff rights.
    """

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    def __init__(self, token: ApiToken):
        self.token = token

    def __str__(self) -> str:
        return f"token:{self.token.prefix}"

    def has_perm(self, *args: Any, **kwargs: Any) -> bool:
        return False


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[TokenPrincipal, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower().decode(errors="replace") not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("The Authorization header must be 'Bearer <token>'.")
        try:
            raw = header[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("The token contains invalid characters.") from exc
        token = api_token_authenticate(raw=raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return TokenPrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "core.api.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "chk_<prefix>_<secret>",
            "description": "An organisation's API token, shown once when it is created.",
        }
