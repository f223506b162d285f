"""URL resolution that tries only the patterns a path's first segment can match.

Django's resolver tries a URLconf's patterns in order until one matches, and an empty-prefix ``include()``
is a resolver of its own that raises ``Resolver404`` (with the list of everything it tried) back to its
parent when nothing in it matches. The API's routes are four such includes, one per app, so
``/api/v1/jobs/<id>/quotes`` was found after ~60 failed patterns and three caught exceptions: ~140 µs of
CPU on every quote request, against ~8 µs for ``/healthz`` near the top of the list.

``indexed(route, patterns)`` is the same URLconf, resolved differently:

- the empty-prefix includes without a namespace, an app name or default arguments are inlined (they add
  nothing to a match: Django drops empty app names and namespaces, and joins an empty route away);
- the patterns are indexed by the literal first segment of their route (``jobs`` for
  ``jobs/<int:job_id>/quotes``, ``admin`` for ``admin/``). A pattern whose first segment is empty, a
  regular expression or holds a converter can match any first segment, and is a candidate everywhere;
- a path tries only its own segment's candidates, in the URLconf's order: a pattern with another literal
  first segment cannot match it, so the first match is the one Django's walk would find.

A path that no candidate matches goes through Django's own walk, which raises ``Resolver404`` with every
pattern tried (what the debug 404 page lists). Reversing URLs is Django's, unchanged: the inlined patterns
keep their names in the same namespaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from django.urls import URLPattern, URLResolver
from django.urls.exceptions import Resolver404
from django.urls.resolvers import ResolverMatch, RoutePattern


def inline(patterns: Sequence[URLPattern | URLResolver]) -> list[URLPattern | URLResolver]:
    """``patterns`` with every empty-prefix include that adds nothing to a match replaced by its patterns,
    recursively, in order."""
    flat: list[URLPattern | URLResolver] = []
    for pattern in patterns:
        if (
            isinstance(pattern, URLResolver)
            and isinstance(pattern.pattern, RoutePattern)
            and str(pattern.pattern) == ""
            and not pattern.namespace
            and not pattern.app_name
            and not pattern.default_kwargs
        ):
            flat.extend(inline(pattern.url_patterns))
        else:
            flat.append(pattern)
    return flat


def first_segment(pattern: URLPattern | URLResolver) -> str | None:
    """The literal first segment of ``pattern``'s route (up to its first ``/``), or None when the pattern
    can match more than one first segment: an empty route, a regular expression, a converter in it."""
    if not isinstance(pattern.pattern, RoutePattern):
        return None
    segment = str(pattern.pattern).split("/", 1)[0]
    if not segment or "<" in segment:
        return None
    return segment


class IndexedResolver(URLResolver):
    """A URLResolver that tries, for a path, only the patterns its first segment can match (module
    docstring)."""

    @cached_property
    def _candidates(self) -> tuple[dict[str, tuple[Any, ...]], tuple[Any, ...]]:
        """Per literal first segment, the patterns to try in order; and those to try for any other segment."""
        patterns = list(self.url_patterns)
        segments = [first_segment(pattern) for pattern in patterns]
        anywhere = tuple(p for p, s in zip(patterns, segments, strict=True) if s is None)
        by_segment = {
            segment: tuple(p for p, s in zip(patterns, segments, strict=True) if s is None or s == segment)
            for segment in {s for s in segments if s is not None}
        }
        return by_segment, anywhere

    def resolve(self, path: Any) -> ResolverMatch:
        path = str(path)  # path may be a reverse_lazy object
        match = self.pattern.match(path)
        if not match:
            raise Resolver404({"path": path})
        new_path, args, kwargs = match
        by_segment, anywhere = self._candidates
        for pattern in by_segment.get(new_path.split("/", 1)[0], anywhere):
            try:
                sub_match = pattern.resolve(new_path)
            except Resolver404:
                continue
            if sub_match:
                # As URLResolver.resolve builds its match (the captured arguments merged the same way).
                sub_match_dict = {**kwargs, **self.default_kwargs}
                sub_match_dict.update(sub_match.kwargs)
                sub_match_args = sub_match.args if sub_match_dict else args + sub_match.args
                current_route = "" if isinstance(pattern, URLPattern) else str(pattern.pattern)
                return ResolverMatch(
                    sub_match.func,
                    sub_match_args,
                    sub_match_dict,
                    sub_match.url_name,
                    [self.app_name, *sub_match.app_names],
                    [self.namespace, *sub_match.namespaces],
                    _join_route(current_route, sub_match.route),
                    [[pattern, *t] for t in sub_match.tried] if sub_match.tried else [[pattern]],
                    captured_kwargs=sub_match.captured_kwargs,
                    extra_kwargs={**self.default_kwargs, **sub_match.extra_kwargs},
                )
        return super().resolve(path)  # nothing matches: Django's walk raises, with everything it tried


def _join_route(route1: str, route2: str) -> str:
    """Two routes joined, without the second's leading ``^`` (URLResolver._join_route)."""
    return route2 if not route1 else route1 + route2.removeprefix("^")


def indexed(
    route: str,
    patterns: Sequence[URLPattern | URLResolver],
    *,
    app_name: str | None = None,
    namespace: str | None = None,
) -> IndexedResolver:
    """``path(route, include((patterns, app_name), namespace=namespace))``, resolved by first segment."""
    return IndexedResolver(
        RoutePattern(route, is_endpoint=False),
        inline(patterns),
        app_name=app_name,
        namespace=namespace,
    )
