"""When no island can take a job: the nearest changes to it that would produce a quote.

Each candidate change loosens one constraint the rejections point at — the pinned cluster, the latency
budget (to the next latencies from the origin hub), the chip (any chip with the figures asked), memory,
fabric, the minimum reliability, the price cap, the window (up to the planning horizon), the placement (spanning the islands of
one cluster) and the number of cards — and is tried by running the matcher again with it. At most
``MAX_TRIES`` runs are made per job, so a job with no quote costs a bounded amount of work. A change that
produces a placement is kept with that placement; its values are the nearest that admit it (the latency
of the next hub that fits, the cap the placement needs, the deadline its run ends by).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, Decimal

from django.conf import settings
from django.utils import timezone

from broker.types import JobSpec, MatchResult, Placement, Relaxation
from federation.selectors import hub_latencies_to_listed_clusters

# Matcher runs at most, per job without a quote (each is one in-memory match, a few ms at design load).
MAX_TRIES = 10
# Latency budgets tried, from the next latency up.
LATENCY_STEPS = 3
# Tries of the binary search for the most cards that fit.
CARD_STEPS = 4

Find = Callable[[JobSpec], MatchResult]


def relaxations_find(
    *, spec: JobSpec, result: MatchResult, find: Find, now: datetime | None = None
) -> list[Relaxation]:
    """The changes to ``spec`` that would produce a quote, nearest first, one per kind; ``result`` is the
    match that found nothing (its rejection counts choose what to try) and ``find`` runs the matcher
    (limit 1) on a changed spec. Reads only; at most MAX_TRIES calls of ``find``."""
    now = now or timezone.now()
    rejected = {reason for reason, count in result.rejections.items() if count}
    tries = 0
    found: list[Relaxation] = []

    def attempt(changed: JobSpec) -> Placement | None:
        nonlocal tries
        if tries >= MAX_TRIES:
            return None
        tries += 1
        placements = find(changed).placements
        return placements[0] if placements else None

    for kind, candidates in _candidates(spec, rejected, now):
        for changed, changes in candidates:
            if tries >= MAX_TRIES:
                return found
            placement = attempt(changed)
            if placement is None:
                continue
            found.append(
                Relaxation(
                    kind=kind,
                    changes=_nearest(kind, spec, changes, placement),
                    cluster_cpi=placement.cluster_cpi,
                    accelerator=placement.accelerator,
                    start_at=placement.start_at,
                    cost=placement.cost,
                )
            )
            break
    if spec.cards and spec.cards > 1 and "capacity" in rejected and tries < MAX_TRIES:
        fewer = _fewer_cards(spec, attempt)
        if fewer is not None:
            cards, placement = fewer
            found.append(
                Relaxation(
                    kind="cards",
                    changes={"cards": cards},
                    cluster_cpi=placement.cluster_cpi,
                    accelerator=placement.accelerator,
                    start_at=placement.start_at,
                    cost=placement.cost,
                )
            )
    return found


Candidate = tuple[JobSpec, dict[str, object]]


def _candidates(spec: JobSpec, rejected: set[str], now: datetime) -> Iterator[tuple[str, list[Candidate]]]:
    """(kind, [(changed spec, changes), ...]) in the order they are tried: a kind's candidates nearest
    first, the first that produces a placement wins."""
    if spec.only_cluster is not None:
        yield "cluster", [(replace(spec, only_cluster=None), {"cluster": ""})]
    if "latency" in rejected:
        budgets = sorted(
            {
                math.ceil(ms)
                for ms in hub_latencies_to_listed_clusters(
                    origin_hub=spec.origin_hub, above_ms=Decimal(spec.latency_budget_ms)
                )
            }
        )[:LATENCY_STEPS]
        yield "latency", [(replace(spec, latency_budget_ms=ms), {"latency_budget_ms": ms}) for ms in budgets]
    if "chip" in rejected and (spec.accelerators or spec.min_fp16_tflops is not None):
        yield (
            "chip",
            [
                (
                    replace(spec, accelerators=(), min_fp16_tflops=None),
                    {"accelerators": [], "min_fp16_tflops": None},
                )
            ],
        )
    if "memory" in rejected and spec.min_memory_gb is not None:
        yield "memory", [(replace(spec, min_memory_gb=None), {"min_memory_gb": None})]
    if "fabric" in rejected and spec.fabrics:
        yield "fabric", [(replace(spec, fabrics=()), {"fabrics": []})]
    if "reliability" in rejected and spec.min_reliability is not None:
        yield "reliability", [(replace(spec, min_reliability=None), {"min_reliability": None})]
    if "price" in rejected and spec.max_price_per_card_hour is not None:
        yield "price", [(replace(spec, max_price_per_card_hour=None), {"max_price_per_card_hour": None})]
    if rejected & {"capacity", "window", "price"}:
        horizon = (now + timedelta(days=settings.CARDHOUR_PLANNING_HORIZON_DAYS)).replace(microsecond=0)
        earliest = max(spec.earliest_start_at, now)
        if horizon > spec.deadline_at or earliest > spec.earliest_start_at:
            yield (
                "window",
                [
                    (
                        replace(spec, earliest_start_at=earliest, deadline_at=horizon),
                        {"deadline_at": horizon.isoformat()},
                    )
                ],
            )
    if "capacity" in rejected and spec.gang == "island":
        yield "gang", [(replace(spec, gang="cluster"), {"gang": "cluster"})]


def _nearest(kind: str, spec: JobSpec, changes: dict[str, object], placement: Placement) -> dict[str, object]:
    """The change narrowed to what the placement found needs."""
    if kind == "chip":
        return {"accelerators": [placement.accelerator], "min_fp16_tflops": None}
    if kind == "price":
        hours = Decimal(spec.duration_seconds) / 3600 * placement.cards
        if spec.standard_cards is not None and placement.standard_card_factor:
            hours *= placement.standard_card_factor
        cap = (placement.cost / hours).quantize(Decimal("0.01"), ROUND_CEILING)
        return {"max_price_per_card_hour": str(cap)}
    if kind == "reliability" and placement.reliability_percent is not None:
        # The minimum that still admits the placement found: its cluster's score.
        return {"min_reliability": str(placement.reliability_percent)}
    if kind == "window":
        local = timezone.localtime(placement.end_at)
        # The deadline the placement's run ends by, up to the next full hour (what a person would type).
        deadline = local if local.minute == local.second == 0 else local.replace(minute=0, second=0)
        if deadline < local:
            deadline += timedelta(hours=1)
        deadline = min(deadline, datetime.fromisoformat(str(changes["deadline_at"])))
        return {"deadline_at": deadline.isoformat()}
    return changes


def _fewer_cards(
    spec: JobSpec, attempt: Callable[[JobSpec], Placement | None]
) -> tuple[int, Placement] | None:
    """The most cards (fewer than asked) that fit, by a binary search of CARD_STEPS matcher runs; None
    when even the smallest tried does not."""
    assert spec.cards is not None
    low, high = 0, spec.cards - 1  # low: known to fit (0: none yet); high: the most that might
    best: tuple[int, Placement] | None = None
    for _ in range(CARD_STEPS):
        if low >= high:
            break
        cards = max((low + high + 1) // 2, 1)
        placement = attempt(replace(spec, cards=cards))
        if placement is None:
            high = cards - 1
        else:
            low, best = cards, (cards, placement)
    return best
