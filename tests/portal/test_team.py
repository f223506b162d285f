"""Team page: members and roles, invitations by e-mail, accepting them (core.views.team)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core import services
from core.models import Invitation, Membership, Organisation
from core.portal import SESSION_ORGANISATION_KEY
from core.types import Actor
from tests.factories import MembershipFactory, UserFactory
from tests.portal.conftest import PASSWORD

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "Copper-Lantern-2026"


def _member(organisation: Organisation, username: str, role: str) -> User:
    user = UserFactory(username=username)
    user.set_password(PASSWORD)
    user.save()
    MembershipFactory(user=user, organisation=organisation, role=role)
    return user


def _invite(
    organisation: Organisation, inviter: User, email: str, role: str = "member"
) -> tuple[Invitation, str]:
    return services.invitation_create(
        actor=Actor(organisation=organisation, user=inviter), email=email, role=role
    )


def _link_path(body: str) -> str:
    match = re.search(r"https?://[^/\s]+(/invites/[A-Za-z0-9_-]+/)", body)
    assert match is not None, body
    return match.group(1)


# --- The page ---------------------------------------------------------------------------------------


def test_anonymous_visitor_is_sent_to_log_in() -> None:
    response = Client().get(reverse("team"))
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next=/team/"


def test_an_owner_sees_members_roles_and_the_invite_form(buyer_client: Client, buyer_viewer: User) -> None:
    response = buyer_client.get(reverse("team"))
    assert response.status_code == 200
    content = response.content.decode()
    assert "alice" in content and "vera" in content
    assert "Viewer (read only)" in content
    assert f'action="{reverse("team-invite")}"' in content
    assert [m.user.username for m in response.context["page"].object_list] == ["alice", "vera"]


def test_a_viewer_sees_the_members_but_no_management(
    login: Callable[[User], Client], buyer_viewer: User, buyer_user: User
) -> None:
    response = login(buyer_viewer).get(reverse("team"))
    assert response.status_code == 200
    content = response.content.decode()
    assert "alice" in content
    assert reverse("team-invite") not in content
    assert "team-member-remove" not in content and "/remove/" not in content


def test_an_operator_has_a_team_page_too(operator_client: Client) -> None:
    response = operator_client.get(reverse("team"))
    assert response.status_code == 200
    assert b"olga" in response.content


def test_staff_without_an_organisation_get_403(staff_client: Client) -> None:
    assert staff_client.get(reverse("team")).status_code == 403


def test_another_organisations_members_never_show(buyer_client: Client, other_buyer_user: User) -> None:
    response = buyer_client.get(reverse("team"))
    assert b"bob" not in response.content


def test_team_search_narrows_the_members(
    buyer_client: Client, buyer: Organisation, buyer_viewer: User
) -> None:
    response = buyer_client.get(reverse("team"), {"q": "VER"})
    assert [m.user.username for m in response.context["page"].object_list] == ["vera"]


def test_team_page_queries_do_not_grow_with_members(
    buyer_client: Client,
    buyer: Organisation,
    buyer_user: User,
    django_assert_max_num_queries: Any,
) -> None:
    for n in range(70):
        _member(buyer, f"member{n:02d}", "member")
    for n in range(30):
        _invite(buyer, buyer_user, f"guest{n}@example.com")
    with django_assert_max_num_queries(12):
        response = buyer_client.get(reverse("team"))
    assert response.status_code == 200
    assert len(response.context["page"].object_list) == 50
    assert response.context["page"].paginator.count == 71
    assert len(response.context["invitations"]) == 30
    second = buyer_client.get(reverse("team"), {"page": 2})
    assert len(second.context["page"].object_list) == 21


# --- Inviting ---------------------------------------------------------------------------------------


def test_an_owner_invites_by_email_and_the_link_goes_out(
    buyer_client: Client, buyer: Organisation, buyer_user: User
) -> None:
    response = buyer_client.post(reverse("team-invite"), {"email": " Dana@Example.com ", "role": "admin"})
    assert response.status_code == 302
    assert response["Location"] == reverse("team")
    invitation = Invitation.objects.get()
    assert (invitation.organisation, invitation.email, invitation.role) == (
        buyer,
        "dana@example.com",
        "admin",
    )
    assert invitation.invited_by == buyer_user
    assert invitation.expires_at - invitation.created_at == pytest.approx(
        timedelta(days=7), abs=timedelta(seconds=5)
    )
    assert invitation.state == "pending"
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["dana@example.com"]
    assert message.subject == "You are invited to join Acme AI on Cardhour"
    assert "alice invited you to join Acme AI on Cardhour as Administrator." in message.body
    path = _link_path(message.body)
    token = path.split("/")[2]
    assert invitation.token_hash != token and token not in invitation.token_hash
    listing = buyer_client.get(reverse("team"))
    assert b"dana@example.com" in listing.content


def test_accepting_by_signing_up_creates_the_membership_with_the_invited_role(
    buyer_client: Client, buyer: Organisation
) -> None:
    buyer_client.post(reverse("team-invite"), {"email": "dana@example.com", "role": "viewer"})
    path = _link_path(mail.outbox[0].body)
    visitor = Client()
    page = visitor.get(path)
    assert page.status_code == 200
    content = page.content.decode()
    assert "dana@example.com" in content and "Acme AI" in content
    assert f"{reverse('login')}?next={path.replace('/', '%2F')}" in content
    response = visitor.post(path, {"username": "dana", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == reverse("home")
    dana = User.objects.get(username="dana")
    assert dana.email == "dana@example.com"
    membership = Membership.objects.get(user=dana)
    assert (membership.organisation, membership.role) == (buyer, Membership.Role.VIEWER)
    assert visitor.session["_auth_user_id"] == str(dana.pk)
    assert visitor.session[SESSION_ORGANISATION_KEY] == "acme"
    invitation = Invitation.objects.get()
    assert invitation.accepted_by == dana and invitation.accepted_at is not None
    # The link is used up.
    again = Client().get(path)
    assert again.status_code == 410
    assert b"already been used" in again.content


def test_accepting_signed_in_adds_the_membership_and_switches_organisation(
    buyer: Organisation, buyer_user: User, other_buyer_user: User, login: Callable[[User], Client]
) -> None:
    _invitation, token = _invite(buyer, buyer_user, "bob@example.com", role="member")
    bob = login(other_buyer_user)
    page = bob.get(reverse("invite-accept", args=[token]))
    assert page.status_code == 200
    assert b"Accept and join" in page.content
    response = bob.post(reverse("invite-accept", args=[token]))
    assert response.status_code == 302
    membership = Membership.objects.get(user=other_buyer_user, organisation=buyer)
    assert membership.role == Membership.Role.MEMBER
    assert bob.session[SESSION_ORGANISATION_KEY] == "acme"
    assert Membership.objects.filter(user=other_buyer_user).count() == 2


def test_an_anonymous_visitor_can_log_in_and_come_back(
    buyer: Organisation, buyer_user: User, other_buyer_user: User
) -> None:
    _invitation, token = _invite(buyer, buyer_user, "bob@example.com")
    path = reverse("invite-accept", args=[token])
    client = Client()
    response = client.post(reverse("login"), {"username": "bob", "password": PASSWORD, "next": path})
    assert response.status_code == 302
    assert response["Location"] == path
    assert client.post(path).status_code == 302
    assert Membership.objects.filter(user=other_buyer_user, organisation=buyer).exists()


def test_invitation_signup_with_a_taken_username_shows_the_error_and_changes_nothing(
    buyer: Organisation, buyer_user: User
) -> None:
    _invitation, token = _invite(buyer, buyer_user, "dana@example.com")
    users = User.objects.count()
    response = Client().post(
        reverse("invite-accept", args=[token]),
        {"username": "alice", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD},
    )
    assert response.status_code == 200
    assert response.context["form"].errors == {"username": ["That username is taken."]}
    assert User.objects.count() == users
    assert Invitation.objects.get().state == "pending"


def test_a_member_who_is_not_an_admin_cannot_invite(
    buyer: Organisation, login: Callable[[User], Client]
) -> None:
    mona = _member(buyer, "mona", "member")
    response = login(mona).post(reverse("team-invite"), {"email": "x@example.com", "role": "member"})
    assert response.status_code == 403
    assert Invitation.objects.count() == 0
    assert mail.outbox == []


def test_a_viewer_cannot_invite(buyer_viewer: User, login: Callable[[User], Client]) -> None:
    response = login(buyer_viewer).post(reverse("team-invite"), {"email": "x@example.com", "role": "member"})
    assert response.status_code == 403
    assert Invitation.objects.count() == 0


def test_an_admin_cannot_invite_an_owner(buyer: Organisation, login: Callable[[User], Client]) -> None:
    ada = _member(buyer, "ada", "admin")
    response = login(ada).post(reverse("team-invite"), {"email": "x@example.com", "role": "owner"})
    assert response.status_code == 200
    assert list(response.context["invite_form"].errors) == ["role"]
    assert Invitation.objects.count() == 0


def test_a_bad_address_shows_the_error_beside_the_field(buyer_client: Client) -> None:
    response = buyer_client.post(reverse("team-invite"), {"email": "not-an-address", "role": "member"})
    assert response.status_code == 200
    assert response.context["invite_form"].errors == {"email": ["Enter a valid email address."]}
    assert b'id="id_email_error"' in response.content
    assert Invitation.objects.count() == 0
    assert mail.outbox == []


def test_a_second_pending_invitation_for_the_same_address_is_refused(buyer_client: Client) -> None:
    buyer_client.post(reverse("team-invite"), {"email": "dana@example.com", "role": "member"})
    response = buyer_client.post(reverse("team-invite"), {"email": "DANA@example.com", "role": "admin"})
    assert response.status_code == 200
    assert response.context["invite_form"].errors == {
        "email": ["That address already has a pending invitation; revoke it to invite again."]
    }
    assert Invitation.objects.count() == 1
    assert len(mail.outbox) == 1


def test_inviting_an_existing_members_address_is_refused(buyer_client: Client, buyer_viewer: User) -> None:
    response = buyer_client.post(reverse("team-invite"), {"email": "vera@example.com", "role": "member"})
    assert response.status_code == 200
    assert response.context["invite_form"].errors == {
        "email": ["Someone with that e-mail address is already a member."]
    }


def test_a_lapsed_invitation_is_retired_when_the_address_is_invited_again(
    buyer: Organisation, buyer_user: User
) -> None:
    old, _token = _invite(buyer, buyer_user, "dana@example.com")
    Invitation.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    new, _token = _invite(buyer, buyer_user, "dana@example.com", role="admin")
    old.refresh_from_db()
    assert old.state == "revoked"
    assert new.state == "pending"


# --- Revoking and dead links ---------------------------------------------------------------------------


def test_revoking_an_invitation_kills_its_link(
    buyer_client: Client, buyer: Organisation, buyer_user: User
) -> None:
    invitation, token = _invite(buyer, buyer_user, "dana@example.com")
    response = buyer_client.post(reverse("team-invitation-revoke", args=[invitation.pk]))
    assert response.status_code == 302
    invitation.refresh_from_db()
    assert invitation.revoked_at is not None
    # Idempotent.
    assert buyer_client.post(reverse("team-invitation-revoke", args=[invitation.pk])).status_code == 302
    page = Client().get(reverse("invite-accept", args=[token]))
    assert page.status_code == 410
    assert b"withdrawn" in page.content
    post = Client().post(
        reverse("invite-accept", args=[token]),
        {"username": "dana", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD},
    )
    assert post.status_code == 410
    assert not User.objects.filter(username="dana").exists()


def test_another_organisations_invitation_is_404(
    other_buyer_client: Client, buyer: Organisation, buyer_user: User
) -> None:
    invitation, _token = _invite(buyer, buyer_user, "dana@example.com")
    response = other_buyer_client.post(reverse("team-invitation-revoke", args=[invitation.pk]))
    assert response.status_code == 404
    invitation.refresh_from_db()
    assert invitation.revoked_at is None


def test_an_expired_invitation_shows_a_clear_page(buyer: Organisation, buyer_user: User) -> None:
    invitation, token = _invite(buyer, buyer_user, "dana@example.com")
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    response = Client().get(reverse("invite-accept", args=[token]))
    assert response.status_code == 410
    assert b"This invitation has expired." in response.content
    with pytest.raises(services.ConflictError) as caught:
        services.invitation_accept(token=token, user=buyer_user)
    assert caught.value.code == "invitation_expired"


def test_an_unknown_invitation_link_is_404_with_a_message() -> None:
    response = Client().get(reverse("invite-accept", args=["no-such-token"]))
    assert response.status_code == 404
    assert b"This invitation link is not valid" in response.content


def test_accepting_into_an_organisation_you_are_in_changes_nothing(
    buyer_client: Client, buyer: Organisation, buyer_user: User
) -> None:
    _invitation, token = _invite(buyer, buyer_user, "someone@example.com", role="viewer")
    assert b"You already belong to" in buyer_client.get(reverse("invite-accept", args=[token])).content
    response = buyer_client.post(reverse("invite-accept", args=[token]))
    assert response.status_code == 302
    assert Membership.objects.get(user=buyer_user, organisation=buyer).role == "owner"
    assert Invitation.objects.get().state == "pending"


# --- Roles and removal -----------------------------------------------------------------------------


def test_an_owner_changes_a_members_role(
    buyer_client: Client, buyer: Organisation, buyer_viewer: User
) -> None:
    membership = Membership.objects.get(user=buyer_viewer)
    response = buyer_client.post(reverse("team-member-role", args=[membership.pk]), {"role": "admin"})
    assert response.status_code == 302
    membership.refresh_from_db()
    assert membership.role == "admin"


def test_the_last_owner_cannot_be_demoted(buyer_client: Client, buyer_user: User) -> None:
    membership = Membership.objects.get(user=buyer_user)
    response = buyer_client.post(
        reverse("team-member-role", args=[membership.pk]), {"role": "member"}, follow=True
    )
    assert response.status_code == 200
    assert b"alice is the last owner of Acme AI; make someone else an owner first." in response.content
    membership.refresh_from_db()
    assert membership.role == "owner"


def test_the_last_owner_cannot_be_removed(buyer_client: Client, buyer_user: User) -> None:
    membership = Membership.objects.get(user=buyer_user)
    response = buyer_client.post(reverse("team-member-remove", args=[membership.pk]), follow=True)
    assert b"is the last owner" in response.content
    assert Membership.objects.filter(pk=membership.pk).exists()


def test_with_two_owners_one_can_step_down(
    buyer_client: Client, buyer: Organisation, buyer_user: User
) -> None:
    _member(buyer, "otto", "owner")
    membership = Membership.objects.get(user=buyer_user)
    buyer_client.post(reverse("team-member-role", args=[membership.pk]), {"role": "admin"})
    membership.refresh_from_db()
    assert membership.role == "admin"
    assert Membership.objects.filter(organisation=buyer, role="owner").count() == 1


def test_an_owner_removes_a_member(buyer_client: Client, buyer: Organisation, buyer_viewer: User) -> None:
    membership = Membership.objects.get(user=buyer_viewer)
    response = buyer_client.post(reverse("team-member-remove", args=[membership.pk]))
    assert response.status_code == 302
    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert User.objects.filter(pk=buyer_viewer.pk).exists()


def test_an_admin_cannot_touch_an_owner(
    buyer: Organisation, buyer_user: User, login: Callable[[User], Client]
) -> None:
    ada = login(_member(buyer, "ada", "admin"))
    owner = Membership.objects.get(user=buyer_user)
    assert ada.post(reverse("team-member-role", args=[owner.pk]), {"role": "viewer"}).status_code == 403
    assert ada.post(reverse("team-member-remove", args=[owner.pk])).status_code == 403
    owner.refresh_from_db()
    assert owner.role == "owner"


def test_a_member_cannot_change_roles_or_remove(
    buyer: Organisation, buyer_viewer: User, login: Callable[[User], Client]
) -> None:
    mona = login(_member(buyer, "mona", "member"))
    vera = Membership.objects.get(user=buyer_viewer)
    assert mona.post(reverse("team-member-role", args=[vera.pk]), {"role": "admin"}).status_code == 403
    assert mona.post(reverse("team-member-remove", args=[vera.pk])).status_code == 403
    vera.refresh_from_db()
    assert vera.role == "viewer"


def test_another_organisations_member_is_404(buyer_client: Client, other_buyer_user: User) -> None:
    bob = Membership.objects.get(user=other_buyer_user)
    assert (
        buyer_client.post(reverse("team-member-role", args=[bob.pk]), {"role": "viewer"}).status_code == 404
    )
    assert buyer_client.post(reverse("team-member-remove", args=[bob.pk])).status_code == 404
    bob.refresh_from_db()
    assert bob.role == "owner"


def test_leaving_the_organisation_goes_home(
    buyer: Organisation, login: Callable[[User], Client], buyer_user: User
) -> None:
    ada_user = _member(buyer, "ada", "admin")
    ada = login(ada_user)
    membership = Membership.objects.get(user=ada_user)
    response = ada.post(reverse("team-member-remove", args=[membership.pk]))
    assert response.status_code == 302
    assert response["Location"] == reverse("home")
    assert not Membership.objects.filter(user=ada_user).exists()
