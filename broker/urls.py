"""Portal URLs of broker: the marketplace, jobs, quotes and leases; the operator console; staff."""

from broker.views import console, jobs, leases, market, staff

urlpatterns = [
    *market.urlpatterns,
    *jobs.urlpatterns,
    *leases.urlpatterns,
    *console.urlpatterns,
    *staff.urlpatterns,
]
