import time
from datetime import timedelta
from django.test.utils import CaptureQueriesContext
from django.db import connection
from tests.portal.test_usage_dashboard import report, local, make_paid_pack, A800, usage_rate_pending, URL
import pytest
pytestmark = pytest.mark.django_db

def test_perf(buyer, east_cluster, west_cluster, buyer_client):
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100000, price="900000.00", paid_at=local(34, 0))
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=100000, price="1200000.00", paid_at=local(34, 0))
    recs = []
    for i in range(10000):
        start = local(33, 0) + timedelta(minutes=5 * i)
        recs.append((f"p{i}", 1 + i % 4, start, start + timedelta(minutes=50)))
    for off in range(0, 10000, 1000):
        cl = east_cluster if (off // 1000) % 2 else west_cluster
        report(cl, *recs[off:off + 1000])
    t = time.time(); usage_rate_pending(); print("rate", time.time() - t)
    from metering.models import RatedSegment
    print("segments", RatedSegment.objects.count())
    for q in ({}, {"from": local(33, 0).date().isoformat()}):
        for _ in range(3):
            with CaptureQueriesContext(connection) as ctx:
                t = time.time(); r = buyer_client.get(URL, q); el = time.time() - t
            print("page", q, r.status_code, round(el, 3), len(ctx.captured_queries), sorted(round(float(x["time"]), 3) for x in ctx.captured_queries)[-4:])
    t = time.time(); r = buyer_client.get("/usage.csv"); print("csv", round(time.time() - t, 3), len(r.content.splitlines()))
