"""Request guards that must run before a view reads the body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
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
                return JsonResponse(
                    {
                        "code": "payload_too_large",
                        "message": f"The request body is {length} bytes; this endpoint accepts at most {limit}.",
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
