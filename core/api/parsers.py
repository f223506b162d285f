"""The API's one request parser: JSON, with the limits hostile input needs.

* Nesting: Python's JSON decoder recurses, so ``[`` × 50,000 raised RecursionError (a 500). A document
  nested deeper than ``CARDHOUR_API_JSON_MAX_DEPTH`` is refused with ``payload_too_deep`` (400) — checked
  after decoding only when the body could be that deep, so a usage batch pays nothing for it.
* Text: a lone UTF-16 surrogate (``"\\ud800"``) decodes to a Python string that cannot be encoded again
  (an error message echoing it, a COPY of it, a log line all fail); NUL (``"\\u0000"``) is refused by
  PostgreSQL text. Both are refused with ``invalid_text`` (400) naming where. Only bodies containing such an
  escape are walked, so ordinary bodies cost one substring search.
* Size is enforced before parsing, by core.middleware.ApiBodyLimitMiddleware (``payload_too_large``, 413).

NaN and Infinity (which Python's decoder accepts and JSON does not) are a ``parse_error``.
"""

from __future__ import annotations

import json
import re
from itertools import chain
from typing import Any

from django.conf import settings
from django.utils.translation import gettext as _
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from core.api.strict import JsonBody
from core.errors import InvalidInputError

_SUSPECT_ESCAPE = re.compile(rb"\\u(?:[dD][89a-fA-F][0-9a-fA-F]{2}|0000)")


class PayloadTooDeepError(InvalidInputError):
    code = "payload_too_deep"


class InvalidTextError(InvalidInputError):
    code = "invalid_text"


def _reject_constant(name: str) -> Any:
    raise ParseError(_("%(name)s is not valid JSON.") % {"name": name})


def _bad_text(value: str) -> str | None:
    if "\x00" in value:
        return _("contains NUL (\\u0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return _("contains a lone UTF-16 surrogate")
    return None


def _too_deep(max_depth: int) -> str:
    return _("The JSON document is nested deeper than %(max_depth)d levels.") % {"max_depth": max_depth}


def text_check(document: Any, *, max_depth: int) -> None:
    """Refuse a decoded document nested deeper than ``max_depth`` or holding unencodable text or NUL."""
    stack: list[tuple[Any, str, int]] = [(document, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            problem = _bad_text(value)
            if problem:
                where = path or _("the top level")
                raise InvalidTextError(
                    _("The text at %(where)s %(problem)s.") % {"where": where, "problem": problem},
                    extra={
                        "fields": {
                            path or "non_field_errors": [_("The text %(problem)s.") % {"problem": problem}]
                        }
                    },
                )
            continue
        if depth > max_depth:
            raise PayloadTooDeepError(_too_deep(max_depth), extra={"max_depth": max_depth})
        if isinstance(value, dict):
            for key, item in value.items():
                problem = _bad_text(key)
                if problem:
                    where = path or _("the top level")
                    raise InvalidTextError(
                        _("A key at %(where)s %(problem)s.") % {"where": where, "problem": problem},
                        extra={
                            "fields": {
                                path or "non_field_errors": [_("A key %(problem)s.") % {"problem": problem}]
                            }
                        },
                    )
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _deeper_than(document: Any, max_depth: int) -> bool:
    """Whether text_check would find a value (other than a string) nested deeper than ``max_depth``.

    Level by level: each level's children are gathered and their types collected by C loops (chain, map),
    so a usage batch's thousand records cost no Python step per value; only containers go to the next
    level. A value-by-value walk cost ~2 ms per 1,000 records, as much as decoding them."""
    if not isinstance(document, dict | list):
        return False
    level: list[Any] = [document]
    depth = 0
    while level:
        depth += 1  # the depth of this level's children
        children = list(
            chain.from_iterable(value.values() if isinstance(value, dict) else value for value in level)
        )
        if depth > max_depth:
            return any(not isinstance(child, str) for child in children)
        if not any(issubclass(kind, dict | list) for kind in set(map(type, children))):
            return False
        level = [child for child in children if isinstance(child, dict | list)]
    return False


class JSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(_("The request body is not UTF-8.")) from exc
        max_depth = settings.CARDHOUR_API_JSON_MAX_DEPTH
        try:
            document = json.loads(text, parse_constant=_reject_constant)
        except RecursionError as exc:
            raise PayloadTooDeepError(_too_deep(max_depth), extra={"max_depth": max_depth}) from exc
        except ValueError as exc:
            raise ParseError(_("JSON parse error: %(error)s") % {"error": exc}) from exc
        # Text trouble needs an escape; deep nesting needs at least max_depth opening brackets, and then a
        # walk over the containers alone finds it (a usage batch has a thousand objects, none deep, and
        # its strings need no look). Either way text_check says where.
        if _SUSPECT_ESCAPE.search(raw) or (
            raw.count(b"[") + raw.count(b"{") > max_depth and _deeper_than(document, max_depth)
        ):
            text_check(document, max_depth=max_depth)
        # The top-level object is marked so its serializer checks every value's JSON type (core.api.strict).
        return JsonBody(document) if type(document) is dict else document
