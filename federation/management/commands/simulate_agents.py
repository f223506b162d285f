"""``manage.py simulate_agents``: the demo operators' agents, beating over the REST API.

Every heartbeat interval each demo cluster reports its islands' available (K2) and unhealthy cards to
``POST /api/v1/clusters/<cpi>/heartbeats`` with its operator's API token — exactly what a real agent
does — so the demo's clusters stay online and their capacity moves. The figures are a deterministic
random walk per island (a fixed seed, and the island's identifier), so two runs tell the same story.

Every ``--latency-every`` rounds (and on the first) each demo operator's agent also reports round-trip
latencies from each hub it runs clusters in to every hub, through ``POST /api/v1/hub-latencies/measurements``,
so measured rows replace the seeded estimates as they would with real agents. These figures are
*simulated*, not measured: the seeded distance estimate (federation.catalog.hub_latency_seed) plus a
deterministic 5–25 % for switching and queueing, which the estimate leaves out; a real agent would probe
its peers. They exist only in a demo database.

It uses only the standard library's urllib on purpose: it must talk HTTP like an outside agent, not call
the services in-process. It waits for the web server to come up, survives a server that goes away (logs,
retries on the next tick), and stops cleanly on SIGINT/SIGTERM. The token secrets come from the file
``seed_demo`` writes (var/demo-agent-tokens.json).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections
from django.utils import timezone

from federation.catalog import HUB_SITES, hub_latency_seed
from federation.management.commands.seed_demo import default_tokens_file, read_tokens_file
from federation.models import Cluster, ClusterStatus, Health

logger = logging.getLogger("cardhour.simulate_agents")

DEFAULT_SEED = 2026
DEFAULT_LATENCY_EVERY = 30  # rounds; at the default 10 s heartbeat interval, every five minutes
REQUEST_TIMEOUT_SECONDS = 10
USER_AGENT = "cardhour-demo-agent/1.0 (urllib)"
# Share of a cluster's cards out of service at which its agent reports degraded / critical health.
DEGRADED_AT = 0.02
CRITICAL_AT = 0.10


@dataclass
class IslandWalk:
    """One island's state: available and unhealthy cards, moving a little every tick.

    The walk stands for the operator's own work on the island (work that is not a Cardhour lease), so
    ``available`` is what K2 means: healthy cards not busy with that work, Cardhour's leases included (the
    platform subtracts its own holds). It drifts around a target with some mean reversion, so an island
    neither fills up nor drains for good; cards fail now and then and come back after a few ticks (a
    failure every few hours is routine at this scale).
    """

    name: str
    cards: int
    rng: random.Random
    available: int = 0
    unhealthy: int = 0
    target_free: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.target_free = self.cards * self.rng.uniform(0.1, 0.6)
        self.available = round(self.target_free)

    def step(self) -> None:
        spread = max(1.0, self.cards * 0.03)
        drift = (self.target_free - self.available) * 0.2
        self.available = round(self.available + drift + self.rng.gauss(0, spread))
        if self.rng.random() < 0.02 + self.cards / 20_000:
            # A card fails, or on a big island sometimes a whole 8-card server.
            self.unhealthy += 8 if self.cards >= 256 and self.rng.random() < 0.2 else 1
        elif self.unhealthy and self.rng.random() < 0.25:
            self.unhealthy -= min(self.unhealthy, 8 if self.unhealthy >= 8 else 1)
        self.unhealthy = min(self.unhealthy, self.cards // 4)
        self.available = max(0, min(self.available, self.cards - self.unhealthy))

    def report(self) -> dict[str, Any]:
        return {"name": self.name, "available_cards": self.available, "unhealthy_cards": self.unhealthy}


@dataclass
class ClusterAgent:
    """The simulated agent of one cluster."""

    cpi: str
    operator: str
    islands: list[IslandWalk]

    def beat(self, *, sent_at: datetime) -> dict[str, Any]:
        """Advance every island one tick and return the heartbeat body."""
        for island in self.islands:
            island.step()
        cards = sum(island.cards for island in self.islands)
        unhealthy = sum(island.unhealthy for island in self.islands)
        share = unhealthy / cards if cards else 0.0
        health = (
            Health.CRITICAL
            if share >= CRITICAL_AT
            else Health.DEGRADED
            if share >= DEGRADED_AT
            else Health.OK
        )
        return {
            "sent_at": sent_at.isoformat(),
            "health": str(health),
            "islands": [island.report() for island in self.islands],
        }


class AgentFleet:
    """The agents of every demo cluster. The inventory is re-read each round, so a cluster registered,
    retired or re-seeded while the simulator runs is picked up without a restart; an island keeps its
    random walk for as long as it exists."""

    def __init__(self, *, seed: int = DEFAULT_SEED):
        self.seed = seed
        self._agents: dict[str, ClusterAgent] = {}

    def refresh(self, *, operators: Sequence[str]) -> list[ClusterAgent]:
        clusters = (
            Cluster.objects.filter(operator__slug__in=operators)
            .exclude(status=ClusterStatus.RETIRED)
            .select_related("operator")
            .prefetch_related("islands")
            .order_by("cpi")
        )
        agents: dict[str, ClusterAgent] = {}
        for cluster in clusters:
            previous = self._agents.get(cluster.cpi)
            walks = {walk.name: walk for walk in previous.islands} if previous else {}
            islands = []
            for island in cluster.islands.all():
                walk = walks.get(island.name)
                if walk is None or walk.cards != island.cards:
                    # String seeds are hashed with SHA-512 by random.Random: stable across processes.
                    walk = IslandWalk(
                        name=island.name, cards=island.cards, rng=random.Random(f"{self.seed}:{island.cpi}")
                    )
                islands.append(walk)
            agents[cluster.cpi] = ClusterAgent(
                cpi=cluster.cpi, operator=cluster.operator.slug, islands=islands
            )
        self._agents = agents
        return list(agents.values())


@dataclass(frozen=True)
class PostResult:
    ok: bool
    status: int | None
    detail: str


class ServerUnreachableError(Exception):
    """The web server did not answer at all (refused, reset, timed out): try again next tick."""


def _request(req: urllib.request.Request) -> tuple[int, bytes]:
    try:
        # The URL is built from --base-url, whose scheme is checked to be http(s) in handle().
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_SECONDS) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise ServerUnreachableError(str(getattr(exc, "reason", exc))) from exc


def post_heartbeat(*, base_url: str, token: str, cpi: str, body: dict[str, Any]) -> PostResult:
    """POST one heartbeat. HTTP errors are results (the server answered); no answer raises
    ServerUnreachableError."""
    return _post_json(
        url=f"{base_url}/api/v1/clusters/{urllib.parse.quote(cpi, safe=':')}/heartbeats",
        token=token,
        body=body,
    )


def post_latencies(*, base_url: str, token: str, body: dict[str, Any]) -> PostResult:
    """POST one batch of latency measurements (see latency_report)."""
    return _post_json(url=f"{base_url}/api/v1/hub-latencies/measurements", token=token, body=body)


def latency_report(
    *, hubs: Sequence[str], seed: int, round_number: int, measured_at: datetime
) -> dict[str, Any]:
    """The simulated measurements of one operator's agents: from each hub in ``hubs`` to every located
    hub, the seeded estimate × a deterministic 1.05–1.25 (switching and queueing the estimate leaves out;
    see the module docstring). One direction per pair: the other hub's agents report theirs."""
    measurements = []
    for source in sorted(hubs):
        if source not in HUB_SITES:
            continue
        for target in HUB_SITES:
            estimate, _ = hub_latency_seed(source, target)
            rng = random.Random(f"{seed}:{source}:{target}:{round_number}")
            latency = (estimate * Decimal(str(rng.uniform(1.05, 1.25)))).quantize(Decimal("0.001"))
            measurements.append(
                {
                    "source": source,
                    "target": target,
                    "latency_ms": str(latency),
                    "measured_at": measured_at.isoformat(),
                }
            )
    return {"measurements": measurements, "symmetric": False}


def _post_json(*, url: str, token: str, body: dict[str, Any]) -> PostResult:
    req = urllib.request.Request(  # noqa: S310 (scheme checked in handle())
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        },
    )
    status, payload = _request(req)
    if 200 <= status < 300:
        return PostResult(ok=True, status=status, detail="")
    try:
        error = json.loads(payload)
        detail = f"{error.get('code')}: {error.get('message')}"
    except (ValueError, AttributeError):
        detail = payload[:200].decode(errors="replace")
    return PostResult(ok=False, status=status, detail=detail)


def server_is_up(base_url: str) -> bool:
    req = urllib.request.Request(f"{base_url}/healthz", headers={"User-Agent": USER_AGENT})  # noqa: S310
    try:
        status, _ = _request(req)
    except ServerUnreachableError:
        return False
    return status == 200


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop`` (the loop finishes the beat in flight and exits); the previous
    handlers are restored afterwards. A no-op off the main thread, where Python allows no handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        logger.info("%s received, stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Command(BaseCommand):
    help = "Simulate the demo operators' agents: POST a heartbeat for every demo cluster every interval."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--base-url",
            default=f"http://127.0.0.1:{os.environ.get('PORT', '8000')}",
            help="The Cardhour web server (default http://127.0.0.1:$PORT, PORT defaulting to 8000).",
        )
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            help="Seconds between rounds (default CARDHOUR_HEARTBEAT_INTERVAL_SECONDS).",
        )
        parser.add_argument(
            "--once", action="store_true", help="Send one round and exit (non-zero if any failed)."
        )
        parser.add_argument(
            "--tokens-file", type=Path, default=None, help="Default var/demo-agent-tokens.json."
        )
        parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="Seed of the random walk.")
        parser.add_argument(
            "--latency-every",
            type=int,
            default=DEFAULT_LATENCY_EVERY,
            help=f"Report hub latencies every N rounds and on the first (default {DEFAULT_LATENCY_EVERY}; 0 never).",
        )
        parser.add_argument(
            "--startup-timeout",
            type=float,
            default=None,
            help="Give up if the server is not up after this many seconds (default: wait forever; 60 with --once).",
        )
        parser.add_argument(
            "--silent",
            action="append",
            default=[],
            metavar="CPI",
            help="Withhold this cluster's beats, to watch the heartbeat monitor take it offline (repeatable).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        base_url: str = options["base_url"].rstrip("/")
        if urllib.parse.urlsplit(base_url).scheme not in {"http", "https"}:
            raise CommandError(f"--base-url must be an http(s) URL, not {base_url!r}.")
        interval: float = options["interval"] or float(settings.CARDHOUR_HEARTBEAT_INTERVAL_SECONDS)
        if interval <= 0:
            raise CommandError("--interval must be positive.")
        once: bool = options["once"]
        tokens_path: Path = options["tokens_file"] or default_tokens_file()
        startup_timeout = options["startup_timeout"]
        if startup_timeout is None and once:
            startup_timeout = 60.0
        silent = set(options["silent"])
        fleet = AgentFleet(seed=options["seed"])
        latency_every: int = options["latency_every"]
        if latency_every < 0:
            raise CommandError("--latency-every must be 0 or more.")
        stop = threading.Event()
        round_number = 0

        with stop_on_signals(stop):
            if not self._wait_for_server(base_url, stop=stop, timeout=startup_timeout):
                if stop.is_set():
                    return
                raise CommandError(f"{base_url} did not come up within {startup_timeout:g} s.")
            logger.info("agents beating to %s every %g s (tokens: %s)", base_url, interval, tokens_path)
            deadline = time.monotonic()
            while not stop.is_set():
                failed = self._round(
                    fleet,
                    base_url=base_url,
                    tokens_path=tokens_path,
                    silent=silent,
                    stop=stop,
                    latencies=bool(latency_every) and round_number % latency_every == 0,
                    round_number=round_number,
                )
                round_number += 1
                if once:
                    if failed:
                        raise CommandError(f"{failed} heartbeat(s) failed.")
                    return
                # A fixed cadence, not a fixed pause: a slow round does not push every later beat back.
                deadline = max(deadline + interval, time.monotonic())
                stop.wait(deadline - time.monotonic())
        logger.info("agents stopped")

    def _wait_for_server(self, base_url: str, *, stop: threading.Event, timeout: float | None) -> bool:
        started = time.monotonic()
        announced = False
        while not stop.is_set():
            if server_is_up(base_url):
                return True
            if not announced:
                logger.info("waiting for the web server at %s ...", base_url)
                announced = True
            if timeout is not None and time.monotonic() - started >= timeout:
                return False
            stop.wait(1.0)
        return False

    def _round(
        self,
        fleet: AgentFleet,
        *,
        base_url: str,
        tokens_path: Path,
        silent: set[str],
        stop: threading.Event,
        latencies: bool = False,
        round_number: int = 0,
    ) -> int:
        """Beat every demo cluster once (and report latencies when ``latencies``). Returns the number of
        failed posts."""
        # The token file is re-read every round: re-running seed_demo may have issued new tokens.
        tokens = read_tokens_file(tokens_path)
        if not tokens:
            logger.error("no agent tokens in %s; run `manage.py seed_demo` first", tokens_path)
            return 1
        close_old_connections()
        try:
            agents = fleet.refresh(operators=sorted(tokens))
        finally:
            # Between rounds the simulator holds no connection: SQLite stays free for the web server.
            close_old_connections()
        applied = 0
        failures: list[str] = []
        for agent in agents:
            if stop.is_set():
                break
            if agent.cpi in silent:
                continue
            body = agent.beat(sent_at=timezone.now())
            try:
                result = post_heartbeat(
                    base_url=base_url, token=tokens[agent.operator], cpi=agent.cpi, body=body
                )
            except ServerUnreachableError as exc:
                logger.warning("web server unreachable (%s); retrying next tick", exc)
                return len(agents) - applied
            if result.ok:
                applied += 1
            else:
                failures.append(f"{agent.cpi}: HTTP {result.status} {result.detail}")
        if latencies and not stop.is_set():
            try:
                failures.extend(
                    self._report_latencies(
                        agents, base_url=base_url, tokens=tokens, seed=fleet.seed, round_number=round_number
                    )
                )
            except ServerUnreachableError as exc:
                logger.warning("web server unreachable (%s); retrying next tick", exc)
                return len(failures) + 1
        if failures:
            logger.warning(
                "heartbeats: %d applied, %d failed; first: %s", applied, len(failures), failures[0]
            )
        else:
            logger.info("heartbeats: %d clusters reported", applied)
        return len(failures)

    def _report_latencies(
        self,
        agents: Sequence[ClusterAgent],
        *,
        base_url: str,
        tokens: dict[str, str],
        seed: int,
        round_number: int,
    ) -> list[str]:
        """Each operator reports from the hubs it runs clusters in. Returns the failures."""
        hubs_by_operator: dict[str, set[str]] = {}
        for agent in agents:
            hubs_by_operator.setdefault(agent.operator, set()).add(agent.cpi.split(":")[2])
        failures = []
        measured_at = timezone.now()
        for operator, hubs in sorted(hubs_by_operator.items()):
            body = latency_report(
                hubs=sorted(hubs), seed=seed, round_number=round_number, measured_at=measured_at
            )
            if not body["measurements"]:
                continue
            result = post_latencies(base_url=base_url, token=tokens[operator], body=body)
            if result.ok:
                logger.info("latencies: %s reported %d pairs", operator, len(body["measurements"]))
            else:
                failures.append(f"latencies of {operator}: HTTP {result.status} {result.detail}")
        return failures
