from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from rest_framework import serializers


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 datetime that must carry its UTC offset: a naive time is ambiguous across the
    platform's time zones, so it is rejected instead of guessed."""

    default_error_messages = {"naive": "Include a UTC offset (e.g. 2026-11-21T10:00:00+08:00 or ...Z)."}

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, str):
            try:
                parsed = parse_datetime(value.strip())
            except ValueError:
                parsed = None
            if parsed is not None and parsed.tzinfo is None:
                self.fail("naive")
        return super().to_internal_value(value)
