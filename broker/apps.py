from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "broker"
    verbose_name = "Broker: jobs, quotes, leases"

    def ready(self) -> None:
        from broker import metrics  # noqa: F401  (registers its /metrics gauges)
