"""API tokens page: list, create (secret shown once), revoke (core.views.tokens)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from core import services
from core.models import ApiToken, Organisation
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def _member(organisation: Organisation, username: str, role: str) -> User:
    user = UserFactory(username=username)
    MembershipFactory(user=user, organisation=organisation, role=role)
    return user


def test_anonymous_visitor_is_sent_to_log_in() -> None:
    response = Client().get(reverse("token-list"))
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next=/tokens/"


def test_staff_without_an_organisation_get_403(staff_client: Client) -> None:
    assert staff_client.get(reverse("token-list")).status_code == 403


def test_the_list_shows_this_organisations_tokens_only(
    buyer_client: Client, buyer: Organisation, other_buyer: Organisation, buyer_user: User
) -> None:
    mine, _raw = services.api_token_create(organisation=buyer, name="scheduler", created_by=buyer_user)
    theirs, _raw = services.api_token_create(organisation=other_buyer, name="globex-secret-bot")
    response = buyer_client.get(reverse("token-list"))
    assert response.status_code == 200
    content = response.content.decode()
    assert "scheduler" in content and f"chk_{mine.prefix}_…" in content
    assert "globex-secret-bot" not in content and theirs.prefix not in content
    assert "Read and write" in content and "never" in content
    assert 'name="name"' in content  # an owner gets the create form


def test_an_operator_has_tokens_too(operator_client: Client, east_operator: Organisation) -> None:
    response = operator_client.post(reverse("token-list"), {"name": "agent zw-ai01", "scope": "read_write"})
    assert response.status_code == 200
    assert ApiToken.objects.get().organisation == east_operator


def test_creating_shows_the_secret_once_and_it_authenticates(
    buyer_client: Client, buyer: Organisation, buyer_user: User
) -> None:
    response = buyer_client.post(reverse("token-list"), {"name": "  trainer  ", "scope": "read_only"})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    content = response.content.decode()
    match = re.search(r">(chk_[0-9a-f]{8}_[A-Za-z0-9_-]+)<", content)
    assert match is not None
    secret = match.group(1)
    token = ApiToken.objects.get()
    assert (token.name, token.scope, token.created_by, token.organisation) == (
        "trainer",
        "read_only",
        buyer_user,
        buyer,
    )
    assert secret.startswith(f"chk_{token.prefix}_")
    assert token.key_hash != secret and secret not in token.key_hash
    authenticated = services.api_token_authenticate(raw=secret)
    assert authenticated is not None and authenticated.pk == token.pk
    assert "Copy the secret now." in content
    # Never again: not in the list, not in a message carried to the next page.
    listing = buyer_client.get(reverse("token-list"))
    assert secret not in listing.content.decode()
    assert f"chk_{token.prefix}_…" in listing.content.decode()
    assert secret not in response.wsgi_request.get_full_path()


def test_the_api_accepts_the_new_token(buyer_client: Client) -> None:
    response = buyer_client.post(reverse("token-list"), {"name": "cli", "scope": "read_write"})
    secret = re.search(r">(chk_[^<]+)<", response.content.decode()).group(1)  # type: ignore[union-attr]
    api = Client().get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.status_code == 200


def test_a_blank_name_shows_the_error_beside_the_field_and_creates_nothing(buyer_client: Client) -> None:
    response = buyer_client.post(reverse("token-list"), {"name": "   ", "scope": "read_write"})
    assert response.status_code == 200
    assert response.context["form"].errors == {"name": ["This field is required."]}
    assert b'id="id_name_error"' in response.content
    assert ApiToken.objects.count() == 0


def test_a_bad_scope_shows_the_error_beside_the_field(buyer_client: Client) -> None:
    response = buyer_client.post(reverse("token-list"), {"name": "x", "scope": "root"})
    assert response.status_code == 200
    assert list(response.context["form"].errors) == ["scope"]
    assert ApiToken.objects.count() == 0


def test_a_member_sees_the_list_but_cannot_create_or_revoke(
    buyer: Organisation, login: Callable[[User], Client]
) -> None:
    token, _raw = services.api_token_create(organisation=buyer, name="scheduler")
    mona = login(_member(buyer, "mona", "member"))
    page = mona.get(reverse("token-list"))
    assert page.status_code == 200
    assert b"scheduler" in page.content
    assert b'name="name"' not in page.content
    assert reverse("token-revoke", args=[token.pk]).encode() not in page.content
    assert mona.post(reverse("token-list"), {"name": "mine", "scope": "read_write"}).status_code == 403
    assert mona.post(reverse("token-revoke", args=[token.pk])).status_code == 403
    assert ApiToken.objects.count() == 1
    token.refresh_from_db()
    assert token.revoked_at is None


def test_a_viewer_cannot_create(buyer_viewer: User, login: Callable[[User], Client]) -> None:
    viewer = login(buyer_viewer)
    assert viewer.get(reverse("token-list")).status_code == 200
    assert viewer.post(reverse("token-list"), {"name": "mine", "scope": "read_write"}).status_code == 403
    assert ApiToken.objects.count() == 0


def test_revoking_works_and_is_idempotent(buyer_client: Client, buyer: Organisation) -> None:
    token, raw = services.api_token_create(organisation=buyer, name="scheduler")
    response = buyer_client.post(reverse("token-revoke", args=[token.pk]))
    assert response.status_code == 302
    assert response["Location"] == reverse("token-list")
    token.refresh_from_db()
    revoked_at = token.revoked_at
    assert revoked_at is not None
    assert services.api_token_authenticate(raw=raw) is None
    again = buyer_client.post(reverse("token-revoke", args=[token.pk]))
    assert again.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at == revoked_at
    listing = buyer_client.get(reverse("token-list"))
    assert b"revoked" in listing.content


def test_revoke_needs_a_post(buyer_client: Client, buyer: Organisation) -> None:
    token, _raw = services.api_token_create(organisation=buyer, name="scheduler")
    assert buyer_client.get(reverse("token-revoke", args=[token.pk])).status_code == 405
    token.refresh_from_db()
    assert token.revoked_at is None


def test_another_organisations_token_is_404(buyer_client: Client, other_buyer: Organisation) -> None:
    token, raw = services.api_token_create(organisation=other_buyer, name="globex")
    assert buyer_client.post(reverse("token-revoke", args=[token.pk])).status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    assert services.api_token_authenticate(raw=raw) is not None


def test_filter_by_state(buyer_client: Client, buyer: Organisation) -> None:
    services.api_token_create(organisation=buyer, name="live-one")
    dead, _raw2 = services.api_token_create(organisation=buyer, name="dead-one")
    services.api_token_revoke(organisation=buyer, token_id=dead.pk)
    active = buyer_client.get(reverse("token-list"), {"state": "active"})
    assert [t.name for t in active.context["page"].object_list] == ["live-one"]
    revoked = buyer_client.get(reverse("token-list"), {"state": "revoked"})
    assert [t.name for t in revoked.context["page"].object_list] == ["dead-one"]
    everything = buyer_client.get(reverse("token-list"), {"state": "bogus"})
    assert everything.status_code == 200
    assert len(everything.context["page"].object_list) == 2


def test_token_list_queries_do_not_grow_with_tokens(
    buyer_client: Client,
    buyer: Organisation,
    buyer_user: User,
    django_assert_max_num_queries: Any,
) -> None:
    for n in range(120):
        services.api_token_create(organisation=buyer, name=f"bot-{n}", created_by=buyer_user)
    with django_assert_max_num_queries(8):
        response = buyer_client.get(reverse("token-list"))
    assert response.status_code == 200
    assert len(response.context["page"].object_list) == 50
    assert response.context["page"].paginator.num_pages == 3
