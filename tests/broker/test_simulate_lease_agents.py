"""The demo operators' lease agents (`manage.py simulate_lease_agents`): start, usage and stop over HTTP."""

from __future__ import annotations

import itertools
import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone

from broker.management.commands import simulate_lease_agents as agents
from broker.models import Lease, LeaseState
from broker.services import dispatch
from broker.services.leases import lease_lock, lease_transition
from core.models import Organisation
from core.services import api_token_create
from core.types import Actor
from federation.models import Cluster
from metering.models import PriceCard, UsageRecord
from tests.broker.factories import make_job, make_lease


@pytest.fixture(autouse=True)
def _agent_log_captured(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A Celery worker started by an earlier test in the same process raises the root logger's level
    (it hijacks the root logger) and a logging reconfiguration can disable existing loggers; either would
    hide this module's warnings from caplog. Pin the level on the logger itself and keep it enabled."""
    monkeypatch.setattr(agents.logger, "disabled", False)
    caplog.set_level(logging.INFO, logger=agents.logger.name)


TEST = Actor.system("test")


def now_s() -> datetime:
    return timezone.now().replace(microsecond=0)


def write_tokens(path: Path, tokens: dict[str, str]) -> Path:
    """The file seed_demo writes: operator slug → token secret."""
    path.write_text(json.dumps({"version": 1, "tokens": tokens}))
    return path


def token_of(operator: Organisation) -> str:
    return api_token_create(organisation=operator, name="lease agent")[1]


def lease_at(
    cluster: Cluster, buyer: Organisation, *, start: datetime, end: datetime, cards: int, island: str
) -> Lease:
    job = make_job(buyer=buyer, cards=cards, duration_seconds=int((end - start).total_seconds()))
    return make_lease(job=job, cluster=cluster, start_at=start, end_at=end, cards=cards, island=island)


def usage_of(lease: Lease) -> list[UsageRecord]:
    return list(UsageRecord.objects.filter(reference=f"lease:{lease.pk}").order_by("start_at"))


def card_seconds(records: list[UsageRecord]) -> int:
    return sum(r.cards * int((r.end_at - r.start_at).total_seconds()) for r in records)


def assert_contiguous(lease: Lease, records: list[UsageRecord]) -> None:
    """No gap, no overlap: each record starts where the previous one ended, the first at the lease's
    start, the last at its last_usage_end_at."""
    lease.refresh_from_db()
    assert records, f"no usage for lease {lease.pk}"
    assert records[0].start_at == max(lease.start_at, lease.started_at or lease.start_at)
    for earlier, later in itertools.pairwise(records):
        assert later.start_at == earlier.end_at
    assert records[-1].end_at == lease.last_usage_end_at


@pytest.fixture
def world(east_cluster: Cluster, east_operator: Organisation, funded_buyer: Organisation) -> dict[str, Lease]:
    """East's 16 cards (isl-01, isl-02 of 8) with a lease in every situation an agent meets."""
    # The leases start in the past: the price card must have been in force then.
    PriceCard.objects.filter(cluster=east_cluster).update(effective_from=timezone.now() - timedelta(days=2))
    now = now_s()
    hour = timedelta(hours=1)
    b = funded_buyer
    leases = {
        # Reserved, its start 2 minutes ago: started at start_at, usage since then.
        "due": lease_at(
            east_cluster, b, start=now - timedelta(minutes=2), end=now + hour, cards=4, island="isl-01"
        ),
        # Reserved, its start 30 minutes ago: the agent is late, so the job starts now.
        "late": lease_at(
            east_cluster, b, start=now - timedelta(minutes=30), end=now + hour, cards=4, island="isl-01"
        ),
        # Reserved, its whole window passed unstarted: failed.
        "missed": lease_at(
            east_cluster, b, start=now - 5 * hour, end=now - 4 * hour, cards=8, island="isl-01"
        ),
        # Running since 3 hours ago, ended 10 minutes ago: three records (1 h, 1 h, 50 min) and a stop.
        "over": lease_at(
            east_cluster, b, start=now - 3 * hour, end=now - timedelta(minutes=10), cards=8, island="isl-02"
        ),
        # Running since 5 minutes ago, asked to stop a minute ago: usage to the request, a stop there.
        "asked": lease_at(
            east_cluster, b, start=now - timedelta(minutes=5), end=now + hour, cards=8, island="isl-02"
        ),
        # Reserved for later: left alone.
        "later": lease_at(
            east_cluster, b, start=now + 2 * hour, end=now + 3 * hour, cards=8, island="isl-02"
        ),
    }
    for name in ("over", "asked"):
        dispatch.lease_start(
            operator=east_operator, lease_id=leases[name].pk, actor=TEST, at=leases[name].start_at
        )
    with transaction.atomic():
        lease_transition(
            lease=lease_lock(lease_id=leases["asked"].pk),
            to_state=LeaseState.STOP_REQUESTED,
            actor=TEST,
            reason="packs ran dry",
            at=now - timedelta(minutes=1),
        )
    for lease in leases.values():
        lease.refresh_from_db()
    return leases


# --- Against a live server ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_one_tick_starts_reports_usage_and_stops_over_http(
    live_server, tmp_path: Path, east_operator: Organisation, world: dict[str, Lease], caplog
) -> None:
    tokens_file = write_tokens(tmp_path / "tokens.json", {east_operator.slug: token_of(east_operator)})
    caplog.set_level(logging.INFO, logger="cardhour.simulate_lease_agents")

    call_command(
        "simulate_lease_agents",
        once=True,
        base_url=live_server.url,
        tokens_file=tokens_file,
        startup_timeout=10,
    )

    for lease in world.values():
        lease.refresh_from_db()
    due, late, missed, over, asked, later = (
        world[k] for k in ("due", "late", "missed", "over", "asked", "later")
    )

    # Started on time, at its start_at; usage since then, priced with the lease's card.
    assert due.state == LeaseState.RUNNING and due.started_at == due.start_at
    due_usage = usage_of(due)
    assert_contiguous(due, due_usage)
    assert all(r.price_card_id == due.price_card_id and r.cards == 4 for r in due_usage)
    assert all(r.cluster_id == due.cluster_id and r.buyer_id == due.buyer_id for r in due_usage)
    assert 110 <= card_seconds(due_usage) / 4 <= 180

    # Started late: at the moment the agent got to it, so none of the missed half-hour is billed.
    assert late.state == LeaseState.RUNNING
    assert late.started_at is not None and late.started_at - late.start_at >= timedelta(minutes=29)
    assert sum(r.start_at < late.started_at for r in usage_of(late)) == 0

    assert missed.state == LeaseState.FAILED and usage_of(missed) == []

    # Past its end: completed at end_at with exactly cards × seconds of usage, in hour-long records at most.
    assert over.state == LeaseState.COMPLETED and over.ended_at == over.end_at
    over_usage = usage_of(over)
    assert_contiguous(over, over_usage)
    assert [int((r.end_at - r.start_at).total_seconds()) for r in over_usage] == [3600, 3600, 3000]
    assert card_seconds(over_usage) == 8 * int((over.end_at - over.start_at).total_seconds())
    assert {r.price_card_id for r in over_usage} == {over.price_card_id}
    assert over.last_usage_end_at == over.end_at

    # Asked to stop: usage up to the request, completed at that instant.
    assert asked.state == LeaseState.COMPLETED and asked.ended_at == asked.stop_requested_at
    asked_usage = usage_of(asked)
    assert_contiguous(asked, asked_usage)
    assert card_seconds(asked_usage) == 8 * 240

    assert later.state == LeaseState.RESERVED and usage_of(later) == []

    assert f"lease {due.pk} started at" in caplog.text
    assert f"lease {over.pk} completed at" in caplog.text
    assert f"lease {missed.pk} failed" in caplog.text
    assert "usage reported" in caplog.text

    # A second tick moves the running leases on, without a record twice nor an overlap.
    stored = UsageRecord.objects.count()
    report = agents.tick(base_url=live_server.url, tokens={east_operator.slug: token_of(east_operator)})
    assert report.errors == [] and not report.unreachable
    assert report.records_duplicate == 0
    assert UsageRecord.objects.count() == stored + report.records_created
    for lease in (due, late, asked, over):
        records = usage_of(lease)
        if records:
            assert_contiguous(lease, records)
    assert card_seconds(usage_of(over)) == 8 * int((over.end_at - over.start_at).total_seconds())
    assert card_seconds(usage_of(asked)) == 8 * 240


@pytest.mark.django_db(transaction=True)
def test_a_retried_tick_is_a_duplicate_not_a_second_charge(
    live_server, east_operator: Organisation, world: dict[str, Lease]
) -> None:
    client = agents.OperatorClient(
        base_url=live_server.url, token=token_of(east_operator), operator=east_operator.slug
    )
    # What the agent saw before its tick, and the tick itself at a fixed instant.
    listed = client.active_leases()
    assert isinstance(listed, list)
    now = datetime.now(UTC).replace(microsecond=0)
    first = agents.tick(base_url=live_server.url, tokens={east_operator.slug: client.token}, now=now)
    assert first.errors == [] and first.records_created > 0
    stored = UsageRecord.objects.count()

    # The same tick again (the answer was lost, the agent lists afresh): nothing more to report.
    again = agents.tick(base_url=live_server.url, tokens={east_operator.slug: client.token}, now=now)
    assert again.errors == [] and again.records_created == 0 and again.stopped == 0

    # The same batch again from the stale list (the agent retries its POST): every record a duplicate.
    stale = [lease for lease in listed if lease["state"] != "reserved"]
    records = [r for lease in stale for r in agents.usage_plan(lease, now=now).records]
    assert records
    replay = client.call("POST", agents.USAGE_PATH, body={"records": records})
    assert replay.status == 200
    assert replay.body["created"] == 0 and replay.body["duplicates"] == len(records)
    assert UsageRecord.objects.count() == stored
    over = Lease.objects.get(pk=world["over"].pk)
    assert card_seconds(usage_of(over)) == 8 * int((over.end_at - over.start_at).total_seconds())


@pytest.mark.django_db(transaction=True)
def test_an_http_error_is_logged_with_its_code_and_fails_once(
    live_server, tmp_path: Path, east_operator: Organisation, world: dict[str, Lease], caplog
) -> None:
    tokens_file = write_tokens(tmp_path / "tokens.json", {east_operator.slug: "chk_not_a_token"})

    with pytest.raises(CommandError, match="failed"):
        call_command(
            "simulate_lease_agents",
            once=True,
            base_url=live_server.url,
            tokens_file=tokens_file,
            startup_timeout=10,
        )

    assert "listing leases failed: HTTP 401" in caplog.text
    assert Lease.objects.get(pk=world["due"].pk).state == LeaseState.RESERVED


@pytest.mark.django_db(transaction=True)
def test_without_tokens_it_fails_and_says_why(live_server, tmp_path: Path, caplog) -> None:
    with pytest.raises(CommandError, match="failed"):
        call_command(
            "simulate_lease_agents",
            once=True,
            base_url=live_server.url,
            tokens_file=tmp_path / "missing.json",
            startup_timeout=5,
        )
    assert "run `manage.py seed_demo` first" in caplog.text


# --- Without a server -----------------------------------------------------------------------------------


def test_it_gives_up_when_the_server_never_comes_up(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="did not come up"):
        call_command(
            "simulate_lease_agents",
            once=True,
            base_url="http://127.0.0.1:9",
            tokens_file=tmp_path / "t.json",
            startup_timeout=0.5,
        )


def test_a_server_gone_mid_tick_is_logged_and_left_to_the_next_tick(caplog) -> None:
    report = agents.tick(base_url="http://127.0.0.1:9", tokens={"ctyun": "x", "cucc": "y"})
    assert report.unreachable and report.errors == []
    assert "unreachable" in caplog.text and "retrying next tick" in caplog.text


def test_the_usage_plan_slices_whole_seconds_and_keys_them_by_lease_and_start() -> None:
    def doc(**kw: object) -> dict[str, object]:
        base: dict[str, object] = {
            "id": 7,
            "cards": 2,
            "state": "running",
            "cluster": "cpi:x",
            "start_at": "2026-01-01T00:00:00.250000Z",
            "end_at": "2026-01-01T03:00:00Z",
            "started_at": "2026-01-01T00:00:00.250000Z",
            "stop_requested_at": None,
            "last_usage_end_at": None,
        }
        base.update(kw)
        return base

    t = datetime(2026, 1, 1, tzinfo=UTC)
    plan = agents.usage_plan(doc(), now=t + timedelta(hours=2, minutes=30, microseconds=900_000))
    spans = [(r["start_at"], r["end_at"]) for r in plan.records]
    assert spans == [
        ("2026-01-01T00:00:01Z", "2026-01-01T01:00:01Z"),
        ("2026-01-01T01:00:01Z", "2026-01-01T02:00:01Z"),
        ("2026-01-01T02:00:01Z", "2026-01-01T02:30:00Z"),
    ]
    assert plan.records[0]["idempotency_key"] == f"sim:lease:7:{int(t.timestamp()) + 1}"
    assert plan.stop_at is None
    assert agents.usage_plan(doc(), now=t + timedelta(hours=2, minutes=30)).records == plan.records

    # Ended: usage to end_at and a stop there.
    ended = agents.usage_plan(doc(last_usage_end_at="2026-01-01T02:30:00Z"), now=t + timedelta(hours=4))
    assert [(r["start_at"], r["end_at"]) for r in ended.records] == [
        ("2026-01-01T02:30:00Z", "2026-01-01T03:00:00Z")
    ]
    assert ended.stop_at == t + timedelta(hours=3)

    # Asked to stop after usage already ran past the request: no more usage, and the stop does not
    # precede what was reported.
    asked = agents.usage_plan(
        doc(
            state="stop_requested",
            stop_requested_at="2026-01-01T01:00:00Z",
            last_usage_end_at="2026-01-01T01:00:20Z",
        ),
        now=t + timedelta(hours=1, minutes=1),
    )
    assert asked.records == [] and asked.stop_at == t + timedelta(hours=1, seconds=20)
