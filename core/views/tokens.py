"""API tokens: list the organisation's tokens, issue one (its secret shown once), revoke one."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST

from core import selectors, services
from core.errors import InvalidInputError
from core.forms.accounts import form_add_domain_error
from core.forms.tokens import ApiTokenFilterForm, ApiTokenForm
from core.portal import PortalActor, portal_view
from core.types import Actor

PAGE_SIZE = 50


def _portal(request: HttpRequest) -> PortalActor:
    return request.portal  # type: ignore[attr-defined]


def _list_page(request: HttpRequest, *, form: ApiTokenForm | None = None) -> HttpResponse:
    portal = _portal(request)
    filters = ApiTokenFilterForm(request.GET or None)
    state = filters.cleaned_data["state"] if filters.is_valid() else ""
    tokens = selectors.api_token_list_filtered(organisation=portal.organisation, state=state)
    page = Paginator(tokens, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "filters": filters,
        "state": state,
        "can_manage": portal.can_manage,
        "form": form or (ApiTokenForm() if portal.can_manage else None),
    }
    return render(request, "core/tokens/token_list.html", context)


@portal_view("any", write=True)
@require_http_methods(["GET", "HEAD", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    """The organisation's tokens; a POST (owners and administrators) issues one and answers with its
    secret, once: the page is not stored by caches and the secret never enters a URL or a message."""
    portal = _portal(request)
    if request.method != "POST":
        return _list_page(request)
    if not portal.can_manage:
        raise PermissionDenied(_("Only owners and administrators issue API tokens."))
    form = ApiTokenForm(request.POST)
    if form.is_valid():
        try:
            token, secret = services.api_token_create(
                organisation=portal.organisation,
                name=form.cleaned_data["name"],
                scope=form.cleaned_data["scope"],
                can_manage_tokens=form.cleaned_data["can_manage_tokens"],
                actor=Actor(organisation=portal.organisation, user=portal.user),
            )
        except InvalidInputError as exc:
            form_add_domain_error(form, exc)
        else:
            response = render(request, "core/tokens/token_created.html", {"token": token, "secret": secret})
            add_never_cache_headers(response)
            return response
    return _list_page(request, form=form)


@portal_view("any", write=True)
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    """Revoke a token; revoking a revoked token changes nothing. Another organisation's token: 404."""
    portal = _portal(request)
    if not portal.can_manage:
        raise PermissionDenied(_("Only owners and administrators revoke API tokens."))
    token = services.api_token_revoke(
        organisation=portal.organisation,
        token_id=pk,
        actor=Actor(organisation=portal.organisation, user=portal.user),
    )
    messages.success(
        request,
        _("Token “%(name)s” (chk_%(prefix)s_…) is revoked.") % {"name": token.name, "prefix": token.prefix},
    )
    return redirect("token-list")


urlpatterns: list[URLPattern] = [
    path("tokens/", token_list, name="token-list"),
    path("tokens/<int:pk>/revoke/", token_revoke, name="token-revoke"),
]
