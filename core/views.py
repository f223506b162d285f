from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults
from django.views.decorators.http import require_GET


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers: the process answers and can reach its database."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for URLs no route matches. Under /api/ it keeps the one error shape, so a client sees the same
    body whether a route rejected the path or a view found no object."""
    if _is_api(request):
        return JsonResponse({"code": "not_found", "message": "Not found.", "extra": {}}, status=404)
    return defaults.page_not_found(request, exception or Http404())


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        body = {"code": "server_error", "message": "Internal error; it has been logged.", "extra": {}}
        return JsonResponse(body, status=500)
    return defaults.server_error(request)
