"""The per-process compiled-tariff cache is keyed by version id. SQLite hands out a rolled-back insert's id
again, so a version written under a reused id must not be rated with the schedule cached for the rolled-back
one (found as an order-dependent failure: a month's invoice split at the wrong band edges)."""

from __future__ import annotations

import pytest
from django.db import transaction

from core.types import Actor
from metering.models import TariffVersion
from metering.selectors.tariffs import compiled_tariff
from metering.services.tariffs import tariff_create
from metering.tariffs import PRESETS
from tests.factories import OperatorFactory

pytestmark = pytest.mark.django_db


class _RolledBack(Exception):
    pass


def test_a_version_written_under_a_reused_id_is_compiled_afresh() -> None:
    operator = OperatorFactory()
    actor = Actor(organisation=operator, system_label="test")

    def create(code: str, preset: str) -> TariffVersion:
        tariff = tariff_create(
            owner=operator,
            code=code,
            name=code,
            time_zone=PRESETS[preset].spec.time_zone,
            source="",
            spec=PRESETS[preset].spec,
            effective_from=None,
            actor=actor,
        )
        return TariffVersion.objects.get(tariff=tariff)

    with pytest.raises(_RolledBack), transaction.atomic():
        gone = create("gone", "cn-gd")
        assert set(compiled_tariff(tariff_version_id=gone.pk).bands) == {
            "critical_peak",
            "peak",
            "flat",
            "valley",
        }
        raise _RolledBack
    kept = create("kept", "flat")
    # On SQLite ``kept`` has the rolled-back version's id; on PostgreSQL a new one. Either way, its own schedule.
    assert compiled_tariff(tariff_version_id=kept.pk).bands == ("flat",)
