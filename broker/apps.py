from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "broker"
