from django.urls import URLPattern, URLResolver

from broker.api import buyer, operator
from broker.budgets import api as budgets

urlpatterns: list[URLPattern | URLResolver] = [
    *buyer.urlpatterns,
    *operator.urlpatterns,
    *budgets.urlpatterns,
]
