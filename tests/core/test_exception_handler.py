"""The one exception handler: every API error is ``{"code", "message", "extra"}`` with a stable code, both
through real requests and when the handler is called directly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from django.test import override_settings
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.test import APIClient

from core.api.exceptions import exception_handler
from core.errors import ConflictError, DomainError, InvalidInputError, NotFoundError, PermissionDeniedError
from core.models import ApiToken, Membership, Organisation
from core.services import api_token_create
from tests.factories import MembershipFactory, UserFactory

ERROR_KEYS = {"code", "message", "extra"}


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert body["code"] == code
    assert isinstance(body["message"], str)
    assert body["message"]
    assert isinstance(body["extra"], dict)
    return body


# --- through real requests ---------------------------------------------------------------------------


@pytest.fixture
def tiny_throttle(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two requests a minute per token or person, for each purpose."""
    rates = {"credential": "2/min", "heartbeat": "2/min", "usage": "2/min", "anon": "2/min"}
    with override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}):
        cache.clear()
        yield
    cache.clear()


@pytest.mark.django_db
def test_throttled_is_429_with_retry_after(tiny_throttle: None, api: APIClient) -> None:
    assert api.get("/api/v1/me").status_code == 200
    assert api.get("/api/v1/tokens").status_code == 200

    response = api.get("/api/v1/me")

    body = assert_error(response, 429, "throttled")
    retry_after = int(response["Retry-After"])
    assert 1 <= retry_after <= 60
    assert body["extra"] == {"retry_after_seconds": retry_after}
    assert body["message"].startswith("Request was throttled.")


@pytest.mark.django_db
def test_throttle_budget_is_per_token_not_per_organisation(
    tiny_throttle: None,
    operator: Organisation,
    api: APIClient,
    other_api: APIClient,
    token_client: Callable[..., APIClient],
) -> None:
    second_token = token_client(operator)

    assert [api.get("/api/v1/me").status_code for _ in range(3)] == [200, 200, 429]
    # The same organisation's other token still has its whole budget.
    assert [second_token.get("/api/v1/me").status_code for _ in range(3)] == [200, 200, 429]
    assert other_api.get("/api/v1/me").status_code == 200


@pytest.mark.django_db
def test_session_throttle_budget_is_per_user(tiny_throttle: None, operator: Organisation) -> None:
    clients = []
    for name in ("alice", "bob"):
        user = UserFactory(username=name)
        MembershipFactory(organisation=operator, user=user, role=Membership.Role.MEMBER)
        client = APIClient()
        client.force_login(user)
        clients.append(client)
    alice, bob = clients

    assert [alice.get("/api/v1/me").status_code for _ in range(3)] == [200, 200, 429]
    assert bob.get("/api/v1/me").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("put", "/api/v1/me"),
        ("post", "/api/v1/me"),
        ("delete", "/api/v1/me"),
        ("delete", "/api/v1/tokens"),
        ("put", "/api/v1/tokens"),
        ("get", "/api/v1/tokens/1"),
        ("patch", "/api/v1/tokens/1"),
        ("post", "/api/v1/tokens/1"),
    ],
)
def test_method_not_allowed_is_405(api: APIClient, method: str, path: str) -> None:
    before = ApiToken.objects.count()

    response = getattr(api, method)(path, {}, format="json")

    body = assert_error(response, 405, "method_not_allowed")
    assert body["message"] == f'Method "{method.upper()}" not allowed.'
    assert body["extra"] == {}
    assert method.upper() not in {m.strip() for m in response["Allow"].split(",")}
    assert ApiToken.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content_type", "data"),
    [
        ("text/plain", "name=x"),
        ("application/xml", "<token><name>x</name></token>"),
        ("application/x-yaml", "name: x"),
    ],
)
def test_unsupported_media_type_is_415_and_creates_nothing(
    api: APIClient, content_type: str, data: str
) -> None:
    before = ApiToken.objects.count()

    response = api.post("/api/v1/tokens", data, content_type=content_type)

    body = assert_error(response, 415, "unsupported_media_type")
    assert body["message"] == f'Unsupported media type "{content_type}" in request.'
    assert body["extra"] == {}
    assert ApiToken.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize("data", ['{"name": ', "not json", '{"name": "x"}}', "\xff"])
def test_unparseable_json_is_400_parse_error_and_creates_nothing(api: APIClient, data: str) -> None:
    before = ApiToken.objects.count()

    response = api.post("/api/v1/tokens", data, content_type="application/json")

    assert_error(response, 400, "parse_error")
    assert ApiToken.objects.count() == before


@pytest.mark.django_db
def test_not_acceptable_is_406(api: APIClient) -> None:
    response = api.get("/api/v1/me", HTTP_ACCEPT="application/xml")

    assert_error(response, 406, "not_acceptable")


@pytest.mark.django_db
def test_serializer_validation_error_is_invalid_with_fields(api: APIClient) -> None:
    response = api.post("/api/v1/tokens", {"scope": "superuser"}, format="json")

    body = assert_error(response, 400, "invalid")
    assert body["message"] == "The request has invalid fields."
    assert set(body["extra"]) == {"fields"}
    assert body["extra"]["fields"] == {
        "name": ["This field is required."],
        "scope": ['"superuser" is not a valid choice.'],
    }


@pytest.mark.django_db
def test_domain_error_from_a_view_keeps_its_code_and_extra(
    operator: Organisation, other_operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    theirs, _ = api_token_create(organisation=other_operator, name="theirs")
    manager = token_client(operator, can_manage_tokens=True)

    body = assert_error(manager.delete(f"/api/v1/tokens/{theirs.pk}"), 404, "token_not_found")

    assert body == {"code": "token_not_found", "message": "No such token.", "extra": {}}


@pytest.mark.django_db
def test_every_error_of_the_core_api_has_exactly_the_three_keys(
    operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    anonymous = APIClient()
    bad_token = APIClient()
    bad_token.credentials(HTTP_AUTHORIZATION="Bearer chk_deadbeef_nope")
    read_only = token_client(operator, scope="read_only")
    read_write = token_client(operator)

    responses = [
        anonymous.get("/api/v1/me"),
        bad_token.get("/api/v1/tokens"),
        read_only.post("/api/v1/tokens", {"name": "x"}, format="json"),
        read_write.post("/api/v1/tokens", {}, format="json"),
        read_write.delete("/api/v1/tokens/0"),
        read_write.put("/api/v1/me", {}, format="json"),
        read_write.post("/api/v1/tokens", "x", content_type="text/plain"),
    ]

    # The delete is refused before any lookup: a token that may not manage tokens learns nothing of ids.
    assert [r.status_code for r in responses] == [401, 401, 403, 400, 403, 405, 415]
    for response in responses:
        assert set(response.json()) == ERROR_KEYS
        assert response["Content-Type"] == "application/json"


# --- the handler on its own --------------------------------------------------------------------------


class _CapacityTaken(ConflictError):
    code = "capacity_taken"


@pytest.mark.parametrize(
    ("exc", "status", "code", "extra"),
    [
        (InvalidInputError("bad"), 400, "invalid", {}),
        (NotFoundError("gone"), 404, "not_found", {}),
        (PermissionDeniedError("no"), 403, "permission_denied", {}),
        (
            ConflictError("clash", code="slug_taken", extra={"slug": "cucc"}),
            409,
            "slug_taken",
            {"slug": "cucc"},
        ),
        (
            _CapacityTaken("Island has 6 free cards.", extra={"free_cards": 6}),
            409,
            "capacity_taken",
            {"free_cards": 6},
        ),
        (DomainError("generic"), 400, "error", {}),
    ],
)
def test_domain_errors_map_to_their_status_code_and_extra(
    exc: DomainError, status: int, code: str, extra: dict[str, Any]
) -> None:
    response = exception_handler(exc, {})

    assert response is not None
    assert response.status_code == status
    assert response.data == {"code": code, "message": exc.message, "extra": extra}


def test_django_validation_error_with_fields_maps_to_invalid() -> None:
    exc = DjangoValidationError({"slug": ["Enter a valid slug."], "name": ["Required."]})

    response = exception_handler(exc, {})

    assert response is not None
    assert response.status_code == 400
    assert response.data == {
        "code": "invalid",
        "message": "The request has invalid fields.",
        "extra": {"fields": {"slug": ["Enter a valid slug."], "name": ["Required."]}},
    }


def test_django_validation_error_without_fields_maps_to_non_field_errors() -> None:
    response = exception_handler(DjangoValidationError(["first", "second"]), {})

    assert response is not None
    assert response.status_code == 400
    assert response.data["extra"] == {"fields": {"non_field_errors": ["first", "second"]}}


def test_drf_validation_errors_map_to_invalid_with_fields() -> None:
    with_fields = exception_handler(exceptions.ValidationError({"cards": ["Must be positive."]}), {})
    without_fields = exception_handler(exceptions.ValidationError("Window is empty."), {})

    assert with_fields is not None
    assert with_fields.status_code == 400
    assert with_fields.data["code"] == "invalid"
    assert with_fields.data["extra"] == {"fields": {"cards": ["Must be positive."]}}
    assert without_fields is not None
    assert without_fields.data["extra"] == {"fields": {"non_field_errors": ["Window is empty."]}}


def test_throttled_sets_retry_after_rounded_up() -> None:
    response = exception_handler(exceptions.Throttled(wait=12.2), {})

    assert response is not None
    assert response.status_code == 429
    assert response["Retry-After"] == "13"
    assert response.data["code"] == "throttled"
    assert response.data["extra"] == {"retry_after_seconds": 13}


def test_throttled_without_wait_has_no_retry_after() -> None:
    response = exception_handler(exceptions.Throttled(), {})

    assert response is not None
    assert response.status_code == 429
    assert not response.has_header("Retry-After")
    assert response.data["extra"] == {}


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (Http404("missing"), 404, "not_found"),
        (DjangoPermissionDenied(), 403, "permission_denied"),
        (exceptions.NotAuthenticated(), 401, "not_authenticated"),
        (exceptions.AuthenticationFailed(), 401, "authentication_failed"),
        (exceptions.PermissionDenied(), 403, "permission_denied"),
        (exceptions.NotFound(), 404, "not_found"),
        (exceptions.MethodNotAllowed("PUT"), 405, "method_not_allowed"),
        (exceptions.NotAcceptable(), 406, "not_acceptable"),
        (exceptions.UnsupportedMediaType("text/plain"), 415, "unsupported_media_type"),
        (exceptions.ParseError(), 400, "parse_error"),
    ],
)
def test_framework_errors_map_to_stable_codes(exc: Exception, status: int, code: str) -> None:
    response = exception_handler(exc, {})

    assert response is not None
    assert response.status_code == status
    assert set(response.data) == ERROR_KEYS
    assert response.data["code"] == code
    assert response.data["extra"] == {}


def test_unknown_api_exception_uses_its_default_code() -> None:
    class Gone(exceptions.APIException):
        status_code = 410
        default_detail = "This resource is gone."
        default_code = "gone"

    response = exception_handler(Gone(), {})

    assert response is not None
    assert response.status_code == 410
    assert response.data == {"code": "gone", "message": "This resource is gone.", "extra": {}}


def test_auth_header_is_passed_on() -> None:
    exc = exceptions.NotAuthenticated()
    exc.auth_header = 'Bearer realm="api"'  # type: ignore[attr-defined]

    response = exception_handler(exc, {})

    assert response is not None
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyError("x"), ValueError("y")])
def test_unexpected_errors_are_left_to_django(exc: Exception) -> None:
    assert exception_handler(exc, {}) is None


@pytest.mark.django_db
def test_one_tokens_traffic_never_spends_another_tokens_heartbeats(
    tiny_throttle: None, operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    """25 GETs from a read-only token used to make the same organisation's next heartbeat answer 429."""
    from tests.factories import make_cluster

    cluster = make_cluster(operator=operator)
    reader = token_client(operator, scope="read_only")
    agent = token_client(operator)
    island = cluster.islands.first()
    assert island is not None
    now = timezone.now()
    beats = [
        {
            "sent_at": (now + timedelta(seconds=i)).isoformat(),
            "health": "ok",
            "islands": [{"name": island.name, "available_cards": 1, "unhealthy_cards": 0}],
        }
        for i in range(2)
    ]

    assert [reader.get("/api/v1/me").status_code for _ in range(25)].count(429) == 23
    # The agent's own GETs do not spend its heartbeat budget either.
    assert [agent.get("/api/v1/me").status_code for _ in range(3)] == [200, 200, 429]
    responses = [
        agent.post(f"/api/v1/clusters/{cluster.cpi}/heartbeats", beat, format="json") for beat in beats
    ]
    assert [r.status_code for r in responses] == [200, 200], [r.json() for r in responses]
