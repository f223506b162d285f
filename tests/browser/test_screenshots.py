"""Every portal page in the browser, as the people it is for, at desktop and phone widths.

The pages come from the root resolver (tests/browser/portal_world.py: the same enumeration and the same
world as the permission sweep), so a new page is photographed without editing this test. Each page must
answer 200, leave no console error, uncaught exception, failed request or error answer from the
server behind, and fit a 390 px phone without scrolling sideways (wide tables scroll inside their
``.table-wrap``). The PNGs go to var/screenshots/<side>-<url name>.{desktop,phone}.png for people to look at.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.browser.conftest import Portal, phone_overflow, shot
from tests.browser.portal_world import PortalPattern, PortalWorld, build_world, portal_patterns, world_kwargs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Public pages photographed without logging in; keywords of public pages get these values.
PUBLIC = frozenset(
    {"home", "login", "signup", "password_reset", "password_reset_done", "password_reset_complete"}
)
# Pages that are parts of another page (fetched by portal.js) rather than pages of their own.
FRAGMENTS = frozenset({"lease-usage-fragment", "pack-order-status"})


def _pages(world: PortalWorld, side: str) -> list[tuple[PortalPattern, str]]:
    """(pattern, path) of every HTML page of ``side`` that answers GET; account pages go with buyers and
    operators alike."""
    user = {"buyer": world.users["alice"], "operator": world.users["olga"], "staff": world.users["sam"]}[side]
    client = Client(raise_request_exception=False)
    client.force_login(user)
    pages = []
    for pattern in portal_patterns():
        if pattern.name in FRAGMENTS or pattern.name in PUBLIC or pattern.name.startswith("password_"):
            continue
        if pattern.side != side and not (side == "operator" and pattern.side == "buyer"):
            continue
        if pattern.name in ("invite-accept", "logout"):
            continue
        path = reverse(pattern.name, kwargs=world_kwargs(world, pattern))
        response = client.get(path)
        if side == "operator" and pattern.side == "buyer" and response.status_code == 403:
            continue  # a buyer-only page: not the operator's
        if response.status_code == 405:
            continue  # a POST endpoint
        if not response.get("Content-Type", "").startswith("text/html"):
            continue  # CSV, PDF
        pages.append((pattern, path))
    return pages


def _visit(portal: Portal, name: str, path: str) -> list[str]:
    """Open ``path``, wait for it to settle, photograph it; return what went wrong."""
    portal.problems.clear()
    response: Any = portal.goto(path)
    portal.page.wait_for_load_state("networkidle")
    wrong = []
    if response is None or response.status != 200:
        wrong.append(f"{name} {path}: HTTP {response.status if response else 'no answer'}")
    shot(portal.page, name)
    overflow = phone_overflow(portal.page)
    if overflow:
        wrong.append(f"{name} {path}: {overflow} px wider than a 390 px phone (sideways scrolling)")
    wrong.extend(f"{name} {path}: {problem}" for problem in portal.problems.all())
    return wrong


@pytest.fixture
def world(stripe_on_localstripe: Any) -> PortalWorld:
    return build_world()


@pytest.mark.parametrize("side", ["buyer", "operator", "staff"])
def test_every_page_of_a_side_renders_cleanly(portal: Portal, world: PortalWorld, side: str) -> None:
    user = {"buyer": world.users["alice"], "operator": world.users["olga"], "staff": world.users["sam"]}[side]
    portal.login_as(user)
    pages = _pages(world, side)
    assert pages, f"no {side} page found"
    wrong: list[str] = []
    for pattern, path in pages:
        name = pattern.name if pattern.name.startswith(f"{side}-") else f"{side}-{pattern.name}"
        wrong.extend(_visit(portal, name, path))
    assert not wrong, "\n".join(wrong)


def test_public_pages_render_cleanly(portal: Portal, world: PortalWorld) -> None:
    names = {p.name for p in portal_patterns()}
    wrong: list[str] = []
    for name in sorted(PUBLIC & names):
        wrong.extend(_visit(portal, f"public-{name}", reverse(name)))
    token = world.objects["invitation_token"]
    if "invite-accept" in names:
        wrong.extend(
            _visit(portal, "public-invite-accept", reverse("invite-accept", kwargs={"token": token}))
        )
    assert not wrong, "\n".join(wrong)


def test_the_admin_and_swagger_ui_work_under_the_content_security_policy(
    portal: Portal, world: PortalWorld
) -> None:
    """Swagger UI (drf-spectacular's sidecar files, served from here) draws the API and the admin its
    index, with no policy violation or other console error."""
    wrong = _visit(portal, "public-api-docs", "/api/docs/")
    portal.page.locator(".swagger-ui .info .title").wait_for()
    assert portal.page.locator(".swagger-ui .info .title").inner_text().startswith("Cardhour API")
    assert portal.page.locator(".opblock").count() > 50
    wrong.extend(f"api-docs after drawing: {problem}" for problem in portal.problems.all())
    portal.login_as(world.users["sam"])
    wrong.extend(_visit(portal, "staff-admin-index", "/admin/"))
    assert portal.page.locator("#site-name").inner_text() != ""
    assert not wrong, "\n".join(wrong)
