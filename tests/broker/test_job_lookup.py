"""job_get_for runs a query composed once (broker.selectors._PreparedJobQuery): the job it returns must be
the one the queryset returns, with its hub and cluster loaded, and another buyer's job must stay a 404."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from broker import selectors
from broker.errors import JobNotFoundError
from broker.models import Job
from core.models import Organisation
from core.services import api_token_create
from federation.models import Cluster
from tests.broker.factories import make_job
from tests.factories import BuyerFactory

FIELDS = [field.attname for field in Job._meta.concrete_fields]


def test_the_job_is_the_querysets_job_with_its_hub_and_cluster(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    pinned = make_job(
        buyer=buyer,
        cluster=east_cluster,
        standard_cards=Decimal("2.5000"),
        cards=None,
        accelerators=["nvidia-a800-sxm4-80gb"],
        fabrics=["infiniband"],
        min_reliability=Decimal("99.125"),
        quote_summary={"offers": 2, "峰": "谷"},
    )
    free = make_job(buyer=buyer, origin_hub="nx")
    for job in (pinned, free):
        reference = selectors.job_list_for(buyer=buyer).filter(pk=job.pk).first()
        assert reference is not None
        with CaptureQueriesContext(connection) as queries:
            found = selectors.job_get_for(buyer=buyer, job_id=job.pk)
            assert found.origin_hub.code == reference.origin_hub.code  # loaded with the job
            assert (found.cluster.cpi if found.cluster else None) == (
                reference.cluster.cpi if reference.cluster else None
            )
        assert len(queries) == 1
        assert [getattr(found, name) for name in FIELDS] == [getattr(reference, name) for name in FIELDS]
        assert [type(getattr(found, name)) for name in FIELDS] == [
            type(getattr(reference, name)) for name in FIELDS
        ]
        assert found.buyer is buyer and not found._state.adding and found._state.db == reference._state.db
    assert selectors.job_get_for(buyer=buyer, job_id=pinned.pk).cluster == east_cluster


def test_another_buyers_job_and_a_missing_one_are_not_found(buyer: Organisation, presets: None) -> None:
    other = BuyerFactory(slug="other", name="Other AI")
    theirs = make_job(buyer=other)
    mine = make_job(buyer=buyer)
    for job_id in (theirs.pk, mine.pk + 1000, 0, -1, 2**63):
        with pytest.raises(JobNotFoundError):
            selectors.job_get_for(buyer=buyer, job_id=job_id)
    assert selectors.job_get_for(buyer=other, job_id=theirs.pk).pk == theirs.pk
    assert selectors.job_get_for(buyer=buyer, job_id=mine.pk).pk == mine.pk


@pytest.mark.django_db(transaction=True)
def test_the_query_survives_a_new_connection(buyer: Organisation, presets: None) -> None:
    job = make_job(buyer=buyer)
    assert selectors.job_get_for(buyer=buyer, job_id=job.pk).pk == job.pk
    connection.close()
    assert selectors.job_get_for(buyer=buyer, job_id=job.pk).pk == job.pk


def test_a_buyer_cannot_quote_another_buyers_job(buyer: Organisation, east_cluster: Cluster) -> None:
    other = BuyerFactory(slug="other", name="Other AI")
    theirs = make_job(buyer=other)
    _, raw = api_token_create(organisation=buyer, name="t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post(f"/api/v1/jobs/{theirs.pk}/quotes", {"limit": 2}, format="json")
    assert response.status_code == 404
    assert response.json()["code"] == "job_not_found"
    assert not theirs.quotes.exists()
    assert Job.objects.get(pk=theirs.pk).quote_summary == {}
