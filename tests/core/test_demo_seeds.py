"""The demo seeds touch only what they created (core.demo): each seed run a second time changes no row of
any table; objects they did not create — another operator's unpriced cluster, a user or organisation that
holds a demo name — are never changed; a demo object people changed since is not reverted or re-made."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.management import call_command

from broker.models import Job
from broker.services.leases import lease_cancel
from core.models import DemoRecord, Membership, Organisation
from core.types import Actor
from federation.models import Cluster, ClusterStatus
from federation.services import cluster_status_set
from metering.models import PackProduct, PriceCard
from tests.factories import OperatorFactory, make_cluster

pytestmark = pytest.mark.django_db


def seed(name: str, tmp_path: Path) -> str:
    out = StringIO()
    if name == "seed_demo":
        call_command(name, tokens_file=tmp_path / "tokens.json", port=8000, stdout=out)
    else:
        call_command(name, stdout=out, stderr=StringIO())
    return out.getvalue()


def seed_all(tmp_path: Path) -> None:
    for name in ("seed_demo", "seed_billing_demo", "seed_broker_demo"):
        seed(name, tmp_path)


def snapshot() -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, by model, in primary-key order."""
    rows = {}
    for model in apps.get_models():
        fields = [field.attname for field in model._meta.concrete_fields]
        rows[model._meta.label] = list(model._default_manager.order_by("pk").values_list(*fields))
    return rows


def changed(before: dict[str, list[tuple[Any, ...]]], after: dict[str, list[tuple[Any, ...]]]) -> list[str]:
    return [label for label in before if before[label] != after[label]]


def test_each_seed_run_again_changes_no_row(tmp_path: Path) -> None:
    seed_all(tmp_path)
    before = snapshot()
    assert DemoRecord.objects.count() > 0

    for name in ("seed_demo", "seed_billing_demo", "seed_broker_demo"):
        seed(name, tmp_path)
        assert changed(before, snapshot()) == [], name


def test_a_non_demo_operators_unpriced_cluster_stays_unpriced(tmp_path: Path) -> None:
    """Another operator's cluster, unpriced on purpose, and a cluster a demo operator registered itself
    are not the seeds' to price, however often they run."""
    seed("seed_demo", tmp_path)
    other = OperatorFactory(slug="ningxia-dc", name="Ningxia DC")
    own = make_cluster(operator=other, hub="nx", name="yc-ai01", islands=[("isl-01", 8)])
    cucc = Organisation.objects.get(slug="cucc")
    added = make_cluster(operator=cucc, hub="nx", name="yc-new01", islands=[("isl-01", 8)])

    seed("seed_billing_demo", tmp_path)
    seed("seed_billing_demo", tmp_path)

    assert not PriceCard.objects.filter(cluster__in=[own, added]).exists()
    demo = Cluster.objects.exclude(pk__in=[own.pk, added.pk])
    assert PriceCard.objects.filter(cluster__in=demo).count() == demo.count()


def test_a_demo_object_changed_by_people_is_not_reverted_or_remade(tmp_path: Path) -> None:
    seed_all(tmp_path)
    user_model = get_user_model()
    # The operator changes its password, drains a cluster and prices another anew; staff reprice a pack
    # product and delete another; the buyer cancels its demo lease.
    owner = user_model.objects.get(username="cucc-ops")
    owner.set_password("my-own-password-2026")
    owner.save()
    cluster = (
        Cluster.objects.filter(operator__slug="cucc", status=ClusterStatus.ACTIVE).order_by("pk").first()
    )
    assert cluster is not None
    cluster_status_set(
        actor=Actor(organisation=cluster.operator, user=owner),
        cluster=cluster,
        status=ClusterStatus.DRAINING,
        reason="our own maintenance",
    )
    PackProduct.objects.filter(code="std-100").update(price="999.00")
    PackProduct.objects.filter(code="h800-100").delete()
    job = Job.objects.get(buyer__slug="demo-buyer", idempotency_key="demo-pretrain")
    lease = job.leases.get()
    lease_cancel(lease_id=lease.pk, actor=Actor(organisation=job.buyer, system_label="the buyer"))
    before = snapshot()

    seed_all(tmp_path)

    assert changed(before, snapshot()) == []
    assert user_model.objects.get(username="cucc-ops").check_password("my-own-password-2026")
    assert not PackProduct.objects.filter(code="h800-100").exists()


def test_objects_holding_demo_names_are_left_alone(tmp_path: Path) -> None:
    """A real 'admin' and an organisation with a demo operator's slug, made before the seeds ran: neither
    changes (no password reset, no privileges, no membership, no clusters), the rest of the demo is built
    and the seed says what it skipped."""
    user_model = get_user_model()
    admin = user_model.objects.create_user(username="admin", password="the-real-admin-password")
    cmcc = Organisation.objects.create(slug="cmcc", name="Someone else", is_buyer=True)
    before = {label: rows for label, rows in snapshot().items() if rows}

    output = seed("seed_demo", tmp_path)
    seed("seed_billing_demo", tmp_path)

    admin.refresh_from_db()
    assert admin.check_password("the-real-admin-password") and not admin.is_staff and not admin.is_superuser
    cmcc.refresh_from_db()
    assert (cmcc.name, cmcc.is_operator, cmcc.is_buyer) == ("Someone else", False, True)
    assert not Membership.objects.filter(organisation=cmcc).exists()
    assert not Cluster.objects.filter(operator=cmcc).exists()
    assert not Organisation.objects.filter(slug="cardhour").exists()  # its demo owner is not demo data
    assert Cluster.objects.filter(operator__slug="cucc").exists()
    assert "user 'admin' exists and is not demo data: left as it is." in output
    assert "organisation 'cmcc' exists and is not demo data: left as it is." in output
    after = snapshot()
    for label, rows in before.items():  # every row that was there is still there, unchanged
        assert all(row in after[label] for row in rows), label
