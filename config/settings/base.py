"""Settings shared by every environment.

Every value that differs between environments comes from an environment variable through the one
``env`` object; production secrets have no default (see production.py).
"""

from decimal import Decimal
from pathlib import Path
from typing import Any

import environ
from kombu import Exchange, Queue

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()

DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env("DJANGO_SECRET_KEY", default="")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # The project's apps before the third-party ones: Django merges the apps' catalogues with the earlier app
    # winning, and django_celery_beat's zh_Hans "Name" (任务名, a task's name) would otherwise label every
    # name field of the portal (tests/core/test_translations.py checks what is served).
    "core",
    "federation",
    "metering",
    "broker",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
]

MIDDLEWARE = [
    "core.observability.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy on HTML pages, and the nonce templates put on their inline blocks.
    "core.middleware.ContentSecurityPolicyMiddleware",
    "core.middleware.ApiBodyLimitMiddleware",
    "core.middleware.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "core.portal.portal_context",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'cardhour.sqlite3'}"),
}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=0)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL and a busy timeout let the web server, the Celery worker and beat share one file.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def cache_from_url(url_variable: str, default: str | None = None) -> dict[str, Any]:
    """``CACHE_URL`` as a cache setting; Redis URLs get core.cache's backend, which shares one connection
    pool per process instead of connecting anew in every request's context."""
    config = env.cache(url_variable) if default is None else env.cache(url_variable, default=default)
    if config["BACKEND"] == "django.core.cache.backends.redis.RedisCache":
        config["BACKEND"] = "core.cache.SharedPoolRedisCache"
    return dict(config)


CACHES = {"default": cache_from_url("CACHE_URL", default="locmemcache://cardhour")}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en"
# Each language named in itself (the switcher shows both whatever the page's language). Only "zh-hans" is
# listed: LocaleMiddleware maps a browser's zh, zh-CN, zh-SG and zh-Hans to it through Django's LANG_INFO
# fallbacks (tests/core/test_i18n.py holds that).
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
# The project catalogue (templates); each app keeps the catalogue of its Python strings in <app>/locale.
LOCALE_PATHS = [BASE_DIR / "locale"]
# Thousands grouped with a comma in Chinese too (config/formats/zh_Hans/formats.py says why).
FORMAT_MODULE_PATH = ["config.formats"]
TIME_ZONE = "Asia/Shanghai"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env("DJANGO_STATIC_ROOT", default=str(VAR_DIR / "staticfiles"))
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves static files (admin, Swagger UI) from the web process itself, compressed and with
# far-future cache headers in production, so no CDN or separate file server is needed.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "home"

# --- REST API -------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "core.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "core.api.pagination.StandardPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["core.api.filters.StrictDjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "core.api.schema.CardhourAutoSchema",
    "EXCEPTION_HANDLER": "core.api.exceptions.exception_handler",
    # Budgets per credential and per purpose, as atomic counters in the shared cache (core.api.throttling).
    "DEFAULT_THROTTLE_CLASSES": [
        "core.api.throttling.CredentialRateThrottle",
        "core.api.throttling.AddressRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "credential": env("API_THROTTLE_CREDENTIAL", default="6000/min"),
        # A token's heartbeats and usage reports: a large operator beats for thousands of clusters.
        "heartbeat": env("API_THROTTLE_HEARTBEAT", default="60000/min"),
        # Batches of heartbeats (up to CARDHOUR_HEARTBEAT_BATCH_MAX beats each), counted in requests.
        "heartbeat_batch": env("API_THROTTLE_HEARTBEAT_BATCH", default="600/min"),
        "usage": env("API_THROTTLE_USAGE", default="6000/min"),
        "anon": env("API_THROTTLE_ANON", default="60/min"),
    },
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON only (core.api.parsers): the schema then promises exactly what the server reads; form bodies
    # silently dropped nested lists (a heartbeat lost its islands and answered 200).
    "DEFAULT_PARSER_CLASSES": ["core.api.parsers.JSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

# Guessing (core.lockout): failed log-ins per account and per client address in a window, then a pause;
# sign-ups and password-reset requests per address (and per e-mail) per hour. Behind reverse proxies, how
# many of them append to X-Forwarded-For (0: use REMOTE_ADDR).
CARDHOUR_LOGIN_FAILURES_PER_ACCOUNT = env.int("CARDHOUR_LOGIN_FAILURES_PER_ACCOUNT", default=5)
CARDHOUR_LOGIN_FAILURES_PER_ADDRESS = env.int("CARDHOUR_LOGIN_FAILURES_PER_ADDRESS", default=30)
CARDHOUR_LOCKOUT_SECONDS = env.int("CARDHOUR_LOCKOUT_SECONDS", default=900)
CARDHOUR_SIGNUPS_PER_ADDRESS = env.int("CARDHOUR_SIGNUPS_PER_ADDRESS", default=10)
CARDHOUR_PASSWORD_RESETS_PER_ADDRESS = env.int("CARDHOUR_PASSWORD_RESETS_PER_ADDRESS", default=10)
CARDHOUR_PASSWORD_RESETS_PER_EMAIL = env.int("CARDHOUR_PASSWORD_RESETS_PER_EMAIL", default=3)
CARDHOUR_TRUSTED_PROXY_COUNT = env.int("CARDHOUR_TRUSTED_PROXY_COUNT", default=0)

# Outbound requests to operator-chosen URLs (core.net, the SSRF guard): https only and public addresses
# only, unless these say otherwise (development: the demo agents listen on loopback over http).
CARDHOUR_ENDPOINT_ALLOW_HTTP = env.bool("CARDHOUR_ENDPOINT_ALLOW_HTTP", default=False)
CARDHOUR_ENDPOINT_ALLOW_LOOPBACK = env.bool("CARDHOUR_ENDPOINT_ALLOW_LOOPBACK", default=False)

# Hostile input (core.api.parsers, core.middleware): bodies over these sizes are refused with 413 before they
# are read; JSON nested deeper than this is refused with 400. A usage batch of 10,000 records with
# 200-character keys is about 3.4 MB.
CARDHOUR_API_BODY_MAX_BYTES = env.int("CARDHOUR_API_BODY_MAX_BYTES", default=1 << 20)
CARDHOUR_API_USAGE_BODY_MAX_BYTES = env.int("CARDHOUR_API_USAGE_BODY_MAX_BYTES", default=8 << 20)
CARDHOUR_API_USAGE_PATHS = ("/api/v1/operator/usage",)
CARDHOUR_API_JSON_MAX_DEPTH = env.int("CARDHOUR_API_JSON_MAX_DEPTH", default=32)
# Django's own cap on a body it reads into memory: the largest of the API's limits (the middleware enforces
# the per-endpoint ones first).
DATA_UPLOAD_MAX_MEMORY_SIZE = CARDHOUR_API_USAGE_BODY_MAX_BYTES

SPECTACULAR_SETTINGS = {
    "TITLE": "Cardhour API",
    "DESCRIPTION": (
        "The computing-power internet: operators federate clusters under compute identifiers (CPI), "
        "buyers place jobs by the card-hour. Every error has the shape "
        '`{"code": "...", "message": "...", "extra": {...}}`.'
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "FabricEnum": "federation.models.Fabric",
        "ClusterStatusEnum": "federation.models.ClusterStatus",
        "ReportedHealthEnum": "federation.models.REPORTABLE_HEALTH",
        "HealthEnum": "federation.models.Health",
        "HubCodeEnum": "federation.identifiers.HUB_CODES",
        "ScopeEnum": "core.models.ApiToken.Scope",  # an API token's; named so beside BudgetScopeEnum
        "BudgetScopeEnum": "broker.budgets.models.BudgetScope",
        "DeliveryStatusEnum": "broker.budgets.models.DeliveryStatus",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "core.api.schema.postprocess_error_responses",
        "core.api.schema.one_of_to_any_of",
        "federation.api.schema.declare_identifier_grammar",
        "core.api.schema.text_without_nul",
    ],
    # Swagger UI is served from drf-spectacular-sidecar's static files: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Celery ---------------------------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
CELERY_BROKER_TRANSPORT: str | None = None  # kombu's choice from the URL's scheme
if CELERY_BROKER_URL.startswith("filesystem://"):
    from config.kombu_filesystem import transport_options

    # Poll the queue folder often: a worker that polls every 2 s also takes that long to stop.
    CELERY_BROKER_TRANSPORT_OPTIONS = transport_options(
        Path(env("CELERY_FILESYSTEM_DIR", default=str(VAR_DIR / "celery"))), polling_interval=0.1
    )
    # kombu's filesystem transport with atomic writes (config/kombu_filesystem.py): a consumer never
    # reads a message file before it is whole.
    CELERY_BROKER_TRANSPORT = "config.kombu_filesystem:Transport"
# Time limits: a task past its soft limit gets SoftTimeLimitExceeded (its transaction rolls back; every
# task is idempotent and safe to run again), past the hard limit its worker process is replaced. The
# month-end close and the ledger reconciliation take longer and set their own (metering/tasks.py).
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", default=300)
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=360)
# acks_late (below) with Redis: a message not acknowledged within visibility_timeout is delivered again, so
# it must be longer than the longest task's hard limit (the close: 2 h), or a long task runs twice at once.
# RabbitMQ's consumer_timeout (30 min by default) plays the same part there: raise it on the broker
# (consumer_timeout = 10800000 in rabbitmq.conf) when the close can take longer than 30 minutes.
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=10_800)
    }
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = TIME_ZONE
CELERY_ENABLE_UTC = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Three queues, so that the platform's safety work never waits behind billing (README: "Celery workers and
# queues"). A design-load soak showed why: with one queue the heartbeat monitor's and failover's runs expired
# in it (their expiry is one interval) behind rating runs of a minute or more, and silent clusters were never
# taken offline.
#   control — short, latency-bound safety work: the heartbeat monitor, failover, stopping the leases of
#             exhausted or capped buyers, lease events to operators, budget alerts;
#   rating  — usage rating, on arrival and the minute's run: heavy, and it may fall behind under overload;
#   celery  — everything else (daily and monthly jobs, hourly refreshes, SLA assessment): may run for hours.
# Production runs a worker for control apart from the one for rating and celery (-Q); a worker started
# without -Q consumes all three (tests, benchmarks, a small deployment). Each queue has its own direct
# exchange and routing key (Celery's default for a queue it creates): queues declared by name alone would
# all be bound to the default exchange under the default key, and RabbitMQ would copy every task into each.
CARDHOUR_QUEUE_CONTROL, CARDHOUR_QUEUE_RATING, CARDHOUR_QUEUE_DEFAULT = "control", "rating", "celery"
CELERY_TASK_DEFAULT_QUEUE = CARDHOUR_QUEUE_DEFAULT
CELERY_TASK_QUEUES = tuple(
    Queue(name, Exchange(name, type="direct"), routing_key=name)
    for name in (CARDHOUR_QUEUE_CONTROL, CARDHOUR_QUEUE_RATING, CARDHOUR_QUEUE_DEFAULT)
)
_CONTROL_TASKS = (
    "federation.clusters_mark_missed_heartbeats",
    "broker.leases_fail_over",
    "broker.leases_stop_exhausted",
    "broker.leases_stop_over_cap",
    "broker.lease_events_deliver",
    "broker.budget_alerts_deliver",
)
_RATING_TASKS = ("broker.usage_rate_on_arrival", "metering.usage_rate_pending")
_DEFAULT_TASKS = (
    "metering.packs_expire_due",
    "metering.ledger_reconcile",
    "metering.billing_close_previous_month",
    "metering.billing_close_period",
    "metering.usage_partitions_ensure",
    "broker.quotes_purge",
    "broker.reliability_refresh",
    "broker.leases_sla_assess",
)
# Every task is named here (tests/core/test_celery_queues.py fails on a task that is not), so a new task's author
# chooses its queue.
CELERY_TASK_ROUTES = {
    **{name: {"queue": CARDHOUR_QUEUE_CONTROL} for name in _CONTROL_TASKS},
    **{name: {"queue": CARDHOUR_QUEUE_RATING} for name in _RATING_TASKS},
    **{name: {"queue": CARDHOUR_QUEUE_DEFAULT} for name in _DEFAULT_TASKS},
}

# --- Cardhour -------------------------------------------------------------------------------------
# Heartbeats: a cluster that misses HEARTBEAT_MISSED_LIMIT intervals in a row goes offline.
CARDHOUR_HEARTBEAT_INTERVAL_SECONDS = env.int("CARDHOUR_HEARTBEAT_INTERVAL_SECONDS", default=30)
CARDHOUR_HEARTBEAT_MISSED_LIMIT = env.int("CARDHOUR_HEARTBEAT_MISSED_LIMIT", default=3)
# Beats in one POST /api/v1/heartbeats (500 beats of 10 islands is ~0.4 MB, inside the 1 MiB API body limit).
CARDHOUR_HEARTBEAT_BATCH_MAX = env.int("CARDHOUR_HEARTBEAT_BATCH_MAX", default=500)
# The mass-miss hold (federation.selectors.heartbeat_monitor_assess): when at least HOLD_MIN_CLUSTERS clusters
# are missing at once (overdue, or taken offline for missed beats within the missed-beat window) and the hubs
# where at least HOLD_HUB_SHARE of the clusters are missing carry at least HOLD_FLEET_SHARE of the fleet, the
# platform is more likely failing to read heartbeats than the fleet failing to send them: the monitor takes no
# cluster offline and says so (log, /metrics, admin) until staff override or the beats come back. After
# Kubernetes' node lifecycle controller, which stops evictions when every zone looks down at once
# (--large-cluster-size-threshold 50, --unhealthy-zone-threshold 0.55). HOLD_MIN_CLUSTERS=0 turns it off.
CARDHOUR_HEARTBEAT_HOLD_MIN_CLUSTERS = env.int("CARDHOUR_HEARTBEAT_HOLD_MIN_CLUSTERS", default=50)
CARDHOUR_HEARTBEAT_HOLD_HUB_SHARE = env.float("CARDHOUR_HEARTBEAT_HOLD_HUB_SHARE", default=0.05)
CARDHOUR_HEARTBEAT_HOLD_FLEET_SHARE = env.float("CARDHOUR_HEARTBEAT_HOLD_FLEET_SHARE", default=0.75)
# One failover run (every 5 s) takes no new lease after this many seconds; the rest wait for the next run, so a
# hub going down cannot hold every Celery worker slot while thousands of leases are re-placed.
CARDHOUR_FAILOVER_RUN_SECONDS = env.float("CARDHOUR_FAILOVER_RUN_SECONDS", default=20.0)
# Fleet imports and island registration are bounded so one request cannot hold the database for long.
CARDHOUR_MAX_ISLANDS_PER_CLUSTER = env.int("CARDHOUR_MAX_ISLANDS_PER_CLUSTER", default=4096)
# The largest clusters being built hold 100,000 cards; ten times that is a typo, not a cluster.
CARDHOUR_MAX_CARDS_PER_CLUSTER = env.int("CARDHOUR_MAX_CARDS_PER_CLUSTER", default=1_000_000)
CARDHOUR_FLEET_IMPORT_MAX_ROWS = env.int("CARDHOUR_FLEET_IMPORT_MAX_ROWS", default=200_000)
# API tokens: last_used_at is written at most this often per token, so a busy agent is not one UPDATE
# per request.
CARDHOUR_TOKEN_LAST_USED_RESOLUTION_SECONDS = env.int(
    "CARDHOUR_TOKEN_LAST_USED_RESOLUTION_SECONDS", default=60
)

# --- Metering and billing --------------------------------------------------------------------------
# The platform keeps this share of every operator charge (rate × card-hours × band multiplier).
CARDHOUR_PLATFORM_COMMISSION = Decimal(env("CARDHOUR_PLATFORM_COMMISSION", default="0.10"))
# Usage reported this long after its end is still accepted; statements are in this zone's months.
CARDHOUR_LATE_USAGE_DAYS = env.int("CARDHOUR_LATE_USAGE_DAYS", default=35)
CARDHOUR_BILLING_TIME_ZONE = env("CARDHOUR_BILLING_TIME_ZONE", default="Asia/Shanghai")
# PostgreSQL: usage records and rated segments are partitioned by month (of the billing zone); the daily beat
# creates this many months ahead of the current one (metering.services.partitions).
CARDHOUR_USAGE_PARTITIONS_AHEAD = env.int("CARDHOUR_USAGE_PARTITIONS_AHEAD", default=3)
# SLA credits (issue 16 item 3): maintenance excludes lost time only when announced at least this long before
# it starts (and before the lease was accepted); a lease is assessed this long after it ends, so the agent's
# last usage is in and rated (the beat runs every 10 minutes: a credit note within the hour).
CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS = env.int("CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS", default=24)
CARDHOUR_SLA_ASSESS_DELAY_MINUTES = env.int("CARDHOUR_SLA_ASSESS_DELAY_MINUTES", default=15)
CARDHOUR_USAGE_BATCH_MAX = env.int("CARDHOUR_USAGE_BATCH_MAX", default=10_000)
CARDHOUR_RATING_BATCH_SIZE = env.int("CARDHOUR_RATING_BATCH_SIZE", default=20_000)
# The minute's rating runs as this many parts of the buyers in parallel (metering.tasks.usage_rate_pending):
# one per worker process that should rate at once. 1 (the default): two parts measured no faster on 2 cores
# and cost more CPU per record (benchmarks.metering --rating-workers 2).
CARDHOUR_RATING_SHARDS = env.int("CARDHOUR_RATING_SHARDS", default=1)
# Rate usage as it arrives (a broker task queued after each accepted usage report, at most one waiting at a
# time) and stop the leases of buyers it flags at once, so enforcement takes seconds, not the minute's beat.
# Off: only the minute's rating and the 10 s stop run (the safety net either way).
CARDHOUR_RATING_ON_ARRIVAL = env.bool("CARDHOUR_RATING_ON_ARRIVAL", default=True)
# A rating run (on arrival or the minute's) claims no new batch after this many seconds and, if its last batch
# was full, queues the next run (at most one waiting): it never reaches its 5-minute soft limit behind a
# backlog, and the leases of the buyers an on-arrival run flags are stopped at least this often meanwhile.
CARDHOUR_RATING_RUN_SECONDS = env.float("CARDHOUR_RATING_RUN_SECONDS", default=30.0)
# The platform's seller entity, printed on every invoice and settlement and frozen into it at issue.
# Production sets the company's real details; left empty, statements name only "Cardhour".
CARDHOUR_SELLER = {
    "legal_name": env("CARDHOUR_SELLER_LEGAL_NAME", default=""),
    "tax_id": env("CARDHOUR_SELLER_TAX_ID", default=""),
    "address": env("CARDHOUR_SELLER_ADDRESS", default=""),
    "phone": env("CARDHOUR_SELLER_PHONE", default=""),
    "bank": env("CARDHOUR_SELLER_BANK", default=""),
    "bank_account": env("CARDHOUR_SELLER_BANK_ACCOUNT", default=""),
}
# VAT per product kind (metering.tax.ProductKind), as fractions; amounts on statements are tax-included.
# Defaults: 6 %, the rate of "information technology services" (modern services, 财税〔2016〕36号) for a
# general VAT taxpayer. Defaults only: the platform's tax adviser must confirm them for its entity.
CARDHOUR_VAT_RATES = {
    "pack_purchase": env("CARDHOUR_VAT_RATE_PACK_PURCHASE", default="0.06"),
    "compute_service": env("CARDHOUR_VAT_RATE_COMPUTE_SERVICE", default="0.06"),
}
# 税收分类编码 (the State Taxation Administration's goods-and-services classification code) per product kind,
# exported for the fapiao issuing system. Empty until the tax adviser picks them: the export leaves it blank.
CARDHOUR_FAPIAO_TAX_CODES = {
    "pack_purchase": env("CARDHOUR_FAPIAO_TAX_CODE_PACK_PURCHASE", default=""),
    "compute_service": env("CARDHOUR_FAPIAO_TAX_CODE_COMPUTE_SERVICE", default=""),
}
# A TrueType font to set statement PDFs in instead of the bundled WenQuanYi Micro Hei (metering/fonts).
CARDHOUR_PDF_FONT = env("CARDHOUR_PDF_FONT", default="")

# --- Broker -----------------------------------------------------------------------------------------
# Quotes hold nothing and expire after this long; a job's window may reach at most this far ahead.
CARDHOUR_QUOTE_TTL_SECONDS = env.int("CARDHOUR_QUOTE_TTL_SECONDS", default=60)
CARDHOUR_PLANNING_HORIZON_DAYS = env.int("CARDHOUR_PLANNING_HORIZON_DAYS", default=7)
# Starts are tried in steps of this many seconds from the job's earliest start (time-shifting).
CARDHOUR_QUOTE_STEP_SECONDS = env.int("CARDHOUR_QUOTE_STEP_SECONDS", default=900)
CARDHOUR_QUOTE_LIMIT_DEFAULT = env.int("CARDHOUR_QUOTE_LIMIT_DEFAULT", default=10)
CARDHOUR_QUOTE_LIMIT_MAX = env.int("CARDHOUR_QUOTE_LIMIT_MAX", default=100)
# The matcher keeps the island catalogue (islands, clusters, chips, price cards) in memory and reloads it
# when older than this; leases are followed incrementally on every quote. 0 reloads on every quote.
CARDHOUR_BROKER_CATALOG_TTL_SECONDS = env.float("CARDHOUR_BROKER_CATALOG_TTL_SECONDS", default=5.0)
# Refuse a lease (402 insufficient_balance) whose expected draw the buyer's packs cannot pay.
CARDHOUR_BROKER_REQUIRE_BALANCE = env.bool("CARDHOUR_BROKER_REQUIRE_BALANCE", default=True)
# Reliability scores (broker.services.reliability, recomputed hourly): delivered ÷ sold card-seconds over
# the last WINDOW_DAYS, with a Bayesian prior as if each cluster had also sold PRIOR_CARD_HOURS card-hours and
# delivered PRIOR_PERCENT of them. The prior is a platform choice, not an official or measured figure: a new
# cluster scores exactly it, and its own record outweighs it once it has sold more card-hours than this.
CARDHOUR_RELIABILITY_WINDOW_DAYS = env.int("CARDHOUR_RELIABILITY_WINDOW_DAYS", default=30)
CARDHOUR_RELIABILITY_PRIOR_CARD_HOURS = Decimal(env("CARDHOUR_RELIABILITY_PRIOR_CARD_HOURS", default="1000"))
CARDHOUR_RELIABILITY_PRIOR_PERCENT = Decimal(env("CARDHOUR_RELIABILITY_PRIOR_PERCENT", default="99.0"))
# Operators report usage at least this often; usage after a stop request is accepted this long after it.
CARDHOUR_USAGE_REPORT_INTERVAL_SECONDS = env.int("CARDHOUR_USAGE_REPORT_INTERVAL_SECONDS", default=60)
# Long-poll of GET /operator/leases: the most a request may wait for a change.
CARDHOUR_LEASE_POLL_MAX_WAIT_SECONDS = env.int("CARDHOUR_LEASE_POLL_MAX_WAIT_SECONDS", default=30)
# Long-polls are woken by PostgreSQL NOTIFY; on other databases (SQLite under `make run`) they re-check this
# often instead (core.wakeups).
CARDHOUR_WAKEUP_FALLBACK_POLL_SECONDS = env.float("CARDHOUR_WAKEUP_FALLBACK_POLL_SECONDS", default=1.0)
# The production ASGI app (config/asgi.py): these paths wait on the event loop; every other request runs on a
# fixed pool of this many threads per server process.
# The long-polls' listening connection when it must differ from the default database's (PgBouncer in
# transaction mode: production.py); empty means the default database's parameters.
CARDHOUR_WAKEUP_DATABASE_URL = ""
CARDHOUR_ASYNC_PATHS = ["/api/v1/operator/leases"]
# Three: a worker's threads share one interpreter lock, and more of them running at once under overload cost
# more CPU a request in hand-overs than they gain in overlapped waits (config.wsgi_bridge, issue 14).
CARDHOUR_WSGI_THREADS = env.int("CARDHOUR_WSGI_THREADS", default=3)
# Operator agents' batches (config.wsgi_bridge): their own lane of this many threads per server process, so
# that a batch never holds up a buyer's request; 0 runs them on the pool above.
CARDHOUR_BULK_PATHS = [*CARDHOUR_API_USAGE_PATHS, "/api/v1/heartbeats"]
CARDHOUR_WSGI_BULK_THREADS = env.int("CARDHOUR_WSGI_BULK_THREADS", default=1)
# The long-polls' own database work (the first look and each re-check) runs on this many threads per server
# process, however many agents wait: a herd of re-polls queues on the event loop instead of starting a thread
# each and fighting the WSGI threads for the GIL and the connection pool.
CARDHOUR_LONG_POLL_THREADS = env.int("CARDHOUR_LONG_POLL_THREADS", default=2)

# Stripe. With no secret key, `make run` starts localstripe on loopback and every page says "test mode";
# with real keys (sk_live_/sk_test_) the platform talks to Stripe itself.
STRIPE_SECRET_KEY = env("STRIPE_SECRET_KEY", default="")
STRIPE_PUBLISHABLE_KEY = env("STRIPE_PUBLISHABLE_KEY", default="")
STRIPE_WEBHOOK_SECRET = env("STRIPE_WEBHOOK_SECRET", default="")
# Base URL of the Stripe API; localstripe's when set (e.g. http://127.0.0.1:8420).
STRIPE_API_BASE = env("STRIPE_API_BASE", default="")
STRIPE_JS_URL = env("STRIPE_JS_URL", default="https://js.stripe.com/v3/")

# Readiness (/readyz) fails when beat's fastest interval task has not started for this many of its
# intervals (0: not checked). /metrics answers these networks, or a bearer METRICS_TOKEN.
CARDHOUR_READYZ_BEAT_INTERVALS = env.int("CARDHOUR_READYZ_BEAT_INTERVALS", default=6)
CARDHOUR_METRICS_TOKEN = env("METRICS_TOKEN", default="")
# Tasks whose runs are noted in core.TaskRun (the platform's own).
CARDHOUR_TASK_RUN_PREFIXES = ["broker.", "metering.", "federation.", "core."]
CARDHOUR_METRICS_ALLOWED_NETWORKS = env.list(
    "CARDHOUR_METRICS_ALLOWED_NETWORKS", default=["127.0.0.0/8", "::1/128"]
)

# Every record carries the request id and task id (core.observability); production writes JSON lines.
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "core.observability.ContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s%(task_id)s] %(message)s"},
        "json": {"()": "core.observability.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": env("DJANGO_LOG_FORMAT", default="plain"),
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
