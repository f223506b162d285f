"""Take a screenshot of a page of a running Cardhour with the system's headless Chromium.

    python scripts/screenshot.py URL OUT.png [--width 1280] [--height 900] [--login USER:PASS] [--full-page]
                                              [--wait-for CSS_SELECTOR] [--delay MS]

Uses Playwright for Python (``pip install playwright``) driving Debian's ``/usr/bin/chromium``
(``apt-get install chromium``); Playwright's own browser download is not needed. With ``--login`` it signs
in through ``/admin/login/`` on the same origin first, so admin and portal pages can be captured.
Pages that render with JavaScript after loading (Swagger UI) need ``--wait-for`` (e.g. ``.opblock``).
Failed requests and JavaScript errors are printed to stderr; the exit status is 1 for an HTTP error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 30_000


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url")
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--login", metavar="USER:PASS", help="sign in through /admin/login/ first")
    parser.add_argument("--full-page", action="store_true", help="capture the whole page, not the viewport")
    parser.add_argument("--wait-for", metavar="CSS_SELECTOR", help="wait until this element is visible")
    parser.add_argument("--delay", type=int, default=0, metavar="MS", help="wait this long before the shot")
    parser.add_argument("--chromium", default=CHROMIUM, help=f"browser executable (default {CHROMIUM})")
    return parser.parse_args(argv)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _note_http_error(problems: list[str], status: int, url: str) -> None:
    if status >= 400:
        problems.append(f"HTTP {status}: {url}")


def _note_console_error(problems: list[str], kind: str, text: str) -> None:
    # A failed resource load is already reported, with its URL, by _note_http_error.
    if kind == "error" and not text.startswith("Failed to load resource"):
        problems.append(f"console error: {text}")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if not Path(args.chromium).exists():
        print(f"{args.chromium} not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print(
            "Playwright is not installed: pip install playwright (no 'playwright install' needed)",
            file=sys.stderr,
        )
        return 2

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.set_default_timeout(TIMEOUT_MS)
            page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
            page.on("response", lambda response: _note_http_error(problems, response.status, response.url))
            page.on("pageerror", lambda error: problems.append(f"JavaScript error: {error}"))
            page.on("console", lambda message: _note_console_error(problems, message.type, message.text))
            if args.login:
                username, _, password = args.login.partition(":")
                page.goto(f"{_origin(args.url)}/admin/login/")
                page.fill("input[name=username]", username)
                page.fill("input[name=password]", password)
                with page.expect_navigation():
                    page.click("input[type=submit], button[type=submit]")
                if page.locator("input[name=password]").count():
                    print(f"login as {username!r} failed", file=sys.stderr)
                    return 1
            response = page.goto(args.url, wait_until="networkidle")
            if args.wait_for:
                page.wait_for_selector(args.wait_for, state="visible")
            if args.delay:
                page.wait_for_timeout(args.delay)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=args.full_page)
            status = response.status if response is not None else 0
        finally:
            browser.close()

    print(f"{args.out}: HTTP {status} {args.url}")
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    return 0 if 200 <= status < 400 else 1


if __name__ == "__main__":
    sys.exit(main())
