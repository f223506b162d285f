"""Service levels and credit schedules on price cards (issue 16 item 3): validation (monotone tiers, 0–100, a
schedule needs a level and no tier above it), the credit fraction an availability earns, and the fields kept
immutable on a new price-card version."""

from __future__ import annotations

from decimal import Decimal

import pytest

from core.types import Actor
from metering.errors import PriceCardInvalidError
from metering.models import PriceCard, Tariff
from metering.services.tariffs import price_card_set, tariff_presets_install
from metering.sla import (
    SlaScheduleError,
    SlaTier,
    sla_credit_fraction,
    sla_credit_tier,
    sla_schedule_parse,
    sla_schedule_validate,
)
from tests.factories import OperatorFactory, make_cluster

SCHEDULE = [
    {"below_percent": "99.5", "credit_percent": "10"},
    {"below_percent": "95", "credit_percent": "100"},
    {"below_percent": "99", "credit_percent": "25"},
]


def test_validate_sorts_tiers_from_the_highest_threshold_and_canonicalises() -> None:
    level, tiers = sla_schedule_validate(service_level_percent="99.50", credit_schedule=SCHEDULE)
    assert level == Decimal("99.5")
    assert [(str(t.below_percent), str(t.credit_percent)) for t in tiers] == [
        ("99.5", "10"),
        ("99", "25"),
        ("95", "100"),
    ]


@pytest.mark.parametrize(
    ("availability", "fraction"),
    [
        ("100", "0"),
        ("99.5", "0"),  # strictly below: the promised level itself earns nothing
        ("99.499", "0.1"),
        ("99", "0.1"),
        ("98.999", "0.25"),
        ("95", "0.25"),
        ("94.9", "1"),
        ("0", "1"),
    ],
)
def test_credit_fraction_takes_the_lowest_threshold_the_availability_is_below(availability, fraction) -> None:
    assert sla_credit_fraction(schedule=SCHEDULE, availability=Decimal(availability)) == Decimal(fraction)


def test_credit_fraction_accepts_tiers_or_pairs_and_is_zero_without_a_schedule() -> None:
    tiers = [SlaTier(Decimal("99"), Decimal("20"))]
    assert sla_credit_fraction(schedule=tiers, availability=Decimal("98")) == Decimal("0.2")
    assert sla_credit_fraction(schedule=[("99", "20")], availability=Decimal("98")) == Decimal("0.2")
    assert sla_credit_fraction(schedule=[], availability=Decimal("0")) == 0
    assert sla_credit_fraction(schedule=None, availability=Decimal("0")) == 0
    assert sla_credit_tier(schedule=SCHEDULE, availability=Decimal("97")) == SlaTier(
        Decimal("99"), Decimal("25")
    )
    with pytest.raises(TypeError):
        sla_credit_fraction(schedule=SCHEDULE, availability=97.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("level", "schedule", "field"),
    [
        ("101", [], "sla_availability_percent"),
        ("0", [], "sla_availability_percent"),
        (99.5, [], "sla_availability_percent"),  # float refused
        ("99.1234", [], "sla_availability_percent"),
        (None, [{"below_percent": "99", "credit_percent": "10"}], "sla_availability_percent"),
        ("99", [{"below_percent": "99.5", "credit_percent": "10"}], "sla_credit_schedule"),  # above the level
        ("99.5", [{"below_percent": "99", "credit_percent": "101"}], "sla_credit_schedule"),
        ("99.5", [{"below_percent": "99", "credit_percent": "0"}], "sla_credit_schedule"),
        ("99.5", [{"below_percent": "-1", "credit_percent": "10"}], "sla_credit_schedule"),
        (
            "99.5",
            [
                {"below_percent": "99", "credit_percent": "30"},
                {"below_percent": "95", "credit_percent": "20"},
            ],
            "sla_credit_schedule",
        ),  # not monotone
        (
            "99.5",
            [
                {"below_percent": "99", "credit_percent": "10"},
                {"below_percent": "99.0", "credit_percent": "20"},
            ],
            "sla_credit_schedule",
        ),  # duplicate threshold
        ("99.5", [{"below": "99", "credit_percent": "10"}], "sla_credit_schedule"),
        ("99.5", "99:10", "sla_credit_schedule"),
    ],
)
def test_validate_refuses_bad_levels_and_schedules(level, schedule, field) -> None:
    with pytest.raises(SlaScheduleError) as caught:
        sla_schedule_validate(service_level_percent=level, credit_schedule=schedule)
    assert list(caught.value.fields) == [field]


def test_a_level_alone_is_allowed_and_parse_round_trips() -> None:
    assert sla_schedule_validate(service_level_percent="99.9", credit_schedule=None) == (Decimal("99.9"), ())
    assert sla_schedule_validate(service_level_percent=None, credit_schedule=[]) == (None, ())
    assert sla_schedule_parse([{"below_percent": "95", "credit_percent": "50"}]) == (
        SlaTier(Decimal("95"), Decimal("50")),
    )


@pytest.mark.django_db
def test_price_card_carries_the_sla_as_part_of_its_version() -> None:
    tariff_presets_install()
    operator = OperatorFactory(slug="cucc")
    cluster = make_cluster(operator=operator)
    actor = Actor(organisation=operator, system_label="test")
    tariff = Tariff.objects.get(owner__isnull=True, code="cn-gd")
    first = price_card_set(
        cluster=cluster,
        rate_per_card_hour=Decimal("10"),
        tariff=tariff,
        sla_availability_percent="99.5",
        sla_credit_schedule=SCHEDULE,
        actor=actor,
    )
    first.refresh_from_db()
    assert first.sla_availability_percent == Decimal("99.5")
    assert first.sla_credit_schedule == [
        {"below_percent": "99.5", "credit_percent": "10"},
        {"below_percent": "99", "credit_percent": "25"},
        {"below_percent": "95", "credit_percent": "100"},
    ]
    second = price_card_set(cluster=cluster, rate_per_card_hour=Decimal("10"), tariff=tariff, actor=actor)
    assert (second.version, second.sla_availability_percent, second.sla_credit_schedule) == (2, None, [])
    first.refresh_from_db()
    assert first.sla_availability_percent == Decimal("99.5")  # the old version keeps its promise

    with pytest.raises(PriceCardInvalidError) as caught:
        price_card_set(
            cluster=cluster,
            rate_per_card_hour=Decimal("10"),
            tariff=tariff,
            sla_availability_percent="99",
            sla_credit_schedule=[
                {"below_percent": "98", "credit_percent": "20"},
                {"below_percent": "97", "credit_percent": "5"},
            ],
            actor=actor,
        )
    assert caught.value.code == "price_card_invalid"
    assert "sla_credit_schedule" in caught.value.extra["fields"]
    assert PriceCard.objects.filter(cluster=cluster).count() == 2
