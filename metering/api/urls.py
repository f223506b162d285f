from django.urls import include, path

# One module per area, so each can be built and reviewed on its own.
urlpatterns = [
    path("", include("metering.api.tariffs")),
    path("", include("metering.api.payments")),
    path("", include("metering.api.usage")),
    path("", include("metering.api.billing")),
    path("", include("metering.api.sla")),
]
