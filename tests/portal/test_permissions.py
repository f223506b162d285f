"""The permission sweep: every portal URL, from the root resolver, for everyone who must not see it.

Data-driven: the URL patterns are enumerated from ``config.urls`` (outside /api/, /admin/, static files,
health checks and the schema), each keyword filled with an object of organisation A from one small world
(tests/browser/portal_world.py). A keyword the sweep does not know fails the sweep, so a new page cannot
land without being swept. Then:

* anonymous → 302 to the log-in page (200 only for the public allow-list below), for GET and POST (or
  405 where the URL never takes that method);
* another buyer (B), an operator (A's own operator for buyer pages, B's operator for operator pages),
  staff without an organisation for organisation pages → 403 or 404, and no page they can open carries
  A's identifying values;
* the owner → 200 on every page that answers GET (405 marks a POST-only endpoint);
* POSTs by the wrong people answer 302-to-login / 403 / 404 / 405 and change no row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.test import Client
from django.urls import resolve, reverse

from tests.browser.portal_world import (
    PortalPattern,
    PortalWorld,
    UnknownKwargError,
    build_world,
    portal_patterns,
    world_kwargs,
)

pytestmark = pytest.mark.django_db

# Pages anyone may open without logging in (URL names). Everything else must send them to log in.
PUBLIC = frozenset(
    {
        "home",
        "login",
        "logout",
        "signup",
        "password_reset",
        "password_reset_done",
        "password_reset_confirm",
        "password_reset_complete",
        "invite-accept",
        # Django's language switch: a cookie for anyone, signed in or not (tests/core/test_i18n.py).
        "set_language",
    }
)
# Keywords of public pages: not A's objects, any well-formed value will do.
PUBLIC_KWARGS: dict[str, str] = {"uidb64": "MQ", "token": "set-password", "key": "not-a-real-invitation"}
# Pages whose owner's GET is a redirect by design (URL name → why).
OWNER_REDIRECTS: dict[str, str] = {}
# Buyer pages an operator may read too (URL name → why). Every other buyer page refuses an organisation that
# only operates with 403; these answer it 200, read only.
OPERATOR_READABLE: dict[str, str] = {
    "market": "operators price their clusters against the market, read only (issue 15)",
}
# 405: the method is refused before anything is read (require_POST / require_GET), whoever asks.
DENIED = (403, 404, 405)
APPS = ("core", "federation", "metering", "broker", "auth")


@pytest.fixture
def world() -> PortalWorld:
    return build_world()


@pytest.fixture
def as_user() -> Callable[[User | None], Client]:
    def make(user: User | None) -> Client:
        client = Client(raise_request_exception=False)
        if user is not None:
            client.force_login(user)
        return client

    return make


def _url(world: PortalWorld, pattern: PortalPattern) -> str:
    if pattern.name == "invite-accept":
        kwargs = {"token": world.objects["invitation_token"]}
    elif pattern.name in PUBLIC:
        kwargs = {k: PUBLIC_KWARGS.get(k, "1") for k in pattern.kwargs}
    else:
        kwargs = world_kwargs(world, pattern)
    return reverse(pattern.name, kwargs=kwargs)


def _swept(world: PortalWorld) -> list[tuple[PortalPattern, str]]:
    return [(p, _url(world, p)) for p in portal_patterns()]


def _owner(world: PortalWorld, pattern: PortalPattern) -> User:
    return {"operator": world.users["olga"], "staff": world.users["sam"]}.get(
        pattern.side, world.users["alice"]
    )


def _intruders(world: PortalWorld, pattern: PortalPattern) -> dict[str, User]:
    """Signed-in people who must not see A's objects on this page."""
    u = world.users
    if pattern.side == "operator":
        return {"B's operator": u["oscar"], "a buyer": u["bob"], "A's own buyer": u["alice"]}
    if pattern.side == "staff":
        return {"a buyer": u["alice"], "an operator": u["olga"]}
    return {"another buyer": u["bob"], "A's operator": u["olga"], "B's operator": u["oscar"]}


def _secrets(world: PortalWorld, pattern: PortalPattern, user: User) -> list[str]:
    """What ``user`` (not A's owner) must not see on this page. Every portal page, a 403 page included,
    names the organisation its viewer acts for in the header: a member of A's buyer (alice, refused a
    staff page) seeing its name is not a leak."""
    if pattern.side == "operator":
        return world.operator_secrets
    account = [] if user == world.users["olga"] else world.operator_account_secrets
    own = {world.buyer.name} if user in (world.users["alice"], world.users["vera"]) else set()
    return [secret for secret in (*world.buyer_secrets, *account) if secret not in own]


def _body(response: Any) -> str:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode(errors="replace")
    return response.content.decode(errors="replace")


def _is_login_redirect(response: Any) -> bool:
    return response.status_code == 302 and response["Location"].startswith(reverse("login"))


def _fingerprint() -> str:
    """A digest of every row of the project's tables (sessions aside; a user's last log-in aside)."""
    digest = hashlib.sha256()
    for label in APPS:
        for model in apps.get_app_config(label).get_models():
            fields = [f.attname for f in model._meta.concrete_fields if f.attname != "last_login"]
            for row in model._default_manager.order_by("pk").values_list(*fields):
                digest.update(repr((model._meta.label, row)).encode())
    return digest.hexdigest()


def test_every_portal_url_is_swept(world: PortalWorld) -> None:
    patterns = portal_patterns()
    assert {"home", "login"} <= {p.name for p in patterns}
    unknown = []
    for pattern in patterns:
        try:
            _url(world, pattern)
        except UnknownKwargError as exc:
            unknown.append(str(exc))
    assert not unknown, "\n".join(unknown)


def test_an_unknown_keyword_fails_the_sweep(world: PortalWorld) -> None:
    with pytest.raises(UnknownKwargError, match="widget_id"):
        world_kwargs(
            world,
            PortalPattern(name="widget-detail", route="widgets/<int:widget_id>/", kwargs=("widget_id",)),
        )
    with pytest.raises(UnknownKwargError, match="pk"):
        world_kwargs(world, PortalPattern(name="widget-detail", route="widgets/<int:pk>/", kwargs=("pk",)))


def test_anonymous_visitors_are_sent_to_log_in(world: PortalWorld) -> None:
    client = Client(raise_request_exception=False)
    wrong = []
    for pattern, url in _swept(world):
        if pattern.name in PUBLIC:
            response = client.get(url)
            if response.status_code not in (200, 302, 405):
                wrong.append(f"{pattern.name} {url}: public page answered {response.status_code}")
            continue
        for method in ("get", "post"):
            response = getattr(client, method)(url)
            if not _is_login_redirect(response) and response.status_code != 405:
                wrong.append(f"{method.upper()} {pattern.name} {url}: {response.status_code} (not to log in)")
    assert not wrong, "\n".join(wrong)


def test_the_owner_opens_every_page(world: PortalWorld, as_user: Callable[[User | None], Client]) -> None:
    wrong = []
    seen = {"buyer": "", "operator": ""}
    for pattern, url in _swept(world):
        if pattern.name in PUBLIC:
            continue
        response = as_user(_owner(world, pattern)).get(url)
        expected = {302} if pattern.name in OWNER_REDIRECTS else {200, 405}
        if response.status_code not in expected:
            wrong.append(f"{pattern.name} {url} as {_owner(world, pattern)}: {response.status_code}")
        if pattern.side in seen and response.status_code == 200:
            seen[pattern.side] += _body(response)
        if pattern.side == "buyer" and not pattern.kwargs:  # account pages, as the operator's owner
            operator_view = as_user(world.users["olga"]).get(url)
            if operator_view.status_code == 200:
                seen["operator"] += _body(operator_view)
    # The leak checks are only as good as the secrets: each one must show on some page of its owner.
    for side, secrets in (
        ("buyer", world.buyer_secrets),
        ("operator", [*world.operator_secrets, *world.operator_account_secrets]),
    ):
        wrong.extend(f"no {side} page shows {secret!r}" for secret in secrets if secret not in seen[side])
    assert not wrong, "\n".join(wrong)


def test_nobody_else_sees_a_s_objects(world: PortalWorld, as_user: Callable[[User | None], Client]) -> None:
    wrong = []
    clients = {username: as_user(user) for username, user in world.users.items()}
    for pattern, url in _swept(world):
        if pattern.name in PUBLIC:
            continue
        for who, user in _intruders(world, pattern).items():
            response = clients[user.username].get(url)
            other_side = pattern.side == "staff" or (pattern.side == "operator" and who != "B's operator")
            if pattern.kwargs and response.status_code not in DENIED:
                wrong.append(f"{pattern.name} {url} as {who}: {response.status_code}, not 403/404")
            elif not pattern.kwargs and other_side and response.status_code not in (403, 405):
                wrong.append(f"{pattern.name} {url} as {who}: {response.status_code}, not 403")
            leaked = [secret for secret in _secrets(world, pattern, user) if secret in _body(response)]
            if leaked:
                wrong.append(f"{pattern.name} {url} as {who} shows A's {leaked}")
    assert not wrong, "\n".join(wrong)


def test_posts_by_the_wrong_people_change_nothing(
    world: PortalWorld, as_user: Callable[[User | None], Client]
) -> None:
    wrong = []
    payload = {"confirm": "1", "quantity": "1", "name": "intruder", "reason": "intruder", "role": "owner"}
    for pattern, url in _swept(world):
        if pattern.name in PUBLIC or not (pattern.kwargs or pattern.side != "buyer"):
            # A page without an object of A's acts on the poster's own organisation: not an intrusion.
            continue
        before = _fingerprint()
        intruders = _intruders(world, pattern)
        if not pattern.kwargs:
            # An operator page without an object acts on the poster's own operator: B's is not intruding.
            intruders.pop("B's operator", None)
        people: dict[str, User | None] = {"anonymous": None, **intruders}
        for who, user in people.items():
            response = as_user(user).post(url, payload)
            refused = response.status_code in DENIED or (user is None and _is_login_redirect(response))
            if not refused:
                wrong.append(f"POST {pattern.name} {url} as {who}: {response.status_code}")
        if _fingerprint() != before:
            wrong.append(f"POST {pattern.name} {url} by the wrong people changed the database")
    assert not wrong, "\n".join(wrong)


def test_a_viewer_cannot_post_to_a_s_pages(
    world: PortalWorld, as_user: Callable[[User | None], Client]
) -> None:
    """A read-only member of A: no POST to one of A's objects succeeds (403 or 405 for the endpoints that
    write; pages that only read may answer a POST as a GET) and none changes a row."""
    viewer = as_user(world.users["vera"])
    wrong = []
    for pattern, url in _swept(world):
        if pattern.name in PUBLIC or pattern.side != "buyer" or not pattern.kwargs:
            continue
        before = _fingerprint()
        response = viewer.post(url, {"confirm": "1"})
        if response.status_code not in (200, 403, 405):
            wrong.append(f"POST {pattern.name} {url} as a viewer: {response.status_code}")
        if _fingerprint() != before:
            wrong.append(f"POST {pattern.name} {url} by a viewer changed the database")
    assert not wrong, "\n".join(wrong)


def test_operators_read_the_market_and_no_other_buyer_page(
    world: PortalWorld, as_user: Callable[[User | None], Client]
) -> None:
    """An organisation that only operates: 200 on the buyer pages it may read (OPERATOR_READABLE, declared
    with both sides on the view), 403 on every page declared for buyers alone (405 for a POST-only one),
    and a POST to the marketplace (a buyer's home hub) refused without a change."""
    operator = as_user(world.users["oscar"])
    wrong = []
    for pattern, url in _swept(world):
        sides = getattr(resolve(url).func, "portal_sides", None)
        if pattern.name in PUBLIC or sides is None or pattern.side != "buyer":
            continue
        response = operator.get(url)
        if pattern.name in OPERATOR_READABLE:
            if sides != ("buyer", "operator") or response.status_code != 200:
                wrong.append(f"{pattern.name} {url}: sides {sides}, {response.status_code} (not readable)")
            elif reverse("job-create") in _body(response):
                wrong.append(f"{pattern.name} {url} offers an operator a way to buy")
        elif sides == ("buyer",) and response.status_code not in (403, 405):
            wrong.append(f"{pattern.name} {url}: {response.status_code} for an operator, not 403")
    assert set(OPERATOR_READABLE) <= {p.name for p in portal_patterns()}
    before = _fingerprint()
    assert operator.post(reverse("market"), {"home_hub": "nx"}).status_code == 403
    assert _fingerprint() == before
    assert not wrong, "\n".join(wrong)
