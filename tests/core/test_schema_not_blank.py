"""A request text field that strips its value and refuses a blank one declares so in the schema
(core.api.schema.NOT_BLANK_PATTERN): schemathesis once sent a token name of "\\t", schema-valid, and got a 400."""

from __future__ import annotations

import re
import sys

import pytest
from django.test import Client

from core.api.schema import NO_NUL_PATTERN, NOT_BLANK_PATTERN


def test_the_pattern_accepts_exactly_what_strip_leaves_non_empty() -> None:
    """Every code point, alone and between whitespace: the pattern matches when ``str.strip`` leaves
    something and there is no NUL."""
    pattern = re.compile(NOT_BLANK_PATTERN)
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:  # surrogates: not text JSON can carry alone
            continue
        for text in (chr(code), f" {chr(code)}\t"):
            expected = bool(text.strip()) and "\x00" not in text
            assert bool(pattern.search(text)) is expected, (hex(code), text)


@pytest.mark.django_db
def test_a_token_s_name_declares_it_in_requests_only(client: Client) -> None:
    body = client.get("/api/schema/?format=json").json()
    create = body["components"]["schemas"]["TokenListInputRequest"]["properties"]["name"]
    assert create["pattern"] == NOT_BLANK_PATTERN
    # Responses are not constrained by it: the output's text keeps the no-NUL rule only.
    output = body["components"]["schemas"]["TokenOutput"]["properties"]["name"]
    assert output.get("pattern") == NO_NUL_PATTERN
