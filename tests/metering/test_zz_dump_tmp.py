from django.urls import reverse
from tests.metering.test_admin_metering import world, World, _url, _import, _row  # noqa
from metering.models import Tariff, PriceCard, Pack, UsageRecord, LedgerTransfer


def test_dump(admin_client, world):
    pages = {
        "tariff_add": _url(Tariff, "add"),
        "price_add": _url(PriceCard, "add"),
        "import": reverse("admin:metering_usagerecord_import_csv"),
        "usage_list": _url(UsageRecord, "changelist"),
        "tariff_page": _url(Tariff, "change", Tariff.objects.get(code="cn-gd").pk),
        "transfer": _url(LedgerTransfer, "change", LedgerTransfer.objects.order_by("pk").first().pk),
    }
    for name, url in pages.items():
        open(f"/tmp/dump/{name}.html", "w").write(admin_client.get(url).content.decode())
    r = admin_client.post(_url(Pack, "changelist"), {"action": "refund_unused", "_selected_action": [world.pack.pk], "index": 0})
    open("/tmp/dump/refund.html", "w").write(r.content.decode())
    r = _import(admin_client, _row("ok-1"), _row("bad", cards="0"))
    open("/tmp/dump/import_bad.html", "w").write(r.content.decode())
