"""Production: everything from environment variables; secrets have no defaults."""

from .base import *  # noqa: F403
from .base import LOGGING, cache_from_url, env

DEBUG = False
SECRET_KEY = env("DJANGO_SECRET_KEY")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS")
DATABASES = {"default": env.db("DATABASE_URL")}
_db = DATABASES["default"]
_db_options: dict[str, object] = dict(_db.get("OPTIONS", {}))
if _db["ENGINE"] == "django.db.backends.postgresql":
    # A statement or a lock wait that runs away is cut off instead of holding a connection and its locks
    # (the Celery worker, whose month-end close runs long statements, raises the first: README).
    _db_options["options"] = " ".join(
        [
            f"-c statement_timeout={env.int('DATABASE_STATEMENT_TIMEOUT_MS', default=30_000)}",
            f"-c lock_timeout={env.int('DATABASE_LOCK_TIMEOUT_MS', default=10_000)}",
            f"-c idle_in_transaction_session_timeout={env.int('DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS', default=60_000)}",
        ]
    )
    if env.bool("DATABASE_POOL", default=True):
        # Django's psycopg pool, one per process: every thread borrows a connection for a request and gives
        # it back, so a process never holds more than max_size however many threads it runs. With PgBouncer
        # in transaction mode instead: DATABASE_POOL=false, DATABASE_CONN_MAX_AGE=0 and
        # DATABASE_LISTEN_URL pointing at PostgreSQL itself (LISTEN needs a session; README).
        _db_options["pool"] = {
            "min_size": env.int("DATABASE_POOL_MIN_SIZE", default=2),
            "max_size": env.int("DATABASE_POOL_MAX_SIZE", default=16),
            "timeout": env.float("DATABASE_POOL_TIMEOUT_SECONDS", default=10.0),
        }
        _db["CONN_MAX_AGE"] = 0  # the pool keeps the connections; Django must not hold one per thread
        # The few statements every request runs through core.db.bound_cursor (the token, the job, the quote
        # rows) are prepared once a pooled connection has run them this many times, so PostgreSQL stops
        # parsing and planning them on each request (a third of its CPU per quote, issue 14). Django's own
        # queries bind on the client and are never prepared. Not with PgBouncer (below): a prepared
        # statement would be looked for on another server connection.
        _db_options["prepare_threshold"] = env.int("DATABASE_PREPARE_THRESHOLD", default=5)
    else:
        _db["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=0)
        _db["CONN_HEALTH_CHECKS"] = True
        _db["DISABLE_SERVER_SIDE_CURSORS"] = env.bool("DATABASE_DISABLE_SERVER_SIDE_CURSORS", default=False)
_db["OPTIONS"] = _db_options
# The long-polls' listening connection (core.wakeups): PostgreSQL itself, not a transaction-mode bouncer.
CARDHOUR_WAKEUP_DATABASE_URL = env("DATABASE_LISTEN_URL", default="")
CELERY_BROKER_URL = env("CELERY_BROKER_URL")
# With Redis, longer than the longest task's hard limit (acks_late: see base.py).
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=10_800)}
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
    else {}
)
CACHES = {"default": cache_from_url("CACHE_URL")}

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
# Load balancers and scrapers probe these over plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^livez$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
# JSON lines with request and task ids (core.observability.JsonFormatter); DJANGO_LOG_FORMAT=plain for text.
LOGGING["handlers"]["console"]["formatter"] = env("DJANGO_LOG_FORMAT", default="json")

EMAIL_BACKEND = env("DJANGO_EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
EMAIL_CONFIG = env.email_url("EMAIL_URL", default="smtp://localhost:25")
vars().update(EMAIL_CONFIG)
DEFAULT_FROM_EMAIL = env("DJANGO_DEFAULT_FROM_EMAIL", default="cardhour@localhost")

# Stripe itself, never localstripe: the keys have no defaults, and the API base is Stripe's own.
STRIPE_SECRET_KEY = env("STRIPE_SECRET_KEY")
STRIPE_PUBLISHABLE_KEY = env("STRIPE_PUBLISHABLE_KEY")
STRIPE_WEBHOOK_SECRET = env("STRIPE_WEBHOOK_SECRET")
STRIPE_API_BASE = ""
STRIPE_JS_URL = "https://js.stripe.com/v3/"
