"""Portal URLs of broker: the marketplace, jobs, quotes and leases; the operator console; staff."""

from broker.budgets import views as budgets
from broker.views import console, jobs, leases, market, staff

urlpatterns = [
    *market.urlpatterns,
    *jobs.urlpatterns,
    *leases.urlpatterns,
    *budgets.urlpatterns,
    *console.urlpatterns,
    *staff.urlpatterns,
]
