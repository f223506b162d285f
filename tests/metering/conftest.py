from __future__ import annotations

from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from core.models import Organisation
from federation.models import Cluster
from metering.models import PriceCard
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_price_card

SHANGHAI = ZoneInfo("Asia/Shanghai")


def local(days_ago: int, hour: int, minute: int = 0) -> datetime:
    """An aware instant ``days_ago`` local (Asia/Shanghai) days before today, at hour:minute."""
    day = timezone.now().astimezone(SHANGHAI).date() - timedelta(days=days_ago)
    return datetime.combine(day, time(hour, minute), tzinfo=SHANGHAI)


@pytest.fixture
def seller(db: None) -> Organisation:
    return OperatorFactory(slug="cucc", name="China Unicom")


@pytest.fixture
def a800_cluster(seller: Organisation) -> Cluster:
    return make_cluster(operator=seller, islands=[("isl-01", 64)])


@pytest.fixture
def gd_price_card(a800_cluster: Cluster) -> PriceCard:
    """10 CNY per A800 card-hour on the Guangdong tariff (valley 0.38, flat 1, peak 1.7)."""
    from metering.services.tariffs import tariff_presets_install

    tariff_presets_install()
    return make_price_card(cluster=a800_cluster, rate="10.0000", tariff_code="cn-gd")


@pytest.fixture
def buyer(db: None) -> Organisation:
    return BuyerFactory(slug="acme", name="Acme AI")
