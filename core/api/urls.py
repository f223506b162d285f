from django.urls import path

from core.api import views

urlpatterns = [
    path("me", views.MeApi.as_view(), name="me"),
    path("tokens", views.TokenListApi.as_view(), name="token-list"),
    path("tokens/<int:token_id>", views.TokenRevokeApi.as_view(), name="token-revoke"),
]
