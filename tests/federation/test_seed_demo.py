"""The demo world (`manage.py seed_demo`) and its simulated agents (`manage.py simulate_agents`)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from io import StringIO
from pathlib import Path
from random import Random

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import F
from django.utils import timezone

from core.models import ApiToken, Membership, Organisation
from core.services import api_token_authenticate, api_token_revoke
from core.types import Actor
from federation import catalog, services
from federation.management.commands.seed_demo import DEMO_PASSWORD, OPERATORS, demo_fleet, read_tokens_file
from federation.management.commands.simulate_agents import AgentFleet, IslandWalk, latency_report
from federation.models import (
    Cluster,
    ClusterStatus,
    ClusterStatusChange,
    Health,
    HubLatency,
    Island,
    IssuedIdentifier,
)
from federation.types import IslandReport

EIGHT_HUBS = {"jjj", "yrd", "gba", "cy", "nmg", "gz", "gs", "nx"}


def seed(tokens_file: Path) -> str:
    out = StringIO()
    call_command("seed_demo", tokens_file=tokens_file, port=8000, stdout=out)
    return out.getvalue()


def counts() -> dict[str, int]:
    return {
        "users": get_user_model().objects.count(),
        "organisations": Organisation.objects.count(),
        "memberships": Membership.objects.count(),
        "clusters": Cluster.objects.count(),
        "islands": Island.objects.count(),
        "identifiers": IssuedIdentifier.objects.count(),
        "status_changes": ClusterStatusChange.objects.count(),
        "tokens": ApiToken.objects.count(),
        "active_tokens": ApiToken.objects.filter(revoked_at__isnull=True).count(),
    }


def test_demo_fleet_is_deterministic_and_covers_every_hub() -> None:
    first, second = demo_fleet(), demo_fleet()

    assert first == second
    assert {plan.hub for plan in first} == EIGHT_HUBS
    assert len({plan.cpi for plan in first}) == len(first)
    # Chips with figures (the vendor's own, or reported by server vendors like the Ascend 910B bins).
    with_figures = {spec["slug"] for spec in catalog.ACCELERATORS if spec["tflops"] is not None}
    assert sum(plan.accelerator in with_figures for plan in first) >= 0.9 * len(first)


@pytest.mark.django_db
def test_seed_demo_creates_operators_clusters_in_all_hubs_and_both_chip_families(tmp_path: Path) -> None:
    output = seed(tmp_path / "tokens.json")

    operators = Organisation.objects.filter(is_operator=True)
    assert 4 <= operators.count() <= 6
    assert set(operators.values_list("slug", flat=True)) == {plan.slug for plan in OPERATORS}
    clusters = Cluster.objects.select_related("hub", "accelerator")
    assert {cluster.hub.code for cluster in clusters} == EIGHT_HUBS
    vendors = {cluster.accelerator.vendor for cluster in clusters}
    assert "NVIDIA" in vendors
    assert vendors - {"NVIDIA"}, "no domestic chips in the demo"
    # Registered through the service: identifiers issued, totals kept, history recorded.
    assert IssuedIdentifier.objects.count() == clusters.count() + Island.objects.count()
    for cluster in clusters:
        assert cluster.total_cards == sum(cluster.islands.values_list("cards", flat=True))
        assert cluster.status_changes.filter(reason="registered").exists()
    assert clusters.filter(status=ClusterStatus.DRAINING).count() == 1

    admin = get_user_model().objects.get(username="admin")
    assert admin.is_staff and admin.is_superuser and admin.check_password(DEMO_PASSWORD)
    assert Organisation.objects.get(slug="cardhour").is_platform
    for plan in OPERATORS:
        owner = get_user_model().objects.get(username=plan.username)
        assert owner.check_password(DEMO_PASSWORD)
        assert Membership.objects.filter(organisation__slug=plan.slug, user=owner, role="owner").exists()

    for url in ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/api/docs/", "http://127.0.0.1:8000/admin/"):
        assert url in output
    assert f"admin / {DEMO_PASSWORD}" in output
    assert f"zwicc-ops / {DEMO_PASSWORD}" in output


@pytest.mark.django_db
def test_seed_demo_writes_one_working_token_per_operator(tmp_path: Path) -> None:
    tokens_file = tmp_path / "var" / "tokens.json"

    seed(tokens_file)

    tokens = read_tokens_file(tokens_file)
    assert set(tokens) == {plan.slug for plan in OPERATORS}
    for slug, secret in tokens.items():
        token = api_token_authenticate(raw=secret)
        assert token is not None and token.organisation.slug == slug
    assert tokens_file.stat().st_mode & 0o077 == 0, "the token file must be private"


@pytest.mark.django_db
def test_seed_demo_twice_changes_nothing_and_prints_the_same(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.json"
    first_output = seed(tokens_file)
    first_counts = counts()
    first_tokens = tokens_file.read_text()
    first_clusters = list(Cluster.objects.values_list("cpi", "status", "total_cards", "updated_at"))

    second_output = seed(tokens_file)

    assert counts() == first_counts
    assert second_output == first_output
    assert tokens_file.read_text() == first_tokens
    assert list(Cluster.objects.values_list("cpi", "status", "total_cards", "updated_at")) == first_clusters


@pytest.mark.django_db
def test_seed_demo_reissues_a_revoked_or_lost_token_and_revokes_the_lost_one(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.json"
    seed(tokens_file)
    before = read_tokens_file(tokens_file)
    cucc = Organisation.objects.get(slug="cucc")
    revoked = api_token_authenticate(raw=before["cucc"])
    assert revoked is not None
    api_token_revoke(organisation=cucc, token_id=revoked.pk)

    seed(tokens_file)
    after_revocation = read_tokens_file(tokens_file)
    tokens_file.unlink()
    seed(tokens_file)
    after_loss = read_tokens_file(tokens_file)

    assert after_revocation["cucc"] != before["cucc"]
    assert {k: v for k, v in after_revocation.items() if k != "cucc"} == {
        k: v for k, v in before.items() if k != "cucc"
    }
    assert after_loss.keys() == after_revocation.keys()
    assert all(after_loss[slug] != after_revocation[slug] for slug in after_loss)
    for organisation in Organisation.objects.filter(is_operator=True):
        # Exactly one live demo-agent token per operator: the one on file.
        assert organisation.api_tokens.filter(revoked_at__isnull=True).count() == 1
    assert all(api_token_authenticate(raw=secret) is not None for secret in after_loss.values())


@pytest.mark.django_db
def test_simulated_heartbeats_are_plausible_and_accepted(tmp_path: Path) -> None:
    """The agents' bodies pass the heartbeat service's rules round after round (the HTTP leg is covered
    by the live-server test below)."""
    seed(tmp_path / "tokens.json")
    fleet = AgentFleet(seed=7)
    agents = fleet.refresh(operators=[plan.slug for plan in OPERATORS])
    assert len(agents) == Cluster.objects.count()
    start = timezone.now() - timedelta(minutes=10)

    for round_number in range(3):
        sent_at = start + timedelta(seconds=30 * round_number)
        for agent in agents:
            body = agent.beat(sent_at=sent_at)
            cluster = Cluster.objects.get(cpi=agent.cpi)
            result = services.heartbeat_record(
                actor=Actor(organisation=cluster.operator, system_label="test agent"),
                cluster=cluster,
                sent_at=sent_at,
                health=body["health"],
                islands=[IslandReport(**island) for island in body["islands"]],
            )
            assert result.applied
            assert body["health"] in {Health.OK, Health.DEGRADED, Health.CRITICAL}

    for cluster in Cluster.objects.all():
        assert 0 <= cluster.available_cards <= cluster.total_cards
    # The walk moves: not every island reports the same free cards as at registration (K2 = K1).
    assert Island.objects.exclude(available_cards=F("cards")).exists()


def test_agent_walk_is_deterministic() -> None:
    def run() -> list[tuple[int, int]]:
        walk = IslandWalk(name="isl-01", cards=512, rng=Random("2026:cpi:cucc:nx:zw-ai01:isl-01"))
        states = []
        for _ in range(200):
            walk.step()
            assert 0 <= walk.available <= walk.cards - walk.unhealthy
            states.append((walk.available, walk.unhealthy))
        return states

    assert run() == run()


@pytest.mark.django_db(transaction=True)
def test_simulate_agents_once_beats_every_demo_cluster_over_http(live_server, tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.json"
    seed(tokens_file)
    silent = "cpi:cucc:nx:zw-ai01"
    assert Cluster.objects.filter(cpi=silent).exists()

    call_command(
        "simulate_agents",
        once=True,
        base_url=live_server.url,
        tokens_file=tokens_file,
        silent=[silent],
        startup_timeout=10,
    )

    beaten = Cluster.objects.filter(last_heartbeat_at__isnull=False)
    assert beaten.count() == Cluster.objects.count() - 1
    assert not beaten.filter(cpi=silent).exists()
    assert Cluster.objects.exclude(health=Health.UNKNOWN).count() == beaten.count()
    # The first round also reports latencies: every pair between the eight hubs (each hub has demo
    # clusters) is now measured, with the simulated figures of latency_report; ext keeps its policy tier.
    measured = HubLatency.objects.filter(origin="measured").select_related("source", "target")
    assert measured.count() == 64
    expected = {
        (m["source"], m["target"]): Decimal(str(m["latency_ms"]))
        for m in latency_report(
            hubs=sorted(EIGHT_HUBS), seed=2026, round_number=0, measured_at=timezone.now()
        )["measurements"]
    }
    assert {(row.source.code, row.target.code): row.latency_ms for row in measured} == expected
    assert Decimal("25.515") <= expected[("yrd", "nx")] <= Decimal("30.375")  # 24.3 × 1.05–1.25
    assert set(HubLatency.objects.exclude(origin="measured").values_list("origin", flat=True)) == {"policy"}


@pytest.mark.django_db(transaction=True)
def test_simulate_agents_without_tokens_fails_and_says_why(live_server, tmp_path: Path, caplog) -> None:
    with pytest.raises(CommandError, match="failed"):
        call_command(
            "simulate_agents",
            once=True,
            base_url=live_server.url,
            tokens_file=tmp_path / "missing.json",
            startup_timeout=5,
        )
    assert "run `manage.py seed_demo` first" in caplog.text


def test_simulate_agents_gives_up_when_the_server_never_comes_up(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="did not come up"):
        call_command(
            "simulate_agents",
            once=True,
            base_url="http://127.0.0.1:9",
            tokens_file=tmp_path / "t.json",
            startup_timeout=0.5,
        )
