"""Portal fixtures: people with memberships in a buyer, another buyer and an operator, and Django test
clients logged in as each of them. The world (clusters, packs) reuses the broker fixtures."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from core.models import Membership, Organisation
from tests.broker.conftest import (  # noqa: F401 (fixtures)
    buyer,
    east_cluster,
    east_operator,
    funded_buyer,
    presets,
    west_cluster,
    west_operator,
)
from tests.factories import BuyerFactory, MembershipFactory, UserFactory

PASSWORD = "portal-pass-2026"


def _person(username: str, organisation: Organisation | None, role: str = "owner") -> User:
    user = UserFactory(username=username)
    user.set_password(PASSWORD)
    user.save()
    if organisation is not None:
        MembershipFactory(user=user, organisation=organisation, role=role)
    return user


@pytest.fixture
def other_buyer(db: None) -> Organisation:
    return BuyerFactory(slug="globex", name="Globex Compute")


@pytest.fixture
def buyer_user(buyer: Organisation) -> User:  # noqa: F811
    return _person("alice", buyer)


@pytest.fixture
def buyer_viewer(buyer: Organisation) -> User:  # noqa: F811
    return _person("vera", buyer, role=Membership.Role.VIEWER)


@pytest.fixture
def other_buyer_user(other_buyer: Organisation) -> User:
    return _person("bob", other_buyer)


@pytest.fixture
def operator_user(east_operator: Organisation) -> User:  # noqa: F811
    return _person("olga", east_operator)


@pytest.fixture
def staff_user(db: None) -> User:
    user = _person("sam", None)
    user.is_staff = True
    user.save()
    return user


@pytest.fixture
def login() -> Callable[[User], Client]:
    """A factory of Django test clients with ``user`` logged in."""

    def make(user: User) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def buyer_client(login: Callable[[User], Client], buyer_user: User) -> Client:
    return login(buyer_user)


@pytest.fixture
def other_buyer_client(login: Callable[[User], Client], other_buyer_user: User) -> Client:
    return login(other_buyer_user)


@pytest.fixture
def operator_client(login: Callable[[User], Client], operator_user: User) -> Client:
    return login(operator_user)


@pytest.fixture
def staff_client(login: Callable[[User], Client], staff_user: User) -> Client:
    return login(staff_user)
