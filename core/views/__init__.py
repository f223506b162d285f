from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views import defaults
from django.views.decorators.http import require_GET, require_POST


def _home_url_name(request: HttpRequest) -> str | None:
    """Where a signed-in person starts: their side's main page (None: the landing page)."""
    from core.portal import portal_actor_resolve

    actor = portal_actor_resolve(request)
    if actor is None:
        return None
    if not actor.has_organisation:
        return "staff-dashboard" if actor.is_staff else None
    if actor.is_buyer:
        return "usage-dashboard"
    if actor.is_operator:
        return "operator-cluster-list"
    return "staff-dashboard" if actor.is_staff else None


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """The landing page for a visitor; a signed-in person goes on to their side's main page."""
    url_name = _home_url_name(request)
    if url_name is not None:
        return redirect(url_name)
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
        return JsonResponse({"code": "not_found", "message": _("Not found."), "extra": {}}, status=404)
    return defaults.page_not_found(request, exception or Http404())


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """403 for a page the person may not open: inside the portal (its navigation, the reason in their
    words, a way back). Under /api/ the one error shape, as DRF's own refusals have."""
    if _is_api(request):
        return JsonResponse(
            {"code": "permission_denied", "message": "You may not do this.", "extra": {}},
            status=403,
        )
    reason = str(exception) if exception is not None and str(exception) else ""
    return render(request, "403.html", {"reason": reason}, status=403)


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        body = {"code": "server_error", "message": _("Internal error; it has been logged."), "extra": {}}
        return JsonResponse(body, status=500)
    return defaults.server_error(request)


@require_POST
def organisation_switch(request: HttpRequest) -> HttpResponse:
    """Act for another of the person's organisations (the header's switcher); back to where they were."""
    from core.portal import portal_organisation_choose

    if not request.user.is_authenticated:
        return redirect("login")
    slug = request.POST.get("organisation", "")
    if not portal_organisation_choose(request, slug=slug):
        messages.error(request, _("You are not a member of that organisation."))
    target = request.POST.get("next") or request.headers.get("referer") or ""
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = reverse("home")
    return redirect(target)
