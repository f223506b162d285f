from django.apps import AppConfig


class FederationConfig(AppConfig):
    name = "federation"
    verbose_name = "Federation: hubs, accelerators, clusters"

    def ready(self) -> None:
        from federation import metrics  # noqa: F401  (registers its /metrics gauges)
