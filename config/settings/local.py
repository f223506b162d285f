"""Embedded defaults for one machine: SQLite, a file-based Celery transport, console e-mail."""

from .base import *  # noqa: F403
from .base import env

DEBUG = env.bool("DJANGO_DEBUG", default=True)
SECRET_KEY = env("DJANGO_SECRET_KEY", default="local-development-only-not-a-secret")
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
WHITENOISE_USE_FINDERS = True  # serve static files straight from the apps in development
