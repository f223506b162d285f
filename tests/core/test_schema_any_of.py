"""The OpenAPI document says anyOf where the server accepts a value matching any branch (never oneOf,
which demands exactly one)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def _nodes(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found += _nodes(value)
    elif isinstance(node, list):
        for value in node:
            found += _nodes(value)
    return found


def test_the_schema_has_any_of_and_no_one_of(client: Client) -> None:
    document = json.loads(client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").content)
    nodes = _nodes(document)

    assert [n for n in nodes if "oneOf" in n and "discriminator" not in n] == []
    endpoint = document["components"]["schemas"]["ClusterListInputRequest"]["properties"]["endpoint_url"]
    assert [branch.get("format") for branch in endpoint["anyOf"]] == ["uri", None]
