"""URL resolution by first segment (core.routing) finds what Django's own walk of the same URLconf finds:
every route of the project, near misses and random paths, against a resolver built from the same patterns
with Django's ``include()``."""

from __future__ import annotations

import random
import re

import pytest
from django.urls import URLPattern, URLResolver, include, path
from django.urls.exceptions import Resolver404
from django.urls.resolvers import RegexPattern, ResolverMatch

import config.urls
from core.routing import IndexedResolver, first_segment, indexed, inline


def _view(name: str):
    def view(request: object, **kwargs: object) -> str:
        return name

    view.__name__ = view.__qualname__ = name
    return view


def _reference_root() -> URLResolver:
    """The project's URLconf as it was written before the index: Django's resolvers throughout."""
    patterns = []
    for pattern in config.urls.urlpatterns:
        if pattern is config.urls.urlpatterns[-1]:
            patterns.append(path("", include(config.urls.portal)))
        elif isinstance(pattern, IndexedResolver):
            patterns.append(path("api/v1/", include((config.urls.api_v1, "api"), namespace="api")))
        else:
            patterns.append(pattern)
    return URLResolver(RegexPattern(r"^/"), patterns)


def _indexed_root() -> URLResolver:
    return URLResolver(RegexPattern(r"^/"), config.urls.urlpatterns)


def _routes(patterns: list, prefix: str = "") -> list[str]:
    """Every endpoint's full route under ``patterns``."""
    routes: list[str] = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            routes.extend(_routes(pattern.url_patterns, route))
        else:
            routes.append(route)
    return routes


def _concrete(route: str) -> str:
    """A path the route matches: converters filled in (regular-expression routes are left out)."""
    values = {
        "int": "7",
        "slug": "abc-1",
        "str": "abc-1",
        "path": "a/b",
        "uuid": "12345678-1234-5678-1234-567812345678",
    }
    return "/" + re.sub(r"<(?:(\w+):)?\w+>", lambda m: values.get(m.group(1) or "str", "abc-1"), route)


def _same(a: ResolverMatch, b: ResolverMatch) -> None:
    assert (a.func, a.args, a.kwargs, a.url_name, a.namespaces, a.app_names, a.route, a.view_name) == (
        b.func,
        b.args,
        b.kwargs,
        b.url_name,
        b.namespaces,
        b.app_names,
        b.route,
        b.view_name,
    )


def _outcome(resolver: URLResolver, url: str) -> ResolverMatch | None:
    try:
        return resolver.resolve(url)
    except Resolver404:
        return None


def _paths() -> list[str]:
    reference = _reference_root()
    paths = [_concrete(route) for route in _routes(reference.url_patterns) if "^" not in route]
    assert len(paths) > 100  # the whole project: API, portal, admin
    return paths


def test_every_route_of_the_project_resolves_as_django_resolves_it() -> None:
    reference, index = _reference_root(), _indexed_root()
    for url in _paths():
        expected = _outcome(reference, url)
        got = _outcome(index, url)
        assert (expected is None) == (got is None), url
        if expected is not None and got is not None:
            _same(got, expected)
    assert index.resolve("/api/v1/jobs/12/quotes").kwargs == {"job_id": 12}
    assert index.resolve("/api/v1/jobs/12/quotes").view_name == "api:job-quotes"
    assert index.resolve("/jobs/12/").view_name == "job-detail"


def test_near_misses_and_random_paths_resolve_or_fail_as_django_does() -> None:
    reference, index = _reference_root(), _indexed_root()
    segments = sorted(
        {segment for url in _paths() for segment in url.strip("/").split("/")}
        | {"", "x", "7", "-1", "api", "v1", "v2", "jobs.csv", "ÄÖ", "%2F", "."}
    )
    rng = random.Random(14)
    urls = [
        "/",
        "/api/v1/",
        "/api/v1",
        "/api/v1/jobs/abc/quotes",
        "/api/v1/jobs/7/quotes/",
        "/api/v1/nope",
        "/jobsx/",
        "/jobs",
        "/admin",
        "/admin/",
        "//api/v1/jobs",
    ]
    urls += [
        "/" + "/".join(rng.choice(segments) for _ in range(rng.randint(1, 5))) + rng.choice(["", "/"])
        for _ in range(3000)
    ]
    for url in _paths():  # each real path, with and without its trailing slash, and with a segment changed
        urls += [url.rstrip("/") or "/", url.rstrip("/") + "/"]
        parts = url.split("/")
        changed = rng.randrange(1, len(parts))
        urls.append("/".join([*parts[:changed], rng.choice(segments), *parts[changed + 1 :]]))
    found = 0
    for url in urls:
        expected, got = _outcome(reference, url), _outcome(index, url)
        assert (expected is None) == (got is None), url
        if expected is not None and got is not None:
            _same(got, expected)
            found += 1
    assert found > 200  # hits as well as misses


def test_a_miss_lists_everything_django_tried() -> None:
    with pytest.raises(Resolver404) as raised:
        _indexed_root().resolve("/api/v1/nope")
    tried = raised.value.args[0]["tried"]
    assert len(tried) > 50  # the debug 404 page's list, as Django's walk makes it


def test_the_first_pattern_in_order_wins_also_over_a_converter_first_segment() -> None:
    a, b, c = _view("a"), _view("b"), _view("c")
    resolver = URLResolver(
        RegexPattern(r"^/"),
        [indexed("", [path("<str:x>/go", a), path("jobs/go", b), path("jobs/<int:n>", c)])],
    )
    assert resolver.resolve("/jobs/go").func is a  # written first, and it matches
    assert resolver.resolve("/jobs/5").func is c
    assert resolver.resolve("/other/go").kwargs == {"x": "other"}
    with pytest.raises(Resolver404):
        resolver.resolve("/jobs/x")


def test_first_segments_and_inlining() -> None:
    a = _view("a")
    assert first_segment(path("jobs/<int:n>/quotes", a)) == "jobs"
    assert first_segment(path("heartbeats", a)) == "heartbeats"
    assert first_segment(path("invoices/<int:n>.csv", a)) == "invoices"
    assert first_segment(path("admin/", include([]))) == "admin"
    assert first_segment(path("", a)) is None
    assert first_segment(path("job<int:n>", a)) is None
    assert first_segment(URLPattern(RegexPattern(r"^jobs/$"), a)) is None
    namespaced = path("", include(([path("b", a)], "app"), namespace="app"))
    with_kwargs = path("", include([path("c", a)]), {"k": 1})
    flat = inline(
        [path("", include([path("x", a), path("", include([path("y", a)]))])), namespaced, with_kwargs]
    )
    assert [str(p.pattern) for p in flat] == ["x", "y", "", ""]
    assert flat[2] is namespaced and flat[3] is with_kwargs
