"""The SSRF guard end to end, on the live server: an operator cannot save a loopback endpoint over the
API, and a lease event whose endpoint was saved while loopback was allowed (or whose name later resolves
there) is refused at send time by the real dispatch code, with nothing reaching the listener; the same
event is delivered once loopback is allowed again, so the listener does hear what gets through."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.test import override_settings
from django.utils import timezone

from broker.models import LeaseEventDelivery
from broker.services import dispatch
from core.services import api_token_create
from tests.broker.factories import make_job, make_lease
from tests.core.test_ssrf import listener  # noqa: F401  # fixture, asked for by name
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_price_card

pytestmark = pytest.mark.django_db(transaction=True)

LOOPBACK_REFUSED = override_settings(
    CARDHOUR_ENDPOINT_ALLOW_HTTP=True, CARDHOUR_ENDPOINT_ALLOW_LOOPBACK=False
)


def test_a_loopback_endpoint_is_refused_when_saved_and_when_an_event_is_sent(
    live_server: Any,
    listener: Any,  # noqa: F811
) -> None:
    port = listener.server_address[1]
    endpoint = f"http://127.0.0.1:{port}/cardhour/events"
    operator = OperatorFactory(slug="cucc", name="China Unicom")
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    _, secret = api_token_create(organisation=operator, name="agent", scope="read_write")
    agent = httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {secret}"}, timeout=10)

    with LOOPBACK_REFUSED:
        registered = agent.post(
            "/api/v1/clusters",
            json={
                "cpi": "cpi:cucc:nx:zw-ai09",
                "site": "Zhongwei",
                "accelerator": "nvidia-a800-sxm4-80gb",
                "endpoint_url": endpoint,
                "islands": [{"name": "isl-01", "cards": 8, "fabric": "infiniband"}],
            },
        )
    assert registered.status_code == 400
    assert registered.json()["code"] == "endpoint_url_forbidden"

    # Saved while loopback was allowed (the tests' and make run's setting), as a rebinding name would be.
    cluster = make_cluster(operator=operator, islands=[("isl-01", 8)], endpoint_url=endpoint)
    make_price_card(cluster=cluster)
    assert agent.post("/api/v1/operator/endpoint-secret").status_code == 200
    soon = timezone.now().replace(microsecond=0) + timedelta(seconds=30)
    lease = make_lease(job=make_job(buyer=buyer, origin_hub="nx"), cluster=cluster, start_at=soon)
    assert agent.post(f"/api/v1/operator/leases/{lease.pk}/start", json={}).status_code == 200
    assert list(LeaseEventDelivery.objects.order_by("pk").values_list("url", "status")) == [
        (endpoint, "pending"),
        (endpoint, "pending"),
    ]

    with LOOPBACK_REFUSED:
        assert dispatch.lease_events_deliver_due() == 0
    assert listener.received == []
    refusals = list(LeaseEventDelivery.objects.order_by("pk").values_list("status", "attempts", "last_error"))
    assert [(status, attempts) for status, attempts, _ in refusals] == [("pending", 1), ("pending", 1)]
    assert all(error.startswith("refused: ") and "127.0.0.1" in error for _, _, error in refusals)

    # Allowed again, the same events reach the listener: it would have heard them.
    assert dispatch.lease_events_deliver_due(now=timezone.now() + timedelta(minutes=1)) == 2
    assert len(listener.received) == 2
    assert set(LeaseEventDelivery.objects.values_list("status", flat=True)) == {"delivered"}
