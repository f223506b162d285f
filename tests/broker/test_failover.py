"""Failover: the leases of an offline cluster are interrupted; checkpointable jobs (and never-started
reservations) are re-placed elsewhere for their remaining time, the rest fail and the buyer is told; usage
up to the last report stays billed; running it twice, or on two workers at once, handles a lease once."""

from __future__ import annotations

import importlib
import threading
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import OperationalError, connections
from django.db.models import Sum
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from broker.errors import LeaseUsageInvalidError
from broker.models import BuyerNotice, CapacityHold, Job, Lease, LeaseState, LeaseTransition
from broker.services import quotes
from broker.services.dispatch import LeaseUsageInput, lease_usage_report
from broker.services.failover import leases_fail_over
from broker.services.leases import lease_transition
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster, ClusterStatus
from federation.services import cluster_status_set, clusters_mark_missed_heartbeats, hub_latency_record
from federation.types import LatencyMeasurement
from metering.models import PriceCard, RatedSegment, UsageRecord
from metering.services.rating import usage_rate_pending
from tests.broker.conftest import A800, H800
from tests.broker.factories import make_job, make_lease
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

TEST = Actor.system("test")
HOUR = 3600


# --- helpers -------------------------------------------------------------------------------------------


def backdate_price_cards(*clusters: Cluster, hours: int = 6) -> None:
    """Price cards cannot be set in the past through the service; leases here started an hour ago."""
    PriceCard.objects.filter(cluster__in=clusters).update(
        effective_from=timezone.now().replace(microsecond=0) - timedelta(hours=hours)
    )


def start(lease: Lease, *, at: datetime) -> Lease:
    lease_transition(lease=lease, to_state=LeaseState.RUNNING, actor=TEST, reason="started", at=at)
    return lease


def take_offline(cluster: Cluster) -> list[str]:
    """The heartbeat monitor's way: the cluster's last heartbeat is long past."""
    long_ago = timezone.now() - timedelta(hours=1)
    Cluster.objects.filter(pk=cluster.pk).update(last_heartbeat_at=long_ago, last_heartbeat_sent_at=long_ago)
    Cluster.objects.exclude(pk=cluster.pk).update(last_heartbeat_at=timezone.now())
    return clusters_mark_missed_heartbeats(now=timezone.now())


def report_usage(lease: Lease, *, start_at: datetime, end_at: datetime, key: str) -> int:
    """Usage reported through the broker's usage API, as the operator's agent does: stored in metering with
    reference ``lease:<id>`` and the lease's locked price card, and ``last_usage_end_at`` moved forward."""
    result = lease_usage_report(
        operator=lease.operator,
        records=[
            LeaseUsageInput(
                lease_id=lease.pk, idempotency_key=key, start_at=start_at, end_at=end_at, cards=lease.cards
            )
        ],
        actor=Actor(organisation=lease.operator, system_label="agent"),
    )
    (outcome,) = result.outcomes
    assert outcome.status == "created"
    lease.refresh_from_db()
    return outcome.record_id


def notices(job: Job) -> list[tuple[str, int | None, str]]:
    return list(BuyerNotice.objects.filter(job=job).order_by("id").values_list("kind", "lease_id", "message"))


def replacement_of(lease: Lease) -> Lease:
    return Lease.objects.select_related("cluster").get(replaces=lease)


def active_holds(lease: Lease) -> int:
    return CapacityHold.objects.filter(lease=lease, active=True).count()


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture
def market(east_cluster: Cluster, west_cluster: Cluster) -> dict[str, Cluster]:
    """East (yrd, A800, where leases run) and west (nx, A800, 20 ms from yrd, 9 CNY), plus two clusters a
    yrd job asking for A800 within 30 ms must never land on although they are cheaper: an H800 cluster in
    nx (wrong chip) and an A800 cluster in gs measured at 45 ms from yrd (over the latency budget)."""
    h800_operator = OperatorFactory(slug="cmcc", name="China Mobile")
    h800 = make_cluster(
        operator=h800_operator, hub="nx", name="zw-h800", accelerator=H800, islands=[("isl-01", 64)]
    )
    make_price_card(cluster=h800, rate="4.0000", tariff_code="cn-nx")
    far_operator = OperatorFactory(slug="ctc", name="China Tower")
    far = make_cluster(
        operator=far_operator, hub="gs", name="qy-ai01", islands=[("isl-01", 64)], site="Qingyang"
    )
    make_price_card(cluster=far, rate="5.0000", tariff_code="cn-nx")
    hub_latency_record(
        measurements=[
            LatencyMeasurement(
                source="yrd", target="gs", latency_ms=Decimal("45"), measured_at=timezone.now()
            )
        ]
    )
    backdate_price_cards(east_cluster, west_cluster, h800, far)
    return {"east": east_cluster, "west": west_cluster, "h800": h800, "far": far}


def a800_job(buyer: Organisation, *, checkpointable: bool, **overrides: object) -> Job:
    now = timezone.now().replace(microsecond=0)
    values: dict[str, object] = {
        "accelerators": [A800],
        "origin_hub": "yrd",
        "latency_budget_ms": 30,
        "earliest_start_at": now - timedelta(hours=1),
        "deadline_at": now + timedelta(hours=24),
        "duration_seconds": 2 * HOUR,
        "checkpointable": checkpointable,
    }
    values.update(overrides)
    return make_job(buyer=buyer, **values)


def running_lease(job: Job, cluster: Cluster, *, started_ago: int = HOUR, island: str | None = None) -> Lease:
    """A lease of the job's duration that started ``started_ago`` seconds ago and is running."""
    start_at = timezone.now().replace(microsecond=0) - timedelta(seconds=started_ago)
    lease = make_lease(job=job, cluster=cluster, start_at=start_at, island=island)
    return start(lease, at=start_at)


# --- tests ---------------------------------------------------------------------------------------------


def test_a_checkpointable_lease_is_re_placed_on_a_cluster_that_meets_the_constraints(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    job = a800_job(funded_buyer, checkpointable=True)
    lease = running_lease(job, market["east"])
    report_usage(lease, start_at=lease.start_at, end_at=lease.start_at + timedelta(minutes=30), key="u-1")

    assert take_offline(market["east"]) == [market["east"].cpi]
    before = timezone.now().replace(microsecond=0)
    assert leases_fail_over() == 1

    lease.refresh_from_db()
    assert lease.state == LeaseState.INTERRUPTED
    assert lease.reason == f"cluster {market['east'].cpi} went offline (missed heartbeats)"
    assert lease.ended_at == lease.start_at + timedelta(minutes=30) == lease.last_usage_end_at
    assert active_holds(lease) == 0
    transition = LeaseTransition.objects.filter(lease=lease).latest("id")
    assert (transition.from_state, transition.to_state, transition.actor_label) == (
        LeaseState.RUNNING,
        LeaseState.INTERRUPTED,
        "failover",
    )

    new = replacement_of(lease)
    assert new.cluster == market["west"]  # not the cheaper H800 (wrong chip) nor gs (45 ms > 30 ms)
    assert new.state == LeaseState.RESERVED
    assert new.cards == 8
    assert new.end_at - new.start_at == timedelta(seconds=90 * 60)  # 2 h planned, 30 min already reported
    assert new.start_at >= before
    assert new.end_at <= job.deadline_at
    assert new.buyer == funded_buyer
    assert new.price_card == PriceCard.objects.get(cluster=market["west"])
    assert active_holds(new) == 1
    assert LeaseTransition.objects.get(lease=new).actor_label == "failover"

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (Job.State.PLACED, "")
    assert notices(job) == [
        (
            "lease_replaced",
            new.pk,
            f"Lease {lease.pk} on {market['east'].cpi} was interrupted (went offline (missed heartbeats)). "
            f"Its remaining 5400 s were re-placed as lease {new.pk} on {market['west'].cpi}, "
            f"starting {new.start_at.isoformat()}.",
        )
    ]


def test_a_non_checkpointable_lease_fails_its_job_and_tells_the_buyer(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    job = a800_job(funded_buyer, checkpointable=False)
    lease = running_lease(job, market["east"])
    take_offline(market["east"])

    assert leases_fail_over() == 1

    lease.refresh_from_db()
    job.refresh_from_db()
    assert lease.state == LeaseState.INTERRUPTED
    assert lease.ended_at == lease.started_at  # nothing reported: nothing billed
    assert active_holds(lease) == 0
    assert not Lease.objects.filter(replaces=lease).exists()
    reason = (
        f"Lease {lease.pk} was interrupted: {market['east'].cpi} went offline (missed heartbeats). "
        "The job is not checkpointable, so it cannot resume elsewhere."
    )
    assert (job.state, job.failure_reason) == (Job.State.FAILED, reason)
    assert notices(job) == [("lease_failed", lease.pk, reason)]


def test_without_a_feasible_alternative_the_job_fails_and_the_buyer_is_told(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    job = a800_job(funded_buyer, checkpointable=True)
    lease = running_lease(job, market["east"])
    cluster_status_set(
        actor=TEST, cluster=market["west"], status=ClusterStatus.DRAINING, reason="maintenance"
    )
    take_offline(market["east"])

    assert leases_fail_over() == 1

    lease.refresh_from_db()
    job.refresh_from_db()
    assert lease.state == LeaseState.INTERRUPTED
    assert not Lease.objects.filter(replaces=lease).exists()
    assert job.state == Job.State.FAILED
    assert job.failure_reason.startswith(
        f"Lease {lease.pk} was interrupted ({market['east'].cpi} went offline (missed heartbeats)) and its "
        "remaining 7200 s could not be re-placed: no other cluster can take it within the job's constraints"
    )
    assert notices(job) == [("lease_failed", lease.pk, job.failure_reason)]


def test_a_buyer_who_cannot_pay_for_the_remaining_time_is_told(
    market: dict[str, Cluster], buyer: Organisation
) -> None:
    job = a800_job(buyer, checkpointable=True)  # no packs at all
    lease = running_lease(job, market["east"])
    take_offline(market["east"])

    assert leases_fail_over() == 1

    job.refresh_from_db()
    assert not Lease.objects.filter(replaces=lease).exists()
    reason = (
        f"Lease {lease.pk} was interrupted ({market['east'].cpi} went offline (missed heartbeats)) and its "
        "remaining 7200 s could not be re-placed: your packs cannot pay for the remaining time; buy a pack "
        "and submit the job again."
    )
    assert (job.state, job.failure_reason) == (Job.State.FAILED, reason)
    assert notices(job) == [("lease_failed", lease.pk, reason)]


def test_a_reservation_that_never_started_is_re_placed_in_full_whatever_the_job(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    job = a800_job(
        funded_buyer, checkpointable=False, earliest_start_at=timezone.now().replace(microsecond=0)
    )
    later = timezone.now().replace(microsecond=0) + timedelta(hours=3)
    lease = make_lease(job=job, cluster=market["east"], start_at=later)
    cluster_status_set(actor=TEST, cluster=market["east"], status=ClusterStatus.OFFLINE, reason="power work")

    assert leases_fail_over() == 1

    lease.refresh_from_db()
    assert lease.state == LeaseState.INTERRUPTED
    assert lease.reason == f"cluster {market['east'].cpi} was set offline by platform staff"
    assert lease.ended_at is not None and lease.ended_at <= timezone.now()  # nothing can be billed
    new = replacement_of(lease)
    assert new.cluster == market["west"]
    assert new.end_at - new.start_at == timedelta(hours=2)
    job.refresh_from_db()
    assert job.state == Job.State.PLACED
    assert [kind for kind, _, _ in notices(job)] == ["lease_replaced"]


def test_a_lease_that_was_stopping_is_interrupted_and_not_re_placed(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    job = a800_job(funded_buyer, checkpointable=True)
    lease = running_lease(job, market["east"])
    lease_transition(lease=lease, to_state=LeaseState.STOP_REQUESTED, actor=TEST, reason="packs ran dry")
    take_offline(market["east"])

    assert leases_fail_over() == 1

    lease.refresh_from_db()
    job.refresh_from_db()
    assert lease.state == LeaseState.INTERRUPTED
    assert not Lease.objects.filter(replaces=lease).exists()
    reason = f"Lease {lease.pk} was stopping when {market['east'].cpi} went offline (missed heartbeats); it is not re-placed."
    assert (job.state, job.failure_reason) == (Job.State.FAILED, reason)
    assert notices(job) == [("lease_failed", lease.pk, reason)]


def test_a_retired_cluster_fails_over_and_a_draining_one_keeps_its_leases(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    retired_job = a800_job(funded_buyer, checkpointable=True)
    retired_lease = running_lease(retired_job, market["east"])
    draining_job = a800_job(funded_buyer, checkpointable=True)
    draining_lease = running_lease(draining_job, market["west"])
    cluster_status_set(
        actor=TEST, cluster=market["east"], status=ClusterStatus.RETIRED, reason="decommissioned"
    )
    cluster_status_set(
        actor=TEST, cluster=market["west"], status=ClusterStatus.DRAINING, reason="maintenance"
    )

    assert leases_fail_over() == 1

    retired_lease.refresh_from_db()
    draining_lease.refresh_from_db()
    assert retired_lease.state == LeaseState.INTERRUPTED
    assert retired_lease.reason == f"cluster {market['east'].cpi} was retired"
    assert draining_lease.state == LeaseState.RUNNING
    # The only other A800 cluster within 30 ms is draining: the checkpointable job had nowhere to go.
    retired_job.refresh_from_db()
    assert retired_job.state == Job.State.FAILED


def test_running_it_twice_changes_nothing_the_second_time(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    replaced = running_lease(a800_job(funded_buyer, checkpointable=True), market["east"], island="isl-01")
    failed = running_lease(a800_job(funded_buyer, checkpointable=False), market["east"], island="isl-02")
    take_offline(market["east"])
    assert leases_fail_over() == 2

    def snapshot() -> tuple[object, ...]:
        return (
            list(Lease.objects.order_by("id").values_list("id", "state", "ended_at", "replaces_id")),
            list(Job.objects.order_by("id").values_list("id", "state", "failure_reason")),
            LeaseTransition.objects.count(),
            BuyerNotice.objects.count(),
            CapacityHold.objects.filter(active=True).count(),
        )

    before = snapshot()
    assert leases_fail_over() == 0
    assert snapshot() == before
    assert Lease.objects.filter(replaces=replaced).count() == 1
    assert not Lease.objects.filter(replaces=failed).exists()


def test_a_cluster_back_online_before_failover_runs_keeps_its_leases(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    lease = running_lease(a800_job(funded_buyer, checkpointable=True), market["east"])
    take_offline(market["east"])
    cluster_status_set(actor=TEST, cluster=market["east"], status=ClusterStatus.ACTIVE, reason="back")

    assert leases_fail_over() == 0

    lease.refresh_from_db()
    assert (lease.state, lease.ended_at) == (LeaseState.RUNNING, None)
    assert not BuyerNotice.objects.exists()


def test_a_lease_whose_whole_duration_was_reported_completes_its_job(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    job = a800_job(funded_buyer, checkpointable=True, earliest_start_at=timezone.now() - timedelta(hours=3))
    lease = running_lease(job, market["east"], started_ago=3 * HOUR)
    report_usage(lease, start_at=lease.start_at, end_at=lease.end_at, key="u-all")
    take_offline(market["east"])

    assert leases_fail_over() == 1

    lease.refresh_from_db()
    job.refresh_from_db()
    assert (lease.state, lease.ended_at) == (LeaseState.INTERRUPTED, lease.end_at)
    assert not Lease.objects.filter(replaces=lease).exists()
    assert (job.state, job.failure_reason) == (Job.State.COMPLETED, "")
    assert notices(job) == [
        (
            "lease_interrupted",
            lease.pk,
            f"Lease {lease.pk} on {market['east'].cpi} was interrupted (went offline (missed heartbeats)) "
            "after its whole duration had been reported; the job is complete.",
        )
    ]


def test_an_error_on_one_lease_does_not_stop_the_others(
    market: dict[str, Cluster], funded_buyer: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, third = (
        running_lease(a800_job(funded_buyer, checkpointable=True, cards=4), market["east"], island=island)
        for island in ("isl-01", "isl-01", "isl-02")
    )
    take_offline(market["east"])
    real = quotes.placements_find
    calls: list[int] = []

    def flaky(**kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("deadlock detected")
        if len(calls) == 2:
            raise RuntimeError("matcher bug")
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(quotes, "placements_find", flaky)

    with pytest.raises(OperationalError, match="deadlock detected"):
        leases_fail_over()  # the transient error is raised after the other leases were handled

    states = dict(Lease.objects.filter(pk__in=[first.pk, second.pk, third.pk]).values_list("pk", "state"))
    assert states == {
        first.pk: LeaseState.RUNNING,  # rolled back: nothing half-written
        second.pk: LeaseState.RUNNING,
        third.pk: LeaseState.INTERRUPTED,
    }
    assert not BuyerNotice.objects.filter(lease=first).exists()
    assert Lease.objects.filter(replaces=third).exists()

    assert leases_fail_over() == 2  # the next run takes the two that were left live
    assert Lease.objects.filter(replaces__in=[first, second]).count() == 2


def test_usage_up_to_the_last_report_stays_billed_and_the_replacement_runs_the_rest(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    job = a800_job(funded_buyer, checkpointable=True)
    lease = running_lease(job, market["east"], started_ago=HOUR)
    t0 = lease.start_at
    first = report_usage(lease, start_at=t0, end_at=t0 + timedelta(minutes=20), key="u-1")
    second = report_usage(
        lease, start_at=t0 + timedelta(minutes=20), end_at=t0 + timedelta(minutes=45), key="u-2"
    )
    take_offline(market["east"])

    assert leases_fail_over() == 1
    assert usage_rate_pending() == 2

    lease.refresh_from_db()
    # The cut-off: billing stops at the end of the last report (45 min), not at the interruption (60 min).
    assert lease.ended_at == lease.last_usage_end_at == t0 + timedelta(minutes=45)
    billed = RatedSegment.objects.filter(usage_record__in=[first, second]).aggregate(s=Sum("card_seconds"))
    assert billed["s"] == 8 * 45 * 60
    assert set(UsageRecord.objects.filter(reference=f"lease:{lease.pk}").values_list("pk", flat=True)) == {
        first,
        second,
    }
    # Nothing after the cut-off is billed: the agent's later report is refused, its replay is a duplicate.
    with pytest.raises(LeaseUsageInvalidError) as refused:
        report_usage(lease, start_at=t0 + timedelta(minutes=45), end_at=t0 + timedelta(minutes=55), key="u-3")
    assert [(e["index"], e["code"]) for e in refused.value.extra["errors"]] == [(0, "after_lease_ended")]
    replay = lease_usage_report(
        operator=lease.operator,
        records=[
            LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key="u-2",
                start_at=t0 + timedelta(minutes=20),
                end_at=t0 + timedelta(minutes=45),
                cards=8,
            )
        ],
        actor=Actor(organisation=lease.operator, system_label="agent"),
    )
    assert [(o.status, o.record_id) for o in replay.outcomes] == [("duplicate", second)]
    assert UsageRecord.objects.filter(reference=f"lease:{lease.pk}").count() == 2
    lease.refresh_from_db()
    assert lease.ended_at == lease.last_usage_end_at == t0 + timedelta(minutes=45)
    assert UsageRecord.objects.unrated().count() == 0
    new = replacement_of(lease)
    assert new.end_at - new.start_at == timedelta(seconds=2 * HOUR - 45 * 60)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_workers_at_once_re_place_each_lease_exactly_once(
    east_operator: Organisation, west_cluster: Cluster, presets: None
) -> None:
    big = make_cluster(
        operator=east_operator,
        hub="yrd",
        name="sh-ai02",
        islands=[(f"isl-0{n}", 8) for n in range(1, 7)],
        site="Shanghai",
    )
    make_price_card(cluster=big, rate="12.0000", tariff_code="cn-gd")
    backdate_price_cards(big, west_cluster)
    buyers = [BuyerFactory(slug=f"buyer-{n}", name=f"Buyer {n}") for n in range(2)]
    for b in buyers:
        make_paid_pack(buyer=b, accelerator=A800, card_hours=1000, price="9000.00", key=f"a800-{b.slug}")
    leases = [
        running_lease(a800_job(buyers[n % 2], checkpointable=True), big, island=f"isl-0{n + 1}")
        for n in range(6)
    ]
    take_offline(big)

    counts: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker() -> None:
        try:
            barrier.wait()
            counts.append(leases_fail_over())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    print(f"\nleases handled per worker: {sorted(counts)}")
    assert errors == []
    assert sum(counts) == 6
    for lease in leases:
        lease.refresh_from_db()
        assert lease.state == LeaseState.INTERRUPTED
        assert LeaseTransition.objects.filter(lease=lease, to_state=LeaseState.INTERRUPTED).count() == 1
        new = Lease.objects.get(replaces=lease)
        assert new.cluster == west_cluster
        assert new.end_at - new.start_at == timedelta(hours=2)
        assert BuyerNotice.objects.filter(job_id=lease.job_id, kind="lease_replaced").count() == 1
    assert Lease.objects.filter(cluster=west_cluster).count() == 6
    assert Job.objects.filter(state=Job.State.PLACED).count() == 6
    assert leases_fail_over() == 0


def test_the_beat_migration_schedules_the_four_broker_tasks(db: None) -> None:
    """The migration is applied, and its forward step creates exactly these schedules (run here on an empty
    table: a transactional test's flush, kept by --reuse-db, may have removed the migrated rows), once."""
    from django.apps import apps
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    from config.celery_app import app as celery_app

    migration = importlib.import_module("broker.migrations.0002_broker_schedules")
    recorder = MigrationRecorder(connection)
    assert recorder.migration_qs.filter(app="broker", name="0002_broker_schedules").exists()
    PeriodicTask.objects.filter(task__startswith="broker.").delete()
    migration.create(apps, None)
    migration.create(apps, None)

    rows = {
        task.name: (task.task, task.interval.every, task.interval.period, task.enabled)
        for task in PeriodicTask.objects.filter(task__startswith="broker.").select_related("interval")
    }
    assert rows == {
        "Broker: fail over offline clusters": ("broker.leases_fail_over", 5, "seconds", True),
        "Broker: stop leases of exhausted buyers": ("broker.leases_stop_exhausted", 10, "seconds", True),
        "Broker: deliver lease events": ("broker.lease_events_deliver", 5, "seconds", True),
        "Broker: purge expired quotes": ("broker.quotes_purge", 3600, "seconds", True),
    }
    celery_app.loader.import_default_modules()
    assert {task for task, _, _, _ in rows.values()} <= set(celery_app.tasks)
    migration.remove(apps, None)
    assert not PeriodicTask.objects.filter(task__startswith="broker.").exists()


def test_a_job_pinned_to_its_cluster_is_not_moved_elsewhere(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    """A pin means only that cluster's islands: when it goes offline, west (which would take the job
    otherwise, as above) is not used; the checkpointable job fails and the buyer is told."""
    job = a800_job(funded_buyer, checkpointable=True, cluster=market["east"])
    lease = running_lease(job, market["east"])
    take_offline(market["east"])

    assert leases_fail_over() == 1

    job.refresh_from_db()
    assert not Lease.objects.filter(replaces=lease).exists()
    assert job.state == Job.State.FAILED
    assert "could not be re-placed: no other cluster can take it within the job's constraints" in (
        job.failure_reason
    )


def test_a_run_out_of_time_leaves_the_rest_for_the_next_run(
    market: dict[str, Cluster], funded_buyer: Organisation
) -> None:
    """A hub outage must not hold a worker slot for minutes: a run takes no new lease once its budget is
    spent (at least one, so every run makes progress), and the next runs handle the rest, each lease once."""
    leases = [
        running_lease(a800_job(funded_buyer, checkpointable=True, cards=2), market["east"], island=island)
        for island in ("isl-01", "isl-01", "isl-02")
    ]
    take_offline(market["east"])

    assert [leases_fail_over(budget_seconds=0) for _ in range(4)] == [1, 1, 1, 0]
    assert set(
        Lease.objects.filter(pk__in=[lease.pk for lease in leases]).values_list("state", flat=True)
    ) == {LeaseState.INTERRUPTED}
    assert Lease.objects.filter(replaces__in=leases).count() == 3
