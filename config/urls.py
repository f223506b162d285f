from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from core.routing import indexed
from core.views import healthz, home
from core.views.probes import livez, metrics, readyz

api_v1 = [
    path("", include("core.api.urls")),
    path("", include("federation.api.urls")),
    path("", include("metering.api.urls")),
    path("", include("broker.api.urls")),
]

portal = [
    path("", include("core.urls")),
    path("", include("federation.urls")),
    path("", include("metering.urls")),
    path("", include("broker.urls")),
]

# The API's routes and the portal's are each resolved by first path segment (core.routing): a path tries
# only the patterns that can match it, in the order written, instead of every pattern before its own.
urlpatterns = [
    path("", home, name="home"),
    path("healthz", healthz, name="healthz"),
    path("livez", livez, name="livez"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    # set_language: the header's language switch POSTs here (a plain form, no script needed).
    path("i18n/", include("django.conf.urls.i18n")),
    # Namespaced, so the portal can use the same URL names for its pages (job-list, lease-detail, …).
    indexed("api/v1/", api_v1, app_name="api", namespace="api"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # Split: the initialising script is served from ?script, so the page needs no inline script under the
    # Content-Security-Policy (core.middleware); Swagger UI's files are the sidecar's, served from here.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    # The portal: server-rendered pages for buyers, operators and staff.
    indexed("", portal),
]

handler403 = "core.views.permission_denied"
handler404 = "core.views.not_found"
handler500 = "core.views.server_error"
