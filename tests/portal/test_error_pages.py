"""403 and 404 inside the portal: the base template with its navigation, a clear message and a way back.
The API keeps its JSON errors."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory

from core.models import Organisation
from core.views import permission_denied


def test_a_page_for_the_other_side_is_a_403_inside_the_portal(operator_client: Client) -> None:
    response = operator_client.get("/jobs/")
    assert response.status_code == 403
    assert [t.name for t in response.templates][:2] == ["403.html", "base.html"]
    html = response.content.decode()
    assert '<p class="lede" id="reason">This page is for buyers.</p>' in html
    assert '<nav class="sidenav"' in html and 'href="/operator/clusters/"' in html  # the operator's menu
    assert "You are signed in as olga, acting for China Telecom Cloud." in html
    assert '<a class="button" href="/">Back to your start page</a>' in html


def test_a_viewer_posting_is_told_the_role_is_read_only(
    buyer: Organisation,
    login,
    buyer_viewer,  # type: ignore[no-untyped-def]
) -> None:
    response = login(buyer_viewer).post("/market/", {"home_hub": "nx"})
    assert response.status_code == 403
    assert "Your role in this organisation is read only." in response.content.decode()


def test_an_unknown_address_and_another_buyers_object_are_the_same_404(
    buyer: Organisation, buyer_client: Client
) -> None:
    for url in ("/no-such-page/", "/jobs/999999/"):
        response = buyer_client.get(url)
        assert response.status_code == 404
        assert [t.name for t in response.templates][:2] == ["404.html", "base.html"]
        html = response.content.decode()
        assert "<h1>Page not found</h1>" in html and f'<code class="mono">{url}</code>' in html
        assert '<nav class="sidenav"' in html and "or choose a page from the menu." in html
        assert "No job 999999" not in html  # the object's own message is not shown


def test_an_anonymous_404_has_the_portal_header_and_no_menu() -> None:
    response = Client().get("/no-such-page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "<h1>Page not found</h1>" in html and 'href="/accounts/login/"' in html
    assert '<nav class="sidenav"' not in html


def test_the_api_keeps_its_json_errors(
    operator_client: Client, token_client, east_operator: Organisation
) -> None:  # type: ignore[no-untyped-def]
    missing = Client().get("/api/v1/no-such-endpoint")
    assert missing.status_code == 404
    assert missing.json() == {"code": "not_found", "message": "Not found.", "extra": {}}
    refused = token_client(east_operator).get("/api/v1/jobs")
    assert refused.status_code == 403
    assert refused.json() == {
        "code": "not_a_buyer",
        "message": "ctyun is not a buyer organisation.",
        "extra": {},
    }
    # The project's 403 handler answers an /api/ path in the same shape, should Django raise there.
    answer = permission_denied(RequestFactory().get("/api/v1/anything"), PermissionDenied("x"))
    assert answer.status_code == 403
    assert answer.content == b'{"code": "permission_denied", "message": "You may not do this.", "extra": {}}'


def test_the_error_pages_speak_chinese_to_a_chinese_browser(
    operator_client: Client, buyer_client: Client
) -> None:
    forbidden = operator_client.get("/jobs/", HTTP_ACCEPT_LANGUAGE="zh-CN")
    assert forbidden.status_code == 403
    html = forbidden.content.decode()
    assert '<html lang="zh-hans">' in html and "您无法打开此页面" in html and "此页面仅供买方使用。" in html
    missing = buyer_client.get("/no-such-page/", HTTP_ACCEPT_LANGUAGE="zh-CN")
    assert "页面不存在" in missing.content.decode()
