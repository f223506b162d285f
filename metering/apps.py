from django.apps import AppConfig


class MeteringConfig(AppConfig):
    name = "metering"

    def ready(self) -> None:
        from metering import metrics  # noqa: F401  (registers its /metrics gauges)
