"""Portal URLs of core: accounts, team, API tokens, the organisation switcher."""

from django.urls import path

from core.views import accounts, organisation_switch, team, tokens

urlpatterns = [
    path("organisation/switch/", organisation_switch, name="organisation-switch"),
    *accounts.urlpatterns,
    *team.urlpatterns,
    *tokens.urlpatterns,
]
