"""Render output the way a DRF serializer class declares it, without building the serializer per call.

Instantiating a serializer deep-copies every declared field (and every nested serializer's) for each
response: at resolution's rate that copying cost more than the SQL. ``Output(ClusterDescriptionOutput)``
binds the serializer's fields once per process and then walks them for each instance, calling the very
same bound fields' ``get_attribute`` and ``to_representation``; so the declaration (and the OpenAPI schema
drawn from it) stays the one source of truth, and a value renders exactly as ``Serializer(instance).data``
would (tests/federation/test_render.py holds the two side by side).

Read-only rendering only: no validation, no ``context``. Fields whose representation depends on the
serializer's context or on related-field primary-key shortcuts are refused when the plan is built.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from django.db.models import Manager
from rest_framework import serializers
from rest_framework.fields import SkipField
from rest_framework.relations import RelatedField

# (field name, bound field, nested plan or None, many)
_Plan = list[tuple[str, serializers.Field, "_Plan | None", bool]]


def _plan_of(serializer: serializers.Serializer) -> _Plan:
    plan: _Plan = []
    for field in serializer._readable_fields:
        name = str(field.field_name)
        unsupported = f"{type(serializer).__name__}.{name}: not supported by render.Output"
        if isinstance(field, RelatedField | serializers.ManyRelatedField | serializers.SerializerMethodField):
            raise TypeError(unsupported)
        if isinstance(field, serializers.ListSerializer):
            if not isinstance(field.child, serializers.Serializer):
                raise TypeError(unsupported)
            plan.append((name, field, _plan_of(field.child), True))
        elif isinstance(field, serializers.Serializer):
            plan.append((name, field, _plan_of(field), False))
        else:
            plan.append((name, field, None, False))
    return plan


def _render(plan: _Plan, instance: Any) -> dict[str, Any]:
    # Serializer.to_representation, field for field.
    data: dict[str, Any] = {}
    for name, field, nested, many in plan:
        try:
            attribute = field.get_attribute(instance)
        except SkipField:
            continue
        if attribute is None:
            data[name] = None
        elif nested is None:
            data[name] = field.to_representation(attribute)
        elif many:
            items = attribute.all() if isinstance(attribute, Manager) else attribute
            data[name] = [_render(nested, item) for item in items]
        else:
            data[name] = _render(nested, attribute)
    return data


class Output:
    """A serializer class's read-side rendering, with its fields bound once per process."""

    def __init__(self, serializer_class: type[serializers.Serializer]) -> None:
        self.serializer_class = serializer_class
        self._plan: _Plan | None = None
        self._lock = threading.Lock()

    def _get_plan(self) -> _Plan:
        if self._plan is None:
            with self._lock:
                if self._plan is None:
                    self._plan = _plan_of(self.serializer_class())
        return self._plan

    def one(self, instance: Any) -> dict[str, Any]:
        return _render(self._get_plan(), instance)

    def many(self, instances: Iterable[Any]) -> list[dict[str, Any]]:
        plan = self._get_plan()
        return [_render(plan, instance) for instance in instances]
