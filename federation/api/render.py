"""Render output the way a DRF serializer class declares it, without building the serializer per call.

Instantiating a serializer deep-copies every declared field (and every nested serializer's) for each
response: at resolution's rate that copying cost more than the SQL. ``Output(ClusterDescriptionOutput)``
binds the serializer's fields once per process and then walks them for each instance, calling the very
same bound fields' ``get_attribute`` and ``to_representation``; so the declaration (and the OpenAPI schema
drawn from it) stays the one source of truth, and a value renders exactly as ``Serializer(instance).data``
would (tests/federation/test_render.py holds the two side by side).

Read-only rendering only: no validation, no ``context``. Fields whose representation depends on the
serializer's context or on related-field primary-key shortcuts are refused when the plan is built.

The plan also takes two shortcuts where DRF's own path is provably the same value, because at 100 fields a
description (10 islands) DRF's generic ``get_attribute`` was most of the rendering cost: a field whose source
is one plain attribute is read with ``getattr`` (anything else, a callable, a Mapping instance or a failed
lookup goes through the field's own ``get_attribute``), and a plain ``CharField``, ``IntegerField`` or string
``DecimalField`` converts as its ``to_representation`` does (``str``, ``int``, the field's own ``quantize``);
every other field, and every value of an unexpected type, calls ``to_representation``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from django.db.models import Manager
from rest_framework import serializers
from rest_framework.fields import SkipField
from rest_framework.relations import RelatedField
from rest_framework.settings import api_settings

# (field name, bound field, nested plan or None, many, plain source attribute or None, converter)
_Plan = list[tuple[str, serializers.Field, "_Plan | None", bool, str | None, Callable[[Any], Any]]]


def _plain_attribute(field: serializers.Field) -> str | None:
    """The attribute a field reads when its source is one plain name: DRF's ``get_attribute`` then is
    ``getattr``, unless the value is callable, the instance a Mapping or the lookup fails (its default,
    ``allow_null`` and required apply only then), which :func:`_render` leaves to the field."""
    attrs = field.source_attrs
    return str(attrs[0]) if len(attrs) == 1 else None


def _converter(field: serializers.Field) -> Callable[[Any], Any]:
    """``field.to_representation``, or a cheaper function that returns the same value (see the module
    docstring); a value of another type than the shortcut expects still goes to ``to_representation``."""
    kind = type(field)
    if kind is serializers.CharField:
        return lambda value: value if type(value) is str else field.to_representation(value)
    if kind is serializers.IntegerField:
        return lambda value: value if type(value) is int else field.to_representation(value)
    if (
        isinstance(field, serializers.DecimalField)
        and kind is serializers.DecimalField
        and getattr(field, "coerce_to_string", api_settings.COERCE_DECIMAL_TO_STRING)
        and not field.localize
        and not field.normalize_output
        and field.decimal_places is not None
    ):
        quantize = field.quantize
        return lambda value: (
            f"{quantize(value):f}" if type(value) is Decimal else field.to_representation(value)
        )
    return field.to_representation


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
            plan.append((name, field, _plan_of(field.child), True, None, field.to_representation))
        elif isinstance(field, serializers.Serializer):
            plan.append((name, field, _plan_of(field), False, None, field.to_representation))
        else:
            plan.append((name, field, None, False, _plain_attribute(field), _converter(field)))
    return plan


_missing = object()


def _render(plan: _Plan, instance: Any) -> dict[str, Any]:
    # Serializer.to_representation, field for field.
    data: dict[str, Any] = {}
    plain = not isinstance(instance, Mapping)
    for name, field, nested, many, attr, convert in plan:
        attribute: Any = _missing
        if attr is not None and plain:
            attribute = getattr(instance, attr, _missing)
            if callable(attribute):
                attribute = _missing
        if attribute is _missing:
            try:
                attribute = field.get_attribute(instance)
            except SkipField:
                continue
        if attribute is None:
            data[name] = None
        elif nested is None:
            data[name] = convert(attribute)
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
