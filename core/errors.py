"""Domain errors: a closed set of failures, each with a stable snake_case code.

Every app's errors subclass these; one DRF exception handler (core.api.exceptions) maps them to HTTP with
the body ``{"code", "message", "extra"}``. Services raise them; views never build error bodies by hand.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DomainError(Exception):
    """Base of every expected failure. ``code`` is part of the public API: never rename one."""

    code: ClassVar[str] = "error"
    http_status: ClassVar[int] = 400

    def __init__(self, message: str, *, code: str | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code  # type: ignore[misc]
        self.extra: dict[str, Any] = extra or {}


class InvalidInputError(DomainError):
    """The request is well-formed but its content breaks a rule (400)."""

    code = "invalid"
    http_status = 400


class NotFoundError(DomainError):
    """The object does not exist *for this caller* (404). Used for other organisations' objects too, so
    their existence does not leak."""

    code = "not_found"
    http_status = 404


class PermissionDeniedError(DomainError):
    code = "permission_denied"
    http_status = 403


class ConflictError(DomainError):
    """The request clashes with the current state (409): a taken identifier, a conflicting duplicate."""

    code = "conflict"
    http_status = 409
