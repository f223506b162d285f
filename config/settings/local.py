"""Embedded defaults for one machine: SQLite, a file-based Celery transport, console e-mail."""

from .base import *  # noqa: F403
from .base import env

DEBUG = env.bool("DJANGO_DEBUG", default=True)
SECRET_KEY = env("DJANGO_SECRET_KEY", default="local-development-only-not-a-secret")
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
WHITENOISE_USE_FINDERS = True  # serve static files straight from the apps in development

# Stripe: with no STRIPE_SECRET_KEY in the environment, `make run` starts localstripe on loopback
# (Procfile.dev, `manage.py run_localstripe`) and the platform talks to it in test mode; these keys are
# placeholders localstripe accepts. Set real test or live keys to talk to Stripe itself.
if not env("STRIPE_SECRET_KEY", default=""):
    STRIPE_API_BASE = env("STRIPE_API_BASE", default="http://127.0.0.1:8420")
    STRIPE_SECRET_KEY = "sk_test_localstripe"  # noqa: S105
    STRIPE_PUBLISHABLE_KEY = "pk_test_localstripe"
    STRIPE_WEBHOOK_SECRET = "whsec_localstripe"  # noqa: S105
    STRIPE_JS_URL = f"{STRIPE_API_BASE}/js.stripe.com/v3/"

# The demo platform's seller entity on statements: plainly a demo, with no made-up tax id or bank account.
CARDHOUR_SELLER = {
    **CARDHOUR_SELLER,  # noqa: F405
    "legal_name": env(
        "CARDHOUR_SELLER_LEGAL_NAME", default="Cardhour 演示平台 (demo platform, not a company)"
    ),
}

# The demo's lease agents listen on loopback over plain http (core.net's SSRF guard allows it here only).
CARDHOUR_ENDPOINT_ALLOW_HTTP = env.bool("CARDHOUR_ENDPOINT_ALLOW_HTTP", default=True)
CARDHOUR_ENDPOINT_ALLOW_LOOPBACK = env.bool("CARDHOUR_ENDPOINT_ALLOW_LOOPBACK", default=True)
