"""The web portal's plumbing: who a signed-in person acts for, who may see a page, and the navigation.

Every portal view is wrapped in :func:`portal_view`, which

* sends an anonymous visitor to the log-in page (``?next=`` back to where they were going);
* resolves the organisation the person acts for: the one chosen with the organisation switcher (kept in
  the session), or their first membership;
* refuses a page meant for another side (a buyer page for an operator-only organisation, a staff page for
  a non-staff person) with 403, a suspended organisation with 403, and a write by a viewer with 403;
* puts ``request.portal`` (a :class:`PortalActor`) on the request for the view and the templates.

Objects of another organisation are never fetched: views read through selectors scoped to
``request.portal.organisation`` (``job_get_for(buyer=...)`` and the like), which raise NotFoundError, and
:func:`portal_view` turns any NotFoundError into a plain 404, so another organisation's object looks
exactly like one that does not exist.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from django.contrib.auth.models import User
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

from core.errors import NotFoundError
from core.models import Membership, Organisation
from core.types import Actor

SESSION_ORGANISATION_KEY = "cardhour_organisation"

Side = Literal["any", "buyer", "operator", "staff"]
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class PortalActor:
    """The signed-in person, the organisation they act for, and through which membership."""

    user: User
    membership: Membership | None
    memberships: tuple[Membership, ...] = field(default_factory=tuple)

    @property
    def organisation(self) -> Organisation:
        if self.membership is None:
            raise PermissionDenied(_("This account does not belong to an organisation."))
        return self.membership.organisation

    @property
    def has_organisation(self) -> bool:
        return self.membership is not None

    @property
    def is_buyer(self) -> bool:
        return self.membership is not None and self.membership.organisation.is_buyer

    @property
    def is_operator(self) -> bool:
        return self.membership is not None and self.membership.organisation.is_operator

    @property
    def is_staff(self) -> bool:
        return self.user.is_staff

    @property
    def can_write(self) -> bool:
        return self.membership is not None and self.membership.can_write

    @property
    def can_manage(self) -> bool:
        """Owners and administrators manage members and tokens."""
        return self.membership is not None and self.membership.role in (
            Membership.Role.OWNER,
            Membership.Role.ADMIN,
        )

    @property
    def actor(self) -> Actor:
        """The Actor services record in their audit rows."""
        return Actor(organisation=self.organisation, user=self.user, can_write=self.can_write)


def portal_actor_resolve(request: HttpRequest) -> PortalActor | None:
    """The PortalActor of ``request`` (cached on it), or None for an anonymous visitor."""
    cached = getattr(request, "_portal_actor", None)
    if cached is not None:
        return cast(PortalActor, cached)
    user = request.user
    if not user.is_authenticated:
        return None
    memberships = tuple(
        Membership.objects.select_related("organisation").filter(user=user).order_by("created_at", "pk")
    )
    chosen = request.session.get(SESSION_ORGANISATION_KEY)
    membership = next((m for m in memberships if m.organisation.slug == chosen), None)
    if membership is None and memberships:
        membership = memberships[0]
    actor = PortalActor(user=cast(User, user), membership=membership, memberships=memberships)
    request._portal_actor = actor  # type: ignore[attr-defined]
    return actor


def portal_organisation_choose(request: HttpRequest, *, slug: str) -> bool:
    """Make ``slug`` the organisation the person acts for, if they are a member of it."""
    actor = portal_actor_resolve(request)
    if actor is None or not any(m.organisation.slug == slug for m in actor.memberships):
        return False
    request.session[SESSION_ORGANISATION_KEY] = slug
    if hasattr(request, "_portal_actor"):
        del request._portal_actor
    return True


ViewFunc = TypeVar("ViewFunc", bound=Callable[..., HttpResponse])


def portal_view(
    side: Side | tuple[Side, ...] = "any", *, write: bool = False
) -> Callable[[ViewFunc], ViewFunc]:
    """Guard a portal view; see the module docstring.

    ``side`` is which organisations may open the page: one side, or several (``("buyer", "operator")``:
    either may). ``write=True`` refuses unsafe methods to viewers (read-only members); a page that shows a
    form to everyone checks ``request.portal.can_write`` itself. The sides are kept on the view as
    ``portal_sides`` (the permission sweep reads them).
    """
    sides: tuple[Side, ...] = side if isinstance(side, tuple) else (side,)

    def decorate(view: ViewFunc) -> ViewFunc:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            actor = portal_actor_resolve(request)
            if actor is None:
                return redirect_to_login(request.get_full_path(), reverse("login"))
            request.portal = actor  # type: ignore[attr-defined]
            if sides == ("staff",):
                if not actor.is_staff:
                    raise PermissionDenied(_("This page is for Cardhour staff."))
            elif "any" not in sides:
                if not actor.has_organisation:
                    raise PermissionDenied(_("This account does not belong to an organisation."))
                if actor.organisation.is_suspended:
                    raise PermissionDenied(
                        _("Your organisation is suspended: %(reason)s")
                        % {"reason": actor.organisation.suspension_reason or _("no reason given")}
                    )
                allowed = ("buyer" in sides and actor.is_buyer) or ("operator" in sides and actor.is_operator)
                if not allowed:
                    if sides == ("buyer",):
                        raise PermissionDenied(_("This page is for buyers."))
                    if sides == ("operator",):
                        raise PermissionDenied(_("This page is for operators."))
                    raise PermissionDenied(_("This page is for buyers and operators."))
            if write and request.method not in _SAFE_METHODS and not actor.can_write:
                raise PermissionDenied(_("Your role in this organisation is read only."))
            try:
                return view(request, *args, **kwargs)
            except NotFoundError as exc:
                raise Http404(exc.message) from exc

        wrapped.portal_sides = sides  # type: ignore[attr-defined]
        return cast(ViewFunc, wrapped)

    return decorate


# --- Navigation -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NavItem:
    label: StrOrPromise
    url_name: str
    section: str  # "buyer" | "operator" | "staff" | "account"


# Which pages the navigation offers, in order, by URL name (a test checks every name resolves). A page
# listed under two sections (the marketplace: buyers buy there, operators price against it) is shown once,
# under the first section the person sees.
NAV_ITEMS: tuple[NavItem, ...] = (
    NavItem(gettext_lazy("Marketplace"), "market", "buyer"),
    NavItem(gettext_lazy("Jobs"), "job-list", "buyer"),
    NavItem(gettext_lazy("Leases"), "lease-list", "buyer"),
    NavItem(gettext_lazy("Usage & spend"), "usage-dashboard", "buyer"),
    NavItem(gettext_lazy("Card-hour packs"), "pack-list", "buyer"),
    NavItem(gettext_lazy("Invoices"), "invoice-list", "buyer"),
    NavItem(gettext_lazy("SLA credits"), "sla-credit-list", "buyer"),
    NavItem(gettext_lazy("Clusters"), "operator-cluster-list", "operator"),
    NavItem(gettext_lazy("Tariffs & prices"), "operator-tariff-list", "operator"),
    NavItem(gettext_lazy("Leases"), "operator-lease-list", "operator"),
    NavItem(gettext_lazy("Earnings"), "operator-earnings", "operator"),
    NavItem(gettext_lazy("SLA credits"), "operator-sla-credit-list", "operator"),
    NavItem(gettext_lazy("Fleet import"), "operator-fleet-import", "operator"),
    NavItem(gettext_lazy("Marketplace"), "market", "operator"),
    NavItem(gettext_lazy("Team"), "team", "account"),
    NavItem(gettext_lazy("API tokens"), "token-list", "account"),
    NavItem(gettext_lazy("Staff dashboard"), "staff-dashboard", "staff"),
)


@dataclass(frozen=True)
class NavLink:
    label: str
    url: str
    section: str
    active: bool


def portal_nav(request: HttpRequest) -> list[NavLink]:
    """The links the signed-in person's navigation shows, the current page's marked active."""
    actor = portal_actor_resolve(request)
    if actor is None:
        return []
    visible = {
        "buyer": actor.is_buyer,
        "operator": actor.is_operator,
        "staff": actor.is_staff,
        "account": actor.has_organisation,
    }
    links = []
    shown: set[str] = set()
    path = request.path
    for item in NAV_ITEMS:
        if not visible[item.section] or item.url_name in shown:
            continue
        shown.add(item.url_name)
        url = reverse(item.url_name)
        links.append(NavLink(str(item.label), url, item.section, active=path.startswith(url)))
    return links


def portal_context(request: HttpRequest) -> dict[str, Any]:
    """Template context processor: ``portal`` (the PortalActor or None) and ``portal_nav``."""
    if request.path.startswith(("/api/", "/admin/", "/static/")):
        return {}
    return {"portal": portal_actor_resolve(request), "portal_nav": portal_nav(request)}
