"""Request guards that must run before a view reads the body."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import translation
from django.utils.translation import gettext as _
from whitenoise.middleware import WhiteNoiseMiddleware


class DualModeMiddleware:
    """Base of the project's middleware: sync- and async-capable, running in the mode of the handler it
    wraps. Under the ASGI server a long-poll must reach its async view without a synchronous middleware
    pinning a thread for the whole wait (core.api.longpoll); subclasses branch on ``self.is_async``."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)  # type: ignore[type-var]  # every subclass defines __call__


class ApiBodyLimitMiddleware(DualModeMiddleware):
    """Refuse an API request whose body is larger than its endpoint accepts, before anything reads it:
    ``413 {"code": "payload_too_large", …}`` in the API's error shape (Django alone would answer an HTML 400
    once the body passed DATA_UPLOAD_MAX_MEMORY_SIZE). Usage batches get a larger limit, sized for the
    largest documented batch (CARDHOUR_USAGE_BATCH_MAX records with 200-character keys)."""

    def __call__(self, request: HttpRequest) -> Any:
        refusal = self.refusal(request)
        if self.is_async:
            return self._acall(request, refusal)
        return refusal or self.get_response(request)

    async def _acall(self, request: HttpRequest, refusal: HttpResponse | None) -> HttpResponse:
        if refusal is not None:
            return refusal
        response: HttpResponse = await self.get_response(request)
        return response

    def refusal(self, request: HttpRequest) -> HttpResponse | None:
        if request.path.startswith("/api/"):
            limit = (
                settings.CARDHOUR_API_USAGE_BODY_MAX_BYTES
                if request.path.rstrip("/") in settings.CARDHOUR_API_USAGE_PATHS
                else settings.CARDHOUR_API_BODY_MAX_BYTES
            )
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > limit:
                # This runs before LocaleMiddleware, so the language is read from the request here.
                with translation.override(translation.get_language_from_request(request)):
                    message = _(
                        "The request body is %(bytes)d bytes; this endpoint accepts at most %(limit)d."
                    ) % {
                        "bytes": length,
                        "limit": limit,
                    }
                return JsonResponse(
                    {
                        "code": "payload_too_large",
                        "message": message,
                        "extra": {"max_bytes": limit, "bytes": length},
                    },
                    status=413,
                )
        return None


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, async-capable: static files are served from memory-indexed files before the rest of the
    stack; every other request passes through in the server's own mode (WhiteNoise's own middleware is
    synchronous only, which under ASGI would pin a thread for each waiting long-poll)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(get_response, **kwargs)
        self.is_async = get_response is not None and iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        return super().__call__(request)

    def _static_response(self, request: HttpRequest) -> HttpResponse | None:
        static_file = (
            self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        )
        return None if static_file is None else self.serve(static_file, request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        found = self._static_response(request)
        if found is not None:
            return found
        get_response: Callable[[HttpRequest], Awaitable[HttpResponse]] = self.get_response
        return await get_response(request)


class ContentSecurityPolicyMiddleware(DualModeMiddleware):
    """``Content-Security-Policy`` on every HTML page (the portal, the admin, Swagger UI): scripts and
    ``<style>`` elements only from this origin or carrying the request's nonce (``request.csp_nonce``, for
    the few inline blocks the templates keep), Stripe.js from the origin ``STRIPE_JS_URL`` names, no
    plug-ins, no ``<base>``, forms posting only here and no framing by anyone.

    The Stripe origins follow Stripe's documented directives (script-src and frame-src js.stripe.com,
    frame-src hooks.stripe.com for 3-D Secure, connect-src api.stripe.com) but are derived from the Stripe
    settings, so ``make run`` and the tests on localstripe allow localstripe's origin and nothing else.
    They are read per response: the tests point ``STRIPE_API_BASE`` at a localstripe started on a free port.

    ``style`` attributes stay allowed (``style-src-attr 'unsafe-inline'``): the portal colours tariff
    swatches from data and Swagger UI and the admin set them; a style attribute cannot run script. Browsers
    without the CSP3 ``-elem``/``-attr`` directives fall back to ``style-src 'self' 'unsafe-inline'``
    (a nonce there would switch ``'unsafe-inline'`` off for the attributes too)."""

    def __call__(self, request: HttpRequest) -> Any:
        request.csp_nonce = secrets.token_urlsafe(18)  # type: ignore[attr-defined]
        if self.is_async:
            return self._acall(request)
        return self.with_policy(request, self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        response: HttpResponse = await self.get_response(request)
        return self.with_policy(request, response)

    def with_policy(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if response.get("Content-Type", "").startswith("text/html") and (
            "Content-Security-Policy" not in response
        ):
            response["Content-Security-Policy"] = content_security_policy(
                nonce=request.csp_nonce  # type: ignore[attr-defined]
            )
        return response


STRIPE_HOOKS_ORIGIN = "https://hooks.stripe.com"  # 3-D Secure challenges are framed from here
STRIPE_API_ORIGIN = "https://api.stripe.com"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def stripe_csp_origins() -> dict[str, list[str]]:
    """The origins Stripe.js needs, by directive, for the configured Stripe: Stripe's own hosts in
    production, the localstripe origin when ``STRIPE_API_BASE``/``STRIPE_JS_URL`` point there."""
    js = _origin(settings.STRIPE_JS_URL)
    api = _origin(settings.STRIPE_API_BASE) or STRIPE_API_ORIGIN
    frames = [js, STRIPE_HOOKS_ORIGIN] if js == "https://js.stripe.com" else [js]
    return {
        "script-src": [js] if js else [],
        "frame-src": [origin for origin in frames if origin],
        "connect-src": [api],
    }


def content_security_policy(*, nonce: str) -> str:
    """The policy text for one HTML response, with its nonce."""
    stripe = stripe_csp_origins()
    directives = {
        "default-src": ["'self'"],
        "script-src": ["'self'", f"'nonce-{nonce}'", *stripe["script-src"]],
        "style-src": ["'self'", "'unsafe-inline'"],
        "style-src-elem": ["'self'", f"'nonce-{nonce}'"],
        "style-src-attr": ["'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'", *stripe["connect-src"]],
        "frame-src": stripe["frame-src"] or ["'none'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
    return "; ".join(f"{name} {' '.join(dict.fromkeys(sources))}" for name, sources in directives.items())
