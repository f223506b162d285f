"""Request bodies declared once (core.api.typed): strict JSON types, DRF's answer shape and sentences (in
the reader's language), and the usage batch's declaration over REST. The JSON parser's container-only depth
walk agrees with the full text check."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field
from rest_framework import exceptions
from rest_framework.test import APIClient
from typing_extensions import TypedDict

from core.api.parsers import PayloadTooDeepError, _deeper_than, text_check
from core.api.typed import AwareDateTime, TypedBody
from core.models import Organisation


class Item(TypedDict):
    n: Annotated[int, Field(ge=1, strict=True)]
    at: AwareDateTime


class Body(TypedDict):
    items: Annotated[list[Item], Field(min_length=1, max_length=3)]


BODY = TypedBody(Body, name="Body")


def fields_of(data: Any) -> Any:
    with pytest.raises(exceptions.ValidationError) as caught:
        BODY.validate(data)
    return caught.value.detail


def test_a_valid_body_comes_back_typed() -> None:
    body = BODY.validate({"items": [{"n": 2, "at": "2026-11-21T10:00:00+08:00", "extra": [1]}]})

    (item,) = body["items"]
    # The same instant, on datetime.UTC (not pydantic's tzinfo, which slows every later comparison).
    assert item["n"] == 2 and "extra" not in item
    assert item["at"] == datetime(2026, 11, 21, 2, tzinfo=UTC) and item["at"].tzinfo is UTC


def test_wrong_json_types_are_refused_not_coerced() -> None:
    detail = fields_of(
        {
            "items": [
                {"n": "2", "at": 1_700_000_000},
                {"n": True, "at": "2026-11-21T10:00:00"},
                {"n": 2.0, "at": "yesterday"},
            ]
        }
    )

    assert detail == {
        "items": {
            "0": {
                "n": ["Must be an integer, not a string."],
                "at": ["Must be a date-time string, not a number."],
            },
            "1": {
                "n": ["Must be an integer, not a boolean."],
                "at": ["Include a UTC offset (e.g. 2026-11-21T10:00:00+08:00 or ...Z)."],
            },
            "2": {
                "n": ["Must be an integer, not a number."],
                "at": [
                    "Datetime has wrong format. Use one of these formats instead: "
                    "YYYY-MM-DDThh:mm[:ss[.uuuuuu]][+HH:MM|-HH:MM|Z]."
                ],
            },
        }
    }


def test_missing_empty_too_many_and_out_of_range() -> None:
    assert fields_of({}) == {"items": ["This field is required."]}
    assert fields_of({"items": []}) == {"items": ["This list may not be empty."]}
    assert fields_of({"items": [{"n": 1, "at": "2026-11-21T10:00:00Z"}] * 4}) == {
        "items": ["Ensure this field has no more than 3 elements."]
    }
    assert fields_of({"items": [{"at": "2026-11-21T10:00:00Z", "n": 0}]}) == {
        "items": {"0": {"n": ["Ensure this value is greater than or equal to 1."]}}
    }
    assert fields_of([1]) == {"non_field_errors": ["Invalid data. Expected a dictionary, but got list."]}


def test_the_schema_comes_from_the_declaration() -> None:
    schema, components = BODY.json_schema(suffix="Request")

    assert schema == {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/ItemRequest"},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["items"],
    }
    assert components["ItemRequest"]["properties"] == {
        "n": {"type": "integer", "minimum": 1},
        "at": {"type": "string", "format": "date-time"},
    }


# --- Over REST: the usage batch ------------------------------------------------------------------------


USAGE = "/api/v1/operator/usage"


def test_usage_field_errors_follow_the_readers_language(
    operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    client = token_client(operator)
    body = {"records": [{"lease": 1, "start_at": "2026-11-01T00:00:00Z", "end_at": "2026-11-01T00:01:00Z"}]}

    english = client.post(USAGE, body, format="json")
    chinese = client.post(USAGE, body, format="json", HTTP_ACCEPT_LANGUAGE="zh-Hans")

    assert english.status_code == chinese.status_code == 400
    assert english.json()["code"] == chinese.json()["code"] == "invalid"
    en_fields = english.json()["extra"]["fields"]["records"]["0"]
    zh_fields = chinese.json()["extra"]["fields"]["records"]["0"]
    assert set(en_fields) == set(zh_fields) == {"idempotency_key", "cards"}
    assert en_fields["cards"] == ["This field is required."]
    assert zh_fields["cards"] == ["该字段是必填项。"]
    assert chinese.json()["message"] != english.json()["message"]


def test_a_usage_body_that_is_not_an_object_is_invalid_not_a_500(
    operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    client = token_client(operator)

    for body in ('[{"lease": 1}]', '"records"', '{"records": {"0": {}}}', '{"records": [7]}'):
        response = client.post(USAGE, body, content_type="application/json")
        assert response.status_code == 400 and response.json()["code"] == "invalid", (body, response.content)


# --- The parser's depth walk ---------------------------------------------------------------------------

# Text the parser lets through (no NUL, no lone surrogate): only the nesting is in question here.
_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=3)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_text, children, max_size=3),
    max_leaves=30,
)


@given(document=json_values, max_depth=st.integers(0, 6))
def test_the_depth_walk_agrees_with_the_text_check(document: Any, max_depth: int) -> None:
    try:
        text_check(document, max_depth=max_depth)
        too_deep = False
    except PayloadTooDeepError:
        too_deep = True

    assert _deeper_than(document, max_depth) is too_deep


def test_a_date_time_with_no_utc_instant_is_a_field_error_not_a_500() -> None:
    """0001-01-01T00:00:00+03:00 is a valid ISO 8601 string whose UTC instant falls before year 1: the
    conversion to UTC overflows (schemathesis found it as a 500 on the usage endpoint)."""
    detail = fields_of({"items": [{"n": 1, "at": "0001-01-01T00:00:00+03:00"}]})

    assert detail == {"items": {"0": {"at": ["Datetime value out of range."]}}}
