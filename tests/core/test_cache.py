"""core.cache: the Redis cache backend shares one connection pool per process, and the rate limiter counts in
one round trip — against a real Redis (skipped when none is reachable)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings
from rest_framework.test import APIClient

from core.api.throttling import hit
from core.cache import SharedPoolRedisCache

REDIS_URL = os.environ.get("CARDHOUR_TEST_REDIS_URL", "redis://127.0.0.1:6379/8")


def _redis_reachable() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


pytestmark = pytest.mark.skipif(not _redis_reachable(), reason=f"no Redis at {REDIS_URL}")

REDIS_CACHES = {
    "default": {
        "BACKEND": "core.cache.SharedPoolRedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "cache-test",
    }
}


@pytest.fixture
def redis_cache() -> Iterator[SharedPoolRedisCache]:
    with override_settings(CACHES=REDIS_CACHES):
        caches._settings = caches.settings = caches.configure_settings(None)  # type: ignore[attr-defined]
        backend = caches.create_connection("default")
        backend.clear()
        yield backend  # type: ignore[misc]
        backend.clear()
    caches._settings = caches.settings = caches.configure_settings(None)  # type: ignore[attr-defined]


def test_cache_objects_of_different_threads_share_one_pool(redis_cache: SharedPoolRedisCache) -> None:
    pools = []

    def in_thread() -> None:
        backend = caches.create_connection("default")
        backend.set("k", 1)
        pools.append(backend._cache._get_connection_pool(True))

    threads = [threading.Thread(target=in_thread) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    redis_cache.set("k", 2)
    assert len({id(pool) for pool in [*pools, redis_cache._cache._get_connection_pool(True)]}) == 1


def test_cache_objects_share_one_client_per_pool_and_it_serves_threads(
    redis_cache: SharedPoolRedisCache,
) -> None:
    """One redis client per pool, not one per call (building one copies its response callbacks): every
    cache object's get_client returns it, it is the pool's, and threads using it at once each read their
    own answers."""
    client = redis_cache._cache.get_client(write=True)
    other = caches.create_connection("default")._cache.get_client(write=False)
    assert client is other
    assert client.connection_pool is redis_cache._cache._get_connection_pool(True)
    errors: list[str] = []

    def in_thread(n: int) -> None:
        backend = caches.create_connection("default")
        for i in range(200):
            backend.set(f"t{n}", i)
            if backend.get(f"t{n}") != i:
                errors.append(f"thread {n} read another value at {i}")

    threads = [threading.Thread(target=in_thread, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_count_in_window_counts_and_reads_the_previous_window(redis_cache: SharedPoolRedisCache) -> None:
    assert redis_cache.count_in_window(key="w:2", previous_key="w:1", timeout=60) == (1, 0)
    assert redis_cache.count_in_window(key="w:2", previous_key="w:1", timeout=60) == (2, 0)
    assert redis_cache.count_in_window(key="w:3", previous_key="w:2", timeout=60) == (1, 2)
    # The counters are plain integers in the cache's own key space: the cache API reads them back.
    assert redis_cache.get("w:2") == 2
    client = redis_cache._cache.get_client(write=True)
    assert 0 < client.ttl(redis_cache.make_key("w:2")) <= 60


def test_count_in_window_survives_a_redis_that_lost_its_scripts(redis_cache: SharedPoolRedisCache) -> None:
    """The counter is a script run by its SHA: a Redis restarted (or ``SCRIPT FLUSH``ed) since the script was
    loaded is given it again, and the count goes on."""
    assert redis_cache.count_in_window(key="f:1", previous_key="f:0", timeout=60) == (1, 0)
    client = redis_cache._cache.get_client(write=True)
    client.script_flush()
    assert redis_cache.count_in_window(key="f:1", previous_key="f:0", timeout=60) == (2, 0)


def test_count_in_window_is_atomic_under_concurrency(redis_cache: SharedPoolRedisCache) -> None:
    def hammer() -> None:
        for _ in range(50):
            redis_cache.count_in_window(key="c:1", previous_key="c:0", timeout=60)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert redis_cache.get("c:1") == 400


def test_the_rate_limiter_on_redis_refuses_past_the_budget_and_names_the_wait(
    redis_cache: SharedPoolRedisCache,
) -> None:
    now = 60 * 16_666_667 + 30.0  # 30 s into a minute window
    assert [hit(purpose="p", ident="t:1", rate="2/min", now=now) for _ in range(2)] == [None, None]
    assert hit(purpose="p", ident="t:1", rate="2/min", now=now) == 30
    # Another credential's budget is its own.
    assert hit(purpose="p", ident="t:2", rate="2/min", now=now) is None


@pytest.mark.django_db
def test_an_api_token_is_throttled_through_redis(redis_cache: SharedPoolRedisCache, api: APIClient) -> None:
    rates = {"credential": "2/min", "heartbeat": "2/min", "usage": "2/min", "anon": "2/min"}
    with override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}):
        codes = [api.get("/api/v1/me").status_code for _ in range(3)]
    assert codes == [200, 200, 429]
