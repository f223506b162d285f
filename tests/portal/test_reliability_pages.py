"""Reliability on the portal (issue 16 item 4): the market shows each cluster's score ("new — prior" for a
cluster without history), sorts and filters by it; the job form takes a minimum and the quotes show the score."""

from __future__ import annotations

from decimal import Decimal

from django.test import Client

from broker.catalog import market
from core.models import Organisation
from federation.models import Cluster
from tests.broker.factories import make_reliability
from tests.portal.test_jobs import form_data


def test_the_market_shows_each_score_and_new_clusters_as_the_prior(
    buyer_client: Client, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    make_reliability(cluster=west_cluster, percent="97.250", sold_card_seconds=3_600_000, interruptions=3)
    response = buyer_client.get("/market/")
    rows = {row.cluster.cpi: row.reliability for row in response.context["rows"]}
    assert (rows[west_cluster.cpi].percent, rows[west_cluster.cpi].prior) == (Decimal("97.250"), False)
    assert rows[west_cluster.cpi].interruptions_per_1000_card_hours == Decimal("3.000")
    assert (rows[east_cluster.cpi].percent, rows[east_cluster.cpi].prior) == (Decimal("99.000"), True)
    html = response.content.decode()
    assert '<strong data-reliability="97.250">97.250&nbsp;%</strong>' in html
    assert "3.00 int. / 1,000 card-h" in html
    assert html.count('data-prior="1"') == 1 and "new — prior" in html

    # Sorted by reliability (highest first), and filtered by a minimum.
    by_score = buyer_client.get("/market/?sort=reliability")
    assert [row.cluster.cpi for row in by_score.context["rows"]] == [east_cluster.cpi, west_cluster.cpi]
    reliable = buyer_client.get("/market/?min_reliability=98")
    assert [row.cluster.cpi for row in reliable.context["rows"]] == [east_cluster.cpi]

    zh = buyer_client.get("/market/", headers={"accept-language": "zh-hans"})
    assert "新集群 — 先验" in zh.content.decode()


def test_the_job_form_takes_a_minimum_and_the_quotes_show_the_score(
    funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, buyer_client: Client
) -> None:
    make_reliability(cluster=west_cluster, percent="97.250", interruptions=3)
    market.reset()
    response = buyer_client.post("/jobs/new/", form_data(min_reliability="98.5"), follow=True)
    job = response.context["job"]
    assert job.min_reliability == Decimal("98.500")
    (row,) = response.context["quotes"]
    assert row.cluster == east_cluster.cpi
    assert (row.reliability.percent, row.reliability.prior) == (Decimal("99.000"), True)
    html = response.content.decode()
    assert "reliability 99.000 % (new — prior)" in html
    assert 'data-reason="reliability"' in html and "reliability score is below your minimum" in html
    assert '<dd data-min-reliability="98.500">98.500&nbsp;%</dd>' in html

    bad = buyer_client.post("/jobs/new/", form_data(min_reliability="101", idempotency_key="form-2"))
    assert bad.status_code == 200
    assert "The minimum reliability is a percentage between 0 and 100." in bad.content.decode()
