"""Accounts: sign up, log in, password reset by e-mail, and the landing page's redirects (core.views)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse

from core import services
from core.models import Membership, Organisation
from core.portal import SESSION_ORGANISATION_KEY
from tests.portal.conftest import PASSWORD

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "Violet-Harbour-2026"


def _signup_data(**overrides: str) -> dict[str, str]:
    data = {
        "username": "nina",
        "email": "nina@example.com",
        "password1": NEW_PASSWORD,
        "password2": NEW_PASSWORD,
        "organisation_name": "Nimbus Robotics Ltd.",
    }
    data.update(overrides)
    return data


def _counts() -> tuple[int, int, int]:
    return User.objects.count(), Organisation.objects.count(), Membership.objects.count()


# --- Sign up ------------------------------------------------------------------------------------------


def test_signup_page_renders_for_a_visitor() -> None:
    response = Client().get(reverse("signup"))
    assert response.status_code == 200
    for name in ("username", "email", "password1", "password2", "organisation_name"):
        assert f'name="{name}"'.encode() in response.content


def test_signup_creates_one_user_one_buyer_organisation_and_an_owner_membership() -> None:
    client = Client()
    before = _counts()
    response = client.post(reverse("signup"), _signup_data())
    assert response.status_code == 302
    assert response["Location"] == reverse("market")
    assert _counts() == (before[0] + 1, before[1] + 1, before[2] + 1)
    user = User.objects.get(username="nina")
    assert user.email == "nina@example.com"
    assert user.check_password(NEW_PASSWORD)
    organisation = Organisation.objects.get(name="Nimbus Robotics Ltd.")
    assert organisation.slug == "nimbus-robotics-ltd"
    assert (organisation.is_buyer, organisation.is_operator, organisation.is_platform) == (True, False, False)
    membership = Membership.objects.get(user=user)
    assert (membership.organisation, membership.role) == (organisation, Membership.Role.OWNER)
    assert client.session["_auth_user_id"] == str(user.pk)
    assert client.session[SESSION_ORGANISATION_KEY] == "nimbus-robotics-ltd"


def test_signup_makes_the_slug_unique_with_a_suffix(buyer: Organisation) -> None:
    Client().post(reverse("signup"), _signup_data(organisation_name="ACME"))
    Client().post(reverse("signup"), _signup_data(username="nora", organisation_name="Acme!"))
    assert buyer.slug == "acme"
    assert Organisation.objects.get(memberships__user__username="nina").slug == "acme-2"
    assert Organisation.objects.get(memberships__user__username="nora").slug == "acme-3"


def test_signup_with_a_name_without_latin_letters_gets_a_generic_slug() -> None:
    Client().post(reverse("signup"), _signup_data(organisation_name="算力科技"))
    organisation = Organisation.objects.get(memberships__user__username="nina")
    assert (organisation.slug, organisation.name) == ("org", "算力科技")


def test_signup_with_a_taken_username_shows_the_error_beside_the_field_and_creates_nothing(
    buyer_user: User,
) -> None:
    before = _counts()
    response = Client().post(reverse("signup"), _signup_data(username="Alice"))
    assert response.status_code == 200
    assert response.context["form"].errors == {"username": ["That username is taken."]}
    assert b'id="id_username_error"' in response.content
    assert _counts() == before


def test_signup_with_mismatched_passwords_shows_the_error_beside_the_field_and_creates_nothing() -> None:
    before = _counts()
    response = Client().post(reverse("signup"), _signup_data(password2="Violet-Harbour-2027"))
    assert response.status_code == 200
    assert response.context["form"].errors == {"password2": ["The two passwords differ."]}
    assert b'id="id_password2_error"' in response.content
    assert _counts() == before
    assert "_auth_user_id" not in response.wsgi_request.session


def test_signup_applies_the_password_validators() -> None:
    before = _counts()
    response = Client().post(reverse("signup"), _signup_data(password1="1234567", password2="1234567"))
    assert response.status_code == 200
    assert response.context["form"].errors == {
        "password2": [
            "This password is too short. It must contain at least 8 characters.",
            "This password is too common.",
            "This password is entirely numeric.",
        ]
    }
    assert _counts() == before


def test_signup_refuses_a_missing_organisation_name_and_a_bad_address() -> None:
    response = Client().post(reverse("signup"), _signup_data(organisation_name=" ", email="not-an-address"))
    assert response.status_code == 200
    assert set(response.context["form"].errors) == {"organisation_name", "email"}
    assert User.objects.filter(username="nina").count() == 0


def test_a_fault_during_signup_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**kwargs: object) -> Organisation:
        raise RuntimeError("database went away")

    monkeypatch.setattr(services, "organisation_create", broken)
    before = _counts()
    with pytest.raises(RuntimeError):
        services.buyer_signup(
            username="nina", email="nina@example.com", password=NEW_PASSWORD, organisation_name="Nimbus"
        )
    assert _counts() == before
    assert not User.objects.filter(username="nina").exists()


def test_signup_service_reports_a_taken_username_on_the_field(buyer_user: User) -> None:
    with pytest.raises(services.ConflictError) as caught:
        services.buyer_signup(
            username="ALICE", email="a@example.com", password=NEW_PASSWORD, organisation_name="Other"
        )
    assert caught.value.code == "username_taken"
    assert caught.value.extra == {"fields": {"username": ["That username is taken."]}}


def test_a_signed_in_person_opening_signup_goes_home(buyer_client: Client) -> None:
    response = buyer_client.get(reverse("signup"))
    assert response.status_code == 302
    assert response["Location"] == reverse("home")


# --- Log in and out -------------------------------------------------------------------------------------


def test_login_page_links_to_signup_and_password_reset() -> None:
    response = Client().get(reverse("login"))
    assert response.status_code == 200
    assert f'href="{reverse("signup")}"'.encode() in response.content
    assert f'href="{reverse("password_reset")}"'.encode() in response.content


def test_login_with_a_wrong_password_shows_an_error(buyer_user: User) -> None:
    response = Client().post(reverse("login"), {"username": "alice", "password": "wrong-password"})
    assert response.status_code == 200
    assert response.context["form"].non_field_errors()
    assert b'class="alert error"' in response.content


def test_logout_ends_the_session(buyer_client: Client) -> None:
    response = buyer_client.post(reverse("logout"))
    assert response.status_code == 302
    assert "_auth_user_id" not in buyer_client.session


# --- Password reset ---------------------------------------------------------------------------------


def test_password_reset_by_email_end_to_end(buyer_user: User) -> None:
    client = Client()
    assert client.get(reverse("password_reset")).status_code == 200
    response = client.post(reverse("password_reset"), {"email": "alice@example.com"})
    assert response.status_code == 302
    assert response["Location"] == reverse("password_reset_done")
    assert client.get(response["Location"]).status_code == 200

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["alice@example.com"]
    assert message.subject == "Reset your Cardhour password"
    match = re.search(r"https?://[^/\s]+(/accounts/reset/[^/\s]+/[^/\s]+/)", message.body)
    assert match is not None
    assert "alice" in message.body

    # The link swaps its token for a session-held one and redirects to the form.
    response = client.get(match.group(1))
    assert response.status_code == 302
    set_password_url = response["Location"]
    response = client.get(set_password_url)
    assert response.status_code == 200
    assert response.context["validlink"] is True

    response = client.post(
        set_password_url, {"new_password1": NEW_PASSWORD, "new_password2": "something-else-2026"}
    )
    assert response.status_code == 200
    assert "new_password2" in response.context["form"].errors

    response = client.post(set_password_url, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == reverse("password_reset_complete")
    assert client.get(response["Location"]).status_code == 200
    buyer_user.refresh_from_db()
    assert buyer_user.check_password(NEW_PASSWORD)
    assert not buyer_user.check_password(PASSWORD)

    # The link works once.
    response = client.get(match.group(1), follow=True)
    assert response.context["validlink"] is False
    assert b"This link does not work" in response.content


def test_password_reset_for_an_unknown_address_sends_nothing_and_says_the_same() -> None:
    response = Client().post(reverse("password_reset"), {"email": "nobody@example.com"})
    assert response.status_code == 302
    assert response["Location"] == reverse("password_reset_done")
    assert mail.outbox == []


# --- Home -------------------------------------------------------------------------------------------


def test_home_is_a_landing_page_for_a_visitor() -> None:
    response = Client().get(reverse("home"))
    assert response.status_code == 200
    content = response.content.decode()
    assert "Compute by the card-hour" in content
    assert f'href="{reverse("signup")}"' in content
    assert f'href="{reverse("login")}"' in content
    assert f'href="{reverse("api-docs")}"' in content


@pytest.mark.parametrize(
    ("person", "target"),
    [
        ("buyer_user", "usage-dashboard"),
        ("operator_user", "operator-cluster-list"),
        ("staff_user", "staff-dashboard"),
    ],
)
def test_home_sends_a_signed_in_person_to_their_side(
    request: pytest.FixtureRequest, login: Callable[[User], Client], person: str, target: str
) -> None:
    response = login(request.getfixturevalue(person)).get(reverse("home"))
    assert response.status_code == 302
    assert response["Location"] == reverse(target)


def test_home_for_a_person_without_an_organisation_explains_it(login: Callable[[User], Client]) -> None:
    loner = User.objects.create_user(username="lone", password=PASSWORD)
    response = login(loner).get(reverse("home"))
    assert response.status_code == 200
    assert b"does not belong to an organisation" in response.content
