"""The one exception handler: every API error leaves as ``{"code", "message", "extra"}``."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import OperationalError
from django.http import Http404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from core.errors import DomainError

logger = logging.getLogger(__name__)

# Messages follow the request's language (LocaleMiddleware applies to /api/ too: Accept-Language, else
# English); codes never change. DRF's own details (str(exc.detail)) come translated by DRF's catalogue.
_DRF_CODES: dict[type[exceptions.APIException], tuple[str, Any]] = {
    exceptions.ParseError: ("parse_error", gettext_lazy("The request body could not be parsed.")),
    exceptions.AuthenticationFailed: (
        "authentication_failed",
        gettext_lazy("The credentials were not accepted."),
    ),
    exceptions.NotAuthenticated: ("not_authenticated", gettext_lazy("Authentication is required.")),
    exceptions.PermissionDenied: ("permission_denied", gettext_lazy("You may not do this.")),
    exceptions.NotFound: ("not_found", gettext_lazy("Not found.")),
    exceptions.MethodNotAllowed: ("method_not_allowed", gettext_lazy("Method not allowed.")),
    exceptions.NotAcceptable: (
        "not_acceptable",
        gettext_lazy("The requested representation is not available."),
    ),
    exceptions.UnsupportedMediaType: ("unsupported_media_type", gettext_lazy("Unsupported media type.")),
    exceptions.Throttled: ("throttled", gettext_lazy("Too many requests.")),
}


# PostgreSQL conditions that mean "busy, try again" rather than a bug: lock_timeout (55P03), a deadlock victim
# (40P01), a serialization failure (40001) and statement_timeout (57014).
TRANSIENT_SQLSTATES = frozenset({"55P03", "40P01", "40001", "57014"})
BUSY_RETRY_AFTER_SECONDS = 1


def _transient_sqlstate(exc: OperationalError) -> bool:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in TRANSIENT_SQLSTATES


def _error(status_code: int, code: str, message: str, extra: dict[str, Any] | None = None) -> Response:
    return Response({"code": code, "message": message, "extra": extra or {}}, status=status_code)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        set_rollback()
        return _error(exc.http_status, exc.code, exc.message, exc.extra)
    if isinstance(exc, DjangoValidationError):
        set_rollback()
        fields = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return _error(400, "invalid", _("The request has invalid fields."), {"fields": fields})
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, OperationalError) and _transient_sqlstate(exc):
        # Contention, not a fault: the request's transaction rolled back whole, and the same request (with
        # the same idempotency key) succeeds once the lock is free. A 503 the client can retry, not a 500.
        set_rollback()
        logger.warning("API request refused as busy: %s", str(exc).splitlines()[0] if str(exc) else exc)
        response = _error(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "database_busy",
            _("The service is busy and did not complete the request; nothing was changed. Retry it shortly."),
            {"retry_after_seconds": BUSY_RETRY_AFTER_SECONDS},
        )
        response["Retry-After"] = str(BUSY_RETRY_AFTER_SECONDS)
        return response
    if not isinstance(exc, exceptions.APIException):
        return None  # a real server error: let Django log it and answer 500

    set_rollback()
    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]

    if isinstance(exc, exceptions.ValidationError):
        response = _error(
            status.HTTP_400_BAD_REQUEST,
            "invalid",
            _("The request has invalid fields."),
            {"fields": exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}},
        )
    else:
        code, default_message = next(
            ((c, m) for cls, (c, m) in _DRF_CODES.items() if isinstance(exc, cls)),
            (str(exc.default_code), str(exc.default_detail)),
        )
        message = str(exc.detail) if isinstance(exc.detail, str) else str(default_message)
        extra: dict[str, Any] = {}
        wait = getattr(exc, "wait", None)
        if isinstance(exc, exceptions.Throttled) and wait is not None:
            extra["retry_after_seconds"] = int(wait)
        response = _error(exc.status_code, code, message, extra)
    for key, value in headers.items():
        response[key] = value
    return response
