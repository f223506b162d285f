"""federation.api.render.Output renders exactly what its serializer class renders."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework import serializers

from core.types import Actor
from federation import selectors, services
from federation.api import serializers as out
from federation.api.render import Output
from federation.models import Cluster, ClusterStatus, Island
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


class _Shortcuts(serializers.Serializer):
    text = serializers.CharField()
    number = serializers.IntegerField()
    amount = serializers.DecimalField(max_digits=6, decimal_places=2, allow_null=True)
    dotted = serializers.CharField(source="inner.text")
    computed = serializers.CharField()


@dataclass
class _Inner:
    text: str


@dataclass
class _Row:
    text: object
    number: object
    amount: object
    inner: _Inner
    computed: object


def test_shortcuts_render_every_value_type_as_drf_does():
    """The getattr and conversion shortcuts of render.Output give DRF's value for values they expect and
    hand everything else (enum members, bools, floats, callables, Mappings, rounding) to the field."""
    rows = [
        _Row("plain", 7, Decimal("1.005"), _Inner("x"), "c"),
        _Row(ClusterStatus.ACTIVE, True, Decimal("12.3456"), _Inner("y"), lambda: "called"),
        _Row(12, 3.0, 2.5, _Inner("z"), "c"),
        _Row("", -1, None, _Inner(""), "c"),
    ]
    output = Output(_Shortcuts)
    for row in rows:
        assert output.one(row) == _Shortcuts(row).data
    mapping = {"text": "m", "number": 1, "amount": Decimal("0.1"), "inner": {"text": "t"}, "computed": "c"}
    assert output.one(mapping) == _Shortcuts(mapping).data
    assert output.one(rows[1])["computed"] == "called"
