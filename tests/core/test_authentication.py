"""Who is calling: tokens for machines, sessions for people, the organisation a person acts for, roles,
and suspended organisations. Bad credentials are a 401, never a 500."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from rest_framework.test import APIClient

from core.models import ApiToken, Membership, Organisation
from core.services import api_token_create, membership_set, organisation_reinstate, organisation_suspend
from tests.factories import BuyerFactory, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

ON_POSTGRES = "postgresql" in settings.DATABASES["default"]["ENGINE"]
ERROR_KEYS = {"code", "message", "extra"}


def session_client(user: AbstractBaseUser, organisation_slug: str | None = None) -> APIClient:
    client = APIClient()
    client.force_login(user)
    if organisation_slug is not None:
        client.credentials(HTTP_X_CARDHOUR_ORGANISATION=organisation_slug)
    return client


# --- no or bad credentials ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/me"),
        ("get", "/api/v1/tokens"),
        ("post", "/api/v1/tokens"),
        ("delete", "/api/v1/tokens/1"),
    ],
)
def test_no_credentials_is_401_not_authenticated(operator: Organisation, method: str, path: str) -> None:
    before = ApiToken.objects.count()

    response = getattr(APIClient(), method)(path, {"name": "x"} if method == "post" else None, format="json")

    assert response.status_code == 401
    assert response.json() == {
        "code": "not_authenticated",
        "message": "Authentication credentials were not provided.",
        "extra": {},
    }
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'
    assert ApiToken.objects.count() == before


@pytest.mark.parametrize(
    ("header", "code"),
    [
        ("Bearer", "authentication_failed"),
        ("Bearer ", "authentication_failed"),
        ("Token", "authentication_failed"),
        ("Bearer a b", "authentication_failed"),
        ("Bearer chk_deadbeef_x extra", "authentication_failed"),
        ("Bearer garbage", "authentication_failed"),
        ("Bearer chk__", "authentication_failed"),
        ("Bearer chk_deadbeef_", "authentication_failed"),
        ("Bearer chk_deadbeef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "authentication_failed"),
        ("Bearer chk", "authentication_failed"),
        ("Bearer _______", "authentication_failed"),
        ("Bearer " + "x" * 10_000, "authentication_failed"),
        ("Bearer chk_" + "a" * 5_000 + "_b", "authentication_failed"),
        ("Bearer chk_ab_\xff\xfe", "authentication_failed"),
        ("Bearer \xe9", "authentication_failed"),
        ("Bearer ' OR 1=1 --", "authentication_failed"),
        ("Bearer chk_%_x", "authentication_failed"),
        pytest.param("Bearer chk_\x00_x", "authentication_failed", id="nul-prefix"),
        pytest.param("Bearer chk_dead\x00beef_x", "authentication_failed", id="nul-inner"),
        ("Bearer \x00", "authentication_failed"),
        # Not a scheme this API knows: no credentials at all.
        ("Basic dXNlcjpwYXNzd29yZA==", "not_authenticated"),
        ("Bearerchk_deadbeef_x", "not_authenticated"),
        ("chk_deadbeef_x", "not_authenticated"),
        ("garbage", "not_authenticated"),
        ("", "not_authenticated"),
        ("   ", "not_authenticated"),
    ],
)
def test_malformed_authorization_is_401_never_500(operator: Organisation, header: str, code: str) -> None:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/v1/me")

    assert response.status_code == 401
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert body["code"] == code


def test_a_secret_with_one_character_changed_is_rejected(operator: Organisation) -> None:
    _, secret = api_token_create(organisation=operator, name="t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret[:-1]}{'A' if secret[-1] != 'A' else 'B'}")

    response = client.get("/api/v1/me")

    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"


@pytest.mark.parametrize("keyword", ["Bearer", "bearer", "BEARER", "Token", "token"])
def test_token_keywords_are_case_insensitive(operator: Organisation, keyword: str) -> None:
    _, secret = api_token_create(organisation=operator, name="t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {secret}")

    response = client.get("/api/v1/me")

    assert response.status_code == 200
    assert response.json()["organisation"]["slug"] == "cucc"


def test_token_acts_for_its_own_organisation_whatever_the_header_says(
    operator: Organisation, other_operator: Organisation
) -> None:
    _, secret = api_token_create(organisation=operator, name="t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_X_CARDHOUR_ORGANISATION="cmcc")

    response = client.get("/api/v1/me")

    assert response.status_code == 200
    assert response.json()["organisation"]["slug"] == "cucc"
    assert response.json()["credential"] == "token"


# --- sessions: which organisation a person acts for --------------------------------------------------


@pytest.fixture
def two_org_user(operator: Organisation, other_operator: Organisation) -> AbstractBaseUser:
    """Owner of cucc (first membership) and viewer of cmcc."""
    user = UserFactory(username="li.wei")
    MembershipFactory(organisation=operator, user=user, role=Membership.Role.OWNER)
    MembershipFactory(organisation=other_operator, user=user, role=Membership.Role.VIEWER)
    return user


def test_session_without_header_acts_for_the_first_membership(two_org_user: AbstractBaseUser) -> None:
    response = session_client(two_org_user).get("/api/v1/me")

    assert response.status_code == 200
    body = response.json()
    assert body["organisation"]["slug"] == "cucc"
    assert body["credential"] == "session"
    assert body["user"] == "li.wei"
    assert body["can_write"] is True


def test_session_header_picks_the_organisation(two_org_user: AbstractBaseUser) -> None:
    cmcc = session_client(two_org_user, "cmcc").get("/api/v1/me")
    cucc = session_client(two_org_user, "cucc").get("/api/v1/me")

    assert cmcc.status_code == 200
    assert cmcc.json()["organisation"]["slug"] == "cmcc"
    assert cmcc.json()["can_write"] is False
    assert cucc.json()["organisation"]["slug"] == "cucc"
    assert cucc.json()["can_write"] is True


def test_session_writes_go_to_the_header_organisation(
    operator: Organisation, other_operator: Organisation, two_org_user: AbstractBaseUser
) -> None:
    membership_set(organisation=other_operator, user=two_org_user, role=Membership.Role.ADMIN)

    response = session_client(two_org_user, "cmcc").post("/api/v1/tokens", {"name": "cmcc-ci"}, format="json")

    assert response.status_code == 201
    token = ApiToken.objects.get(pk=response.json()["token"]["id"])
    assert token.organisation == other_operator
    assert token.created_by == two_org_user
    assert response.json()["token"]["created_by"] == "li.wei"
    assert not ApiToken.objects.filter(organisation=operator, name="cmcc-ci").exists()


def test_session_lists_the_header_organisations_tokens(
    operator: Organisation, other_operator: Organisation, two_org_user: AbstractBaseUser
) -> None:
    api_token_create(organisation=operator, name="cucc-only")
    api_token_create(organisation=other_operator, name="cmcc-only")

    response = session_client(two_org_user, "cmcc").get("/api/v1/tokens")

    assert [t["name"] for t in response.json()["results"]] == ["cmcc-only"]


def test_session_header_naming_a_foreign_organisation_is_403_no_organisation(
    two_org_user: AbstractBaseUser,
) -> None:
    BuyerFactory(slug="acme")
    before = ApiToken.objects.count()

    for slug in ("acme", "does-not-exist"):
        client = session_client(two_org_user, slug)
        read = client.get("/api/v1/me")
        write = client.post("/api/v1/tokens", {"name": "x"}, format="json")
        for response in (read, write):
            assert response.status_code == 403
            assert response.json() == {
                "code": "no_organisation",
                "message": "This account does not belong to an organisation.",
                "extra": {},
            }
    assert ApiToken.objects.count() == before


@pytest.mark.parametrize(
    "header",
    [
        "CUCC",
        " cucc",
        "x" * 5_000,
        "\xe9",
        pytest.param("\x00", id="nul"),
        pytest.param("cu\x00cc", id="inner-nul"),
    ],
)
def test_session_header_that_is_no_slug_is_403_never_500(two_org_user: AbstractBaseUser, header: str) -> None:
    client = APIClient(raise_request_exception=False)
    client.force_login(two_org_user)
    client.credentials(HTTP_X_CARDHOUR_ORGANISATION=header)

    response = client.get("/api/v1/me")

    assert response.status_code == 403
    assert response.json()["code"] == "no_organisation"


def test_user_with_no_membership_is_403_no_organisation(db: None) -> None:
    user = UserFactory(username="lonely", is_staff=True)

    response = session_client(user).get("/api/v1/me")

    assert response.status_code == 403
    assert response.json()["code"] == "no_organisation"
    assert set(response.json()) == ERROR_KEYS


def test_logged_out_session_with_header_is_401(two_org_user: AbstractBaseUser) -> None:
    client = session_client(two_org_user, "cucc")
    client.logout()

    response = client.get("/api/v1/me")

    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_session_writes_need_a_csrf_token(operator: Organisation, two_org_user: AbstractBaseUser) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(two_org_user)
    before = ApiToken.objects.count()

    response = client.post("/api/v1/tokens", {"name": "x"}, format="json")

    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    assert set(response.json()) == ERROR_KEYS
    assert ApiToken.objects.count() == before


# --- roles -------------------------------------------------------------------------------------------


def test_viewer_can_read_but_not_write(operator: Organisation) -> None:
    viewer = UserFactory(username="viewer")
    MembershipFactory(organisation=operator, user=viewer, role=Membership.Role.VIEWER)
    target, _ = api_token_create(organisation=operator, name="target")
    client = session_client(viewer)
    before = ApiToken.objects.count()

    assert client.get("/api/v1/tokens").status_code == 200
    assert client.get("/api/v1/me").json()["can_write"] is False
    created = client.post("/api/v1/tokens", {"name": "nope"}, format="json")
    revoked = client.delete(f"/api/v1/tokens/{target.pk}")

    for response in (created, revoked):
        assert response.status_code == 403
        assert response.json()["code"] == "read_only_credential"
    assert ApiToken.objects.count() == before
    target.refresh_from_db()
    assert target.revoked_at is None


@pytest.mark.parametrize("role", [Membership.Role.OWNER, Membership.Role.ADMIN])
def test_owners_and_admins_can_create_tokens(operator: Organisation, role: str) -> None:
    user = UserFactory(username=f"u-{role}")
    MembershipFactory(organisation=operator, user=user, role=role)

    response = session_client(user).post("/api/v1/tokens", {"name": f"by-{role}"}, format="json")

    assert response.status_code == 201
    assert ApiToken.objects.filter(organisation=operator, name=f"by-{role}", created_by=user).count() == 1


def test_a_plain_member_can_neither_create_nor_revoke_tokens(operator: Organisation) -> None:
    """The portal's rule, now the API's too (core.services.api_token_manage_authorise)."""
    user = UserFactory(username="plain")
    MembershipFactory(organisation=operator, user=user, role=Membership.Role.MEMBER)
    target, _ = api_token_create(organisation=operator, name="agent")
    client = session_client(user)

    created = client.post("/api/v1/tokens", {"name": "mine"}, format="json")
    revoked = client.delete(f"/api/v1/tokens/{target.pk}")

    for response in (created, revoked):
        assert response.status_code == 403 and response.json()["code"] == "not_a_token_manager"
    assert not ApiToken.objects.filter(name="mine").exists()
    target.refresh_from_db()
    assert target.revoked_at is None


def test_demoting_to_viewer_takes_effect_on_the_next_request(operator: Organisation) -> None:
    user = UserFactory(username="demoted")
    MembershipFactory(organisation=operator, user=user, role=Membership.Role.ADMIN)
    client = session_client(user)
    assert client.get("/api/v1/me").json()["can_write"] is True

    membership_set(organisation=operator, user=user, role=Membership.Role.VIEWER)

    assert client.post("/api/v1/tokens", {"name": "late"}, format="json").status_code == 403
    assert not ApiToken.objects.filter(name="late").exists()


# --- suspended organisations -------------------------------------------------------------------------


def test_suspended_organisation_is_403_for_tokens(
    operator: Organisation, api: APIClient, other_api: APIClient
) -> None:
    before = ApiToken.objects.count()
    organisation_suspend(organisation=operator, reason="unpaid invoices")

    for response in (
        api.get("/api/v1/me"),
        api.get("/api/v1/tokens"),
        api.post("/api/v1/tokens", {"name": "x"}, format="json"),
    ):
        assert response.status_code == 403
        assert response.json() == {
            "code": "organisation_suspended",
            "message": "The organisation cucc is suspended.",
            "extra": {"reason": "unpaid invoices"},
        }
    assert ApiToken.objects.count() == before
    assert other_api.get("/api/v1/me").status_code == 200


def test_suspended_organisation_is_403_for_sessions(
    operator: Organisation, two_org_user: AbstractBaseUser
) -> None:
    organisation_suspend(organisation=operator, reason="abuse")

    suspended = session_client(two_org_user, "cucc").get("/api/v1/me")
    default = session_client(two_org_user).get("/api/v1/me")
    other = session_client(two_org_user, "cmcc").get("/api/v1/me")

    for response in (suspended, default):
        assert response.status_code == 403
        assert response.json()["code"] == "organisation_suspended"
        assert response.json()["extra"] == {"reason": "abuse"}
    assert other.status_code == 200
    assert other.json()["organisation"]["slug"] == "cmcc"


def test_reinstated_organisation_authenticates_again(operator: Organisation, api: APIClient) -> None:
    organisation_suspend(organisation=operator, reason="check")
    assert api.get("/api/v1/me").status_code == 403

    organisation_reinstate(organisation=operator)

    assert api.get("/api/v1/me").status_code == 200
