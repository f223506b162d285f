"""Automatic SLA credits (issue 16 item 3), end to end with time pinned (every instant below is explicit and
passed to the services as ``at``/``now``): a lease on a cluster whose price card promises 99.5 % is
interrupted when the cluster misses its heartbeats, failover re-places it, the assessment attributes the
lost time and issues exactly one credit note within the hour, whose balanced transfer matches a calculation
written here from the scenario's own figures (not from the rating or credit code). Then the cases that must
not credit (the buyer cancelled; maintenance announced ahead), idempotency, and a dispute.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.db.models import Sum
from django_celery_beat.models import PeriodicTask

from broker.models import Job, Lease, LeaseState, SlaAssessment
from broker.services.dispatch import LeaseUsageInput, lease_usage_report
from broker.services.failover import leases_fail_over
from broker.services.leases import lease_cancel, lease_transition
from broker.services.sla import lease_sla_assess, leases_sla_assess_due
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster, ClusterMaintenance
from federation.services import clusters_mark_missed_heartbeats
from metering.errors import SlaCreditDisputeDecidedError
from metering.models import (
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    Pack,
    PriceCard,
    SlaCredit,
    SlaCreditDispute,
    Tariff,
    TransferKind,
)
from metering.services.rating import usage_rate_pending
from metering.services.sla import sla_credit_dispute_decide, sla_credit_reason
from metering.services.tariffs import price_card_set, tariff_presets_install
from tests.broker.factories import make_job, make_lease
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack

pytestmark = pytest.mark.django_db

SHANGHAI = ZoneInfo("Asia/Shanghai")
A800 = "nvidia-a800-sxm4-80gb"
T0 = datetime(2026, 3, 10, 10, 0, tzinfo=SHANGHAI)  # the lease's planned start
MINUTE = timedelta(minutes=1)
SCHEDULE = [
    {"below_percent": "99.5", "credit_percent": "10"},
    {"below_percent": "99", "credit_percent": "25"},
    {"below_percent": "90", "credit_percent": "50"},
]
EAST_RATE = Fraction(12)  # CNY per card-hour, flat tariff (every hour at 1.0)
PACK_PRICE, PACK_HOURS = Fraction(900), 100  # 9 CNY of prepaid value per card-hour
COMMISSION = Fraction(1, 10)
STAFF = Actor.system("staff: alice")


def at(minutes: int) -> datetime:
    return T0 + minutes * MINUTE


def set_price(cluster: Cluster, rate: str, **sla: object) -> PriceCard:
    card = price_card_set(
        cluster=cluster,
        rate_per_card_hour=Decimal(rate),
        tariff=Tariff.objects.get(owner__isnull=True, code="flat"),
        actor=Actor(organisation=cluster.operator, system_label="test"),
        **sla,  # type: ignore[arg-type]
    )
    # Cards cannot be set in the past through the service; this world's prices were set a day before T0.
    PriceCard.objects.filter(pk=card.pk).update(effective_from=T0 - timedelta(days=1))
    return card


@pytest.fixture
def world(db: None) -> dict[str, object]:
    """East (yrd, 16 A800, 12 CNY, promising 99.5 %) and west (yrd, 16 A800, 9 CNY, no promise); Acme holds a
    100 A800 card-hour pack bought for 900 CNY the day before."""
    assert Decimal("0.10") == settings.CARDHOUR_PLATFORM_COMMISSION
    tariff_presets_install()
    east = make_cluster(
        operator=OperatorFactory(slug="ctyun", name="China Telecom Cloud"),
        hub="yrd",
        name="sh-ai01",
        islands=[("isl-01", 8), ("isl-02", 8)],
    )
    west = make_cluster(
        operator=OperatorFactory(slug="cucc", name="China Unicom"),
        hub="yrd",
        name="sh-ai02",
        islands=[("isl-01", 8), ("isl-02", 8)],
    )
    set_price(east, "12.0000", sla_availability_percent="99.5", sla_credit_schedule=SCHEDULE)
    set_price(west, "9.0000")
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    pack = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=PACK_HOURS, price="900.00", paid_at=T0 - timedelta(days=1)
    )
    return {"east": east, "west": west, "buyer": buyer, "pack": pack}


def running_lease(
    world: dict[str, object], *, checkpointable: bool, buyer: Organisation | None = None
) -> Lease:
    buyer = buyer or world["buyer"]  # type: ignore[assignment]
    assert isinstance(buyer, Organisation)
    job = make_job(
        buyer=buyer,
        accelerators=[A800],
        cards=8,
        origin_hub="yrd",
        latency_budget_ms=100,
        earliest_start_at=T0,
        deadline_at=T0 + timedelta(hours=24),
        duration_seconds=7200,
        checkpointable=checkpointable,
    )
    lease = make_lease(job=job, cluster=world["east"], start_at=T0)  # type: ignore[arg-type]
    Lease.objects.filter(pk=lease.pk).update(created_at=T0 - timedelta(hours=1))  # accepted an hour ahead
    Job.objects.filter(pk=job.pk).update(state=Job.State.PLACED)
    lease.refresh_from_db()
    lease_transition(lease=lease, to_state=LeaseState.RUNNING, actor=Actor.system("agent"), at=T0)
    return lease


def report(lease: Lease, start: int, end: int, *, now: int) -> None:
    result = lease_usage_report(
        operator=lease.operator,
        records=[
            LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key=f"u-{lease.pk}-{start}",
                start_at=at(start),
                end_at=at(end),
                cards=lease.cards,
            )
        ],
        actor=Actor(organisation=lease.operator, system_label="agent"),
        now=at(now),
    )
    assert [o.status for o in result.outcomes] == ["created"]
    assert usage_rate_pending(now=at(now)) == 1


def cluster_misses_heartbeats(world: dict[str, object], *, last_beat: int, now: int) -> None:
    east, west = world["east"], world["west"]
    assert isinstance(east, Cluster) and isinstance(west, Cluster)
    Cluster.objects.filter(pk=east.pk).update(
        last_heartbeat_at=at(last_beat), last_heartbeat_sent_at=at(last_beat)
    )
    Cluster.objects.filter(pk=west.pk).update(last_heartbeat_at=at(now), last_heartbeat_sent_at=at(now))
    assert clusters_mark_missed_heartbeats(now=at(now)) == [east.cpi]


def balances() -> dict[str, int]:
    return dict(LedgerAccount.objects.values_list("key", "balance"))


def micros(value: Fraction) -> int:
    """Exact micro-units, half to even (every figure here is a whole number of micro-units anyway)."""
    return round(value * 1_000_000)


# --- the scenario ----------------------------------------------------------------------------------------


def test_an_interrupted_lease_gets_one_credit_note_that_balances_and_matches_the_schedule(world) -> None:
    lease = running_lease(world, checkpointable=True)
    report(lease, 0, 30, now=31)  # 8 cards × 30 min, rated at once
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    assert leases_fail_over(now=at(40)) == 1
    lease.refresh_from_db()
    assert (lease.state, lease.ended_at) == (LeaseState.INTERRUPTED, at(30))  # billed up to the last usage
    replacement = Lease.objects.get(replaces=lease)
    assert replacement.cluster == world["west"]
    lease_transition(lease=replacement, to_state=LeaseState.RUNNING, actor=Actor.system("agent"), at=at(50))

    before = balances()
    # Not yet: the agent's last usage may still come in for CARDHOUR_SLA_ASSESS_DELAY_MINUTES (15) after the end.
    assert leases_sla_assess_due(now=at(44)) == 0
    assert leases_sla_assess_due(now=at(50)) == 1
    assert leases_sla_assess_due(now=at(60)) == 0  # a second run (and a third) issues nothing more
    assert lease_sla_assess(lease_id=lease.pk, now=at(70)) == SlaAssessment.objects.get(lease=lease)

    # Independently: the window is 120 min; from the last usage (min 30) to the replacement's start (min 50)
    # the buyer had nothing: 20 min lost, availability 100/120 = 83.333 % (truncated), below 90 % → 50 %.
    window, lost = 120, 20
    availability = Fraction(window - lost, window) * 100
    assert availability < 90
    share = Fraction(50, 100)
    card_hours = Fraction(8 * 30, 60)  # 4 card-hours drawn from the pack at 1.0 (flat)
    gross = card_hours * EAST_RATE  # 48 CNY charged
    commission = gross * COMMISSION
    value = card_hours * PACK_PRICE / PACK_HOURS  # 36 CNY of prepaid value consumed
    expected_moves = {
        f"pack:{world['pack'].pk}": micros(card_hours * share),  # +2 card-hours back in the pack
        "issuance:" + A800: -micros(card_hours * share),
        f"buyer_money:{world['buyer'].pk}": -micros(value * share),  # 18 CNY of prepaid value back
        f"operator_earnings:{world['east'].operator_id}": micros(
            (gross - commission) * share
        ),  # payable −21.60
        "platform_commission": micros(commission * share),  # −2.40
        "platform_spread": micros((value - gross) * share),  # the spread rating booked, reversed: −(−6)
    }

    credit = SlaCredit.objects.get()
    assert credit.lease_id == lease.pk and credit.reference == f"lease:{lease.pk}"
    assert (credit.buyer, credit.operator, credit.cluster) == (
        world["buyer"],
        world["east"].operator,
        world["east"],
    )
    assert credit.availability_percent == Decimal("83.333")
    assert (credit.service_level_percent, credit.tier_below_percent, credit.credit_percent) == (
        Decimal("99.5"),
        Decimal("90"),
        Decimal("50"),
    )
    assert (credit.window_seconds, credit.lost_seconds, credit.excluded_buyer_seconds) == (7200, 1200, 0)
    assert credit.excluded_maintenance_seconds == 0
    assert credit.charge_gross == micros(gross)
    assert credit.credit_gross == micros(gross * share) == 24_000_000
    assert credit.credit_commission == micros(commission * share) == 2_400_000
    assert credit.credit_buyer_value == micros(value * share) == 18_000_000
    assert credit.issued_at - at(40) <= timedelta(hours=1)  # within the hour of the interruption

    # One transfer, kind sla_credit, balanced per unit, moving exactly the expected amounts.
    transfer = credit.transfer
    assert LedgerTransfer.objects.filter(kind=TransferKind.SLA_CREDIT).get() == transfer
    assert transfer.idempotency_key == f"sla_credit:lease:{lease.pk}"
    per_unit = dict(
        LedgerEntry.objects.filter(transfer=transfer)
        .values("unit")
        .annotate(s=Sum("amount"))
        .values_list("unit", "s")
    )
    assert per_unit == {"CNY": 0, f"card_hours:{A800}": 0}
    moves = dict(transfer.entries.values_list("account__key", "amount"))
    assert moves == expected_moves
    after = balances()
    assert {
        key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)
    } == expected_moves

    assessment = SlaAssessment.objects.get(lease=lease)
    assert (assessment.outcome, assessment.credit, assessment.availability_percent) == (
        SlaAssessment.Outcome.CREDITED,
        credit,
        Decimal("83.333"),
    )
    assert [
        [datetime.fromisoformat(a), datetime.fromisoformat(b)] for a, b in assessment.intervals["lost"]
    ] == [[at(30), at(50)]]
    reason = sla_credit_reason(credit)
    assert "availability 83.333 % against a service level of 99.5 %" in reason
    assert "20.0 min lost to the operator out of 120.0 min counted" in reason
    assert "below 90 %, 50 % of the lease's charge is credited" in reason

    # The replacement (on a card with no promise) ends; it is not assessed: only cards with a level are.
    lease_transition(
        lease=replacement, to_state=LeaseState.COMPLETED, actor=Actor.system("agent"), at=at(140)
    )
    assert leases_sla_assess_due(now=at(200)) == 0
    assert not SlaAssessment.objects.filter(lease=replacement).exists()


def test_the_beat_is_scheduled_every_ten_minutes() -> None:
    """The migration is applied and its forward step schedules the task (run here on an empty table: a
    transactional test's flush, kept by --reuse-db, may have removed the migrated row), once."""
    import importlib

    from django.apps import apps
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    from config.celery_app import app as celery_app

    migration = importlib.import_module("broker.migrations.0007_sla_assessment")
    assert (
        MigrationRecorder(connection).migration_qs.filter(app="broker", name="0007_sla_assessment").exists()
    )
    PeriodicTask.objects.filter(task="broker.leases_sla_assess").delete()
    migration.create_schedule(apps, None)
    migration.create_schedule(apps, None)
    task = PeriodicTask.objects.get(task="broker.leases_sla_assess")
    assert (task.enabled, task.interval.every, task.interval.period, task.expire_seconds) == (
        True,
        600,
        "seconds",
        600,
    )
    celery_app.loader.import_default_modules()
    assert "broker.leases_sla_assess" in celery_app.tasks


def test_no_credit_when_the_buyer_cancelled_before_the_cluster_went_down(world) -> None:
    lease = running_lease(world, checkpointable=True)
    report(lease, 0, 30, now=31)
    lease_cancel(
        lease_id=lease.pk, actor=Actor(organisation=world["buyer"], system_label="portal"), at=at(30)
    )
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    assert leases_fail_over(now=at(40)) == 1
    lease.refresh_from_db()
    assert lease.state == LeaseState.INTERRUPTED
    assert not Lease.objects.filter(replaces=lease).exists()  # a stopping lease is never re-placed

    assert leases_sla_assess_due(now=at(60)) == 1
    assessment = SlaAssessment.objects.get(lease=lease)
    assert (assessment.outcome, assessment.lost_seconds, assessment.excluded_buyer_seconds) == (
        SlaAssessment.Outcome.WITHIN_LEVEL,
        0,
        90 * 60,
    )
    assert assessment.availability_percent == Decimal("100.000")
    assert not SlaCredit.objects.exists()
    assert not LedgerTransfer.objects.filter(kind=TransferKind.SLA_CREDIT).exists()


@pytest.mark.parametrize(("announced_hours_ahead", "credited"), [(48, False), (2, True)])
def test_maintenance_counts_only_when_announced_ahead(
    world, announced_hours_ahead: int, credited: bool
) -> None:
    # Maintenance from minute 30 to the window's end; announced 48 h ahead (counts) or 2 h ahead (too late:
    # the notice is CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS = 24 h).
    ClusterMaintenance.objects.create(
        cluster=world["east"],
        starts_at=at(30),
        ends_at=at(120),
        announced_at=at(30) - timedelta(hours=announced_hours_ahead),
        reason="firmware upgrade",
        announced_by="ctyun ops",
    )
    lease = running_lease(world, checkpointable=False)
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    assert leases_fail_over(now=at(40)) == 1  # not checkpointable: the job fails, nothing replaces it

    assert leases_sla_assess_due(now=at(60)) == 1
    assessment = SlaAssessment.objects.get(lease=lease)
    if credited:
        # 90 of 120 min lost: 25 % availability, 50 % of the 48 CNY charge.
        assert (assessment.lost_seconds, assessment.excluded_maintenance_seconds) == (90 * 60, 0)
        assert assessment.availability_percent == Decimal("25.000")
        assert SlaCredit.objects.get().credit_gross == 24_000_000
    else:
        assert (assessment.lost_seconds, assessment.excluded_maintenance_seconds) == (0, 90 * 60)
        assert assessment.availability_percent == Decimal("100.000")
        assert assessment.outcome == SlaAssessment.Outcome.WITHIN_LEVEL
        assert not SlaCredit.objects.exists()


def test_maintenance_announced_after_the_lease_was_accepted_does_not_count(world) -> None:
    lease = running_lease(world, checkpointable=False)  # accepted at T0 − 1 h
    ClusterMaintenance.objects.create(
        cluster=world["east"],
        starts_at=at(30),
        ends_at=at(120),
        announced_at=T0 - timedelta(minutes=30),  # after the acceptance (and less than 24 h ahead)
        reason="firmware upgrade",
        announced_by="ctyun ops",
    )
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    leases_fail_over(now=at(40))
    leases_sla_assess_due(now=at(60))
    assert SlaAssessment.objects.get(lease=lease).excluded_maintenance_seconds == 0
    assert SlaCredit.objects.count() == 1


def test_a_dispute_is_decided_by_a_new_transfer_and_the_credit_note_is_never_edited(world) -> None:
    lease = running_lease(world, checkpointable=False)
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    leases_fail_over(now=at(40))
    before_credit = balances()
    leases_sla_assess_due(now=at(60))
    credit = SlaCredit.objects.get()
    frozen = (
        SlaCredit.objects.filter(pk=credit.pk).values().get(),
        list(credit.transfer.entries.values_list("account__key", "amount")),
    )

    dispute = sla_credit_dispute_decide(
        credit=credit,
        accepted=True,
        reason="the cluster was up; the agent lost its network",
        actor=STAFF,
        now=at(90),
    )
    assert dispute.outcome == SlaCreditDispute.Outcome.ACCEPTED
    reversal = dispute.reversal_transfer
    assert reversal is not None and reversal.kind == TransferKind.SLA_CREDIT_REVERSAL
    assert reversal.pk != credit.transfer_id
    assert dict(reversal.entries.values_list("account__key", "amount")) == {k: -v for k, v in frozen[1]}
    assert balances() == before_credit | {
        key: 0 for key in balances() if key not in before_credit
    }  # every account back where it was before the credit
    assert (
        SlaCredit.objects.filter(pk=credit.pk).values().get(),
        list(credit.transfer.entries.values_list("account__key", "amount")),
    ) == frozen
    assert Pack.objects.get(pk=world["pack"].pk).status == Pack.Status.ACTIVE

    with pytest.raises(SlaCreditDisputeDecidedError):
        sla_credit_dispute_decide(credit=credit, accepted=False, reason="again", actor=STAFF)
    assert LedgerTransfer.objects.filter(kind=TransferKind.SLA_CREDIT_REVERSAL).count() == 1


def test_a_rejected_dispute_posts_nothing(world) -> None:
    lease = running_lease(world, checkpointable=False)
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    leases_fail_over(now=at(40))
    leases_sla_assess_due(now=at(60))
    credit = SlaCredit.objects.get()
    transfers = LedgerTransfer.objects.count()
    dispute = sla_credit_dispute_decide(
        credit=credit, accepted=False, reason="logs show the outage", actor=STAFF
    )
    assert (dispute.outcome, dispute.reversal_transfer) == (SlaCreditDispute.Outcome.REJECTED, None)
    assert LedgerTransfer.objects.count() == transfers


def test_the_credit_is_debited_on_the_operators_next_settlement_and_a_reversal_on_the_one_after(
    world,
) -> None:
    from datetime import date

    from metering.models import Invoice, InvoiceLine, Settlement, SettlementLine
    from metering.services.billing import billing_close_period

    lease = running_lease(world, checkpointable=False)
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    leases_fail_over(now=at(40))
    leases_sla_assess_due(now=at(60))
    credit = SlaCredit.objects.get()

    billing_close_period(period_start=date(2026, 3, 1), now=datetime(2026, 4, 1, 1, tzinfo=SHANGHAI))
    march = Settlement.objects.get(operator=world["east"].operator, period_start=date(2026, 3, 1))
    rows = list(
        march.lines.order_by("seq").values_list("kind", "gross", "commission", "payable", "sla_credit")
    )
    # 4 card-hours at 12 CNY (flat): 48.00 gross, 4.80 commission; the note takes back half of each.
    assert rows == [
        (SettlementLine.Kind.USAGE, Decimal("48.00"), Decimal("4.80"), Decimal("43.20"), None),
        (SettlementLine.Kind.SLA_CREDIT, Decimal("-24.00"), Decimal("-2.40"), Decimal("-21.60"), credit.pk),
    ]
    assert (march.gross, march.commission, march.payable) == (
        Decimal("24.00"),
        Decimal("2.40"),
        Decimal("21.60"),
    )
    # The payable stated equals what the ledger owes the operator (its earnings account, negative = owed).
    earnings = LedgerAccount.objects.get(key=f"operator_earnings:{world['east'].operator_id}")
    assert -earnings.balance == 21_600_000
    # The buyer's invoice states the note too: the 18 CNY of prepaid value back (2 of the 4 card-hours).
    invoice = Invoice.objects.get(buyer=world["buyer"], period_start=date(2026, 3, 1))
    sla_lines = list(
        invoice.lines.filter(kind=InvoiceLine.Kind.SLA_CREDIT).values_list(
            "amount", "card_hours_drawn", "sla_credit"
        )
    )
    assert sla_lines == [(Decimal("-18.00"), Decimal("-2.000000"), credit.pk)]
    assert invoice.usage_value == Decimal("36.00") - Decimal("18.00")
    assert invoice.amount_due == Decimal("0.00")

    sla_credit_dispute_decide(
        credit=credit, accepted=True, reason="agent fault", actor=STAFF, now=at(60 * 24 * 31)
    )
    billing_close_period(period_start=date(2026, 3, 1), now=datetime(2026, 4, 1, 2, tzinfo=SHANGHAI))
    assert march.lines.count() == 2  # an issued settlement never changes
    billing_close_period(period_start=date(2026, 4, 1), now=datetime(2026, 5, 1, 1, tzinfo=SHANGHAI))
    april = Settlement.objects.get(operator=world["east"].operator, period_start=date(2026, 4, 1))
    assert list(april.lines.values_list("kind", "gross", "commission", "payable")) == [
        (SettlementLine.Kind.SLA_CREDIT_REVERSAL, Decimal("24.00"), Decimal("2.40"), Decimal("21.60"))
    ]
    april_invoice = Invoice.objects.get(buyer=world["buyer"], period_start=date(2026, 4, 1))
    assert list(april_invoice.lines.values_list("kind", "amount")) == [
        (InvoiceLine.Kind.SLA_REVERSAL, Decimal("18.00"))
    ]


def test_the_celery_task_run_twice_issues_one_note(world) -> None:
    from broker.tasks import leases_sla_assess

    lease = running_lease(world, checkpointable=False)
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    leases_fail_over(now=at(40))
    # The task runs on the real clock, long after this pinned March: the lease is due.
    assert leases_sla_assess.apply().get() == 1
    assert leases_sla_assess.apply().get() == 0
    assert SlaCredit.objects.count() == 1
    assert LedgerTransfer.objects.filter(kind=TransferKind.SLA_CREDIT).count() == 1
    assert SlaAssessment.objects.filter(lease=lease).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_workers_assessing_one_lease_at_once_issue_one_note(world) -> None:
    import threading

    from django.db import connections

    lease = running_lease(world, checkpointable=False)
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    leases_fail_over(now=at(40))

    results: list[int | None] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker() -> None:
        try:
            barrier.wait()
            assessment = lease_sla_assess(lease_id=lease.pk, now=at(60))
            results.append(assessment.pk if assessment else None)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert len(set(results)) == 1 and results[0] is not None  # both see the one assessment
    assert SlaCredit.objects.count() == 1
    assert LedgerTransfer.objects.filter(kind=TransferKind.SLA_CREDIT).count() == 1


def test_a_credit_for_usage_with_no_pack_takes_money_off_what_is_owed(world) -> None:
    """Beta has no pack: its 4 card-hours are arrears (48 CNY owed). Half comes back: the arrears shrink by 2
    card-hours, the money owed by 24 CNY, and the invoice's amount due says 24.00."""
    from datetime import date

    from metering.models import Invoice, InvoiceLine
    from metering.services.billing import billing_close_period

    beta = BuyerFactory(slug="beta", name="Beta Labs")
    lease = running_lease(world, checkpointable=False, buyer=beta)
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    leases_fail_over(now=at(40))
    before = balances()
    leases_sla_assess_due(now=at(60))
    credit = SlaCredit.objects.get()
    after = balances()
    moved = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
    assert moved == {
        f"arrears:{beta.pk}:{A800}": 2_000_000,
        f"issuance:{A800}": -2_000_000,
        f"buyer_money:{beta.pk}": -24_000_000,
        f"operator_earnings:{world['east'].operator_id}": 21_600_000,
        "platform_commission": 2_400_000,
    }
    assert [line["to"] for line in credit.lines] == ["arrears"]

    billing_close_period(period_start=date(2026, 3, 1), now=datetime(2026, 4, 1, 1, tzinfo=SHANGHAI))
    invoice = Invoice.objects.get(buyer=beta, period_start=date(2026, 3, 1))
    assert list(invoice.lines.order_by("seq").values_list("kind", "amount")) == [
        (InvoiceLine.Kind.ARREARS, Decimal("48.00")),
        (InvoiceLine.Kind.SLA_CREDIT, Decimal("-24.00")),
    ]
    assert (invoice.arrears_amount, invoice.amount_due) == (Decimal("24.00"), Decimal("24.00"))
