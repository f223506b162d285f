"""Which of a buyer's packs would pay a draw (broker.draws): rating's order (earliest expiry first), each
part in its pack's unit, live leases set aside first, and what the buyer would pay."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.draws import buyer_packs_after_leases, lease_draw_plan, reserved_draws_for
from core.models import Organisation
from federation.models import Cluster
from tests.broker.factories import make_job, make_lease
from tests.metering.factories import make_paid_pack

pytestmark = pytest.mark.django_db

A800 = "nvidia-a800-sxm4-80gb"
FACTOR = Decimal("0.78")  # A800: 312 dense FP16 TFLOPS / 400


def test_a_draw_spills_from_the_pack_expiring_first_onto_the_next_in_its_unit(buyer: Organisation) -> None:
    """4 A800 card-hours (9 CNY each, expiring first) then standard ones (12 CNY) at 0.78: 10 A800
    card-hours take 4 A800 + 6 × 0.78 = 4.68 standard card-hours, worth 36.00 + 56.16 = 92.16."""
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=4, price="36.00", validity_days=30)
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=100, price="1200.00", validity_days=90)
    now = timezone.now()
    plan = buyer_packs_after_leases(buyer=buyer, at=now).plan(
        chip=A800, factor=FACTOR, draw=Decimal("10"), rate=Decimal("12.0000"), at=now
    )
    assert [(p.class_key, p.amount, p.chip_card_hours, p.factor, p.value) for p in plan.parts] == [
        (A800, Decimal("4.000000"), Decimal("4.000000"), None, Decimal("36.00")),
        ("std", Decimal("4.680000"), Decimal("6.000000"), FACTOR, Decimal("56.16")),
    ]
    assert (plan.uncovered, plan.value, plan.effective_price_per_card_hour) == (
        Decimal("0"),
        Decimal("92.16"),
        Decimal("9.22"),
    )
    assert plan.describe() == (
        f"4.00 {A800} card-hours + 4.68 standard card-hours (6.00 {A800} card-hours × factor 0.78)"
    )


def test_a_standard_pack_expiring_first_pays_first(buyer: Organisation) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="900.00", validity_days=90)
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=100, price="1200.00", validity_days=30)
    now = timezone.now()
    plan = buyer_packs_after_leases(buyer=buyer, at=now).plan(
        chip=A800, factor=FACTOR, draw=Decimal("6.08"), rate=Decimal("12.0000"), at=now
    )
    assert [(p.class_key, p.amount, p.display) for p in plan.parts] == [
        ("std", Decimal("4.742400"), Decimal("4.74"))
    ]
    assert plan.total_in_unit() == ("std", Decimal("4.742400"))
    assert plan.describe() == f"4.74 standard card-hours (6.08 {A800} card-hours × factor 0.78)"


def test_no_pack_means_arrears_at_the_operators_rate(buyer: Organisation) -> None:
    now = timezone.now()
    plan = buyer_packs_after_leases(buyer=buyer, at=now).plan(
        chip=A800, factor=FACTOR, draw=Decimal("3.04"), rate=Decimal("12.0000"), at=now
    )
    assert (plan.parts, plan.uncovered, plan.value, plan.effective_price_per_card_hour) == (
        (),
        Decimal("3.04"),
        Decimal("36.48"),
        Decimal("12.00"),
    )
    assert plan.shortfall_text() == f"3.04 {A800} card-hours; none of your packs can pay it"


def test_live_leases_are_set_aside_first_and_a_lease_sees_the_others(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10, price="90.00")
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    first = make_lease(job=make_job(buyer=buyer), cluster=east_cluster, start_at=start, expected_draw="7")
    second = make_lease(
        job=make_job(buyer=buyer, name="second"),
        cluster=east_cluster,
        start_at=start,
        island="isl-02",
        expected_draw="5",
    )
    now = timezone.now()
    after = buyer_packs_after_leases(buyer=buyer, at=now)
    assert [slot.remaining for slot in after.slots] == [Decimal("0.000000")]
    plan = lease_draw_plan(lease=second, at=now)  # the first lease takes 7 of the 10
    assert [(p.class_key, p.amount) for p in plan.parts] == [(A800, Decimal("3.000000"))]
    assert plan.uncovered == Decimal("2.000000")
    assert plan.describe() == (
        f"3.00 {A800} card-hours + 2.00 {A800} card-hours with no pack, at the operator's rate"
    )
    reserved = reserved_draws_for(buyer=buyer, now=now)
    assert [(d.class_key, d.micros) for d in reserved] == [(A800, 7_000_000), (A800, 3_000_000)]
    assert first.pk < second.pk


def test_the_pending_draws_are_the_live_leases_expected_draws_less_the_excluded(
    buyer: Organisation, east_cluster: Cluster, prepare_threshold: int | None
) -> None:
    """The fixed-text statement (draw_pending_for) returns each class's open holds: the live leases'
    expected draws (nothing rated yet), a cancelled one and another buyer's left out, and without the
    excluded lease's hold when asked (a lease's own plan sets the others aside). Bound by PostgreSQL and
    prepared (every quote asks): the same answers run after run."""
    from broker.selectors import draw_pending_for, draw_pending_recompute
    from broker.services.leases import lease_lock, lease_transition
    from core.types import Actor
    from tests.factories import BuyerFactory

    now = timezone.now().replace(microsecond=0)
    leases = [
        make_lease(
            job=make_job(buyer=buyer),
            cluster=east_cluster,
            cards=1,
            start_at=now + timedelta(hours=hours),
            expected_draw=f"{hours}.125000",
        )
        for hours in (3, 2, 1, 1, 5)
    ]
    lease_transition(lease=lease_lock(lease_id=leases[4].pk), to_state="cancelled", actor=Actor.system("t"))
    other = BuyerFactory(slug="someone-else")
    make_lease(job=make_job(buyer=other), cluster=east_cluster, cards=1, start_at=now + timedelta(hours=2))
    for _ in range(3):  # past the threshold: prepared, then run prepared
        assert draw_pending_for(buyer_id=buyer.pk) == {A800: Decimal("7.500000")}
    assert draw_pending_for(buyer_id=buyer.pk) == draw_pending_recompute(buyer_id=buyer.pk)
    assert draw_pending_for(buyer_id=buyer.pk, exclude_lease_ids=[leases[1].pk]) == {
        A800: Decimal("5.375000")
    }
    assert draw_pending_for(buyer_id=buyer.pk, exclude_lease_ids=[leases[4].pk]) == {
        A800: Decimal("7.500000")
    }


def test_the_usable_pack_balances_are_pack_list_for_s_rows(
    buyer: Organisation, prepare_threshold: int | None
) -> None:
    """The fixed-text statement on PostgreSQL (the ORM elsewhere) returns the buyer's active packs not
    expired at ``at``, earliest expiry first, with their ledger balances: what pack_list_for returns. On
    PostgreSQL bound by the server and prepared (every quote asks), the same rows run after run."""
    from metering.models import Pack
    from metering.selectors.payments import pack_balances_usable, pack_list_for
    from tests.factories import BuyerFactory

    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=4, price="36.00", validity_days=30, key="a")
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=100, price="1200.00", validity_days=90, key="b")
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=7, price="84.00", validity_days=10, key="c")
    spent = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1, price="9.00", key="d")
    Pack.objects.filter(pk=spent.pk).update(status=Pack.Status.EXHAUSTED)
    make_paid_pack(buyer=BuyerFactory(slug="another"), accelerator=None, card_hours=5, price="60.00", key="e")
    now = timezone.now()
    expected = [
        (p.pk, p.class_key, p.starts_at, p.expires_at, int(p.remaining_micros), p.price, p.card_hours)  # type: ignore[attr-defined]
        for p in pack_list_for(buyer=buyer, status=Pack.Status.ACTIVE).filter(expires_at__gt=now)
    ]
    assert len(expected) == 3
    for _ in range(3):  # past the threshold: prepared, then run prepared
        assert pack_balances_usable(buyer_id=buyer.pk, at=now) == expected
    assert pack_balances_usable(buyer_id=buyer.pk, at=now + timedelta(days=20)) == expected[1:]


def test_a_quote_s_packs_and_pending_draws_come_in_one_round_trip_as_the_two_statements_give_them(
    buyer: Organisation, east_cluster: Cluster, prepare_threshold: int | None
) -> None:
    """pack_balances_and_pending (what a quote reads: one statement on PostgreSQL) returns what
    pack_balances_usable and draw_pending_for return: packs of two classes in their order of draw, one
    exhausted and one of another buyer left out, live leases' pending draws of two chips, a cancelled
    lease's left out; then with every pack expired (packs none, pending unchanged); and for a buyer with
    packs and no live leases. Prepared, run after run. buyer_packs_after_leases plans from it as before."""
    from broker.models import DrawPending
    from broker.selectors import draw_pending_for, pack_balances_and_pending
    from broker.services.leases import lease_lock, lease_transition
    from core.types import Actor
    from metering.models import Pack
    from metering.selectors.payments import pack_balances_usable
    from tests.factories import BuyerFactory

    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=4, price="36.00", validity_days=30, key="a")
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=100, price="1200.00", validity_days=90, key="b")
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=7, price="84.00", validity_days=10, key="c")
    spent = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1, price="9.00", key="d")
    Pack.objects.filter(pk=spent.pk).update(status=Pack.Status.EXHAUSTED)
    other = BuyerFactory(slug="someone-else")
    make_paid_pack(buyer=other, accelerator=None, card_hours=5, price="60.00", key="e")
    now = timezone.now()
    leases = [
        make_lease(
            job=make_job(buyer=buyer),
            cluster=east_cluster,
            cards=1,
            start_at=now.replace(microsecond=0) + timedelta(hours=hours),
            expected_draw=f"{hours}.125000",
        )
        for hours in (3, 2, 1)
    ]
    lease_transition(lease=lease_lock(lease_id=leases[2].pk), to_state="cancelled", actor=Actor.system("t"))
    DrawPending.objects.create(buyer=buyer, draw_class="huawei-ascend-910b3", open_micros=2_500_000)
    DrawPending.objects.create(buyer=buyer, draw_class="moore-threads-s4000", open_micros=0)

    def both(who: Organisation, at: datetime) -> tuple[object, object]:
        return pack_balances_usable(buyer_id=who.pk, at=at), draw_pending_for(buyer_id=who.pk)

    expected = both(buyer, now)
    assert len(expected[0]) == 3
    assert expected[1] == {"huawei-ascend-910b3": Decimal("2.500000"), A800: Decimal("5.250000")}
    for _ in range(3):  # past the threshold: prepared, then run prepared
        with CaptureQueriesContext(connection) as queries:
            assert pack_balances_and_pending(buyer_id=buyer.pk, at=now) == expected
        assert len(queries) == (1 if connection.vendor == "postgresql" else 2)
    later = now + timedelta(days=120)
    assert pack_balances_and_pending(buyer_id=buyer.pk, at=later) == both(buyer, later) == ([], expected[1])
    assert pack_balances_and_pending(buyer_id=other.pk, at=now) == both(other, now)
    assert pack_balances_and_pending(buyer_id=other.pk, at=now)[1] == {}
    plan = buyer_packs_after_leases(buyer=buyer, at=now).plan(
        chip=A800, factor=FACTOR, draw=Decimal("3"), rate=Decimal("8.50"), at=now
    )
    assert plan.covered


def test_a_quote_values_pending_chips_at_its_catalogue_s_factors_without_asking_the_database(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    """The catalogue's standard-card factors (what its placements carry) are the database's, chip for chip
    (a chip without a public FP16 figure has none), before and after a new standard card comes into force.
    A quote passes them to buyer_packs_after_leases: the same packs as the database's factors give, with
    no query for the standard card or the chips; a chip the catalogue lacks is asked of the database."""
    from broker.catalog import _load_catalogue
    from broker.draws import _factors_if_standard, chip_factors
    from federation.models import Accelerator, StandardCard

    Accelerator.objects.create(
        slug="unpublished-x1", vendor="X", model="X1", spec_status="unknown", dense_fp16_tflops=None
    )
    slugs = list(Accelerator.objects.values_list("slug", flat=True))
    assert len(slugs) > 2
    catalogue = _load_catalogue()
    assert catalogue.standard_card_factors == chip_factors(slugs)
    assert catalogue.standard_card_factors[A800] == FACTOR
    assert catalogue.standard_card_factors["unpublished-x1"] is None
    StandardCard.objects.create(
        version=StandardCard.objects.order_by("-version").first().version + 1,  # type: ignore[union-attr]
        dense_fp16_tflops=Decimal("300"),
        effective_from=timezone.now() - timedelta(seconds=1),
        note="test",
    )
    again = _load_catalogue()
    assert again.standard_card_factors == chip_factors(slugs)
    assert again.standard_card_factors[A800] == Decimal("1.0400")  # 312 / 300

    make_paid_pack(buyer=buyer, accelerator=None, card_hours=100, price="1200.00", validity_days=90)
    make_lease(
        job=make_job(buyer=buyer),
        cluster=east_cluster,
        start_at=timezone.now().replace(microsecond=0) + timedelta(hours=1),
        expected_draw="7",
    )
    now = timezone.now()
    with CaptureQueriesContext(connection) as asked:
        known = buyer_packs_after_leases(buyer=buyer, at=now, known_factors=again.standard_card_factors)
    assert "federation_standardcard" not in " ".join(query["sql"] for query in asked.captured_queries)
    with CaptureQueriesContext(connection) as asked_more:
        looked_up = buyer_packs_after_leases(buyer=buyer, at=now)
    assert len(asked_more) == len(asked) + 2  # the standard card and the chips
    assert known.factors == looked_up.factors == {A800: Decimal("1.0400")}
    assert [slot.remaining for slot in known.slots] == [slot.remaining for slot in looked_up.slots]
    assert known.slots[0].remaining == Decimal("100") - Decimal("7") * Decimal("1.04")
    # A chip the known factors lack: the database answers for all of them.
    with CaptureQueriesContext(connection) as asked:
        factors = _factors_if_standard(known.slots, [A800, "unpublished-x1"], {A800: Decimal("9")})
    assert factors == {A800: Decimal("1.0400"), "unpublished-x1": None}
    assert "federation_standardcard" in " ".join(query["sql"] for query in asked.captured_queries)
