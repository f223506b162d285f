from django.urls import include, path

from federation.api import views

urlpatterns = [
    path("", include("federation.api.fleet")),
    path("hubs", views.HubListApi.as_view(), name="hub-list"),
    path("hub-latencies", views.HubLatencyListApi.as_view(), name="hub-latency-list"),
    path("hub-latencies/measurements", views.HubLatencyMeasureApi.as_view(), name="hub-latency-measure"),
    path("accelerators", views.AcceleratorListApi.as_view(), name="accelerator-list"),
    path("accelerators/<slug:slug>", views.AcceleratorDetailApi.as_view(), name="accelerator-detail"),
    path("standard-cards", views.StandardCardListApi.as_view(), name="standard-card-list"),
    path("resolve/<str:identifier>", views.ResolveApi.as_view(), name="resolve"),
    path("clusters", views.ClusterListApi.as_view(), name="cluster-list"),
    path("heartbeats", views.HeartbeatBatchApi.as_view(), name="heartbeat-batch"),
    path("clusters/<str:cpi>", views.ClusterDetailApi.as_view(), name="cluster-detail"),
    path(
        "clusters/<str:cpi>/status-history",
        views.ClusterStatusHistoryApi.as_view(),
        name="cluster-status-history",
    ),
    path("clusters/<str:cpi>/maintenance", views.ClusterMaintenanceApi.as_view(), name="cluster-maintenance"),
    path("clusters/<str:cpi>/islands", views.IslandAddApi.as_view(), name="island-add"),
    path("clusters/<str:cpi>/islands/<str:name>", views.IslandUpdateApi.as_view(), name="island-update"),
    path("clusters/<str:cpi>/heartbeats", views.HeartbeatApi.as_view(), name="cluster-heartbeat"),
]
