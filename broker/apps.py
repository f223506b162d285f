from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "broker"
    verbose_name = "Broker: jobs, quotes, leases"

    def ready(self) -> None:
        from broker import metrics  # noqa: F401  (registers its /metrics gauges)
        from broker.draws import reserved_draws_for
        from broker.services.draw_holds import draws_posted
        from metering.selectors.usage_dashboard import reserved_draws_provider_register
        from metering.services.rating import rated_draws_listener_register

        # The run-out forecast on /usage/ counts reserved leases; metering cannot import the broker.
        reserved_draws_provider_register(reserved_draws_for)
        # Rating shrinks the live leases' pending draws as it posts their usage (broker.services.draw_holds).
        rated_draws_listener_register(draws_posted)
