"""Portal URLs of metering: packs and payment, usage and spend, invoices, SLA credit notes;
operators' tariffs, price cards, earnings, settlements and the credit notes against them."""

from metering.views import invoices, operator, packs, sla, usage

urlpatterns = [
    *packs.urlpatterns,
    *usage.urlpatterns,
    *invoices.urlpatterns,
    *operator.urlpatterns,
    *sla.urlpatterns,
]
