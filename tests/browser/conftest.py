"""Browser tests: a live Django server, headless Debian Chromium driven by Playwright's sync API, real
localstripe, a real Celery worker, and a platform clock a test can move forward.

* Chromium is ``$CARDHOUR_CHROMIUM`` or ``/usr/bin/chromium``. Without it every ``browser``-marked test is
  skipped with the reason — unless ``CARDHOUR_REQUIRE_BROWSER=1`` (CI), when they fail instead.
* ``live_server`` is pytest-django's (a server thread on the test database: the tests are transactional,
  so what the browser writes through the server is committed and visible here, and the other way round).
* Playwright's sync API runs an asyncio loop in the test thread, and Django refuses database access from
  a thread with a running loop; ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set while a browser is open (module
  scope: the browser tests of a module run together, and the variable is restored after them).
* localstripe and its webhook receiver are the payment tests' fixtures (tests/metering/localstripe.py);
  ``stripe_to_live_server`` has localstripe deliver webhooks to the live server, as Stripe would.
* ``celery_worker`` is a real worker thread consuming the configured broker, the integration tests' way
  (tests/celery_watch.py: ``task_watcher``, worker logging kept quiet).
* ``platform_clock`` moves ``django.utils.timezone.now`` (the platform's clock: every service reads it)
  forward in this process — the live server and the worker thread included — as the replay benchmark's
  simulated clock does for its servers (benchmarks/replay.py).
* ``shot(page, name)`` saves full-page PNGs at 1280×900 and 390×844 into var/screenshots/.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.celery_watch import TaskWatcher, task_watcher  # noqa: F401  # fixture
from tests.metering.localstripe import (  # noqa: F401  # fixtures
    DISABLED_EVENTS,
    LIVE_SERVER_WEBHOOK_ID,
    WEBHOOK_PATH,
    LocalStripe,
    WebhookReceiver,
    localstripe_fixture,
    stripe_on_localstripe_fixture,
    stripe_webhooks_fixture,
)

ROOT = Path(__file__).resolve().parent.parent.parent
SCREENSHOTS = ROOT / "var" / "screenshots"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
TASK_TIMEOUT_SECONDS = 60


def chromium_executable() -> str | None:
    """The Chromium to drive: $CARDHOUR_CHROMIUM, else /usr/bin/chromium; None when neither exists."""
    candidate = os.environ.get("CARDHOUR_CHROMIUM") or DEFAULT_CHROMIUM
    return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None


def browser_required() -> bool:
    return os.environ.get("CARDHOUR_REQUIRE_BROWSER") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the browser tests when there is no Chromium, with the reason (a failure when required)."""
    if chromium_executable() is not None or browser_required():
        return
    wanted = os.environ.get("CARDHOUR_CHROMIUM") or DEFAULT_CHROMIUM
    skip = pytest.mark.skip(
        reason=f"no Chromium at {wanted} (install Debian's chromium or set CARDHOUR_CHROMIUM; "
        "CARDHOUR_REQUIRE_BROWSER=1 makes this a failure)"
    )
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


# --- Playwright ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium for one test module, with DJANGO_ALLOW_ASYNC_UNSAFE set while it is open."""
    executable = chromium_executable()
    if executable is None:
        pytest.fail(
            "CARDHOUR_REQUIRE_BROWSER=1 but there is no Chromium at "
            f"{os.environ.get('CARDHOUR_CHROMIUM') or DEFAULT_CHROMIUM}"
        )
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@dataclass
class PageProblems:
    """What went wrong in the browser while a page was open: console errors, uncaught exceptions,
    failed requests and error answers from the live server."""

    origin: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    error_responses: list[str] = field(default_factory=list)

    def watch(self, page: Any) -> None:
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc)))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)

    def _console(self, message: Any) -> None:
        if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
            self.console_errors.append(f"{message.text} ({message.location.get('url', '')})")

    def _local(self, url: str) -> bool:
        # Chromium asks for /favicon.ico by itself when a page names no icon; that is not the page's.
        return url.startswith(self.origin) and not url.startswith(f"{self.origin}/favicon.ico")

    def _failed(self, request: Any) -> None:
        if self._local(request.url):
            self.failed_requests.append(f"{request.method} {request.url}: {request.failure}")

    def _response(self, response: Any) -> None:
        if self._local(response.url) and response.status >= 400:
            self.error_responses.append(f"{response.request.method} {response.url}: {response.status}")

    def clear(self) -> None:
        for bucket in (self.console_errors, self.page_errors, self.failed_requests, self.error_responses):
            bucket.clear()

    def all(self) -> list[str]:
        return [*self.console_errors, *self.page_errors, *self.failed_requests, *self.error_responses]


@dataclass
class Portal:
    """A browser context on the live server: ``page``, its problems, and helpers to log in and go."""

    base_url: str
    context: Any
    page: Any
    problems: PageProblems

    def url(self, path: str) -> str:
        return path if path.startswith("http") else f"{self.base_url}{path}"

    def goto(self, path: str) -> Any:
        return self.page.goto(self.url(path))

    def login_as(self, user: User) -> None:
        """Sign ``user`` in without the form: a session made by Django's test client, as a cookie."""
        from django.conf import settings

        client = Client()
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME]
        self.context.clear_cookies()
        self.context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": cookie.value, "url": self.base_url}]
        )

    def login_with_form(self, username: str, password: str) -> None:
        self.goto("/accounts/login/")
        self.page.get_by_label(re.compile("user ?name", re.I)).fill(username)
        self.page.get_by_label(re.compile("password", re.I)).fill(password)
        self.page.get_by_role("button", name=re.compile("log ?in|sign ?in", re.I)).click()
        self.page.wait_for_load_state()


CSP_VIOLATIONS_TO_CONSOLE = """
document.addEventListener("securitypolicyviolation", function (event) {
  console.error("CSP violation: " + event.violatedDirective + " blocked " + (event.blockedURI || "inline")
    + " at " + event.sourceFile + ":" + event.lineNumber);
});
"""


@pytest.fixture
def portal(browser: Any, live_server: Any) -> Iterator[Portal]:
    """A fresh browser context (no cookies) at desktop size on the live server."""
    base_url = live_server.url.replace("localhost", "127.0.0.1")
    context = browser.new_context(viewport=DESKTOP, base_url=base_url, locale="en-GB")
    context.set_default_timeout(15_000)
    # A Content-Security-Policy violation (core.middleware) is a console error, whatever Chromium itself
    # logs: the init script runs before the page's own and is not subject to the policy.
    context.add_init_script(CSP_VIOLATIONS_TO_CONSOLE)
    page = context.new_page()
    problems = PageProblems(origin=base_url)
    problems.watch(page)
    try:
        yield Portal(base_url=base_url, context=context, page=page, problems=problems)
    finally:
        context.close()


# --- Screenshots -----------------------------------------------------------------------------------------


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "page"


def shot(page: Any, name: str, *, directory: Path = SCREENSHOTS) -> list[Path]:
    """Full-page PNGs of the page as it is now at desktop (1280×900) and phone (390×844) widths, saved as
    ``var/screenshots/<name>.desktop.png`` and ``<name>.phone.png``; the viewport is put back after."""
    directory.mkdir(parents=True, exist_ok=True)
    before = page.viewport_size
    paths = []
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        path = directory / f"{_file_name(name)}.{label}.png"
        page.screenshot(path=str(path), full_page=True)
        paths.append(path)
    if before:
        page.set_viewport_size(before)
    return paths


def phone_overflow(page: Any) -> int:
    """How many CSS pixels the page is wider than a phone's viewport (390 px); 0 when it fits."""
    before = page.viewport_size
    page.set_viewport_size(PHONE)
    width = int(page.evaluate("document.documentElement.scrollWidth"))
    if before:
        page.set_viewport_size(before)
    return max(0, width - PHONE["width"])


# --- Payments: localstripe delivers webhooks to the live server ------------------------------------------


@pytest.fixture
def stripe_to_live_server(
    stripe_on_localstripe: LocalStripe, stripe_webhooks: WebhookReceiver, live_server: Any
) -> Iterator[LocalStripe]:
    """localstripe (test mode) with its live-server endpoint pointed at this live server for the test."""
    url = live_server.url.replace("localhost", "127.0.0.1") + WEBHOOK_PATH
    stripe_on_localstripe.register_webhook(LIVE_SERVER_WEBHOOK_ID, url)
    try:
        yield stripe_on_localstripe
    finally:
        stripe_on_localstripe.register_webhook(
            LIVE_SERVER_WEBHOOK_ID, f"{stripe_webhooks.url}/unused", events=DISABLED_EVENTS
        )


# --- A real Celery worker ------------------------------------------------------------------------------------


@dataclass
class Worker:
    finished: TaskWatcher

    def run(self, task: Any, *args: Any, **kwargs: Any) -> None:
        """Send ``task`` through the broker and wait until the worker has run it."""
        from config.celery_app import app as celery_app

        result = task.delay(*args, **kwargs)
        assert self.finished.wait(result.id, TASK_TIMEOUT_SECONDS), (
            f"the worker did not run {task.name} within {TASK_TIMEOUT_SECONDS} s "
            f"(broker {celery_app.conf.broker_url.split('@')[-1]})"
        )


@pytest.fixture
def celery_worker(task_watcher: TaskWatcher) -> Iterator[Worker]:  # noqa: F811
    from celery.contrib.testing.worker import start_worker
    from django.conf import settings

    from config.celery_app import app as celery_app

    assert settings.CELERY_TASK_ALWAYS_EAGER is False
    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        yield Worker(finished=task_watcher)


# --- The platform clock ------------------------------------------------------------------------------------


class PlatformClock:
    """``timezone.now`` = the real time + an offset that only grows."""

    def __init__(self, real_now: Callable[[], datetime]):
        self._real_now = real_now
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return self._real_now() + self.offset

    def advance_to(self, instant: datetime) -> None:
        gap = instant - self.now()
        if gap > timedelta(0):
            self.offset += gap


@pytest.fixture
def platform_clock() -> Iterator[PlatformClock]:
    from django.utils import timezone

    original = timezone.now
    clock = PlatformClock(original)
    timezone.now = clock.now
    try:
        yield clock
    finally:
        timezone.now = original


@pytest.fixture
def login_user() -> Callable[..., User]:
    """A factory of people with a password (``portal-pass-2026``) and a membership."""
    from tests.browser.portal_world import _person

    def make(username: str, organisation: Any, role: str = "owner") -> User:
        return _person(username, organisation, role)

    return make
