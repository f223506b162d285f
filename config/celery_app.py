"""The Celery application. Workers and beat: ``celery -A config worker`` / ``celery -A config beat``."""

from celery import Celery

from config.entrypoint import use_settings

use_settings()  # production unless DJANGO_SETTINGS_MODULE says otherwise (config/entrypoint.py)

app = Celery("cardhour")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
