"""Replay Alibaba's production GPU trace through the platform's REST API, on PostgreSQL.

    python -m benchmarks.replay               # the whole trace (9,061 pods; 6,203 of them replayable)
    python -m benchmarks.replay --limit 1500  # the first 1,500 rows of the pod file

What it does, in order:

1. **Trace.** Reads ``../shared/data/traces/alibaba-openb-pods-multigpu.csv`` (9,061 pods: name, cpu_milli,
   memory_mib, num_gpu, gpu_milli — no times, no allowed models) and joins it by pod name to
   ``alibaba-openb-pods-gpuspec.csv`` (8,152 pods with ``gpu_spec``, ``creation_time``, ``scheduled_time``,
   ``deletion_time``). The first 8,152 rows of the multigpu file are exactly the gpuspec pods (every field
   they share is equal); the other 909 (``openb-pod-8152`` … ``-9060``, all asking for 2, 4 or 8 GPUs) are
   the re-sampled gang tasks and have no row in the gpuspec file, hence no times: they are **skipped and
   counted**, never given invented times. Pods with ``num_gpu = 0`` are CPU-only and skipped. Pods that
   never ran (``pod_phase`` Pending, no ``scheduled_time``) have no run length and are skipped and counted.
   Every other pod becomes a job: ``cards = num_gpu``, run length ``deletion_time − scheduled_time``.
2. **Time.** Trace second 0 is 2026-03-02 00:00 Asia/Shanghai. The platform's clock is *simulated*: every
   server process (and this one) reads ``django.utils.timezone.now`` from a shared file that this driver
   moves forward through the trace, so bands fall on the trace's own hours and months close as they
   would. (With the real clock a quote must start in the future while usage must not end in the future;
   no fixed offset satisfies both for a 149-day trace.) The clock moves on a grid of ``--step`` (default
   1 h) and stands still inside a step; steps with nothing due are skipped. At step ``T``, buyers submit
   the jobs created in ``(T, T + step]`` with ``earliest_start_at`` = their trace creation instant (so a
   job reaches the platform up to one step before its trace creation time, and its window starts exactly
   at the trace time), while the operators' agents act on what is due at ``T``: start leases whose start
   has come (``at`` = the lease's start), report usage every ``--report-every-hours`` (default 6 h) and at
   each lease's end — records of at most 1 h, whole seconds, aligned to the lease start — and stop leases
   whose end has come (``at`` = the lease's end, after all their usage). An agent pulls its new leases
   (``GET /operator/leases?state=reserved&after=<cursor>``) when a buyer placed a lease on one of its
   clusters in the step before: what a long poll or a webhook would tell it.
3. **Fleet.** ``alibaba-spot-gpu-nodes.csv`` (4,278 nodes, 10,412 cards) is split node by node over three
   operators and, per (operator, model), one of six sites in six hubs; each operator uploads its share
   through ``POST /api/v1/fleet-imports`` (32 nodes per island; the undisclosed GPU-series-1/2 enter the
   catalog as unknown-spec models). Every cluster gets a price card through the REST API on the
   hub's tariff preset (cn-gd in the Greater Bay Area, cn-nx in Ningxia, flat elsewhere) at a rate per
   card-hour of the chip, the site and the operator (the table of rates is printed).
4. **Jobs.** ``gpu_spec`` models are mapped to catalog slugs through the catalog's aliases (``GET
   /api/v1/accelerators``); a spec model the catalog does not know (G2, G3) is dropped from the list when
   another is known, and a pod with no known model at all is submitted with its lowercased model names, so
   the API answers ``unknown_accelerator`` (reported). Pods are spread over buyers by pod number, each buyer
   in one eastern origin hub. Every job: island gang, 50 ms latency budget (every hub pair is within
   20 ms), price preference, not checkpointable, window ``[creation, creation + --slack-hours + run]``. Each
   job asks for quotes and accepts the best one, falling back to the next on ``capacity_taken``. Buyers'
   packs are credited in this process with ``metering.services.packs.pack_issue`` (what the Stripe webhook
   calls), one pack per chip class, sized at three times the buyer's trace card-hours.
5. **Billing.** Rating (``usage_rate_pending``) runs in this process once per simulated day, and each
   month is closed (``billing_close_period``) one day after it ends; after the last lease, the remaining
   months are closed.
6. **Checks.** Σ cards × run length of the placed jobs (from the CSV) = Σ card-seconds of the usage
   records = Σ card-seconds of the rated segments, to the second (run lengths are whole seconds in the CSV,
   so no rounding was needed; a fractional one would be rounded half-up). The charge is re-derived from the
   CSV run lengths, each lease's start and locked price card, and the tariffs as published by ``GET
   /api/v1/tariffs/<id>`` (own band arithmetic in exact fractions, no platform code), and compared with the
   platform's rated gross to the cent. The saving from valley shifting is computed the same way against
   starting every job at its earliest start on the same cluster and price card, and compared with the Σ of
   the accepted quotes' ``saving``.

The planning horizon (``CARDHOUR_PLANNING_HORIZON_DAYS``, 7 by default) is raised for the replay's servers
to fit the longest job (about 145 days of run plus the slack), unless ``--horizon-days`` says otherwise:
with the default 7 days, the 38 jobs longer than 7 days — 84 % of the trace's card-hours — would be
refused with ``window_beyond_horizon``. The servers run config.settings.test (like every benchmark here) but
with the production matcher catalogue TTL of 5 s (``--catalog-ttl``; the test settings pin it to 0). No
Celery worker runs: no heartbeat monitor (clusters stay active), no failover, no lease event delivery
(operators pull).

A bug this replay found: ``broker.catalog`` reads the wall clock directly (``datetime.now(tz=UTC)`` as the
floor of its hold book's initial load, ``time.time()`` for compaction) instead of ``timezone.now()``. Under a
shifted clock — this replay, or any test that pins ``now`` — its hold book drops every hold that ends before
the *real* now − 1 h (all of the replay's) when it loads (every quote with a TTL of 0) and when it compacts
(every 1,000 quotes), and the matcher then quotes islands whose cards are taken (acceptance catches it:
``capacity_taken``). The servers get a benchmark-side shim that points those two
calls at the simulated clock; ``--no-catalog-clock-fix`` runs without it, to show the effect.

Exits non-zero on an error (a request answered something unexpected, a check failed), never on a figure.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import os
import shutil
import struct
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from benchmarks._common import (
    PROJECT_ROOT,
    BenchDatabase,
    JsonClient,
    Summary,
    Timer,
    WsgiServers,
    django_environment,
    django_setup,
    machine_description,
    ms,
    peak_rss_mb,
    print_table,
    run_on_database,
    serve_wsgi,
)

BENCH_DATABASE = "cardhour_bench_replay"
TRACES = PROJECT_ROOT.parent / "shared" / "data" / "traces"
PODS_FILE = TRACES / "alibaba-openb-pods-multigpu.csv"
SPEC_FILE = TRACES / "alibaba-openb-pods-gpuspec.csv"
FLEET_FILE = TRACES / "alibaba-spot-gpu-nodes.csv"

SHANGHAI = ZoneInfo("Asia/Shanghai")
ANCHOR = datetime(2026, 3, 2, tzinfo=SHANGHAI)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CLOCK_ENV = "CARDHOUR_BENCH_CLOCK_FILE"
CATALOG_FIX_ENV = "CARDHOUR_BENCH_CATALOG_CLOCK_FIX"
CATALOG_TTL_ENV = "CARDHOUR_BENCH_CATALOG_TTL_SECONDS"
USAGE_RECORD_SECONDS = 3600
USAGE_BATCH_MAX = 10_000
LATENCY_BUDGET_MS = 50
QUOTE_LIMIT = 10

# Three operators; each (operator, model) sits at one of six sites, so every model is in three hubs.
OPERATORS = (
    ("cucc", "China Unicom (replay)"),
    ("ctyun", "China Telecom Cloud (replay)"),
    ("cmcc", "China Mobile (replay)"),
)
SITES = (
    ("nx", "Zhongwei", "cn-nx", Decimal("0.80")),
    ("gba", "Shaoguan", "cn-gd", Decimal("1.10")),
    ("nmg", "Ulanqab", "flat", Decimal("0.85")),
    ("gs", "Qingyang", "flat", Decimal("0.82")),
    ("yrd", "Wuhu", "flat", Decimal("1.05")),
    ("gz", "Gui'an", "flat", Decimal("0.88")),
)
OPERATOR_FACTOR = {"cucc": Decimal("1.00"), "ctyun": Decimal("0.97"), "cmcc": Decimal("1.03")}
# List price per card-hour (CNY) of each model of the spot fleet, before the site and operator factors.
# The two undisclosed series have no public figures; their operators price them as they see fit.
BASE_RATE = {
    "A10": Decimal("2.40"),
    "A100-SXM4-80GB": Decimal("12.00"),
    "A800-SXM4-80GB": Decimal("11.50"),
    "H800": Decimal("24.00"),
    "GPU-series-1": Decimal("4.00"),
    "GPU-series-2": Decimal("8.00"),
}
# How the replay's operators spell a trace model in their inventories: the spot trace says bare "H800",
# which the catalog refuses as ambiguous (SXM5 or PCIe); these 8-card nodes are uploaded as SXM5 parts.
INVENTORY_SPELLING = {"H800": "H800-SXM5-80GB"}
BUYER_HUBS = ("yrd", "gba", "jjj", "cy")
BUYERS = 8


# --- The trace ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    name: str
    number: int
    cards: int
    models: tuple[str, ...]  # gpu_spec entries, deduplicated, in file order; () = any model
    creation_s: int
    run_s: int


@dataclass
class TraceIntake:
    rows: int = 0
    cpu_only: int = 0
    unmatched: Counter[int] = field(default_factory=Counter)  # num_gpu → pods with no gpuspec row
    never_scheduled: int = 0
    rounded_runs: int = 0
    pods: list[Pod] = field(default_factory=list)


def _seconds(text: str) -> tuple[int, bool]:
    """Whole seconds of a trace time; rounded half-up when the CSV carries a fraction (it does not)."""
    value = Decimal(text)
    whole = int(value.to_integral_value(rounding="ROUND_HALF_UP"))
    return whole, whole != value


def load_trace(limit: int | None) -> TraceIntake:
    with SPEC_FILE.open(newline="") as handle:
        specs = {row["name"]: row for row in csv.DictReader(handle)}
    intake = TraceIntake()
    with PODS_FILE.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if limit is not None and intake.rows >= limit:
                break
            intake.rows += 1
            cards = int(row["num_gpu"])
            if cards == 0:
                intake.cpu_only += 1
                continue
            spec = specs.get(row["name"])
            if spec is None:
                intake.unmatched[cards] += 1
                continue
            if int(spec["num_gpu"]) != cards:
                raise SystemExit(f"{row['name']}: num_gpu differs between the two pod files")
            if not spec["scheduled_time"]:
                intake.never_scheduled += 1
                continue
            creation, r1 = _seconds(spec["creation_time"])
            scheduled, r2 = _seconds(spec["scheduled_time"])
            deletion, r3 = _seconds(spec["deletion_time"])
            intake.rounded_runs += int(r1 or r2 or r3)
            models = tuple(dict.fromkeys(m.strip() for m in spec["gpu_spec"].split("|") if m.strip()))
            intake.pods.append(
                Pod(
                    name=row["name"],
                    number=int(row["name"].rsplit("-", 1)[1]),
                    cards=cards,
                    models=models,
                    creation_s=creation,
                    run_s=deletion - scheduled,
                )
            )
    return intake


# --- The simulated clock ------------------------------------------------------------------------------------


class SimulatedClock:
    """The platform's "now", shared by every process of the run through an 8-byte file (microseconds since
    the epoch). Only this driver writes it; it only moves forward."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def set(self, at: datetime) -> None:
        micros = (at - EPOCH) // timedelta(microseconds=1)
        os.pwrite(self._fd, struct.pack("<q", micros), 0)

    def now(self) -> datetime:
        (micros,) = struct.unpack("<q", os.pread(self._fd, 8, 0))
        return EPOCH + timedelta(microseconds=micros)


def clock_install(path: str) -> SimulatedClock:
    """Make ``django.utils.timezone.now`` read the shared clock in this process. Every app module calls it
    as ``timezone.now()`` (an attribute lookup at call time), and so do Django's auto_now fields."""
    from django.utils import timezone

    clock = SimulatedClock(Path(path))
    timezone.now = clock.now
    return clock


def serve(argv: Sequence[str]) -> None:
    """One server process: the shared clock, then the project's WSGI application."""
    if len(argv) != 3:
        raise SystemExit("usage: python -m benchmarks.replay serve HOST PORT")
    clock = clock_install(os.environ[CLOCK_ENV])
    import django

    django.setup()
    from django.conf import settings

    # config.settings.test pins the matcher's catalogue TTL to 0 (every quote reloads everything, so tests
    # see each change at once); the servers of a replay run with the production value instead.
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = float(os.environ[CATALOG_TTL_ENV])
    if os.environ.get(CATALOG_FIX_ENV) == "1":
        catalog_clock_fix(clock)
    serve_wsgi(argv[1], int(argv[2]))


def catalog_clock_fix(clock: SimulatedClock) -> None:
    """Put broker.catalog on the platform's clock too. It reads the wall clock directly
    (``datetime.now(tz=UTC)`` for the floor of its initial hold load, ``time.time()`` for compaction)
    instead of ``timezone.now()``, so under a shifted clock its hold book drops every hold that ended
    before the *real* now − 1 h — here, all of them — and quotes islands whose cards are taken (acceptance
    then answers capacity_taken). A benchmark-side shim, reported as a bug; not a change to the broker."""
    import broker.catalog as catalog

    class _Datetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            value = clock.now()
            return value.astimezone(tz) if tz is not None else value.replace(tzinfo=None)

        @classmethod
        def fromtimestamp(cls, t: float, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime.fromtimestamp(t, tz)

    class _Time:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def time() -> float:
            return clock.now().timestamp()

    catalog.datetime = _Datetime  # type: ignore[misc]
    catalog.time = _Time  # type: ignore[assignment]


# --- Tariffs as published, and an independent band calculation ------------------------------------------


WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _minute(label: str) -> int:
    hours, minutes = label.split(":")
    return int(hours) * 60 + int(minutes)


class PublishedTariff:
    """One tariff version as ``GET /api/v1/tariffs/<id>`` publishes it, with its own band arithmetic (no
    platform code): each wall-clock minute of a local day belongs to the window that covers it for that
    day's month and weekday."""

    def __init__(self, detail: dict[str, Any], version: int):
        self.code = detail["code"]
        self.zone = ZoneInfo(detail["time_zone"])
        chosen = next(v for v in detail["versions"] if v["version"] == version)
        self.multiplier = {b["band"]: Fraction(Decimal(b["multiplier"])) for b in chosen["bands"]}
        self.windows = [
            (
                w["band"],
                _minute(w["start"]),
                _minute(w["end"]),
                {WEEKDAYS.index(d.lower()[:3]) for d in w["weekdays"]},
                set(w["months"]),
            )
            for w in chosen["windows"]
        ]
        self._strips: dict[tuple[int, int], list[tuple[int, int, str]]] = {}

    def strip(self, month: int, weekday: int) -> list[tuple[int, int, str]]:
        key = (month, weekday)
        if key not in self._strips:
            minutes: list[str | None] = [None] * 1440
            for band, start, end, weekdays, months in self.windows:
                if month not in months or weekday not in weekdays:
                    continue
                for a, b in [(start, end)] if end > start else [(start, 1440), (0, end)]:
                    for m in range(a, b):
                        minutes[m] = band
            if None in minutes:
                raise SystemExit(f"tariff {self.code}: minute {minutes.index(None)} has no band")
            runs: list[tuple[int, int, str]] = []
            for m, band in enumerate(minutes):
                assert band is not None
                if runs and runs[-1][2] == band:
                    runs[-1] = (runs[-1][0], m + 1, band)
                else:
                    runs.append((m, m + 1, band))
            self._strips[key] = runs
        return self._strips[key]

    def _wall(self, day: date, minute: int) -> datetime:
        if minute >= 1440:
            return datetime.combine(day + timedelta(days=1), dtime(0), self.zone)
        return datetime.combine(day, dtime(minute // 60, minute % 60), self.zone)

    def seconds_by_band(self, start: datetime, end: datetime) -> dict[str, int]:
        """Seconds of ``[start, end)`` in each band."""
        out: dict[str, int] = defaultdict(int)
        day = start.astimezone(self.zone).date()
        while self._wall(day, 0) < end:
            for a, b, band in self.strip(day.month, day.weekday()):
                lo, hi = max(start, self._wall(day, a)), min(end, self._wall(day, b))
                if hi > lo:
                    out[band] += int((hi - lo).total_seconds())
            day += timedelta(days=1)
        return dict(out)

    def cost(self, *, start: datetime, seconds: int, cards: int, rate: Fraction) -> Fraction:
        """rate × card-hours × band multiplier, exactly."""
        by_band = self.seconds_by_band(start, start + timedelta(seconds=seconds))
        return sum(
            (rate * cards * s * self.multiplier[band] / 3600 for band, s in by_band.items()), Fraction(0)
        )


def cents(value: Fraction | Decimal) -> Decimal:
    if isinstance(value, Fraction):
        value = Decimal(value.numerator) / Decimal(value.denominator)
    return value.quantize(Decimal("0.01"), ROUND_HALF_EVEN)


# --- Helpers ------------------------------------------------------------------------------------------------


def iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def epoch_s(value: datetime) -> int:
    return (value - EPOCH) // timedelta(seconds=1)


def at_epoch(seconds: int) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


class ReplayError(Exception):
    pass


def expect(status: int, body: Any, wanted: int | Iterable[int], what: str) -> Any:
    allowed = {wanted} if isinstance(wanted, int) else set(wanted)
    if status not in allowed:
        raise ReplayError(f"{what}: HTTP {status} {str(body)[:500]}")
    return body


def results_of(body: Any) -> list[Any]:
    """A list answer, paginated ({results: [...]}) or not."""
    return body["results"] if isinstance(body, dict) and "results" in body else body


# --- The fleet ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterPrice:
    cpi: str
    operator: str
    hub: str
    site: str
    model: str  # the trace's model name
    accelerator: str  # catalog slug
    tariff: str
    rate: Decimal
    cards: int
    islands: int
    price_card_version: int = 1
    tariff_id: int = 0
    tariff_version: int = 0


def fleet_csvs() -> tuple[dict[str, str], dict[tuple[str, str], tuple[str, str, str, Decimal]]]:
    """Each operator's share of the spot fleet as an inventory CSV with hub and site columns; and the site
    of every (operator, model)."""
    with FLEET_FILE.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    models = sorted({row["gpu_model"] for row in rows})
    where: dict[tuple[str, str], tuple[str, str, str, Decimal]] = {}
    for o, (slug, _) in enumerate(OPERATORS):
        for m, model in enumerate(models):
            hub, site, tariff, factor = SITES[(2 * o + m) % len(SITES)]
            where[(slug, model)] = (hub, site, tariff, factor)
    lines: dict[str, list[str]] = {
        slug: ["gpu_model,gpu_capacity_num,node_name,hub,site"] for slug, _ in OPERATORS
    }
    for index, row in enumerate(rows):
        slug = OPERATORS[index % len(OPERATORS)][0]
        hub, site, _, _ = where[(slug, row["gpu_model"])]
        model = INVENTORY_SPELLING.get(row["gpu_model"], row["gpu_model"])
        lines[slug].append(f"{model},{row['gpu_capacity_num']},{row['node_name']},{hub},{site}")
    return {slug: "\n".join(text) + "\n" for slug, text in lines.items()}, where


def rate_of(*, operator: str, model: str, site_factor: Decimal) -> Decimal:
    return (BASE_RATE[model] * site_factor * OPERATOR_FACTOR[operator]).quantize(Decimal("0.01"))


# --- Buyers -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobPlan:
    pod: Pod
    buyer: int
    accelerators: tuple[str, ...]
    dropped: tuple[str, ...]  # spec models the catalog does not know
    earliest: datetime
    deadline: datetime

    def body(self, origin_hub: str) -> dict[str, Any]:
        return {
            "name": self.pod.name,
            "cards": self.pod.cards,
            "accelerators": list(self.accelerators),
            "gang": "island",
            "origin_hub": origin_hub,
            "latency_budget_ms": LATENCY_BUDGET_MS,
            "earliest_start_at": iso(self.earliest),
            "deadline_at": iso(self.deadline),
            "duration_seconds": self.pod.run_s,
            "checkpointable": False,
            "preference": "price",
            "idempotency_key": self.pod.name,
        }


@dataclass
class JobOutcome:
    plan: JobPlan
    status: str  # placed | no_quote | invalid | accept_failed
    reason: str = ""
    rejections: dict[str, int] = field(default_factory=dict)
    considered: int = 0
    job_id: int = 0
    lease_id: int = 0
    cluster: str = ""
    start_at: datetime | None = None
    end_at: datetime | None = None
    cards: int = 0
    quote_rank: int = 0
    accept_attempts: int = 0
    cost: Decimal = Decimal(0)
    saving: Decimal = Decimal(0)
    price_card: dict[str, Any] = field(default_factory=dict)


REASON_ORDER = ("offline", "chip", "memory", "fabric", "latency", "unpriced", "price", "capacity")


def primary_reason(rejections: dict[str, int]) -> str:
    """The reason most candidates were turned down for (ties: the order of REASON_ORDER)."""
    if not rejections:
        return "none considered"
    order = {reason: i for i, reason in enumerate(REASON_ORDER)}
    return max(rejections, key=lambda r: (rejections[r], -order.get(r, len(order))))


def place_job(client: JsonClient, *, token: str, origin_hub: str, plan: JobPlan) -> JobOutcome:
    """Submit the job, ask for quotes, accept the best one that still has its cards."""
    status, body = client.call(
        "POST", "/api/v1/jobs", token=token, body=plan.body(origin_hub), label="POST /jobs"
    )
    if status == 400 and isinstance(body, dict) and body.get("code") == "job_invalid":
        codes = sorted({e.get("code", "?") for e in body.get("extra", {}).get("errors", [])})
        return JobOutcome(plan=plan, status="invalid", reason=",".join(codes))
    job = expect(status, body, (200, 201), f"POST /jobs {plan.pod.name}")
    outcome = JobOutcome(plan=plan, status="no_quote", job_id=job["id"])
    status, body = client.call(
        "POST",
        f"/api/v1/jobs/{job['id']}/quotes",
        token=token,
        body={"limit": QUOTE_LIMIT},
        label="POST /jobs/<id>/quotes",
    )
    answer = expect(status, body, (200, 201), f"quotes of {plan.pod.name}")
    outcome.rejections = {k: int(v) for k, v in (answer.get("rejections") or {}).items()}
    outcome.considered = int(answer.get("considered") or 0)
    quotes = sorted(answer.get("quotes") or [], key=lambda q: q["rank"])
    if not quotes:
        outcome.reason = primary_reason(outcome.rejections)
        return outcome
    for quote in quotes:
        outcome.accept_attempts += 1
        status, body = client.call(
            "POST",
            f"/api/v1/quotes/{quote['id']}/accept",
            token=token,
            body={},
            label="POST /quotes/<id>/accept",
        )
        if status in (200, 201):
            outcome.status = "placed"
            outcome.lease_id = body["id"]
            outcome.cluster = (
                quote["cluster"] if isinstance(quote["cluster"], str) else quote["cluster"]["cpi"]
            )
            outcome.start_at = parse_time(body["start_at"])
            outcome.end_at = parse_time(body["end_at"])
            outcome.cards = int(body["cards"])
            outcome.quote_rank = int(quote["rank"])
            outcome.cost = Decimal(str(quote["cost"]))
            outcome.saving = Decimal(str(quote.get("saving") or "0"))
            outcome.price_card = quote.get("price_card") or {}
            return outcome
        code = body.get("code") if isinstance(body, dict) else None
        if status == 409 and code in ("capacity_taken", "cluster_unavailable"):
            outcome.reason = code
            continue
        if status == 402:
            outcome.status = "accept_failed"
            outcome.reason = code or "insufficient_balance"
            return outcome
        raise ReplayError(f"accept quote {quote['id']} of {plan.pod.name}: HTTP {status} {str(body)[:500]}")
    outcome.status = "accept_failed"
    return outcome


# --- The operators' agents ------------------------------------------------------------------------------------


@dataclass
class AgentLease:
    id: int
    cards: int
    start: int  # epoch seconds
    end: int
    reported_until: int
    records: int = 0
    started: bool = False
    stopped: bool = False


@dataclass
class OperatorAgent:
    """An operator's agent. It pulls its new leases when told that something changed (the long poll or
    webhook of a real agent; here the driver says so after a step in which a buyer placed a lease on one of
    its clusters), starts each lease at its start, reports usage every ``report_every`` seconds of the
    clock (on a fixed schedule from the anchor) and at each lease's end — records of at most an hour,
    whole seconds, aligned to the lease start — and stops each lease at its end once all its usage is in.
    It knows only what the operator API tells it."""

    slug: str
    token: str
    report_every: int
    next_report: int
    cursor: int | None = None
    notified: bool = True
    leases: dict[int, AgentLease] = field(default_factory=dict)
    open_leases: set[int] = field(default_factory=set)
    records_sent: int = 0
    batches_sent: int = 0
    pulls: int = 0
    steps: int = 0

    def pull(self, client: JsonClient) -> None:
        while True:
            query = "state=reserved&wait=0&page_size=500" + (
                f"&after={self.cursor}" if self.cursor is not None else ""
            )
            status, body = client.call(
                "GET", f"/api/v1/operator/leases?{query}", token=self.token, label="GET /operator/leases"
            )
            expect(status, body, 200, f"{self.slug} pulls leases")
            self.pulls += 1
            for lease in body["results"]:
                if lease["id"] in self.leases or lease["state"] != "reserved":
                    continue
                start, end = epoch_s(parse_time(lease["start_at"])), epoch_s(parse_time(lease["end_at"]))
                self.leases[lease["id"]] = AgentLease(
                    id=lease["id"], cards=int(lease["cards"]), start=start, end=end, reported_until=start
                )
                self.open_leases.add(lease["id"])
            moved = body["cursor"] != self.cursor
            self.cursor = body["cursor"]
            if not body["results"] or not moved:
                return

    def is_due(self, now: int) -> bool:
        due = self.next_due()
        return self.notified or (due is not None and due <= now)

    def next_due(self) -> int | None:
        times = []
        for lease_id in self.open_leases:
            lease = self.leases[lease_id]
            times.append(lease.end if lease.started else lease.start)
            if lease.started and lease.reported_until < lease.end:
                times.append(self.next_report)
        return min(times, default=None)

    def step(self, client: JsonClient, now: int) -> None:
        self.steps += 1
        if self.notified:
            self.notified = False
            self.pull(client)
        reporting = now >= self.next_report
        if reporting:
            self.next_report += (
                math.ceil((now + 1 - self.next_report) / self.report_every) * self.report_every
            )
        leases = sorted((self.leases[i] for i in self.open_leases), key=lambda x: x.id)
        for lease in leases:
            if not lease.started and lease.start <= now:
                status, body = client.call(
                    "POST",
                    f"/api/v1/operator/leases/{lease.id}/start",
                    token=self.token,
                    body={"at": iso(at_epoch(lease.start))},
                    label="POST /operator/leases/<id>/start",
                )
                expect(status, body, 200, f"{self.slug} starts lease {lease.id}")
                lease.started = True
        records: list[dict[str, Any]] = []
        for lease in leases:
            if not lease.started or not (reporting or lease.end <= now):
                continue
            while lease.reported_until < lease.end:
                start = lease.reported_until
                end = min(start + USAGE_RECORD_SECONDS, lease.end)
                if end > now:
                    break
                records.append(
                    {
                        "lease": lease.id,
                        "idempotency_key": f"lease-{lease.id}-{lease.records}",
                        "start_at": iso(at_epoch(start)),
                        "end_at": iso(at_epoch(end)),
                        "cards": lease.cards,
                    }
                )
                lease.records += 1
                lease.reported_until = end
        for i in range(0, len(records), USAGE_BATCH_MAX):
            batch = records[i : i + USAGE_BATCH_MAX]
            status, body = client.call(
                "POST",
                "/api/v1/operator/usage",
                token=self.token,
                body={"records": batch},
                label="POST /operator/usage",
            )
            expect(status, body, 201, f"{self.slug} reports {len(batch)} usage records")
            if body["created"] != len(batch):
                raise ReplayError(f"{self.slug}: {len(batch)} usage records sent, {body['created']} created")
            self.records_sent += len(batch)
            self.batches_sent += 1
        for lease in leases:
            if lease.started and lease.end <= now and lease.reported_until == lease.end:
                status, body = client.call(
                    "POST",
                    f"/api/v1/operator/leases/{lease.id}/stop",
                    token=self.token,
                    body={"at": iso(at_epoch(lease.end)), "outcome": "completed"},
                    label="POST /operator/leases/<id>/stop",
                )
                expect(status, body, 200, f"{self.slug} stops lease {lease.id}")
                lease.stopped = True
                self.open_leases.discard(lease.id)


# --- Setting up ---------------------------------------------------------------------------------------------


@dataclass
class World:
    operator_tokens: dict[str, str]
    buyer_tokens: list[str]
    buyer_slugs: list[str]
    buyer_hubs: list[str]
    clusters: dict[str, ClusterPrice]
    tariffs: dict[int, dict[str, Any]]  # tariff id → published detail
    catalog: dict[str, str]  # lowercased slug or alias → slug
    fleet_summary: list[list[str]]
    accelerators_created: list[str]


def create_organisations(*, buyers: int) -> tuple[dict[str, str], list[str], list[str]]:
    from core.services import api_token_create, organisation_create

    operator_tokens = {}
    for slug, name in OPERATORS:
        organisation = organisation_create(slug=slug, name=name, is_operator=True)
        operator_tokens[slug] = api_token_create(organisation=organisation, name="replay agent")[1]
    buyer_tokens, buyer_slugs = [], []
    for b in range(buyers):
        slug = f"buyer{b:02d}"
        organisation = organisation_create(slug=slug, name=f"Replay buyer {b}", is_buyer=True)
        buyer_tokens.append(api_token_create(organisation=organisation, name="replay")[1])
        buyer_slugs.append(slug)
    return operator_tokens, buyer_tokens, buyer_slugs


def federate(client: JsonClient, *, operator_tokens: dict[str, str], any_token: str) -> World:
    """Each operator uploads its share of the fleet, then prices every cluster it got."""
    csvs, where = fleet_csvs()
    imported: list[tuple[str, dict[str, Any]]] = []
    created: set[str] = set()
    for slug, text in csvs.items():
        status, body = client.call(
            "POST",
            "/api/v1/fleet-imports?allow_unknown_models=true&nodes_per_island=32",
            token=operator_tokens[slug],
            raw=text.encode(),
            content_type="text/csv",
            label="POST /fleet-imports",
        )
        result = expect(status, body, 201, f"fleet import of {slug}")
        created.update(result["accelerators_created"])
        imported.extend((slug, cluster) for cluster in result["clusters"])

    status, body = client.call("GET", "/api/v1/accelerators?page_size=500", token=any_token)
    named: dict[str, set[str]] = {}
    for accelerator in results_of(expect(status, body, 200, "accelerators")):
        for name in [accelerator["slug"], *(accelerator.get("aliases") or [])]:
            named.setdefault(name.lower(), set()).add(accelerator["slug"])
    # An alias of several models (bare "H100": SXM5 or PCIe) names none of them, as in the API.
    catalog = {name: next(iter(slugs)) for name, slugs in named.items() if len(slugs) == 1}
    model_of = {catalog[INVENTORY_SPELLING.get(model, model).lower()]: model for (_, model) in where}

    status, body = client.call("GET", "/api/v1/tariffs?page_size=100", token=any_token)
    presets = {
        t["code"]: t["id"] for t in results_of(expect(status, body, 200, "tariffs")) if t.get("is_preset")
    }
    clusters: dict[str, ClusterPrice] = {}
    for slug, cluster in imported:
        model = model_of[cluster["accelerator"]]
        hub, site, tariff, factor = where[(slug, model)]
        if (cluster["hub"], cluster["site"]) != (hub, site):
            raise ReplayError(
                f"{cluster['cpi']} landed in {cluster['hub']}/{cluster['site']}, not {hub}/{site}"
            )
        rate = rate_of(operator=slug, model=model, site_factor=factor)
        status, body = client.call(
            "POST",
            f"/api/v1/clusters/{cluster['cpi']}/price-cards",
            token=operator_tokens[slug],
            body={"rate_per_card_hour": f"{rate:.4f}", "tariff_id": presets[tariff]},
            label="POST /clusters/<cpi>/price-cards",
        )
        card = expect(status, body, 201, f"price card of {cluster['cpi']}")
        clusters[cluster["cpi"]] = ClusterPrice(
            cpi=cluster["cpi"],
            operator=slug,
            hub=hub,
            site=site,
            model=model,
            accelerator=cluster["accelerator"],
            tariff=tariff,
            rate=rate,
            cards=cluster["cards"],
            islands=cluster["islands"],
            price_card_version=card["version"],
            tariff_id=card["tariff_id"],
            tariff_version=card["tariff_version"],
        )
    tariffs = {}
    for tariff_id in sorted({c.tariff_id for c in clusters.values()}):
        status, body = client.call("GET", f"/api/v1/tariffs/{tariff_id}", token=any_token)
        tariffs[tariff_id] = expect(status, body, 200, f"tariff {tariff_id}")
    summary = [
        [c.cpi, c.accelerator, c.hub, c.site, str(c.islands), f"{c.cards:,}", c.tariff, f"{c.rate:.2f}"]
        for c in sorted(clusters.values(), key=lambda c: c.cpi)
    ]
    return World(
        operator_tokens=operator_tokens,
        buyer_tokens=[],
        buyer_slugs=[],
        buyer_hubs=[],
        clusters=clusters,
        tariffs=tariffs,
        catalog=catalog,
        fleet_summary=summary,
        accelerators_created=sorted(created),
    )


def credit_packs(
    *, buyer_slugs: Sequence[str], card_hours: dict[int, int], chips: Iterable[str], paid_at: datetime
) -> int:
    """One pack per chip class per buyer, credited as the Stripe webhook would (pack_issue)."""
    from core.models import Organisation
    from federation.models import Accelerator
    from metering.models import PackOrder, PackProduct
    from metering.services.packs import pack_issue

    issued = 0
    accelerators = {a.slug: a for a in Accelerator.objects.filter(slug__in=list(chips))}
    for b, slug in enumerate(buyer_slugs):
        buyer = Organisation.objects.get(slug=slug)
        size = max(1000, 3 * card_hours.get(b, 0))
        for chip, accelerator in sorted(accelerators.items()):
            product, _ = PackProduct.objects.get_or_create(
                code=f"replay-{chip}-{size}"[:64],
                defaults={
                    "name": f"{chip} {size} card-hours",
                    "card_hours": size,
                    "price": size * 8,
                    "accelerator": accelerator,
                },
            )
            order = PackOrder.objects.create(
                buyer=buyer,
                product=product,
                accelerator=accelerator,
                card_hours=size,
                amount=Decimal(size * 8),
                validity_days=365,
                idempotency_key=f"replay-{chip}",
            )
            pack_issue(order=order, paid_at=paid_at, posted_by="replay benchmark")
            issued += 1
    return issued


def plan_jobs(
    pods: Sequence[Pod], *, catalog: dict[str, str], slack: timedelta, buyers: int
) -> tuple[list[JobPlan], Counter[tuple[str, str, str]]]:
    """Jobs from pods; and how each distinct gpu_spec was mapped: (spec, slugs, dropped) → pods."""
    plans = []
    mapping: Counter[tuple[str, str, str]] = Counter()
    for pod in pods:
        known = tuple(dict.fromkeys(catalog[m.lower()] for m in pod.models if m.lower() in catalog))
        dropped = tuple(m for m in pod.models if m.lower() not in catalog)
        # No known model at all: send the names as they are and let the API say what it thinks of them.
        accelerators = known if known or not pod.models else tuple(m.lower() for m in pod.models)
        earliest = ANCHOR + timedelta(seconds=pod.creation_s)
        plans.append(
            JobPlan(
                pod=pod,
                buyer=pod.number % buyers,
                accelerators=accelerators,
                dropped=dropped if known else (),
                earliest=earliest,
                deadline=earliest + slack + timedelta(seconds=pod.run_s),
            )
        )
        mapping[
            (
                "|".join(pod.models) or "(empty: any)",
                ", ".join(accelerators) or "[] (any)",
                ", ".join(dropped) if known else ("none known: sent as is" if pod.models else "—"),
            )
        ] += 1
    return plans, mapping


# --- The replay -------------------------------------------------------------------------------------------


@dataclass
class Billing:
    """The billing jobs Celery beat would run: rating once a simulated day, each month closed a day after
    it ends (in the billing zone, Asia/Shanghai)."""

    next_month: date
    rated_day: date | None = None
    rating_runs: int = 0
    rated: int = 0
    rating_s: float = 0.0
    closes: list[tuple[date, float]] = field(default_factory=list)

    def rate(self, now: datetime) -> None:
        from metering.services.rating import usage_rate_pending

        with Timer() as timer:
            self.rated += usage_rate_pending(now=now)
        self.rating_s += timer.seconds
        self.rating_runs += 1

    def tick(self, now: datetime) -> None:
        from metering.services.billing import billing_close_period

        day = now.astimezone(SHANGHAI).date()
        if day != self.rated_day:
            self.rate(now)
            self.rated_day = day
        while now >= datetime.combine(_month_after(self.next_month), dtime(0), SHANGHAI) + timedelta(days=1):
            self.rate(now)
            with Timer() as timer:
                billing_close_period(period_start=self.next_month, now=now)
            self.closes.append((self.next_month, timer.seconds))
            self.next_month = _month_after(self.next_month)

    def finish(self, clock: SimulatedClock, last: datetime) -> datetime:
        """Close every month up to the one ``last`` falls in; returns the final clock."""
        now = last
        final_month = last.astimezone(SHANGHAI).date().replace(day=1)
        while self.next_month <= final_month:
            now = max(
                now, datetime.combine(_month_after(self.next_month), dtime(0), SHANGHAI) + timedelta(days=1)
            )
            clock.set(now)
            self.tick(now)
        self.rate(now)
        return now


def _month_after(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


@dataclass
class ReplayResult:
    outcomes: list[JobOutcome]
    steps: int
    seconds: float
    last: datetime
    errors: list[str]


def replay(
    *,
    client: JsonClient,
    world: World,
    plans: Sequence[JobPlan],
    agents: Sequence[OperatorAgent],
    clock: SimulatedClock,
    billing: Billing,
    step_s: int,
    concurrency: int,
    progress: Callable[[str], None],
) -> ReplayResult:
    step = timedelta(seconds=step_s)

    def step_of(at: datetime, *, before: bool) -> int:
        """The grid step at or after ``at`` — or, with ``before``, the last one strictly before it."""
        k = math.ceil((at - ANCHOR) / step)
        return k - 1 if before else k

    jobs_by_step: dict[int, list[JobPlan]] = defaultdict(list)
    for plan in plans:
        jobs_by_step[step_of(plan.earliest, before=True)].append(plan)
    job_steps = sorted(jobs_by_step)
    next_job = 0
    wakeups: list[int] = []  # epoch seconds of accepted leases' starts
    outcomes: list[JobOutcome] = []
    errors: list[str] = []
    steps = 0
    k = job_steps[0] if job_steps else 0
    started = time.perf_counter()
    reported = started
    agent_of = {agent.slug: agent for agent in agents}
    with ThreadPoolExecutor(max_workers=concurrency + len(agents)) as pool:
        while True:
            now = ANCHOR + k * step
            now_s = epoch_s(now)
            clock.set(now)
            steps += 1
            futures = [pool.submit(agent.step, client, now_s) for agent in agents if agent.is_due(now_s)]
            due = jobs_by_step.get(k, [])
            job_futures = [
                pool.submit(
                    place_job,
                    client,
                    token=world.buyer_tokens[plan.buyer],
                    origin_hub=world.buyer_hubs[plan.buyer],
                    plan=plan,
                )
                for plan in due
            ]
            for future in futures:
                try:
                    future.result()
                except ReplayError as exc:
                    errors.append(str(exc))
            for future in job_futures:
                try:
                    outcome = future.result()
                except ReplayError as exc:
                    errors.append(str(exc))
                    continue
                outcomes.append(outcome)
                if outcome.start_at is not None:
                    heapq.heappush(wakeups, epoch_s(outcome.start_at))
                    agent_of[world.clusters[outcome.cluster].operator].notified = True
            if errors:
                break
            while next_job < len(job_steps) and job_steps[next_job] <= k:
                next_job += 1
            billing.tick(now)
            while wakeups and wakeups[0] <= now_s:
                heapq.heappop(wakeups)
            candidates = [job_steps[next_job]] if next_job < len(job_steps) else []
            candidates += [
                step_of(at_epoch(due_s), before=False)
                for due_s in (a.next_due() for a in agents)
                if due_s is not None
            ]
            if wakeups:
                candidates.append(step_of(at_epoch(wakeups[0]), before=False))
            if not candidates:
                break
            k = max(k + 1, min(candidates))
            if time.perf_counter() - reported > 30:
                reported = time.perf_counter()
                placed = sum(1 for o in outcomes if o.status == "placed")
                progress(
                    f"  … {now.astimezone(SHANGHAI):%Y-%m-%d %H:%M} simulated: {len(outcomes):,}/{len(plans):,} jobs "
                    f"({placed:,} placed), {sum(a.records_sent for a in agents):,} usage records, "
                    f"{steps:,} steps, {reported - started:.0f} s"
                )
    return ReplayResult(
        outcomes=outcomes,
        steps=steps,
        seconds=time.perf_counter() - started,
        last=ANCHOR + k * step,
        errors=errors,
    )


# --- Checks and report ----------------------------------------------------------------------------------------


def card_hours(card_seconds: int) -> str:
    return f"{Decimal(card_seconds) / 3600:,.2f}"


def micro_cny(value: int) -> Decimal:
    return Decimal(value).scaleb(-6)


def report(
    *,
    args: argparse.Namespace,
    intake: TraceIntake,
    world: World,
    plans: Sequence[JobPlan],
    mapping: Counter[tuple[str, str, str]],
    result: ReplayResult,
    agents: Sequence[OperatorAgent],
    billing: Billing,
    client: JsonClient,
    timings: dict[str, float],
    server_rss: Sequence[float],
) -> list[str]:
    """Print the tables; return the failed checks."""
    from django.db import connection
    from django.db.models import Count, Sum

    from metering.models import Invoice, LedgerEntry, RatedSegment, Settlement, UsageRecord

    failures: list[str] = []
    outcomes = sorted(result.outcomes, key=lambda o: o.plan.pod.number)
    placed = [o for o in outcomes if o.status == "placed"]

    # Intake.
    trace_cs = lambda pods: sum(p.cards * p.run_s for p in pods)  # noqa: E731
    unmatched = sum(intake.unmatched.values())
    print_table(
        "Trace intake (alibaba-openb-pods-multigpu.csv joined by name to alibaba-openb-pods-gpuspec.csv)",
        ["pods", "count", "note"],
        [
            ["rows read", f"{intake.rows:,}", f"--limit {args.limit}" if args.limit else "the whole file"],
            ["skipped: num_gpu = 0 (CPU only)", f"{intake.cpu_only:,}", ""],
            [
                "skipped: no row in the gpuspec file",
                f"{unmatched:,}",
                "no times, no gpu_spec; num_gpu "
                + ", ".join(f"{n}: {c}" for n, c in sorted(intake.unmatched.items())),
            ],
            [
                "skipped: never scheduled (Pending)",
                f"{intake.never_scheduled:,}",
                "no scheduled_time, no run length",
            ],
            [
                "replayed as jobs",
                f"{len(intake.pods):,}",
                f"{card_hours(trace_cs(intake.pods))} card-hours in the trace; runs rounded: {intake.rounded_runs}",
            ],
        ],
    )
    print_table(
        "gpu_spec → catalog slugs (through the catalog's aliases)",
        ["gpu_spec", "accelerators sent", "dropped (not in the catalog)", "pods"],
        [[spec, slugs, dropped, f"{n:,}"] for (spec, slugs, dropped), n in mapping.most_common()],
    )

    # Jobs.
    rows = []
    by_status: dict[str, list[JobOutcome]] = defaultdict(list)
    for o in outcomes:
        key = {
            "placed": "placed",
            "invalid": f"refused by POST /jobs: {o.reason}",
            "no_quote": f"no feasible quote — {o.reason}",
            "accept_failed": f"every quote failed at accept: {o.reason}",
        }[o.status]
        by_status[key].append(o)
    for key in sorted(by_status, key=lambda k: (k != "placed", -len(by_status[k]))):
        group = by_status[key]
        rows.append([key, f"{len(group):,}", card_hours(trace_cs([o.plan.pod for o in group]))])
    rows.append(["total", f"{len(outcomes):,}", card_hours(trace_cs([o.plan.pod for o in outcomes]))])
    print_table(
        "Jobs placed / rejected by reason (reason = why most candidates were turned down)",
        ["outcome", "jobs", "trace card-hours"],
        rows,
    )
    rejections: Counter[str] = Counter()
    for o in outcomes:
        rejections.update(o.rejections)
    if rejections:
        print(
            "candidates rejected over all quote requests: "
            + ", ".join(f"{reason} {n:,}" for reason, n in rejections.most_common() if n)
        )
    retried = [o for o in placed if o.accept_attempts > 1]
    print(
        f"placed on the first quote: {sum(1 for o in placed if o.accept_attempts == 1):,}; after capacity_taken "
        f"on earlier quotes: {len(retried):,} (max attempts {max((o.accept_attempts for o in placed), default=0)})"
    )

    # Placement by chip.
    by_chip: dict[str, list[JobOutcome]] = defaultdict(list)
    for o in placed:
        by_chip[world.clusters[o.cluster].accelerator].append(o)
    seg_by_cluster = {
        row["usage_record__cluster__cpi"]: row
        for row in RatedSegment.objects.values("usage_record__cluster__cpi").annotate(
            cs=Sum("card_seconds"), gross=Sum("gross")
        )
    }
    chip_rows = []
    for chip, group in sorted(by_chip.items()):
        cpis = {o.cluster for o in group}
        gross = sum(seg_by_cluster.get(cpi, {}).get("gross") or 0 for cpi in cpis)
        chip_rows.append(
            [
                chip,
                f"{len(group):,}",
                card_hours(sum(o.plan.pod.cards * o.plan.pod.run_s for o in group)),
                f"{len(cpis)}",
                f"{micro_cny(gross):,.2f}",
            ]
        )
    print_table("Placements by chip", ["chip", "jobs", "card-hours", "clusters used", "gross CNY"], chip_rows)

    # Card-hours check.
    placed_cs = sum(o.plan.pod.cards * o.plan.pod.run_s for o in placed)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(cards * extract(epoch FROM end_at - start_at)), 0)::bigint, "
            "count(*) FILTER (WHERE end_at - start_at > interval '1 hour') FROM metering_usagerecord"
        )
        n_records, usage_cs, long_records = cursor.fetchone()
        cursor.execute(
            "SELECT reference, sum(cards * extract(epoch FROM end_at - start_at))::bigint "
            "FROM metering_usagerecord GROUP BY reference"
        )
        per_lease = dict(cursor.fetchall())
    segments = RatedSegment.objects.aggregate(cs=Sum("card_seconds"), gross=Sum("gross"), n=Count("id"))
    unrated = UsageRecord.objects.unrated().count()
    lease_mismatch = [
        o.plan.pod.name
        for o in placed
        if per_lease.get(f"lease:{o.lease_id}") != o.plan.pod.cards * o.plan.pod.run_s
        or o.cards != o.plan.pod.cards
        or o.end_at is None
        or o.start_at is None
        or int((o.end_at - o.start_at).total_seconds()) != o.plan.pod.run_s
    ]
    cs_ok = placed_cs == usage_cs == (segments["cs"] or 0) and not lease_mismatch and unrated == 0
    print_table(
        "Card-hours: the trace's own against the platform's (card-seconds are integers; compared exactly)",
        ["source", "card-seconds", "card-hours"],
        [
            [
                "Σ cards × (deletion − scheduled) of the placed jobs (CSV)",
                f"{placed_cs:,}",
                card_hours(placed_cs),
            ],
            [
                f"Σ usage records ({n_records:,} records, none over 1 h: {long_records == 0})",
                f"{usage_cs:,}",
                card_hours(usage_cs),
            ],
            [
                f"Σ rated segments ({segments['n']:,} segments; unrated records: {unrated})",
                f"{segments['cs'] or 0:,}",
                card_hours(segments["cs"] or 0),
            ],
        ],
    )
    print(
        f"per lease: usage = cards × run length and lease window = run length for every placed job: "
        f"{not lease_mismatch} ({len(lease_mismatch)} mismatches) → card-hours check {'OK' if cs_ok else 'FAILED'}"
    )
    if not cs_ok:
        failures.append(
            f"card-seconds differ: trace {placed_cs}, usage {usage_cs}, segments {segments['cs']}; leases {lease_mismatch[:5]}"
        )

    # Independent charge and saving.
    published: dict[tuple[int, int], PublishedTariff] = {}

    def tariff_of(cluster: ClusterPrice) -> PublishedTariff:
        key = (cluster.tariff_id, cluster.tariff_version)
        if key not in published:
            published[key] = PublishedTariff(world.tariffs[cluster.tariff_id], cluster.tariff_version)
        return published[key]

    charge = Fraction(0)
    always_now = Fraction(0)
    band_cs: Counter[tuple[str, Decimal]] = Counter()
    saving_mismatch: list[JobOutcome] = []
    explained = 0
    fen_off = 0
    for o in placed:
        cluster = world.clusters[o.cluster]
        tariff = tariff_of(cluster)
        rate = Fraction(cluster.rate)
        pod = o.plan.pod
        assert o.start_at is not None
        actual = tariff.cost(start=o.start_at, seconds=pod.run_s, cards=pod.cards, rate=rate)
        at_earliest = tariff.cost(start=o.plan.earliest, seconds=pod.run_s, cards=pod.cards, rate=rate)
        charge += actual
        always_now += at_earliest
        # Quotes price each band to the fen and add the bands up, so a quoted saving may differ from the
        # exact one by a few fen; beyond that, the quote's saving is against the island's earliest
        # *feasible* start: is there a start on the 15-minute grid that explains it?
        if abs(Fraction(o.saving) - (at_earliest - actual)) > Fraction(5, 100):
            saving_mismatch.append(o)
            k_max = int((o.start_at - o.plan.earliest).total_seconds()) // 900
            if any(
                abs(
                    tariff.cost(
                        start=o.plan.earliest + timedelta(seconds=900 * k),
                        seconds=pod.run_s,
                        cards=pod.cards,
                        rate=rate,
                    )
                    - actual
                    - Fraction(o.saving)
                )
                <= Fraction(5, 100)
                for k in range(1, k_max + 1)
            ):
                explained += 1
        elif cents(at_earliest - actual) != o.saving:
            fen_off += 1
        for band, seconds in tariff.seconds_by_band(
            o.start_at, o.start_at + timedelta(seconds=pod.run_s)
        ).items():
            band_cs[
                (band, Decimal(tariff.multiplier[band].numerator) / tariff.multiplier[band].denominator)
            ] += seconds * pod.cards
        card = o.price_card
        if card and "version" in card and int(card["version"]) != cluster.price_card_version:
            failures.append(f"{pod.name}: quote priced with card v{card['version']}")
    platform_gross = micro_cny(segments["gross"] or 0)
    settled = Settlement.objects.aggregate(g=Sum("gross"))["g"] or Decimal(0)
    charge_ok = cents(charge) == cents(platform_gross)
    quoted_saving = sum((o.saving for o in placed), Decimal(0))
    quoted_cost = sum((o.cost for o in placed), Decimal(0))
    print_table(
        "Charge: re-derived from the CSV, the published tariffs and the locked rates, against the platform",
        ["figure", "CNY"],
        [
            [
                "independent: Σ rate × cards × run seconds in each band × multiplier / 3600 (exact)",
                f"{cents(charge):,.2f}",
            ],
            [
                f"platform: Σ gross of the rated segments (micro-CNY {segments['gross'] or 0:,})",
                f"{cents(platform_gross):,.2f}",
            ],
            [
                "difference (independent − platform, before rounding to the cent)",
                f"{Decimal(float(charge - Fraction(platform_gross))):.6f}",
            ],
            ["platform: Σ gross of the monthly settlements (rounded per settlement)", f"{settled:,.2f}"],
            ["Σ cost of the accepted quotes", f"{quoted_cost:,.2f}"],
        ],
        left_columns=1,
    )
    print(f"charge to the cent: {'OK' if charge_ok else 'FAILED'}")
    if not charge_ok:
        failures.append(f"charge differs: independent {cents(charge)}, platform {cents(platform_gross)}")

    # Spend by band.
    band_rows = []
    by_band = {
        (r["band"], r["multiplier"]): r
        for r in RatedSegment.objects.values("band", "multiplier").annotate(
            cs=Sum("card_seconds"), gross=Sum("gross"), draw=Sum("pack_draw"), n=Count("id")
        )
    }
    total_cs = sum(r["cs"] for r in by_band.values()) or 1
    bands_ok = {k: r["cs"] for k, r in by_band.items()} == {k: v for k, v in band_cs.items() if v}
    for (band, multiplier), r in sorted(by_band.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        band_rows.append(
            [
                band,
                f"{multiplier:.4f}",
                card_hours(r["cs"]),
                f"{100 * r['cs'] / total_cs:.1f} %",
                f"{Decimal(r['draw']).scaleb(-6):,.2f}",
                f"{micro_cny(r['gross']):,.2f}",
                card_hours(band_cs.get((band, multiplier), 0)),
            ]
        )
    print_table(
        "Spend by band (rated segments; pack draw = card-hours × multiplier)",
        ["band", "multiplier", "card-hours", "share", "pack draw", "gross CNY", "independent card-hours"],
        band_rows,
    )
    print(f"card-seconds per (band, multiplier) equal to the independent split: {bands_ok}")
    if not bands_ok:
        failures.append("card-seconds per band differ from the independent split")

    saving = always_now - charge
    print_table(
        "Valley shifting: the placed jobs against starting each at its earliest start (same cluster, same card)",
        ["figure", "CNY"],
        [
            ["always start now: Σ cost at the earliest start (independent)", f"{cents(always_now):,.2f}"],
            ["as placed: Σ cost at the chosen start (independent)", f"{cents(charge):,.2f}"],
            [
                "saving (independent)",
                f"{cents(saving):,.2f} ({float(100 * saving / always_now) if always_now else 0:.2f} %)",
            ],
            ["saving: Σ `saving` of the accepted quotes", f"{quoted_saving:,.2f}"],
        ],
    )
    shifted = [o for o in placed if o.start_at != o.plan.earliest]
    print(
        f"jobs started later than their earliest start: {len(shifted):,} of {len(placed):,}. Quoted savings "
        f"within 5 fen of the independent one: {len(placed) - len(saving_mismatch):,} ({fen_off} of them off by a "
        "fen or more, from pricing each band to the fen); further off: "
        f"{len(saving_mismatch)}, {explained} of them explained by a later earliest *feasible* start on the "
        "15-minute grid (the quote's saving is against that; the island was busy at the earliest start)"
    )
    for o in saving_mismatch[:5]:
        if len(saving_mismatch) > explained:
            print(
                f"  {o.plan.pod.name}: earliest {o.plan.earliest.astimezone(SHANGHAI):%m-%d %H:%M}, start "
                f"{o.start_at.astimezone(SHANGHAI) if o.start_at else None:%m-%d %H:%M}, "
                f"quoted saving {o.saving}, cost {o.cost}"
            )

    # Billing.
    units = {r["unit"]: r["t"] for r in LedgerEntry.objects.values("unit").annotate(t=Sum("amount"))}
    month_rows = []
    invoices = {
        r["period_start"]: r
        for r in Invoice.objects.values("period_start").annotate(
            n=Count("id"), value=Sum("usage_value"), due=Sum("amount_due")
        )
    }
    settlements = {
        r["period_start"]: r
        for r in Settlement.objects.values("period_start").annotate(
            n=Count("id"), gross=Sum("gross"), payable=Sum("payable")
        )
    }
    close_s = dict(billing.closes)
    for month in sorted(set(invoices) | set(settlements) | set(close_s)):
        inv, st = invoices.get(month, {}), settlements.get(month, {})
        month_rows.append(
            [
                f"{month:%Y-%m}",
                str(inv.get("n", 0)),
                f"{inv.get('value') or 0:,.2f}",
                str(st.get("n", 0)),
                f"{st.get('gross') or 0:,.2f}",
                f"{st.get('payable') or 0:,.2f}",
                f"{close_s.get(month, math.nan):.2f}",
            ]
        )
    print_table(
        "Month close (billing_close_period, one day after each month)",
        ["month", "invoices", "usage value CNY", "settlements", "gross CNY", "payable CNY", "close s"],
        month_rows,
    )
    ledger_ok = all(v == 0 for v in units.values())
    print(
        f"rating: {billing.rated:,} records in {billing.rating_runs} runs, {billing.rating_s:.1f} s; "
        f"Σ of every ledger unit is zero: {ledger_ok}"
    )
    if not ledger_ok:
        failures.append(f"ledger does not balance: {units}")

    # Run.
    latency_rows = [
        [
            label,
            *Summary.of(values).ms_cells()[:1],
            *(ms(x) for x in (Summary.of(values).p50, Summary.of(values).p99, Summary.of(values).max)),
        ]
        for label, values in sorted(client.latencies.items())
    ]
    print_table(
        "Requests (latency per request, closed loop)",
        ["request", "n", "p50 ms", "p99 ms", "max ms"],
        latency_rows,
    )
    print_table(
        "Run",
        ["phase", "seconds"],
        [[name, f"{seconds:.1f}"] for name, seconds in timings.items()],
    )
    print(
        f"simulated {ANCHOR:%Y-%m-%d %H:%M} → {result.last.astimezone(SHANGHAI):%Y-%m-%d %H:%M} Asia/Shanghai in "
        f"{result.steps:,} steps of {args.step} s; {sum(a.records_sent for a in agents):,} usage records from "
        f"{len(agents)} operator agents ({sum(a.pulls for a in agents):,} pulls)"
    )
    print(
        f"peak RSS: driver {peak_rss_mb():.0f} MiB; servers "
        + ", ".join("?" if math.isnan(x) else f"{x:.0f} MiB" for x in server_rss)
    )
    return failures


# --- Main -----------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, help="read only the first N rows of the pod file")
    parser.add_argument("--step", type=int, default=3600, help="simulated seconds per step (default 3600)")
    parser.add_argument(
        "--slack-hours", type=float, default=12, help="window = run length + this (default 12)"
    )
    parser.add_argument(
        "--horizon-days", type=int, help="planning horizon of the servers (default: fits the longest job)"
    )
    parser.add_argument(
        "--report-every-hours",
        type=float,
        default=6,
        help="operators report usage this often (and at each lease's end); records are ≤ 1 h (default 6)",
    )
    parser.add_argument(
        "--no-catalog-clock-fix",
        action="store_true",
        help="leave broker.catalog on the real clock (see the bug note in the docstring)",
    )
    parser.add_argument(
        "--catalog-ttl",
        type=float,
        default=5.0,
        help="CARDHOUR_BROKER_CATALOG_TTL_SECONDS of the servers (production default 5; the test settings pin 0)",
    )
    parser.add_argument("--buyers", type=int, default=BUYERS)
    parser.add_argument("--workers", type=int, default=2, help="web server processes")
    parser.add_argument(
        "--concurrency", type=int, default=6, help="buyer threads (each operator agent has its own)"
    )
    parser.add_argument("--database-url", help="an empty PostgreSQL database to use (not dropped)")
    parser.add_argument("--keep", action="store_true", help="do not drop the database created for the run")
    args = parser.parse_args(argv)
    if args.step < 60 or args.step > 86400 or 86400 % args.step:
        parser.error("--step must divide a day and be at least 60 s")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        serve(argv)
        return 0
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="No directory at")
    print("Cardhour trace replay")
    print(f"command: python -m benchmarks.replay {' '.join(argv)}".rstrip())
    print(f"machine: {machine_description()}")
    database = (
        BenchDatabase.existing(args.database_url)
        if args.database_url
        else BenchDatabase.create(name=BENCH_DATABASE)
    )
    return run_on_database(database, lambda db: run(args, db), keep=args.keep)


def run(args: argparse.Namespace, database: BenchDatabase) -> list[str]:
    timings: dict[str, float] = {}
    total = Timer().__enter__()
    intake = load_trace(args.limit)
    slack = timedelta(hours=args.slack_hours)
    longest = max((p.run_s for p in intake.pods), default=0)
    horizon_days = args.horizon_days or math.ceil((longest + slack.total_seconds() + args.step) / 86400) + 1
    print(f"database: {database.url} (PostgreSQL {database.server_version()})")
    print(
        f"trace: {len(intake.pods):,} replayable pods of {intake.rows:,} rows; longest run {longest / 86400:.1f} days → "
        f"planning horizon {horizon_days} days; window slack {args.slack_hours:g} h; step {args.step} s"
    )

    with Timer() as timer:
        django_setup(database_url=database.url, conn_max_age=600)
    timings["migrate"] = timer.seconds
    clock_dir = tempfile.mkdtemp(prefix="cardhour-replay-")
    clock_path = Path(clock_dir) / "clock"
    clock = SimulatedClock(clock_path)
    setup_at = ANCHOR - timedelta(days=1)
    clock.set(setup_at)
    clock_install(str(clock_path))

    environment = {
        **django_environment(database_url=database.url, conn_max_age=600),
        CLOCK_ENV: str(clock_path),
        "CARDHOUR_PLANNING_HORIZON_DAYS": str(horizon_days),
        CATALOG_FIX_ENV: "0" if args.no_catalog_clock_fix else "1",
        CATALOG_TTL_ENV: str(args.catalog_ttl),
    }
    servers = WsgiServers.start(workers=args.workers, environment=environment, module="benchmarks.replay")
    failures: list[str] = []
    clean = False
    try:
        with Timer() as timer:
            operator_tokens, buyer_tokens, buyer_slugs = create_organisations(buyers=args.buyers)
            client = JsonClient(host=servers.host, ports=servers.ports)
            world = federate(client, operator_tokens=operator_tokens, any_token=buyer_tokens[0])
            world.buyer_tokens, world.buyer_slugs = buyer_tokens, buyer_slugs
            world.buyer_hubs = [BUYER_HUBS[b % len(BUYER_HUBS)] for b in range(args.buyers)]
            plans, mapping = plan_jobs(intake.pods, catalog=world.catalog, slack=slack, buyers=args.buyers)
            per_buyer: Counter[int] = Counter()
            for plan in plans:
                per_buyer[plan.buyer] += math.ceil(plan.pod.cards * plan.pod.run_s / 3600)
            packs = credit_packs(
                buyer_slugs=buyer_slugs,
                card_hours=dict(per_buyer),
                chips={c.accelerator for c in world.clusters.values()},
                paid_at=setup_at,
            )
        timings["set-up: organisations, fleet import, price cards, packs"] = timer.seconds
        print(
            f"fleet: {len(world.clusters)} clusters, {sum(c.islands for c in world.clusters.values())} islands, "
            f"{sum(c.cards for c in world.clusters.values()):,} cards over {len(OPERATORS)} operators; "
            f"catalog entries added as unknown-spec: {', '.join(world.accelerators_created) or 'none'}; "
            f"{packs} packs credited to {args.buyers} buyers"
        )
        print_table(
            "Fleet as federated (POST /api/v1/fleet-imports) and priced (POST /api/v1/clusters/<cpi>/price-cards)",
            ["cluster", "chip", "hub", "site", "islands", "cards", "tariff", "CNY/card-h"],
            world.fleet_summary,
        )
        agents = [
            OperatorAgent(
                slug=slug,
                token=token,
                report_every=int(args.report_every_hours * 3600),
                next_report=epoch_s(ANCHOR) + int(args.report_every_hours * 3600),
            )
            for slug, token in operator_tokens.items()
        ]
        billing = Billing(next_month=ANCHOR.date().replace(day=1))
        print(
            f"\nreplaying {len(plans):,} jobs ({args.concurrency} buyer threads, {len(agents)} operator agents, {args.workers} web workers) ...",
            flush=True,
        )
        result = replay(
            client=client,
            world=world,
            plans=plans,
            agents=agents,
            clock=clock,
            billing=billing,
            step_s=args.step,
            concurrency=args.concurrency,
            progress=lambda line: print(line, flush=True),
        )
        timings["replay (jobs, quotes, leases, usage; daily rating and month closes)"] = result.seconds
        if result.errors:
            return result.errors
        with Timer() as timer:
            final = billing.finish(clock, result.last)
        timings["final rating and closes"] = timer.seconds
        print(f"billing finished at {final.astimezone(SHANGHAI):%Y-%m-%d %H:%M} simulated", flush=True)
        clean = not result.errors
    finally:
        servers.stop(keep_log=not clean)
        shutil.rmtree(clock_dir, ignore_errors=True)  # this process keeps its descriptor open
        if not clean:
            print(f"server log: {servers.log_path}")
    with Timer() as timer:
        failures += report(
            args=args,
            intake=intake,
            world=world,
            plans=plans,
            mapping=mapping,
            result=result,
            agents=agents,
            billing=billing,
            client=client,
            timings=timings,
            server_rss=servers.peak_rss_mb,
        )
    total.__exit__()
    print(f"checks and report {timer.seconds:.1f} s; whole run {total.seconds:.1f} s")
    return failures


if __name__ == "__main__":
    sys.exit(main())
