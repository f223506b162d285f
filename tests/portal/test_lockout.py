"""Guessing is slowed: failed log-ins pause an account and an address, sign-ups and password resets have a
budget per address (core.lockout), with a message a person understands."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.cache import cache
from django.test import Client, override_settings
from django.urls import reverse

from tests.portal.conftest import PASSWORD

pytestmark = pytest.mark.django_db

SMALL = override_settings(
    CARDHOUR_LOGIN_FAILURES_PER_ACCOUNT=5,
    CARDHOUR_LOGIN_FAILURES_PER_ADDRESS=8,
    CARDHOUR_SIGNUPS_PER_ADDRESS=2,
    CARDHOUR_PASSWORD_RESETS_PER_ADDRESS=10,
    CARDHOUR_PASSWORD_RESETS_PER_EMAIL=2,
)


@pytest.fixture(autouse=True)
def small_budgets() -> Iterator[None]:
    cache.clear()
    with SMALL:
        yield
    cache.clear()


def log_in(username: str, password: str, address: str = "203.0.113.7") -> object:
    return Client(REMOTE_ADDR=address).post(reverse("login"), {"username": username, "password": password})


def test_thirty_wrong_passwords_then_the_right_one_is_paused(buyer_user: User) -> None:
    answers = [log_in("alice", f"guess-{i}") for i in range(30)]
    right = log_in("alice", PASSWORD)

    assert all(r.status_code == 200 for r in answers)  # type: ignore[attr-defined]
    assert right.status_code == 200  # type: ignore[attr-defined]
    assert "_auth_user_id" not in right.client.session  # type: ignore[attr-defined]
    assert "Too many attempts" in right.content.decode()  # type: ignore[attr-defined]
    assert "15 minutes" in right.content.decode()  # type: ignore[attr-defined]


def test_the_account_pause_holds_from_another_address_and_ends_with_its_window(buyer_user: User) -> None:
    for i in range(5):
        log_in("alice", f"guess-{i}")

    elsewhere = log_in("alice", PASSWORD, address="198.51.100.1")
    assert "Too many attempts" in elsewhere.content.decode()  # type: ignore[attr-defined]

    cache.clear()  # the window closes
    response = log_in("alice", PASSWORD, address="198.51.100.1")
    assert response.status_code == 302  # type: ignore[attr-defined]


def test_a_success_clears_the_accounts_failures(buyer_user: User) -> None:
    for i in range(4):
        log_in("alice", f"guess-{i}", address=f"198.51.100.{i}")
    assert log_in("alice", PASSWORD).status_code == 302  # type: ignore[attr-defined]
    for i in range(4):
        log_in("alice", f"again-{i}", address=f"198.51.100.{i}")
    assert log_in("alice", PASSWORD).status_code == 302  # type: ignore[attr-defined]


def test_one_address_spraying_many_accounts_is_paused(buyer_user: User) -> None:
    for i in range(8):
        log_in(f"user{i}", "guess")

    response = log_in("alice", PASSWORD)
    assert "Too many attempts" in response.content.decode()  # type: ignore[attr-defined]
    assert log_in("alice", PASSWORD, address="198.51.100.9").status_code == 302  # type: ignore[attr-defined]


def test_sign_ups_per_address_are_limited() -> None:
    client = Client(REMOTE_ADDR="203.0.113.8")

    def sign_up(n: int) -> object:
        return client.post(
            reverse("signup"),
            {
                "username": f"new{n}",
                "email": f"new{n}@example.com",
                "password1": "a-Long-passphrase-2026",
                "password2": "a-Long-passphrase-2026",
                "organisation_name": f"Org {n}",
            },
        )

    assert sign_up(1).status_code == 302  # type: ignore[attr-defined]
    client.logout()
    assert sign_up(2).status_code == 302  # type: ignore[attr-defined]
    client.logout()
    third = sign_up(3)
    assert third.status_code == 429  # type: ignore[attr-defined]
    assert "Too many sign-ups" in third.content.decode()  # type: ignore[attr-defined]
    assert not User.objects.filter(username="new3").exists()


def test_password_resets_per_email_are_limited(buyer_user: User) -> None:
    client = Client(REMOTE_ADDR="203.0.113.9")
    for _ in range(2):
        assert client.post(reverse("password_reset"), {"email": "alice@example.com"}).status_code == 302
    third = client.post(reverse("password_reset"), {"email": "alice@example.com"})

    assert third.status_code == 200 and "Too many attempts" in third.content.decode()
    assert len(mail.outbox) == 2
