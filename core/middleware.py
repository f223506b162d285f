"""Request guards that must run before a view reads the body."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class ApiBodyLimitMiddleware:
    """Refuse an API request whose body is larger than its endpoint accepts, before anything reads it:
    ``413 {"code": "payload_too_large", …}`` in the API's error shape (Django alone would answer an HTML 400
    once the body passed DATA_UPLOAD_MAX_MEMORY_SIZE). Usage batches get a larger limit, sized for the
    largest documented batch (CARDHOUR_USAGE_BATCH_MAX records with 200-character keys)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
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
        return self.get_response(request)
