"""Slowing down guessing: failed log-ins per account and per client address, sign-ups and password-reset
requests per address (and per e-mail address), counted in the shared cache.

A budget is a fixed window that opens at the first counted attempt and lasts ``window`` seconds; once it
is spent, further attempts are refused without being checked (so a locked account's password cannot be
guessed meanwhile) until the window closes. A successful log-in clears the account's failures, never the
address's. The client address is REMOTE_ADDR, or — behind ``CARDHOUR_TRUSTED_PROXY_COUNT`` reverse proxies
— the address those proxies appended to X-Forwarded-For (never a value the client could have written).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest


@dataclass(frozen=True)
class Budget:
    name: str
    limit: int
    window_seconds: int


def login_account_budget() -> Budget:
    return Budget(
        "login-account", settings.CARDHOUR_LOGIN_FAILURES_PER_ACCOUNT, settings.CARDHOUR_LOCKOUT_SECONDS
    )


def login_address_budget() -> Budget:
    return Budget(
        "login-address", settings.CARDHOUR_LOGIN_FAILURES_PER_ADDRESS, settings.CARDHOUR_LOCKOUT_SECONDS
    )


def signup_address_budget() -> Budget:
    return Budget("signup-address", settings.CARDHOUR_SIGNUPS_PER_ADDRESS, 3600)


def reset_address_budget() -> Budget:
    return Budget("reset-address", settings.CARDHOUR_PASSWORD_RESETS_PER_ADDRESS, 3600)


def reset_email_budget() -> Budget:
    return Budget("reset-email", settings.CARDHOUR_PASSWORD_RESETS_PER_EMAIL, 3600)


def client_address(request: HttpRequest) -> str:
    proxies = settings.CARDHOUR_TRUSTED_PROXY_COUNT
    if proxies > 0:
        chain = [
            part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()
        ]
        if len(chain) >= proxies:
            return chain[-proxies]
    return str(request.META.get("REMOTE_ADDR", "unknown"))


def _key(budget: Budget, subject: str) -> str:
    digest = hashlib.sha256(subject.strip().lower().encode()).hexdigest()[:32]
    return f"lockout:{budget.name}:{digest}"


def spent(budget: Budget, subject: str) -> bool:
    """Whether ``subject`` (an account, an address) has used up ``budget`` in the current window."""
    return int(cache.get(_key(budget, subject), 0)) >= budget.limit


def count(budget: Budget, subject: str) -> int:
    """Count one attempt against ``budget``; return the count in the window."""
    key = _key(budget, subject)
    cache.add(key, 0, timeout=budget.window_seconds)
    try:
        return int(cache.incr(key))
    except ValueError:
        cache.set(key, 1, timeout=budget.window_seconds)
        return 1


def clear(budget: Budget, subject: str) -> None:
    cache.delete(_key(budget, subject))
