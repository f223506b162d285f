from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Core: organisations and access"

    def ready(self) -> None:
        from core.api import schema  # noqa: F401  # registers the django-filter schema extension
        from core.api.strict import strict_json_install
        from core.observability import celery_signals_connect

        strict_json_install()
        celery_signals_connect()
