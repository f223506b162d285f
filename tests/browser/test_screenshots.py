"""Every portal page in the browser, as the people it is for, at desktop and phone widths.

The pages come from the root resolver (tests/browser/portal_world.py: the same enumeration and the same
world as the permission sweep), so a new page is photographed without editing this test. Each page must
answer 200, leave no console error, uncaught exception, failed request or error answer from the
server behind, and fit a 390 px phone without scrolling sideways (wide tables scroll inside their
``.table-wrap``). The PNGs go to var/screenshots/<side>-<url name>.{desktop,phone}.png for people to look at.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.browser.conftest import DESKTOP, PHONE, Portal, phone_overflow, shot
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


def _clipped_tables(page: Any) -> list[str]:
    """Tables that scroll sideways inside their ``.table-wrap`` (their last columns hidden) at the current
    viewport, with how many pixels are hidden."""
    return list(
        page.evaluate(
            "Array.from(document.querySelectorAll('.table-wrap'))"
            ".filter(e => e.scrollWidth > e.clientWidth + 1)"
            ".map(e => ((e.querySelector('table') || e).className || 'table') + ': ' + (e.scrollWidth - e.clientWidth))"
        )
    )


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_quotes_no_quote_market_packs_and_error_pages_fit_in_both_languages(
    portal: Portal, world: PortalWorld, language: str
) -> None:
    """Issue 15's pages at 1280 and 390 px, in English and Chinese: the job page with live quotes (one row
    per offer, the time shift, the chart), a job no island can take (its suggestions), the market as an
    operator, the packs page, a 403 and a 404. Each answers its status, logs no other error, fits a phone,
    and no table hides columns sideways at either width (the quote table's Accept column included)."""
    from django.conf import settings

    from broker.services.quotes import quote_create
    from tests.broker.factories import make_job

    quoted = world.objects["quoted_job"]
    quote_create(job=quoted)  # live quotes for the photograph
    stuck = make_job(buyer=world.buyer, name="acme-too-big", cards=12, latency_budget_ms=10)
    quote_create(job=stuck)
    portal.context.add_cookies(
        [{"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "url": portal.base_url}]
    )
    pages = [
        ("alice", f"quotes-job-{language}", reverse("job-detail", kwargs={"job_id": quoted.pk}), 200),
        ("alice", f"quotes-none-{language}", reverse("job-detail", kwargs={"job_id": stuck.pk}), 200),
        ("alice", f"quotes-packs-{language}", reverse("pack-list"), 200),
        ("alice", f"quotes-403-{language}", reverse("operator-cluster-list"), 403),
        ("alice", f"quotes-404-{language}", "/no-such-page/", 404),
        ("olga", f"quotes-market-operator-{language}", reverse("market"), 200),
    ]
    wrong = _photograph_in(portal, world, language, pages)
    assert not wrong, "\n".join(wrong)


def _photograph_in(
    portal: Portal,
    world: PortalWorld,
    language: str,
    pages: list[tuple[str, str, str, int]],
    *,
    widths: tuple[dict[str, int], ...] = (DESKTOP, PHONE),
) -> list[str]:
    """Photograph each (user, name, path, status) in ``language`` at both widths; return what went wrong:
    a wrong status or ``lang``, a table hiding columns sideways at any of ``widths``, a page wider than a
    phone, a console error or failed request."""
    from django.conf import settings

    wrong: list[str] = []
    for username, name, path, status in pages:
        # Cookies are replaced on log-in: the language cookie is set again after it.
        portal.login_as(world.users[username])
        portal.context.add_cookies(
            [{"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "url": portal.base_url}]
        )
        portal.problems.clear()
        response = portal.goto(path)
        portal.page.wait_for_load_state("networkidle")
        if response is None or response.status != status:
            wrong.append(f"{name} {path}: HTTP {response.status if response else 'no answer'}, not {status}")
        lang = portal.page.evaluate("document.documentElement.lang")
        if lang != language:
            wrong.append(f"{name}: lang={lang}")
        shot(portal.page, name)
        for size in widths:
            portal.page.set_viewport_size(size)
            wrong.extend(
                f"{name} at {size['width']} px: {table} px hidden" for table in _clipped_tables(portal.page)
            )
        portal.page.set_viewport_size(DESKTOP)
        overflow = phone_overflow(portal.page)
        if overflow:
            wrong.append(f"{name} {path}: {overflow} px wider than a 390 px phone")
        expected = f"{portal.base_url}{path}: {status}"
        wrong.extend(
            f"{name}: {problem}"
            for problem in portal.problems.all()
            if not (status != 200 and problem.endswith(expected))
            and not (status != 200 and "the server responded with a status of" in problem)
        )
    return wrong


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_spend_control_credit_notes_and_reliability_fit_in_both_languages(
    portal: Portal, world: PortalWorld, language: str
) -> None:
    """Issue 16's pages at 1280 and 390 px, in English and Chinese: the budgets page with a budget whose
    thresholds and cap were crossed (its alerts and notices), an SLA credit note as the buyer and as the
    operator sees it, and the market with each cluster's reliability."""
    from broker.budgets.services import BudgetInput, budget_create, budgets_evaluate
    from core.types import Actor

    alice = world.users["alice"]
    # A job budget on the job that ran last month: its spend crosses 50/80/100 % and the hard cap.
    budget_create(
        buyer=world.buyer,
        data=BudgetInput(
            name="acme-finetune-job",
            scope="job",
            job_id=world.objects["job"].pk,
            soft_amount=Decimal("10.00"),
            hard_cap=Decimal("15.00"),
        ),
        actor=Actor(organisation=world.buyer, user=alice, can_write=True),
    )
    assert budgets_evaluate(buyer_ids={world.buyer.pk}) == 4  # 50, 80, 100 % and the cap: one alert each
    credit = world.objects["sla_credit"].pk
    pages = [
        ("alice", f"spend-budgets-{language}", "/budgets/", 200),
        ("alice", f"spend-credit-note-{language}", f"/sla-credits/{credit}/", 200),
        ("alice", f"spend-credit-notes-{language}", "/sla-credits/", 200),
        ("olga", f"spend-credit-note-operator-{language}", f"/operator/sla-credits/{credit}/", 200),
        ("alice", f"spend-market-reliability-{language}", reverse("market"), 200),
    ]
    # On a phone their wide tables scroll inside their .table-wrap (the portal's rule, as the sweep above
    # checks); at 1280 px none may hide a column.
    wrong = _photograph_in(portal, world, language, pages, widths=(DESKTOP,))
    assert not wrong, "\n".join(wrong)
