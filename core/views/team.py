"""Team: the organisation's members and invitations; accepting an invitation from its e-mailed link."""

from __future__ import annotations

from smtplib import SMTPException
from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods, require_POST

from core import selectors, services
from core.errors import ConflictError, DomainError, InvalidInputError, NotFoundError, PermissionDeniedError
from core.forms.accounts import PASSWORD_ALIASES, InvitationSignupForm, form_add_domain_error
from core.forms.team import InvitationForm, MemberRoleForm, role_choices
from core.models import Membership
from core.portal import PortalActor, portal_actor_resolve, portal_organisation_choose, portal_view

PAGE_SIZE = 50


def _portal(request: HttpRequest) -> PortalActor:
    return request.portal  # type: ignore[attr-defined]


def _manager(request: HttpRequest) -> PortalActor:
    portal = _portal(request)
    if not portal.can_manage:
        raise PermissionDenied(_("Only owners and administrators manage the team."))
    return portal


def _actor_role(portal: PortalActor) -> str:
    return portal.membership.role if portal.membership is not None else ""


def _team_page(
    request: HttpRequest, *, invite_form: InvitationForm | None = None, status: int = 200
) -> HttpResponse:
    portal = _portal(request)
    organisation = portal.organisation
    query = request.GET.get("q", "").strip()[:100]
    page = Paginator(selectors.membership_list(organisation=organisation, query=query), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    context: dict[str, Any] = {
        "organisation": organisation,
        "page": page,
        "query": query,
        "owner_count": selectors.membership_owner_count(organisation=organisation),
        "can_manage": portal.can_manage,
        "is_owner": _actor_role(portal) == Membership.Role.OWNER,
    }
    if portal.can_manage:
        context["invitations"] = list(selectors.invitation_list_pending(organisation=organisation)[:200])
        context["invite_form"] = invite_form or InvitationForm(actor_role=_actor_role(portal))
        context["role_choices"] = role_choices(actor_role=_actor_role(portal))
    return render(request, "core/team/team.html", context, status=status)


@portal_view("any")
@require_http_methods(["GET", "HEAD"])
def team(request: HttpRequest) -> HttpResponse:
    """Members with their roles; for owners and administrators also invitations and the invite form."""
    return _team_page(request)


@portal_view("any", write=True)
@require_POST
def team_invite(request: HttpRequest) -> HttpResponse:
    portal = _manager(request)
    form = InvitationForm(request.POST, actor_role=_actor_role(portal))
    if form.is_valid():
        try:
            invitation, token = services.invitation_create(
                actor=portal.actor, email=form.cleaned_data["email"], role=form.cleaned_data["role"]
            )
        except PermissionDeniedError as exc:
            raise PermissionDenied(exc.message) from exc
        except DomainError as exc:
            form_add_domain_error(form, exc)
        else:
            accept_url = request.build_absolute_uri(reverse("invite-accept", args=[token]))
            try:
                services.invitation_email_send(invitation=invitation, accept_url=accept_url)
            except (SMTPException, OSError):
                messages.warning(
                    request,
                    _(
                        "The invitation for %(email)s is saved but the e-mail could not be sent; revoke it and try again."
                    )
                    % {"email": invitation.email},
                )
            else:
                messages.success(
                    request,
                    _("Invitation sent to %(email)s; the link works for 7 days.")
                    % {"email": invitation.email},
                )
            return redirect("team")
    return _team_page(request, invite_form=form)


@portal_view("any", write=True)
@require_POST
def team_invitation_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    portal = _manager(request)
    try:
        invitation = services.invitation_revoke(actor=portal.actor, invitation_id=pk)
    except PermissionDeniedError as exc:
        raise PermissionDenied(exc.message) from exc
    except ConflictError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, _("Invitation for %(email)s revoked.") % {"email": invitation.email})
    return redirect("team")


@portal_view("any", write=True)
@require_POST
def team_member_role(request: HttpRequest, pk: int) -> HttpResponse:
    portal = _manager(request)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Choose a valid role."))
        return redirect("team")
    try:
        membership = services.membership_role_change(
            actor=portal.actor, membership_id=pk, role=form.cleaned_data["role"]
        )
    except PermissionDeniedError as exc:
        raise PermissionDenied(exc.message) from exc
    except (ConflictError, InvalidInputError) as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request,
            _("%(user)s is now %(role)s.")
            % {"user": membership.user.get_username(), "role": membership.get_role_display()},
        )
    return redirect("team")


@portal_view("any", write=True)
@require_POST
def team_member_remove(request: HttpRequest, pk: int) -> HttpResponse:
    portal = _manager(request)
    try:
        membership = services.membership_remove(actor=portal.actor, membership_id=pk)
    except PermissionDeniedError as exc:
        raise PermissionDenied(exc.message) from exc
    except ConflictError as exc:
        messages.error(request, exc.message)
        return redirect("team")
    messages.success(
        request,
        _("%(user)s no longer belongs to %(organisation)s.")
        % {"user": membership.user.get_username(), "organisation": portal.organisation.name},
    )
    if membership.user_id == portal.user.pk:
        return redirect("home")
    return redirect("team")


# --- Accepting an invitation ------------------------------------------------------------------------


def _gone(request: HttpRequest, *, message: str, status: int) -> HttpResponse:
    return render(request, "core/team/invitation_gone.html", {"message": message}, status=status)


_GONE_MESSAGES = {
    "accepted": gettext_lazy(
        "This invitation has already been used. If it was you, log in; otherwise ask for a new one."
    ),
    "revoked": gettext_lazy("This invitation was withdrawn. Ask the person who invited you for a new one."),
    "expired": gettext_lazy("This invitation has expired. Ask the person who invited you for a new one."),
}


def _act_for(request: HttpRequest, *, slug: str) -> None:
    """Switch the session to the organisation just joined. The PortalActor cached on the request predates
    the new membership, so it is dropped first."""
    if hasattr(request, "_portal_actor"):
        del request._portal_actor
    portal_organisation_choose(request, slug=slug)


def _invitation_accept(
    request: HttpRequest, *, token: str, actor: PortalActor | None, form: InvitationSignupForm | None
) -> bool:
    """Accept for the signed-in person, or sign the visitor up (and in) and accept for them. False when the
    sign-up form has errors."""
    if actor is not None:
        services.invitation_accept(token=token, user=actor.user)
        return True
    if form is None or not form.is_valid():
        return False
    user, _membership = services.invitation_accept_with_signup(
        token=token, username=form.cleaned_data["username"], password=form.cleaned_data["password1"]
    )
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return True


@sensitive_post_parameters("password1", "password2")
@require_http_methods(["GET", "HEAD", "POST"])
def invite_accept(request: HttpRequest, token: str) -> HttpResponse:
    """The e-mailed link. A signed-in person joins with one click; a visitor signs up here (the address is
    the invited one) or logs in and comes back."""
    try:
        invitation = selectors.invitation_get_by_token(token=token)
    except NotFoundError:
        return _gone(
            request,
            message=str(_("This invitation link is not valid. Check that it was copied whole.")),
            status=404,
        )
    state = invitation.state
    if state != "pending":
        return _gone(request, message=str(_GONE_MESSAGES[state]), status=410)
    actor = portal_actor_resolve(request)
    form = None if actor is not None else InvitationSignupForm(request.POST or None, email=invitation.email)
    if request.method == "POST":
        try:
            joined = _invitation_accept(request, token=token, actor=actor, form=form)
        except ConflictError as exc:
            if exc.code.startswith("invitation_"):  # used, revoked or lapsed since the page was shown
                return _gone(request, message=exc.message, status=410)
            if form is None:  # already a member
                messages.error(request, exc.message)
                return redirect("invite-accept", token=token)
            form_add_domain_error(form, exc, aliases=PASSWORD_ALIASES)
            joined = False
        except InvalidInputError as exc:
            if form is None:
                raise
            form_add_domain_error(form, exc, aliases=PASSWORD_ALIASES)
            joined = False
        if joined:
            _act_for(request, slug=invitation.organisation.slug)
            messages.success(
                request,
                _("You joined %(organisation)s as %(role)s.")
                % {"organisation": invitation.organisation.name, "role": invitation.get_role_display()},
            )
            return redirect("home")
    context = {
        "invitation": invitation,
        "form": form,
        "already_member": actor is not None
        and any(m.organisation_id == invitation.organisation_id for m in actor.memberships),
        "login_url": f"{reverse('login')}?{urlencode({'next': request.path})}",
    }
    return render(request, "core/team/invitation_accept.html", context)


urlpatterns: list[URLPattern] = [
    path("team/", team, name="team"),
    path("team/invite/", team_invite, name="team-invite"),
    path("team/invitations/<int:pk>/revoke/", team_invitation_revoke, name="team-invitation-revoke"),
    path("team/members/<int:pk>/role/", team_member_role, name="team-member-role"),
    path("team/members/<int:pk>/remove/", team_member_remove, name="team-member-remove"),
    path("invites/<str:token>/", invite_accept, name="invite-accept"),
]
