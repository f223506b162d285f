from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Core: organisations and access"

    def ready(self) -> None:
        from core.observability import celery_signals_connect

        celery_signals_connect()
