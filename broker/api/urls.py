from django.urls import URLPattern, URLResolver

from broker.api import buyer, operator

urlpatterns: list[URLPattern | URLResolver] = [*buyer.urlpatterns, *operator.urlpatterns]
