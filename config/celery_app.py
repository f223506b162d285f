"""The Celery application. Workers and beat: ``celery -A config worker`` / ``celery -A config beat``."""

from celery import Celery

from config.entrypoint import use_settings
from core.allocator import malloc_tune

use_settings()  # production unless DJANGO_SETTINGS_MODULE says otherwise (config/entrypoint.py)
malloc_tune()  # the rating's arrays stay on mapped pages between tasks (core/allocator.py)

# Celery's Django fix-up, except that a worker process keeps its database connection pool between tasks
# (config/celery_fixup.py says why).
app = Celery("cardhour", fixups=["config.celery_fixup:fixup"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
