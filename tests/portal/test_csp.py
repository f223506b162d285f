"""Content-Security-Policy on HTML pages (core.middleware.ContentSecurityPolicyMiddleware): the exact
policy, Stripe's origins derived from the Stripe settings, a fresh nonce per response that the templates'
inline blocks carry, and no inline script or event handler left in a template without it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import AsyncClient, Client, override_settings

pytestmark = pytest.mark.django_db

TEMPLATES = Path(settings.BASE_DIR) / "templates"


def directives(response) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    policy = response["Content-Security-Policy"]
    return {part.split()[0]: part.split()[1:] for part in policy.split("; ")}


def nonce_of(response) -> str:  # type: ignore[no-untyped-def]
    (source,) = [s for s in directives(response)["script-src"] if s.startswith("'nonce-")]
    return source.removeprefix("'nonce-").removesuffix("'")


def expected(*, nonce: str, script: list[str], frame: list[str], connect: list[str]) -> dict[str, list[str]]:
    return {
        "default-src": ["'self'"],
        "script-src": ["'self'", f"'nonce-{nonce}'", *script],
        "style-src": ["'self'", "'unsafe-inline'"],
        "style-src-elem": ["'self'", f"'nonce-{nonce}'"],
        "style-src-attr": ["'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'", *connect],
        "frame-src": frame,
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }


@override_settings(
    STRIPE_API_BASE="http://127.0.0.1:8420", STRIPE_JS_URL="http://127.0.0.1:8420/js.stripe.com/v3/"
)
def test_a_portal_page_on_localstripe_allows_localstripe_and_nothing_else_of_stripe() -> None:
    response = Client().get("/accounts/login/")
    assert response.status_code == 200
    nonce = nonce_of(response)
    assert directives(response) == expected(
        nonce=nonce,
        script=["http://127.0.0.1:8420"],
        frame=["http://127.0.0.1:8420"],
        connect=["http://127.0.0.1:8420"],
    )
    # The page's inline <style> carries the same nonce, and nothing inline goes without it.
    html = response.content.decode()
    assert f'<style nonce="{nonce}">' in html
    assert (
        re.findall(r"<(?:style|script)(?![^>]*\bsrc=)(?![^>]*\bnonce=\"" + re.escape(nonce) + '")', html)
        == []
    )


@override_settings(STRIPE_API_BASE="", STRIPE_JS_URL="https://js.stripe.com/v3/")
def test_with_stripe_itself_the_page_allows_stripes_documented_origins() -> None:
    response = Client().get("/accounts/login/")
    assert directives(response) == expected(
        nonce=nonce_of(response),
        script=["https://js.stripe.com"],
        frame=["https://js.stripe.com", "https://hooks.stripe.com"],
        connect=["https://api.stripe.com"],
    )


def test_every_response_has_its_own_nonce() -> None:
    client = Client()
    nonces = {nonce_of(client.get("/accounts/login/")) for _ in range(3)}
    assert len(nonces) == 3
    assert all(len(nonce) == 24 for nonce in nonces)  # 18 random bytes, URL-safe base64


def test_the_async_stack_sets_the_policy_too() -> None:
    """Under ASGI the middleware runs in async mode (core.middleware.DualModeMiddleware)."""
    response = async_to_sync(AsyncClient().get)("/accounts/login/")
    assert response.status_code == 200
    assert directives(response)["frame-ancestors"] == ["'none'"]
    assert f'<style nonce="{nonce_of(response)}">' in response.content.decode()


def test_the_admin_and_swagger_ui_carry_the_policy_and_swagger_ui_needs_no_inline_script() -> None:
    client = Client()
    admin = client.get("/admin/login/")
    assert admin.status_code == 200
    assert directives(admin)["object-src"] == ["'none'"]
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert re.findall(r"<script(?![^>]*\bsrc=)", html) == []
    assert f'<style nonce="{nonce_of(docs)}">' in html
    assert '<script src="/api/docs/?script="></script>' in html
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200
    assert script["Content-Type"] == "application/javascript"
    assert "SwaggerUIBundle" in script.content.decode()


def test_json_answers_carry_no_page_policy() -> None:
    response = Client().get("/healthz")
    assert response["Content-Type"].startswith("application/json")
    assert "Content-Security-Policy" not in response


def test_no_template_has_an_inline_script_style_block_or_event_handler_without_the_nonce() -> None:
    wrong = []
    for path in sorted(TEMPLATES.rglob("*.html")):
        text = path.read_text()
        for match in re.finditer(r"<(script|style)\b([^>]*)>", text):
            attributes = match.group(2)
            if "src=" in attributes or 'type="application/json"' in attributes:
                continue
            if 'nonce="{{ request.csp_nonce }}"' not in attributes:
                wrong.append(f"{path.relative_to(TEMPLATES)}: {match.group(0)}")
        wrong.extend(
            f"{path.relative_to(TEMPLATES)}: {m.group(0)}" for m in re.finditer(r"\son[a-z]+=[\"']", text)
        )
    assert wrong == []
