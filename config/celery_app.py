"""The Celery application. Workers and beat: ``celery -A config worker`` / ``celery -A config beat``."""

from celery import Celery
from celery.signals import worker_process_init

from config.entrypoint import use_settings
from core.warmup import startup_objects_freeze

use_settings()  # production unless DJANGO_SETTINGS_MODULE says otherwise (config/entrypoint.py)

app = Celery("cardhour")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def _startup_objects_freeze(**_kwargs: object) -> None:
    """In each process of a prefork pool (production: ``--concurrency N``), once it is set up: what it holds
    for life (Django, the tasks' modules) is left out of full garbage collections, as the web workers do
    (core.warmup). A rating batch allocates per record, so collections come often; each walked those
    objects too."""
    startup_objects_freeze()
