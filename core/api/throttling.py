"""Rate limits: a budget per credential and per purpose, kept as atomic counters in the shared cache.

* Per credential: each API token has its own budget, each signed-in person theirs; one script's traffic
  never spends another token's budget (it used to be one budget per organisation: 25 GETs from a read-only
  token made the same organisation's next heartbeat answer 429, and 90 s of that takes clusters offline).
* Per purpose: heartbeats and usage reports (views with ``throttle_purpose`` ``heartbeat`` / ``usage``)
  have budgets of their own, which even the same token's other calls cannot spend.
* Anonymous calls: a budget per client address.

Each budget is a sliding window approximated from two fixed windows (the current window's count plus the
previous window's, weighted by how much of it still overlaps): one atomic ``incr`` and one ``get`` per
request, in Redis in production (``CACHE_URL``), instead of DRF's pickled list of timestamps rewritten on
every request (1.3 ms at 6,000/min, and racy between processes). Over budget is a 429 in the API's error
shape (``throttled``) with ``Retry-After``. Rates are ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` keys
``credential``, ``heartbeat``, ``usage`` and ``anon``.
"""

from __future__ import annotations

import math
import time
from typing import Any

from django.core.cache import cache, caches
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from core.cache import SharedPoolRedisCache
from core.models import ApiToken

_DURATIONS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """``"6000/min"`` → (6000, 60)."""
    count, period = rate.split("/")
    return int(count), _DURATIONS[period[0]]


def hit(*, purpose: str, ident: str, rate: str, now: float | None = None) -> float | None:
    """Count one request against ``ident``'s ``purpose`` budget; return None when within it, else the
    seconds to wait."""
    limit, duration = parse_rate(rate)
    now = time.time() if now is None else now
    window = int(now // duration)
    key = f"throttle:{purpose}:{ident}:{window}"
    previous_key = f"throttle:{purpose}:{ident}:{window - 1}"
    backend = caches["default"]
    if isinstance(backend, SharedPoolRedisCache):  # production: one round trip to Redis
        current, previous = backend.count_in_window(
            key=key, previous_key=previous_key, timeout=2 * duration + 1
        )
    else:
        cache.add(key, 0, timeout=2 * duration + 1)
        try:
            current = cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=2 * duration + 1)
            current = 1
        previous = cache.get(previous_key, 0)
    elapsed = (now - window * duration) / duration
    if previous * (1 - elapsed) + current <= limit:
        return None
    return max(1.0, math.ceil((window + 1) * duration - now))


class _CounterThrottle(BaseThrottle):
    _wait: float | None = None

    def rate_for(self, purpose: str) -> str | None:
        rates = api_settings.DEFAULT_THROTTLE_RATES
        rate = rates.get(purpose) or rates.get("credential")
        return str(rate) if rate else None

    def check(self, *, purpose: str, ident: str) -> bool:
        rate = self.rate_for(purpose)
        if not rate:
            return True
        self._wait = hit(purpose=purpose, ident=ident, rate=rate)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait


class CredentialRateThrottle(_CounterThrottle):
    """One budget per API token or signed-in person, per purpose (see the module docstring)."""

    def allow_request(self, request: Request, view: Any) -> bool:
        if isinstance(request.auth, ApiToken):
            ident = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            return True  # anonymous: AddressRateThrottle
        purpose = getattr(view, "throttle_purpose", "credential")
        return self.check(purpose=purpose, ident=ident)


class AddressRateThrottle(_CounterThrottle):
    """Anonymous calls: one budget per client address (the proxy's, unless NUM_PROXIES is set)."""

    def rate_for(self, purpose: str) -> str | None:
        rate = api_settings.DEFAULT_THROTTLE_RATES.get("anon")
        return str(rate) if rate else None

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.user and request.user.is_authenticated:
            return True
        return self.check(purpose="anon", ident=f"addr:{self.get_ident(request)}")
