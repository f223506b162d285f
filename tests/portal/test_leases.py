"""Portal: the buyer's leases — the list, a lease with its state history, locked price and live usage
(rated by band, polled while it runs), cancelling, and who may see what."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from broker.models import Job, Lease, LeaseState, LeaseTransition
from broker.services.dispatch import LeaseUsageInput, lease_start, lease_stop, lease_usage_report
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from metering.services.rating import usage_rate_pending
from tests.broker.factories import make_job, make_lease

A800 = "nvidia-a800-sxm4-80gb"


def yesterday_at(hour: int) -> datetime:
    """Yesterday at ``hour`` o'clock, Asia/Shanghai: 03:00–05:00 lies in Guangdong's valley (×0.38)."""
    return (timezone.localtime() - timedelta(days=1)).replace(hour=hour, minute=0, second=0, microsecond=0)


def running_lease(buyer: Organisation, cluster: Cluster) -> Lease:
    """8 cards on ``cluster`` yesterday 03:00–05:00, started by the operator at 03:00, with usage
    03:00–04:00 rated (two records of 30 min) and 04:00–04:30 reported but not rated yet."""
    job = make_job(buyer=buyer, name="nightly", duration_seconds=7200)
    lease = make_lease(job=job, cluster=cluster, start_at=yesterday_at(3), end_at=yesterday_at(5))
    agent = Actor(organisation=cluster.operator, system_label="agent")
    lease_start(operator=cluster.operator, lease_id=lease.pk, actor=agent, at=yesterday_at(3))

    def report(key: str, minutes_from: int, minutes_to: int) -> None:
        record = LeaseUsageInput(
            lease_id=lease.pk,
            idempotency_key=key,
            start_at=yesterday_at(3) + timedelta(minutes=minutes_from),
            end_at=yesterday_at(3) + timedelta(minutes=minutes_to),
            cards=8,
        )
        lease_usage_report(operator=cluster.operator, records=[record], actor=agent)

    report("u-1", 0, 30)
    report("u-2", 30, 60)
    usage_rate_pending()
    report("u-3", 60, 90)
    lease.refresh_from_db()
    return lease


# --- The list -----------------------------------------------------------------------------------------


def test_the_lease_list_shows_cluster_cards_window_and_state_and_filters(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    reserved = make_lease(job=make_job(buyer=buyer, name="later"), cluster=east_cluster)
    running = running_lease(buyer, east_cluster)
    response = buyer_client.get("/leases/")
    assert response.status_code == 200
    assert list(response.context["page"].object_list) == [reserved, running]
    html = response.content.decode()
    assert f'<a href="/leases/{running.pk}/">#{running.pk}</a>' in html
    assert "<code>cpi:ctyun:yrd:sh-ai01</code>" in html and '<span class="badge good">Running</span>' in html
    assert f"{yesterday_at(3):%Y-%m-%d} 03:00 → 05:00" in html
    filtered = buyer_client.get("/leases/?state=running")
    assert list(filtered.context["page"].object_list) == [running]
    assert list(buyer_client.get("/leases/?state=cancelled").context["page"].object_list) == []
    assert "No lease in this state." in buyer_client.get("/leases/?state=cancelled").content.decode()


def test_the_lease_list_pages_by_50_in_a_bounded_number_of_queries(
    buyer: Organisation, west_cluster: Cluster, buyer_client: Client, django_assert_max_num_queries
) -> None:
    for n in range(60):
        job = make_job(buyer=buyer, name=f"job-{n:02d}", cards=1)
        make_lease(job=job, cluster=west_cluster, island=f"isl-0{n % 2 + 1}")
    with django_assert_max_num_queries(8):
        response = buyer_client.get("/leases/")
    assert len(response.context["page"].object_list) == 50
    with django_assert_max_num_queries(8):
        second = buyer_client.get("/leases/?page=2")
    assert len(second.context["page"].object_list) == 10


# --- A lease ------------------------------------------------------------------------------------------


def test_a_running_lease_shows_its_history_price_and_usage_by_band(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client, django_assert_max_num_queries
) -> None:
    lease = running_lease(funded_buyer, east_cluster)
    # 12 for the page and its usage, 4 for how the buyer's packs would pay the expected draw.
    with django_assert_max_num_queries(16):
        response = buyer_client.get(f"/leases/{lease.pk}/")
    assert response.status_code == 200
    transitions = response.context["transitions"]
    assert [(t.from_state, t.to_state, t.actor_label) for t in transitions] == [
        ("", "reserved", "test"),
        ("reserved", "running", "agent"),
    ]
    usage = response.context["usage"]
    assert (usage.records, usage.unrated_records, usage.card_hours) == (3, 1, Decimal("12.000000"))
    # 8 valley card-hours × 0.38 = 3.04 A800 card-hours, yesterday: before the buyer's packs started, so no
    # pack pays them and the buyer owes them at the operator's list price (12 CNY × 3.04 = ¥36.48).
    assert [
        (
            b.band,
            b.card_hours,
            b.spend,
            b.list_price,
            [(d.class_key, d.arrears, d.card_hours) for d in b.draws],
        )
        for b in usage.bands
    ] == [
        (
            "valley",
            Decimal("8.000000"),
            Decimal("36.48"),
            Decimal("36.48"),
            [(A800, True, Decimal("3.040000"))],
        )
    ]
    assert (usage.spend, usage.list_price, usage.last_end_at) == (
        Decimal("36.48"),
        Decimal("36.48"),
        yesterday_at(4) + timedelta(minutes=30),
    )
    assert response.context["progress"] == 75  # 12 of 16 card-hours
    html = response.content.decode()
    assert "Reserved → " in html and "agent" in html
    assert "¥12.00 / card-hour" in html and "cn-gd" in html
    assert "¥36.48 at the operator's list price" in html
    # The chip by its model name, not its catalogue slug.
    assert (
        "3.04</span> A800 SXM4 80GB card-hours with no pack (amount due)" in html
        and A800 not in html.split("data-class")[0]
    )
    assert "1 record not rated yet" in html
    assert f'data-poll-url="/leases/{lease.pk}/usage/"' in html
    assert f'action="/leases/{lease.pk}/cancel/"' in html and "Stop lease" in html


def test_the_usage_fragment_polls_until_the_lease_ends(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    lease = running_lease(funded_buyer, east_cluster)
    fragment = buyer_client.get(f"/leases/{lease.pk}/usage/")
    assert fragment.status_code == 200
    html = fragment.content.decode()
    assert html.startswith('<div id="lease-usage" data-poll-url=') and "<html" not in html
    assert "12.00" in html
    lease_stop(
        operator=east_cluster.operator,
        lease_id=lease.pk,
        actor=Actor(organisation=east_cluster.operator, system_label="agent"),
        at=yesterday_at(4) + timedelta(minutes=30),
    )
    done = buyer_client.get(f"/leases/{lease.pk}/usage/").content.decode()
    assert done.startswith('<div id="lease-usage" data-poll-done') and "data-poll-url" not in done


def test_a_reserved_lease_says_usage_comes_once_it_starts(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    lease = make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    html = buyer_client.get(f"/leases/{lease.pk}/").content.decode()
    assert "The lease has not started" in html and "data-poll-url" not in html
    assert "Cancel lease" in html


# --- Cancelling ---------------------------------------------------------------------------------------


def test_cancelling_a_reserved_lease_releases_it_and_a_running_one_asks_to_stop(
    funded_buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    reserved = make_lease(job=make_job(buyer=funded_buyer), cluster=east_cluster, island="isl-02")
    response = buyer_client.post(f"/leases/{reserved.pk}/cancel/", follow=True)
    assert f"Lease {reserved.pk} cancelled; its cards are released." in response.content.decode()
    reserved.refresh_from_db()
    assert reserved.state == LeaseState.CANCELLED
    assert reserved.job.state == Job.State.OPEN
    running = running_lease(funded_buyer, east_cluster)
    response = buyer_client.post(f"/leases/{running.pk}/cancel/", follow=True)
    running.refresh_from_db()
    assert running.state == LeaseState.STOP_REQUESTED
    assert "is asked to stop" in response.content.decode()
    again = buyer_client.post(f"/leases/{running.pk}/cancel/", follow=True)
    assert "only a reserved or running lease can be cancelled" in again.content.decode()
    assert LeaseTransition.objects.filter(lease=running).count() == 3


# --- Who may see what ---------------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_log_in(buyer: Organisation, east_cluster: Cluster) -> None:
    lease = make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    client = Client()
    for url in ("/leases/", f"/leases/{lease.pk}/", f"/leases/{lease.pk}/usage/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")


def test_an_operator_is_refused_even_for_a_lease_on_its_cluster(
    buyer: Organisation, east_cluster: Cluster, operator_client: Client
) -> None:
    lease = make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    for url in ("/leases/", f"/leases/{lease.pk}/", f"/leases/{lease.pk}/usage/"):
        assert operator_client.get(url).status_code == 403
    assert operator_client.post(f"/leases/{lease.pk}/cancel/").status_code == 403
    lease.refresh_from_db()
    assert lease.state == LeaseState.RESERVED


def test_another_buyers_lease_is_not_found_and_left_alone(
    buyer: Organisation, east_cluster: Cluster, other_buyer_client: Client
) -> None:
    lease = make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    for url in (f"/leases/{lease.pk}/", f"/leases/{lease.pk}/usage/"):
        assert other_buyer_client.get(url).status_code == 404
    assert other_buyer_client.post(f"/leases/{lease.pk}/cancel/").status_code == 404
    assert list(other_buyer_client.get("/leases/").context["page"].object_list) == []
    lease.refresh_from_db()
    assert lease.state == LeaseState.RESERVED and LeaseTransition.objects.filter(lease=lease).count() == 1


def test_a_viewer_sees_a_lease_but_cannot_cancel_it(
    buyer: Organisation, east_cluster: Cluster, login, buyer_viewer: User
) -> None:
    lease = make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    viewer = login(buyer_viewer)
    page = viewer.get(f"/leases/{lease.pk}/")
    assert page.status_code == 200 and "/cancel/" not in page.content.decode()
    assert viewer.post(f"/leases/{lease.pk}/cancel/").status_code == 403
    lease.refresh_from_db()
    assert lease.state == LeaseState.RESERVED
