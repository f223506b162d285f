"""API error messages follow Accept-Language (English when the client sends none); ``code`` never changes.

LocaleMiddleware applies to /api/ as to the portal, so a domain error raised in a service, DRF's own
failures mapped by core.api.exceptions, the body-size refusal that runs before LocaleMiddleware, and the
per-record messages inside ``extra`` are all said in the caller's language.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import override_settings
from django.utils import translation
from rest_framework.test import APIClient

from core.models import Organisation
from metering.declines import decline_message
from tests.factories import make_cluster

ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-Hans"}


def _pair(
    call: Callable[..., object], *args: object, **kwargs: object
) -> tuple[dict[str, object], dict[str, object], int]:
    english = call(*args, **kwargs)
    chinese = call(*args, **kwargs, **ZH)
    assert english.status_code == chinese.status_code  # type: ignore[attr-defined]
    assert english["Content-Language"] == "en"  # type: ignore[index]
    assert chinese["Content-Language"] == "zh-hans"  # type: ignore[index]
    return english.json(), chinese.json(), english.status_code  # type: ignore[attr-defined]


def test_a_domain_error_is_chinese_for_a_zh_client_and_english_by_default(
    operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    client = token_client(operator)
    english, chinese, status = _pair(client.get, "/api/v1/clusters/cpi:cucc:nx:nope")
    assert status == 404
    assert english == {
        "code": "cluster_not_found",
        "message": "You have no cluster 'cpi:cucc:nx:nope'.",
        "extra": {"cpi": "cpi:cucc:nx:nope"},
    }
    assert chinese == {
        "code": "cluster_not_found",
        "message": "您没有集群 'cpi:cucc:nx:nope'。",
        "extra": {"cpi": "cpi:cucc:nx:nope"},
    }


def test_messages_inside_extra_follow_the_language_too(
    operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    cluster = make_cluster(operator=operator, islands=[("isl-01", 8)])
    client = token_client(operator)
    beat = {
        "sent_at": "2026-01-01T00:00:00+08:00",
        "health": "ok",
        "islands": [{"name": "isl-01", "available_cards": 9, "unhealthy_cards": 0}],
    }
    english, chinese, status = _pair(
        client.post, f"/api/v1/clusters/{cluster.cpi}/heartbeats", beat, format="json"
    )
    assert status == 400
    assert english["code"] == chinese["code"] == "invalid_heartbeat"
    assert english["message"] == "Some island counts are impossible."
    assert chinese["message"] == "部分算力岛的数量不可能成立。"
    assert english["extra"] == {
        "islands": {"isl-01": "available (9) + unhealthy (0) exceeds the island's 8 cards"}
    }
    assert chinese["extra"] == {"islands": {"isl-01": "可用（9）+ 故障（0）超过算力岛的 8 张卡"}}


def test_drf_failures_mapped_by_the_handler_follow_the_language(
    operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    client = token_client(operator)
    english, chinese, status = _pair(client.get, "/api/v1/no-such-route")
    assert status == 404
    assert english == {"code": "not_found", "message": "Not found.", "extra": {}}
    assert chinese == {"code": "not_found", "message": "未找到。", "extra": {}}

    english, chinese, status = _pair(client.post, "/api/v1/clusters", {"cpi": 7}, format="json")
    assert status == 400
    assert english["code"] == chinese["code"] == "invalid"
    assert english["message"] == "The request has invalid fields."
    assert chinese["message"] == "请求中有无效字段。"


def test_the_body_size_refusal_before_locale_middleware_reads_the_header_itself(
    operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    client = token_client(operator, can_manage_tokens=True)
    with override_settings(CARDHOUR_API_BODY_MAX_BYTES=1000):
        english = client.post("/api/v1/tokens", {"name": "x" * 2000}, format="json")
        chinese = client.post("/api/v1/tokens", {"name": "x" * 2000}, format="json", **ZH)
    assert english.status_code == chinese.status_code == 413
    assert english.json()["code"] == chinese.json()["code"] == "payload_too_large"
    size = english.json()["extra"]["bytes"]
    assert (
        english.json()["message"] == f"The request body is {size} bytes; this endpoint accepts at most 1000."
    )
    assert chinese.json()["message"] == f"请求体为 {size} 字节；此接口最多接受 1000 字节。"


@pytest.mark.parametrize(
    ("language", "expected"),
    [("en", "Your card has insufficient funds."), ("zh-hans", "您的银行卡余额不足。")],
)
def test_a_known_decline_code_is_said_in_the_readers_language(language: str, expected: str) -> None:
    with translation.override(language):
        assert decline_message(code="insufficient_funds", stripe_message="Stripe's words.") == expected
        # A code we do not know keeps Stripe's own message.
        assert decline_message(code="something_new", stripe_message="Stripe's words.") == "Stripe's words."
