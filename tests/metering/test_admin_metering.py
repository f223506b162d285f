"""The metering back office: every page renders without N+1 queries, money rows are read-only, writes go
through the services (tariffs, price cards, the usage CSV import, refunds, re-rating, Stripe re-processing).

The world: operator ``cucc`` with an A800 cluster on the Guangdong tariff at 10 CNY per card-hour, buyer
``acme`` with a 100 card-hour pack that usage three days ago has drawn from, buyer ``beta`` with no pack
(arrears, flagged), a failed Stripe event, a recorded refund, a billing profile, and the month's statements.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.db.models import DecimalField, Model, Value
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from core.models import Organisation
from core.money import from_micros
from core.types import Actor
from federation.models import Cluster
from metering import admin as metering_admin
from metering.integrations import stripe as gateway
from metering.models import (
    BillingCloseRun,
    BillingProfile,
    BuyerExhaustion,
    Invoice,
    InvoiceLine,
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    Pack,
    PackOrder,
    PackProduct,
    PackRefund,
    PriceCard,
    RatedSegment,
    Settlement,
    SettlementLine,
    StripeEvent,
    Tariff,
    TariffBand,
    TariffVersion,
    TariffWindow,
    UsageKey,
    UsagePending,
    UsageRecord,
)
from metering.services.billing import billing_close_period
from metering.services.maintenance import ledger_reconcile
from metering.services.payments import billing_profile_get_or_create
from metering.services.rating import usage_rate_pending
from metering.services.sla import sla_credit_dispute_decide, sla_credit_issue
from metering.services.usage import usage_record_create_batch
from metering.tariffs import PRESETS
from metering.types import UsageRecordInput
from tests.factories import BuyerFactory, OperatorFactory, UserFactory, make_cluster
from tests.metering.conftest import local
from tests.metering.factories import make_pack_product, make_paid_pack

A800 = "nvidia-a800-sxm4-80gb"
CPI = "cpi:cucc:nx:zw-ai01"
SH = ZoneInfo("Asia/Shanghai")

METERING_ADMINS = sorted(
    (model for model in admin.site._registry if model._meta.app_label == "metering"),
    key=lambda model: model._meta.label,
)
# Shown inline on their parent's page only.
INLINE_ONLY = {TariffBand, TariffWindow, InvoiceLine, SettlementLine}
# Rating's work queue, shown as the usage records' "Rated" column and filter (a record is rated when it has
# left the queue), not as a page of its own.
# The idempotency-key table (partitioning keeps the key unique here, not on the usage table) holds nothing the
# usage record's page does not show: its key, operator and start.
NO_ADMIN = {UsagePending, UsageKey}
LEDGER = [LedgerAccount, LedgerTransfer, LedgerEntry]
BIG_TABLES = [UsageRecord, RatedSegment, LedgerEntry, LedgerTransfer]


def _url(model: type[Model], view: str, *args: object) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def _price_card_since_2025(
    cluster: Cluster, *, rate: str = "10.0000", tariff_code: str = "cn-gd"
) -> PriceCard:
    """A price card long in force (price_card_set refuses a start in the past, so it is written here), so
    usage of any recent day finds it without naming a version."""
    tariff = Tariff.objects.get(code=tariff_code, owner__isnull=True)
    return PriceCard.objects.create(
        cluster=cluster,
        version=1,
        rate_per_card_hour=Decimal(rate),
        tariff_version=tariff.versions.order_by("version").first(),
        effective_from=datetime(2025, 1, 1, tzinfo=SH),
        sla_availability_percent=Decimal("99.5"),
        sla_credit_schedule=[{"below_percent": "99.5", "credit_percent": "10"}],
    )


def _usage(key: str, buyer: str, *, cards: int = 8, days_ago: int = 3, cpi: str = CPI) -> UsageRecordInput:
    return UsageRecordInput(
        idempotency_key=key,
        cluster=cpi,
        buyer=buyer,
        cards=cards,
        start_at=local(days_ago, 7),
        end_at=local(days_ago, 9),
        reference=f"lease:{key}",
    )


class World:
    def __init__(self, operator: Organisation, suffix: str = "") -> None:
        self.operator = operator
        self.cluster = make_cluster(operator=operator, name=f"zw-ai01{suffix}", islands=[("isl-01", 64)])
        self.price_card = _price_card_since_2025(self.cluster)
        self.acme = BuyerFactory(slug=f"acme{suffix}", name="Acme AI")
        self.beta = BuyerFactory(slug=f"beta{suffix}", name="Beta Labs")
        self.pack = make_paid_pack(
            buyer=self.acme,
            accelerator=A800,
            card_hours=100,
            price="1000.00",
            paid_at=timezone.now() - timedelta(days=10),
            key=f"order-{suffix or 0}",
        )
        PackOrder.objects.filter(pk=self.pack.order_id).update(
            stripe_payment_intent_id=f"pi_test_{suffix or 0}"
        )
        usage_record_create_batch(
            operator=operator,
            records=[
                _usage(f"u-1{suffix}", self.acme.slug, cpi=self.cluster.cpi),
                _usage(f"u-2{suffix}", self.beta.slug, cards=2, cpi=self.cluster.cpi),
            ],
        )
        usage_rate_pending()
        # An SLA credit note on acme's usage (as if its lease lost 12 of its 120 minutes), its dispute rejected.
        self.sla_credit = sla_credit_issue(
            lease_id=1_000_000 + len(suffix),
            reference=f"lease:u-1{suffix}",
            buyer_id=self.acme.pk,
            operator_id=operator.pk,
            cluster_id=self.cluster.pk,
            price_card_id=self.price_card.pk,
            window_start_at=local(3, 7),
            window_end_at=local(3, 9),
            window_seconds=7200,
            lost_seconds=720,
            excluded_buyer_seconds=0,
            excluded_maintenance_seconds=0,
            availability_percent=Decimal("90.000"),
        )
        assert self.sla_credit is not None
        sla_credit_dispute_decide(
            credit=self.sla_credit, accepted=False, reason="logs agree", actor=Actor.system("staff")
        )
        # Beta used A800 cards with no pack: a small A800 pack bought since pays part of its arrears.
        self.beta_pack = make_paid_pack(
            buyer=self.beta,
            accelerator=A800,
            card_hours=1,
            price="10.00",
            paid_at=timezone.now() - timedelta(days=2),
            key=f"beta-order-{suffix or 0}",
        )
        self.profile = billing_profile_get_or_create(buyer=self.acme)
        self.event = StripeEvent.objects.create(
            event_id=f"evt_{suffix or 0}",
            type="customer.created",
            object_id=f"cus_{suffix or 0}",
            payload={
                "id": f"evt_{suffix or 0}",
                "type": "customer.created",
                "data": {"object": {"id": "cus_1", "object": "customer"}},
            },
            status=StripeEvent.Status.FAILED,
            error="RuntimeError: boom",
            attempts=1,
        )
        self.refund = PackRefund.objects.create(
            order=self.pack.order,
            pack=self.pack,
            stripe_refund_id=f"re_{suffix or 0}",
            amount=Decimal("10.00"),
            card_hours_debited=1_000_000,
            refunded_at=timezone.now() - timedelta(days=1),
        )
        make_pack_product(code=f"std-500{suffix}", card_hours=500, price="4000.00")


def _close_usage_month() -> None:
    """Issue the statements of the month the usage fell in (the close is told the month has ended)."""
    start = local(3, 7).date().replace(day=1)
    following = (start + timedelta(days=32)).replace(day=1)
    billing_close_period(period_start=start, now=datetime(following.year, following.month, 1, 1, tzinfo=SH))


@pytest.fixture
def world(operator: Organisation) -> World:
    world = World(operator)
    _close_usage_month()
    ledger_reconcile()  # one ReconciliationRun
    return world


# --- Every page ------------------------------------------------------------------------------------


def test_every_metering_model_has_an_admin_or_an_inline() -> None:
    from django.apps import apps

    assert set(apps.get_app_config("metering").get_models()) - INLINE_ONLY - NO_ADMIN == set(METERING_ADMINS)


def test_the_world_fills_every_table(world: World) -> None:
    empty = [m._meta.label for m in [*METERING_ADMINS, *INLINE_ONLY] if not m._default_manager.exists()]
    assert empty == []


@pytest.mark.parametrize("model", METERING_ADMINS, ids=lambda model: model._meta.label)
def test_every_changelist_search_and_change_page_renders(
    admin_client: Client, world: World, model: type[Model]
) -> None:
    assert admin_client.get(_url(model, "changelist")).status_code == 200
    assert admin_client.get(_url(model, "changelist"), {"q": "acme"}).status_code == 200
    obj = model._default_manager.order_by("pk").first()
    assert obj is not None
    assert admin_client.get(_url(model, "change", obj.pk)).status_code == 200


def _grow(world: World) -> None:
    """More of what the second world does not add by itself: an operator tariff, a close run, and a
    second month of statements (copies of the first, numbered apart)."""
    from metering.services.tariffs import tariff_create
    from metering.tariffs import TariffSpec

    spec = PRESETS["cn-nx"].spec
    tariff_create(
        owner=world.operator,
        code="own-nx",
        name="Own Ningxia",
        time_zone=spec.time_zone,
        source="",
        spec=TariffSpec(time_zone=spec.time_zone, multipliers=spec.multipliers, windows=spec.windows),
        effective_from=None,
        actor=Actor.system("test"),
    )
    BillingCloseRun.objects.create(period_start=date(2020, 1, 1), started_at=timezone.now())
    for statement in [*Invoice.objects.all(), *Settlement.objects.all()]:
        lines = list(statement.lines.all())
        statement.pk = None
        statement.number += "-2020"
        statement.period_start = date(2020, 1, 1)
        if isinstance(statement, Settlement):
            # As settlement_issue does: SQLite checks payable = gross − commission in floating point, so the
            # copy's payable must be the database's own difference (an SLA line's amounts made it differ).
            # Saved unfrozen, then given its amounts and its freeze in one UPDATE: PostgreSQL's trigger
            # refuses any UPDATE of a row already frozen.
            gross, commission, frozen_at = statement.gross, statement.commission, statement.frozen_at
            statement.gross = statement.commission = statement.payable = Decimal(0)
            statement.frozen_at = None
            statement.save()
            money = DecimalField(max_digits=14, decimal_places=2)
            Settlement.objects.filter(pk=statement.pk).update(
                gross=gross,
                commission=commission,
                payable=Value(gross, output_field=money) - Value(commission, output_field=money),
                frozen_at=frozen_at,
            )
        else:
            statement.save()
        for line in lines:
            line.pk = None
            setattr(line, "invoice" if isinstance(statement, Invoice) else "settlement", statement)
            line.save()


@pytest.mark.parametrize("model", METERING_ADMINS, ids=lambda model: model._meta.label)
def test_changelist_queries_do_not_grow_with_rows(
    admin_client: Client, world: World, model: type[Model]
) -> None:
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(_url(model, "changelist")).status_code == 200
    _grow(World(OperatorFactory(slug="ctyun", name="China Telecom Cloud"), suffix="2"))
    with CaptureQueriesContext(connection) as many:
        assert admin_client.get(_url(model, "changelist")).status_code == 200
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]


@pytest.mark.parametrize(
    ("model", "params"),
    [
        (UsageRecord, {"rated": "no"}),
        (UsageRecord, {"rated": "yes", "operator": "1"}),
        (LedgerEntry, {"unit": "CNY", "account__kind__exact": "pack"}),
        (LedgerAccount, {"kind__exact": "pack", "unit": "card_hours:nvidia-a800-sxm4-80gb"}),
        (RatedSegment, {"band__exact": "valley", "invoice__isempty": "1"}),
        (Tariff, {"kind": "preset"}),
        (PackProduct, {"active__exact": "1"}),
        (BuyerExhaustion, {"cleared_at__isempty": "1"}),
        (StripeEvent, {"status__exact": "failed"}),
    ],
)
def test_filters(admin_client: Client, world: World, model: type[Model], params: dict[str, str]) -> None:
    # An unknown filter would redirect (302) to ?e=1; a broken one would be a 500.
    assert admin_client.get(_url(model, "changelist"), params).status_code == 200


def test_big_tables_never_count_the_whole_table(world: World) -> None:
    for model in BIG_TABLES:
        model_admin = admin.site._registry[model]
        assert model_admin.show_full_result_count is False, model
        assert model_admin.paginator is metering_admin._EstimatedCountPaginator, model


def test_the_unfiltered_count_is_the_planners_estimate_on_postgresql(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metering_admin._EstimatedCountPaginator, "threshold", 0)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE metering_ledgerentry")
    paginator = metering_admin._EstimatedCountPaginator(LedgerEntry.objects.order_by("-id"), 100)
    with CaptureQueriesContext(connection) as queries:
        count = paginator.count
    assert count == LedgerEntry.objects.count()
    counted = any("COUNT(" in q["sql"].upper() for q in queries.captured_queries)
    assert counted is (connection.vendor != "postgresql")
    filtered = metering_admin._EstimatedCountPaginator(LedgerEntry.objects.filter(unit="CNY"), 100)
    assert filtered.count == LedgerEntry.objects.filter(unit="CNY").count()


# --- Read-only money -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [*LEDGER, UsageRecord, RatedSegment, PackOrder, Pack, PackRefund, StripeEvent, Invoice, Settlement],
    ids=lambda model: model._meta.label,
)
def test_money_rows_cannot_be_added_changed_or_deleted_even_by_a_superuser(
    admin_client: Client, admin_user: User, world: World, model: type[Model]
) -> None:
    obj = model._default_manager.order_by("pk").first()
    assert obj is not None
    model_admin = admin.site._registry[model]
    request = type("R", (), {"user": admin_user})()
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, obj)
    assert not model_admin.has_delete_permission(request, obj)
    assert admin_client.get(_url(model, "add")).status_code == 403
    assert admin_client.get(_url(model, "delete", obj.pk)).status_code == 403
    assert admin_client.post(_url(model, "change", obj.pk), {}).status_code == 403
    changelist = admin_client.get(_url(model, "changelist"))
    assert "delete_selected" not in changelist.content.decode()


def test_transfer_page_shows_entries_in_units_and_that_it_balances(
    admin_client: Client, world: World
) -> None:
    transfer = LedgerTransfer.objects.get(idempotency_key=f"pack_purchase:{world.pack.order_id}")
    content = admin_client.get(_url(LedgerTransfer, "change", transfer.pk)).content.decode()
    assert "balanced" in content and "NOT BALANCED" not in content
    assert "+100.000000 card-hours (nvidia-a800-sxm4-80gb)" in content
    assert "-100.000000 card-hours (nvidia-a800-sxm4-80gb)" in content
    assert "+1000.000000 CNY" in content
    assert "-1000.000000 CNY" in content


def test_pack_list_shows_the_remaining_balance_from_its_ledger_account(
    admin_client: Client, world: World
) -> None:
    balance = LedgerAccount.objects.get(pack=world.pack).balance
    # 8 cards × 2 h, partly valley (0.38) and flat (1.0): well under the 100 bought.
    assert 0 < balance < 100_000_000
    content = admin_client.get(_url(Pack, "changelist")).content.decode()
    assert f"{from_micros(balance)} card-hours (nvidia-a800-sxm4-80gb)" in content
    detail = admin_client.get(_url(Pack, "change", world.pack.pk)).content.decode()
    assert f"{from_micros(balance)} card-hours" in detail


def test_usage_record_page_shows_its_rated_segments(admin_client: Client, world: World) -> None:
    record = UsageRecord.objects.get(idempotency_key="u-1")
    segments = list(RatedSegment.objects.filter(usage_record=record).order_by("seq"))
    assert {s.band for s in segments} == {"valley", "flat"}
    content = admin_client.get(_url(UsageRecord, "change", record.pk)).content.decode()
    for segment in segments:
        assert f"{from_micros(segment.gross)} CNY" in content
        assert f"{from_micros(segment.pack_draw)} card-hours (nvidia-a800-sxm4-80gb)" in content


def test_search_finds_usage_by_exact_key_and_reference(admin_client: Client, world: World) -> None:
    by_key = admin_client.get(_url(UsageRecord, "changelist"), {"q": "u-1"}).context["cl"]
    assert [r.idempotency_key for r in by_key.result_list] == ["u-1"]
    by_reference = admin_client.get(_url(UsageRecord, "changelist"), {"q": "lease:u-2"}).context["cl"]
    assert [r.idempotency_key for r in by_reference.result_list] == ["u-2"]
    by_event = admin_client.get(_url(StripeEvent, "changelist"), {"q": "evt_0"}).context["cl"]
    assert by_event.result_count == 1
    by_intent = admin_client.get(_url(PackOrder, "changelist"), {"q": "pi_test_0"}).context["cl"]
    assert [o.pk for o in by_intent.result_list] == [world.pack.order_id]


# --- Catalogue and billing profiles -----------------------------------------------------------------


def test_pack_products_are_full_crud_with_an_editable_active_flag(admin_client: Client, world: World) -> None:
    response = admin_client.post(
        _url(PackProduct, "add"),
        {
            "code": "h800-50",
            "name": "H800 50 card-hours",
            "accelerator": "",
            "card_hours": "50",
            "price": "900.00",
            "validity_days": "180",
            "active": "on",
            "sort_order": "3",
        },
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    product = PackProduct.objects.get(code="h800-50")
    assert (product.card_hours, product.price, product.currency) == (50, Decimal("900.00"), "CNY")

    products = list(PackProduct.objects.order_by("pk"))
    data: dict[str, Any] = {
        "form-TOTAL_FORMS": str(len(products)),
        "form-INITIAL_FORMS": str(len(products)),
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    changelist_order = admin_client.get(_url(PackProduct, "changelist")).context["cl"].result_list
    for i, item in enumerate(changelist_order):
        data[f"form-{i}-id"] = str(item.pk)
        if item.pk != product.pk:
            data[f"form-{i}-active"] = "on"
    assert admin_client.post(_url(PackProduct, "changelist"), data).status_code == 302
    product.refresh_from_db()
    assert product.active is False

    assert admin_client.post(_url(PackProduct, "delete", product.pk), {"post": "yes"}).status_code == 302
    assert not PackProduct.objects.filter(pk=product.pk).exists()


def test_billing_profile_details_are_editable_and_the_stripe_customer_is_not(
    admin_client: Client, world: World
) -> None:
    BillingProfile.objects.filter(pk=world.profile.pk).update(stripe_customer_id="cus_real")
    form = admin_client.get(_url(BillingProfile, "change", world.profile.pk)).context["adminform"].form
    assert set(form.fields) == {
        "legal_name",
        "tax_id",
        "address",
        "billing_email",
        "unified_social_credit_code",
        "invoice_title",
        "fapiao_email",
    }
    response = admin_client.post(
        _url(BillingProfile, "change", world.profile.pk),
        {
            "legal_name": "Acme AI Ltd",
            "tax_id": "91110000X",
            "address": "1 Road",
            "billing_email": "ap@acme.example",
            "unified_social_credit_code": "",
            "invoice_title": "",
            "fapiao_email": "",
            "stripe_customer_id": "cus_forged",
        },
    )
    assert response.status_code == 302
    world.profile.refresh_from_db()
    assert (world.profile.legal_name, world.profile.stripe_customer_id) == ("Acme AI Ltd", "cus_real")


# --- Tariffs and price cards ------------------------------------------------------------------------

GD_LIKE = "valley 00:00-08:00\nflat 08:00-10:00\npeak 10:00-12:00\nflat 12:00-14:00\npeak 14:00-19:00\nflat 19:00-24:00"
GD_MULTIPLIERS = "peak=1.7, flat=1, valley=0.38"


def _tariff_add(client: Client, **changes: str) -> Any:
    data = {
        "owner": str(Organisation.objects.get(slug="cucc").pk),
        "code": "cucc-gd",
        "name": "Unicom Guangdong",
        "time_zone": "Asia/Shanghai",
        "source": "our contract",
        "windows": GD_LIKE,
        "multipliers": GD_MULTIPLIERS,
        "effective_from_0": "",
        "effective_from_1": "",
        **changes,
    }
    return client.post(_url(Tariff, "add"), data)


def test_tariff_add_goes_through_the_service(admin_client: Client, world: World) -> None:
    assert admin_client.get(_url(Tariff, "add")).status_code == 200
    response = _tariff_add(admin_client)
    assert response.status_code == 302
    tariff = Tariff.objects.get(code="cucc-gd")
    version = tariff.versions.get()
    assert tariff.owner == world.operator and version.version == 1
    assert version.created_by == "user admin"
    assert {(b.band, b.multiplier) for b in version.bands.all()} == {
        ("peak", Decimal("1.7000")),
        ("flat", Decimal("1.0000")),
        ("valley", Decimal("0.3800")),
    }
    assert version.windows.count() == 6

    again = _tariff_add(admin_client)
    assert again.status_code == 200
    assert "tariff_code_taken" in str(again.context["form"].errors)


def test_tariff_version_form_rejects_a_gap_and_names_it(admin_client: Client, world: World) -> None:
    assert _tariff_add(admin_client).status_code == 302
    tariff = Tariff.objects.get(code="cucc-gd")
    url = reverse("admin:metering_tariff_new_version", args=[tariff.pk])

    form = admin_client.get(url).context["form"]
    assert form.initial["windows"].splitlines()[0] == "valley 00:00-08:00"

    with_gap = GD_LIKE.replace("flat 12:00-14:00\n", "")
    response = admin_client.post(url, {"windows": with_gap, "multipliers": GD_MULTIPLIERS})
    assert response.status_code == 200
    errors = str(response.context["form"].errors)
    assert "12:00–14:00 on Mon–Sun in Jan–Dec has no band" in errors
    assert "tariff_invalid" in errors
    assert tariff.versions.count() == 1

    summer = GD_LIKE.replace(
        "peak 10:00-12:00",
        "peak 10:00-12:00 [months=1-6,10-12]\npeak 10:00-11:00 months=jul-sep\ncritical_peak 11:00-12:00 [months=7,8,9] [weekdays=mon-sun]",
    )
    response = admin_client.post(
        url, {"windows": summer, "multipliers": GD_MULTIPLIERS + ", critical_peak=2.125"}
    )
    assert response.status_code == 302, response.context["form"].errors
    v2 = tariff.versions.get(version=2)
    assert {(w.band, w.start_minute, w.months) for w in v2.windows.filter(band="critical_peak")} == {
        ("critical_peak", 660, 0b1_1100_0000)
    }
    page = admin_client.get(_url(Tariff, "change", tariff.pk)).content.decode()
    assert "critical_peak × 2.125" in page and "v2" in page


def test_tariff_version_form_reports_unreadable_lines(admin_client: Client, world: World) -> None:
    assert _tariff_add(admin_client).status_code == 302
    tariff = Tariff.objects.get(code="cucc-gd")
    url = reverse("admin:metering_tariff_new_version", args=[tariff.pk])
    response = admin_client.post(
        url,
        {
            "windows": "valley 00:00-08:00\npeak ten to noon\nflat 08:00-24:00 weekdays=funday",
            "multipliers": "peak=x",
        },
    )
    errors = response.context["form"].errors
    assert "Line 2" in str(errors["windows"]) and "Line 3" in str(errors["windows"])
    assert "not a number" in str(errors["multipliers"])


def test_presets_are_read_only(admin_client: Client, world: World) -> None:
    preset = Tariff.objects.get(code="cn-gd", owner__isnull=True)
    response = admin_client.get(reverse("admin:metering_tariff_new_version", args=[preset.pk]), follow=True)
    assert "platform preset" in " ".join(str(m) for m in response.context["messages"])
    assert preset.versions.count() == 1
    assert admin_client.post(_url(Tariff, "change", preset.pk), {}).status_code == 403
    assert admin_client.get(_url(Tariff, "delete", preset.pk)).status_code == 403
    version = preset.versions.get()
    assert admin_client.post(_url(TariffVersion, "change", version.pk), {}).status_code == 403


def _price_card_add(client: Client, cluster: Cluster, rate: str, tariff: Tariff) -> Any:
    return client.post(
        _url(PriceCard, "add"),
        {
            "cluster": cluster.cpi,
            "rate_per_card_hour": rate,
            "tariff": str(tariff.pk),
            "effective_from_0": "",
            "effective_from_1": "",
        },
    )


def test_price_card_add_form_creates_version_1_then_2(admin_client: Client, world: World) -> None:
    cluster = make_cluster(operator=world.operator, name="zw-ai02", islands=[("isl-01", 8)])
    gd = Tariff.objects.get(code="cn-gd", owner__isnull=True)
    nx = Tariff.objects.get(code="cn-nx", owner__isnull=True)
    assert admin_client.get(_url(PriceCard, "add")).status_code == 200

    assert _price_card_add(admin_client, cluster, "12.5", gd).status_code == 302
    assert _price_card_add(admin_client, cluster, "11.0000", nx).status_code == 302

    cards = list(PriceCard.objects.filter(cluster=cluster).order_by("version"))
    assert [(c.version, c.rate_per_card_hour, c.tariff_version.tariff.code) for c in cards] == [
        (1, Decimal("12.5000"), "cn-gd"),
        (2, Decimal("11.0000"), "cn-nx"),
    ]
    assert cards[1].created_by == "user admin"
    assert admin_client.post(_url(PriceCard, "change", cards[0].pk), {}).status_code == 403


def test_price_card_add_form_shows_the_services_error(admin_client: Client, world: World) -> None:
    gd = Tariff.objects.get(code="cn-gd", owner__isnull=True)
    response = admin_client.post(
        _url(PriceCard, "add"),
        {
            "cluster": world.cluster.cpi,
            "rate_per_card_hour": "9",
            "tariff": str(gd.pk),
            "effective_from_0": "2020-01-01",
            "effective_from_1": "00:00:00",
        },
    )
    assert response.status_code == 200
    assert "price_card_invalid" in str(response.context["form"].errors)
    assert world.cluster.price_cards.count() == 1
    unknown = admin_client.post(
        _url(PriceCard, "add"),
        {"cluster": "cpi:cucc:nx:nope", "rate_per_card_hour": "9", "tariff": str(gd.pk)},
    )
    assert "No cluster cpi:cucc:nx:nope" in str(unknown.context["form"].errors)


# --- The usage CSV import -----------------------------------------------------------------------------

HEADER = "operator,idempotency_key,cluster,buyer,cards,start_at,end_at,price_card_version,reference"


def _row(
    key: str,
    *,
    operator: str = "cucc",
    cpi: str = CPI,
    buyer: str = "acme",
    cards: str = "4",
    start: str | None = None,
    end: str | None = None,
    version: str = "",
    reference: str = "",
) -> str:
    start = start or local(2, 10).isoformat()
    end = end or local(2, 11).isoformat()
    return ",".join([operator, key, cpi, buyer, cards, start, end, version, reference])


def _import(client: Client, *lines: str) -> Any:
    body = "\n".join([HEADER, *lines]) + "\n"
    upload = SimpleUploadedFile("usage.csv", body.encode(), content_type="text/csv")
    return client.post(reverse("admin:metering_usagerecord_import_csv"), {"csv_file": upload})


@pytest.fixture
def second_operator(world: World) -> Cluster:
    ctyun = OperatorFactory(slug="ctyun", name="China Telecom Cloud")
    cluster = make_cluster(operator=ctyun, hub="gz", name="gy-01", islands=[("isl-01", 16)])
    _price_card_since_2025(cluster, rate="8.0000")
    return cluster


@override_settings(CARDHOUR_USAGE_BATCH_MAX=2)
def test_csv_import_creates_rows_per_operator_in_batches(
    admin_client: Client, world: World, second_operator: Cluster
) -> None:
    changelist = admin_client.get(_url(UsageRecord, "changelist")).content.decode()
    assert reverse("admin:metering_usagerecord_import_csv") in changelist
    assert admin_client.get(reverse("admin:metering_usagerecord_import_csv")).status_code == 200
    before = UsageRecord.objects.count()

    response = _import(
        admin_client,
        _row("c-1", version="1", reference="lease:9"),
        _row("c-2"),
        _row("t-1", operator="ctyun", cpi=second_operator.cpi, buyer="beta"),
        _row("c-3", start=local(2, 22).astimezone(SH).isoformat(), end=local(1, 1).isoformat()),
        _row("c-4", cards="16", start=local(2, 10).astimezone(UTC).isoformat().replace("+00:00", "Z")),
    )

    assert response.status_code == 200
    result = response.context["result"]
    assert (result.rows, result.operators, result.created, result.duplicates, result.errors) == (
        5,
        2,
        5,
        0,
        [],
    )
    assert UsageRecord.objects.count() == before + 5
    c1 = UsageRecord.objects.get(operator=world.operator, idempotency_key="c-1")
    assert (c1.cards, c1.reference, c1.price_card.version, c1.rated_at) == (4, "lease:9", 1, None)
    assert c1.start_at == local(2, 10)
    t1 = UsageRecord.objects.get(idempotency_key="t-1")
    assert (t1.operator.slug, t1.cluster_id, t1.buyer.slug) == ("ctyun", second_operator.pk, "beta")
    assert "5 created" in " ".join(str(m) for m in response.context["messages"])


@override_settings(CARDHOUR_USAGE_BATCH_MAX=2)
def test_a_bad_csv_lists_every_bad_line_and_writes_nothing(
    admin_client: Client, world: World, second_operator: Cluster
) -> None:
    before = UsageRecord.objects.count()
    response = _import(
        admin_client,
        _row("ok-1"),  # line 2
        _row("ok-2"),  # line 3: the first chunk of cucc is fine and is stored, then rolled back
        _row("bad-cards", cards="0"),  # line 4
        _row("bad-time", start="2025-07-01T10:00:00"),  # line 5: no offset
        _row("t-1", operator="ctyun", cpi=CPI, buyer="beta"),  # line 6: not ctyun's cluster
        _row("x-1", operator="nobody"),  # line 7
    )
    result = response.context["result"]
    assert [(e.line, e.code) for e in result.errors] == [
        (5, "bad_value"),
        (7, "unknown_operator"),
    ]
    assert UsageRecord.objects.count() == before

    # Lines that parse are then checked by the service, per operator and chunk; every fault comes back.
    response = _import(
        admin_client,
        _row("ok-1"),
        _row("ok-2"),
        _row("bad-cards", cards="0"),
        _row("bad-end", end=local(2, 9).isoformat()),
        _row("t-1", operator="ctyun", cpi=CPI, buyer="beta"),
        _row("t-2", operator="ctyun", cpi=second_operator.cpi, buyer="nobody"),
    )
    result = response.context["result"]
    assert [(e.line, e.idempotency_key, e.code) for e in result.errors] == [
        (4, "bad-cards", "cards_not_positive"),
        (5, "bad-end", "end_not_after_start"),
        (6, "t-1", "cluster_not_yours"),
        (7, "t-2", "unknown_buyer"),
    ]
    assert result.error_count == 4 and result.created == 0
    assert UsageRecord.objects.count() == before
    content = response.content.decode()
    assert "nothing was imported" in content
    assert "<td>4</td>" in content and "cards_not_positive" in content


def test_a_csv_with_a_bad_header_or_encoding_is_refused(admin_client: Client, world: World) -> None:
    upload = SimpleUploadedFile("usage.csv", b"operator,key\ncucc,1\n", content_type="text/csv")
    response = admin_client.post(reverse("admin:metering_usagerecord_import_csv"), {"csv_file": upload})
    assert [(e.line, e.code) for e in response.context["result"].errors] == [(1, "bad_header")]
    latin = SimpleUploadedFile("usage.csv", HEADER.encode() + b"\n\xff\xfe\n", content_type="text/csv")
    response = admin_client.post(reverse("admin:metering_usagerecord_import_csv"), {"csv_file": latin})
    assert "not UTF-8" in str(response.context["form"].errors)


def test_importing_the_same_csv_twice_counts_duplicates_and_writes_nothing_new(
    admin_client: Client, world: World
) -> None:
    rows = [_row("d-1"), _row("d-2", cards="2")]
    first = _import(admin_client, *rows).context["result"]
    assert (first.created, first.duplicates) == (2, 0)
    count = UsageRecord.objects.count()

    again = _import(admin_client, *rows, _row("d-2", cards="3")).context["result"]
    assert (again.created, again.duplicates, again.conflicts, again.errors) == (0, 2, [(4, "d-2")], [])
    assert UsageRecord.objects.count() == count
    assert UsageRecord.objects.get(idempotency_key="d-2").cards == 2


# --- Who may enter -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        lambda: _url(UsageRecord, "changelist"),
        lambda: reverse("admin:metering_usagerecord_import_csv"),
        lambda: _url(LedgerEntry, "changelist"),
        lambda: _url(PriceCard, "add"),
    ],
)
def test_non_staff_users_are_sent_to_the_login_page(
    client: Client, world: World, url: Callable[[], str]
) -> None:
    member = UserFactory(username="member")
    client.force_login(member)
    response = client.get(url())
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    upload = SimpleUploadedFile("usage.csv", f"{HEADER}\n{_row('n-1')}\n".encode(), content_type="text/csv")
    client.post(reverse("admin:metering_usagerecord_import_csv"), {"csv_file": upload})
    assert not UsageRecord.objects.filter(idempotency_key="n-1").exists()


def test_staff_without_the_add_permission_cannot_import(client: Client, world: World) -> None:
    clerk = UserFactory(username="clerk", is_staff=True)
    clerk.user_permissions.add(Permission.objects.get(codename="view_usagerecord"))
    client.force_login(clerk)
    assert client.get(_url(UsageRecord, "changelist")).status_code == 200
    assert "Import usage CSV" not in client.get(_url(UsageRecord, "changelist")).content.decode()
    assert client.get(reverse("admin:metering_usagerecord_import_csv")).status_code == 403
    clerk.user_permissions.add(Permission.objects.get(codename="add_usagerecord"))
    client.force_login(clerk)
    assert client.get(reverse("admin:metering_usagerecord_import_csv")).status_code == 200


# --- Actions ---------------------------------------------------------------------------------------


def test_rerating_rates_the_unrated_records_of_the_selected_buyers(
    admin_client: Client, world: World
) -> None:
    usage_record_create_batch(operator=world.operator, records=[_usage("late-1", "acme", days_ago=1)])
    late = UsageRecord.objects.get(idempotency_key="late-1")
    segments = RatedSegment.objects.count()

    response = admin_client.post(
        _url(UsageRecord, "changelist"),
        {"action": "rerate_buyers", "_selected_action": [late.pk], "index": 0},
        follow=True,
    )
    assert "1 unrated record(s) rated" in " ".join(str(m) for m in response.context["messages"])
    late.refresh_from_db()
    assert late.rated_at is not None
    assert RatedSegment.objects.count() > segments

    again = admin_client.post(
        _url(UsageRecord, "changelist"),
        {"action": "rerate_buyers", "_selected_action": [late.pk], "index": 0},
        follow=True,
    )
    assert "0 unrated record(s) rated" in " ".join(str(m) for m in again.context["messages"])


def test_refund_asks_for_confirmation_and_a_reason_then_calls_the_service(
    admin_client: Client, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[dict[str, Any]] = []

    def refund_create(**kwargs: Any) -> gateway.RefundInfo:
        asked.append(kwargs)
        return gateway.RefundInfo(
            id="re_new",
            status="pending",
            amount=kwargs["amount"],
            currency="CNY",
            payment_intent_id=kwargs["payment_intent_id"],
            charge_id="ch_1",
            created_at=timezone.now(),
        )

    monkeypatch.setattr(gateway, "refund_create", refund_create)
    changelist = _url(Pack, "changelist")

    confirm = admin_client.post(
        changelist, {"action": "refund_unused", "_selected_action": [world.pack.pk], "index": 0}
    )
    assert confirm.status_code == 200
    assert "Refund the unused part of these packs?" in confirm.content.decode()
    assert asked == []

    no_reason = admin_client.post(
        changelist,
        {"action": "refund_unused", "_selected_action": [world.pack.pk], "confirm": "yes", "reason": " "},
    )
    assert no_reason.status_code == 200
    assert "reason" in no_reason.context["form"].errors
    assert asked == []

    done = admin_client.post(
        changelist,
        {
            "action": "refund_unused",
            "_selected_action": [world.pack.pk],
            "confirm": "yes",
            "reason": "customer left the platform",
        },
        follow=True,
    )
    assert "Refund requested for 1 pack(s)" in " ".join(str(m) for m in done.context["messages"])
    assert len(asked) == 1 and asked[0]["payment_intent_id"] == "pi_test_0"
    assert Decimal(0) < asked[0]["amount"] < Decimal("1000.00")
    entry = LogEntry.objects.get(object_id=str(world.pack.pk), content_type__model="pack")
    assert "customer left the platform" in entry.get_change_message()


def test_reprocessing_failed_stripe_events(admin_client: Client, world: World) -> None:
    processed = StripeEvent.objects.create(
        event_id="evt_done", type="customer.created", payload={}, status=StripeEvent.Status.PROCESSED
    )
    response = admin_client.post(
        _url(StripeEvent, "changelist"),
        {"action": "reprocess_failed", "_selected_action": [world.event.pk, processed.pk], "index": 0},
        follow=True,
    )
    text = " ".join(str(m) for m in response.context["messages"])
    assert "Re-processed 1 failed event(s): now 1 ignored" in text
    assert "Skipped 1 event(s)" in text
    world.event.refresh_from_db()
    assert (world.event.status, world.event.attempts) == (StripeEvent.Status.IGNORED, 2)


# --- Statements ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [Invoice, Settlement])
def test_statements_download_as_csv_and_pdf(admin_client: Client, world: World, model: type[Model]) -> None:
    statement = model._default_manager.order_by("pk").first()
    assert statement is not None
    page = admin_client.get(_url(model, "change", statement.pk)).content.decode()
    csv_url = _url(model, "download", statement.pk, "csv")
    assert csv_url in page
    csv_response = admin_client.get(csv_url)
    assert csv_response.status_code == 200
    assert csv_response["Content-Type"].startswith("text/csv")
    assert statement.number in csv_response.content.decode("utf-8-sig")  # type: ignore[attr-defined]
    pdf = admin_client.get(_url(model, "download", statement.pk, "pdf"))
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")
    assert admin_client.get(_url(model, "download", statement.pk, "xls")).status_code == 404


def test_the_close_run_and_exhaustion_flags_are_listed(admin_client: Client, world: World) -> None:
    assert BillingCloseRun.objects.get().finished_at is not None
    flagged = admin_client.get(_url(BuyerExhaustion, "changelist"), {"cleared_at__isempty": "1"}).context[
        "cl"
    ]
    assert [f.buyer.slug for f in flagged.result_list] == ["beta"]


# --- The schedule text format -------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(PRESETS))
def test_the_schedule_text_round_trips_every_preset(code: str) -> None:
    spec = PRESETS[code].spec
    assert metering_admin.parse_windows(metering_admin.windows_text(spec.windows)) == spec.windows


def test_the_schedule_text_accepts_names_numbers_and_ranges() -> None:
    (window,) = metering_admin.parse_windows("Peak 10:00–12:00 [weekdays=mon,tue,Friday] [months=7-9,dec]")
    assert (window.band, window.start_minute, window.end_minute) == ("peak", 600, 720)
    assert window.weekdays == 0b001_0011
    assert window.months == (1 << 6) | (1 << 7) | (1 << 8) | (1 << 11)
    assert metering_admin.parse_multipliers("peak=1.7; flat = 1\nvalley=0.38") == {
        "peak": Decimal("1.7"),
        "flat": Decimal("1"),
        "valley": Decimal("0.38"),
    }


def test_units_are_named() -> None:
    assert metering_admin.micros_display(1_500_000, "CNY") == "1.500000 CNY"
    assert (
        metering_admin.micros_display(-250_000, "card_hours:std", signed=True) == "-0.250000 card-hours (std)"
    )
    assert metering_admin.unit_label("card_hours:huawei-ascend-910b3") == "card-hours (huawei-ascend-910b3)"
