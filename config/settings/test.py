"""Test settings: SQLite unless DATABASE_URL is set (CI sets it to PostgreSQL)."""

from .base import *  # noqa: F403
from .base import REST_FRAMEWORK, env

DEBUG = False
SECRET_KEY = "test-only-not-a-secret"  # noqa: S105
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "tests"}}
# Integration tests start a real Celery worker; it uses CELERY_BROKER_URL when set (Redis in CI) and an
# in-memory transport otherwise.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="memory://")
CELERY_BROKER_TRANSPORT_OPTIONS = {}
# base.py chose the embedded file transport's class for its own default URL; the URL here decides.
CELERY_BROKER_TRANSPORT = None
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_THROTTLE_RATES": {
        "credential": "100000/min",
        "heartbeat": "100000/min",
        "usage": "100000/min",
        "anon": "100000/min",
    },
}
# Stripe: tests that pay start localstripe on a free loopback port and point STRIPE_API_BASE at it
# (tests/metering/localstripe.py). The default is a loopback port nothing listens on, so a test that
# forgets the fixture fails at once instead of reaching the network.
STRIPE_SECRET_KEY = "sk_test_cardhour_tests"  # noqa: S105
STRIPE_PUBLISHABLE_KEY = "pk_test_cardhour_tests"
STRIPE_WEBHOOK_SECRET = "whsec_cardhour_tests"  # noqa: S105
STRIPE_API_BASE = "http://127.0.0.1:9"
STRIPE_JS_URL = "http://127.0.0.1:9/js.stripe.com/v3/"
# Off in tests: every test posting usage would otherwise queue an arrival task on the test broker (Redis in
# CI), which a later integration test's worker would run. Tests of arrival rating turn it on themselves.
CARDHOUR_RATING_ON_ARRIVAL = False
# The matcher reloads its catalogue on every quote, so a test sees every change it makes at once.
CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 0.0

# Tests' receivers listen on loopback over http; the SSRF tests turn these off.
CARDHOUR_ENDPOINT_ALLOW_HTTP = True
CARDHOUR_ENDPOINT_ALLOW_LOOPBACK = True

# The whole suite signs up and logs in from one address: budgets against guessing are tested on their own
# with small values (tests/portal/test_lockout.py).
CARDHOUR_LOGIN_FAILURES_PER_ADDRESS = 10_000
CARDHOUR_SIGNUPS_PER_ADDRESS = 10_000
CARDHOUR_PASSWORD_RESETS_PER_ADDRESS = 10_000
CARDHOUR_PASSWORD_RESETS_PER_EMAIL = 10_000
