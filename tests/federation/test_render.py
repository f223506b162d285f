"""federation.api.render.Output renders exactly what its serializer class renders."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.types import Actor
from federation import selectors, services
from federation.api import serializers as out
from federation.api.render import Output
from federation.models import Cluster, Island
from federation.selectors import HubSummary
from federation.types import IslandReport
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def beaten(operator):
    """A cluster with a heartbeat applied (datetimes, unhealthy cards, K2 below K1) and a chip without
    published figures (None decimals)."""
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64), ("isl-02", 32)])
    services.heartbeat_record(
        actor=Actor(organisation=operator),
        cluster=cluster,
        sent_at=timezone.now() - timedelta(seconds=1),
        health="degraded",
        islands=[IslandReport("isl-01", available_cards=40, unhealthy_cards=3)],
    )
    make_cluster(operator=operator, name="unknown-chip", accelerator="huawei-ascend-910c", fabric="hccs")
    return cluster


def test_resolution_outputs_render_as_their_serializers(operator, beaten):
    for cpi in ["cpi:cucc:nx:zw-ai01", "cpi:cucc:nx:unknown-chip"]:
        for viewer in [operator, None]:
            description = selectors.resolve(identifier=cpi, viewer=viewer).cluster
            assert description is not None
            rendered = Output(out.ClusterDescriptionOutput).one(description)
            assert rendered == out.ClusterDescriptionOutput(description).data
            island = description.islands[0]
            assert Output(out.IslandDescriptionOutput).one(island) == out.IslandDescriptionOutput(island).data
    described = selectors.resolve(identifier="cpi:cucc:nx:zw-ai01", viewer=operator).cluster
    assert described is not None
    assert described.islands[0].reported_at is not None and described.last_heartbeat_at is not None
    unknown = selectors.resolve(identifier="cpi:cucc:nx:unknown-chip", viewer=None).cluster
    assert unknown is not None and unknown.chip.standard_card_factor is None
    assert Output(out.ClusterDescriptionOutput).one(unknown)["total_standard_cards"] is None

    hubs = [HubSummary(hub="nx", clusters=2, total_cards=200, available_cards=150)]
    assert Output(out.HubSummaryOutput).many(hubs) == out.HubSummaryOutput(hubs, many=True).data


def test_model_outputs_render_as_their_serializers(beaten):
    clusters = list(
        Cluster.objects.select_related("hub", "accelerator", "operator").prefetch_related("islands")
    )
    assert (
        Output(out.ClusterSummaryOutput).many(clusters) == out.ClusterSummaryOutput(clusters, many=True).data
    )
    for cluster in clusters:
        assert Output(out.ClusterOutput).one(cluster) == out.ClusterOutput(cluster).data
    island = Island.objects.get(cpi="cpi:cucc:nx:zw-ai01:isl-01")
    assert Output(out.IslandOutput).one(island) == out.IslandOutput(island).data


def test_fields_that_need_a_context_are_refused():
    with pytest.raises(TypeError, match="standard_card_factor"):
        Output(out.AcceleratorOutput).one(object())
