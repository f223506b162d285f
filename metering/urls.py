"""Portal URLs of metering: packs and payment, usage and spend, invoices; operators' tariffs, price cards,
earnings and settlements."""

from metering.views import invoices, operator, packs, usage

urlpatterns = [*packs.urlpatterns, *usage.urlpatterns, *invoices.urlpatterns, *operator.urlpatterns]
