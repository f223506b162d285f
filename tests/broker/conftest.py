"""Broker fixtures: two operators in an eastern and a western hub, priced, and a buyer with packs."""

from __future__ import annotations

from decimal import Decimal

import pytest

from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from metering.tariffs import TariffSpec, WindowSpec
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

A800 = "nvidia-a800-sxm4-80gb"
H800 = "nvidia-h800-sxm5-80gb"
ASCEND = "huawei-ascend-910b3"


@pytest.fixture
def presets(db: None) -> None:
    from metering.services.tariffs import tariff_presets_install

    tariff_presets_install()


@pytest.fixture
def east_operator(db: None) -> Organisation:
    return OperatorFactory(slug="ctyun", name="China Telecom Cloud")


@pytest.fixture
def west_operator(db: None) -> Organisation:
    return OperatorFactory(slug="cucc", name="China Unicom")


@pytest.fixture
def east_cluster(east_operator: Organisation, presets: None) -> Cluster:
    """16 A800 cards in Shanghai (yrd), two islands of 8, 12 CNY/card-hour on Guangdong's tariff."""
    cluster = make_cluster(
        operator=east_operator,
        hub="yrd",
        name="sh-ai01",
        islands=[("isl-01", 8), ("isl-02", 8)],
        site="Shanghai",
    )
    make_price_card(cluster=cluster, rate="12.0000", tariff_code="cn-gd")
    return cluster


# The west operator's own time-of-use tariff, which the broker and portal figures are computed against:
# peak 08:00–12:00 and 18:30–22:30, valley 22:30–06:30 (wrapping midnight), flat otherwise, 1.5 : 1 : 0.5.
# An operator's own schedule, not a provincial preset (the cn-nx preset follows its notice instead).
WEST_TARIFF = TariffSpec(
    time_zone="Asia/Shanghai",
    multipliers={"peak": Decimal("1.5"), "flat": Decimal("1"), "valley": Decimal("0.5")},
    windows=(
        WindowSpec("valley", 22 * 60 + 30, 6 * 60 + 30),
        WindowSpec("flat", 6 * 60 + 30, 8 * 60),
        WindowSpec("peak", 8 * 60, 12 * 60),
        WindowSpec("flat", 12 * 60, 18 * 60 + 30),
        WindowSpec("peak", 18 * 60 + 30, 22 * 60 + 30),
    ),
)


@pytest.fixture
def west_cluster(west_operator: Organisation, presets: None) -> Cluster:
    """64 A800 cards in Zhongwei (nx), islands of 32, 9 CNY/card-hour on the operator's WEST_TARIFF."""
    from metering.services.tariffs import price_card_set, tariff_create

    cluster = make_cluster(
        operator=west_operator, hub="nx", name="zw-ai01", islands=[("isl-01", 32), ("isl-02", 32)]
    )
    actor = Actor(organisation=west_operator, system_label="test")
    tariff = tariff_create(
        owner=west_operator,
        code="cucc-west",
        name="China Unicom west",
        time_zone="Asia/Shanghai",
        source="the operator's own schedule (test fixture)",
        spec=WEST_TARIFF,
        effective_from=None,
        actor=actor,
    )
    price_card_set(cluster=cluster, rate_per_card_hour=Decimal("9.0000"), tariff=tariff, actor=actor)
    return cluster


@pytest.fixture
def buyer(db: None) -> Organisation:
    return BuyerFactory(slug="acme", name="Acme AI")


@pytest.fixture
def funded_buyer(buyer: Organisation) -> Organisation:
    """Acme with 1,000 A800 card-hours and 1,000 standard card-hours."""
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1000, price="9000.00", key="a800")
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=1000, price="12000.00", key="std")
    return buyer
