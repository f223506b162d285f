"""The matcher: every feasible (island, start) of a job, scored with vectorised arithmetic.

For a job of ``D`` seconds in the window ``[t0, deadline)``, candidate starts are ``t0 + k·step``
(``step`` = 15 minutes) for every ``k`` whose run ends by the deadline.

1. **Filter** every island of the catalogue with array masks, in a fixed order; an island is counted once,
   under the first reason it fails (like HTCondor's analysis): ``offline`` (cluster not active), ``chip``
   (model not allowed, too few TFLOPS, or no public TFLOPS for a standard-card job), ``memory``,
   ``fabric``, ``latency`` (origin hub → cluster hub over budget), ``unpriced`` (no price card in force),
   ``price`` (even the cheapest start is over the job's cap), ``capacity`` (not enough free cards for the
   whole duration at any start), ``window`` (no start fits the window any more).
2. **Price** every start at once per tariff: the tariff's multiplier integrated over time is a
   piecewise-linear function ``M``; the cost of a start is ``rate × cards × (M(s + D) − M(s))``, evaluated
   for all starts with one ``searchsorted``.
3. **Capacity**: only islands whose holds in the window could leave too few cards are examined: their
   occupancy per 15-minute slot comes from prefix sums of hold edges, and a start is feasible when no slot
   of its run is short (a sliding window over a prefix count of short slots). Holds are rounded outward to
   whole slots here, so the quote errs on the safe side; acceptance checks exactly.
4. **Rank** one placement per island (or per cluster when the job may span islands) at that island's
   cheapest feasible start (the earliest on a tie), by the job's preference, and price the top ones exactly
   in Decimal, band by band.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np

from broker.catalog import FABRICS, Catalogue, epoch
from broker.types import BandCost, JobSpec, MatchResult, Placement
from metering.tariffs import CompiledTariff

REASONS = ("offline", "chip", "memory", "fabric", "latency", "unpriced", "price", "capacity", "window")
_R = {reason: i + 1 for i, reason in enumerate(REASONS)}
_EXCLUDED = -1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CENT = Decimal("0.01")
_MICRO = Decimal("0.000001")
_E4 = 10**4


def _at(seconds: int) -> datetime:
    return _EPOCH + timedelta(seconds=int(seconds))


@dataclass(frozen=True)
class Window:
    t0: int
    step: int
    duration: int
    starts: int  # K

    @property
    def last_end(self) -> int:
        return self.t0 + (self.starts - 1) * self.step + self.duration

    def start(self, k: int) -> int:
        return self.t0 + k * self.step


def window_of(spec: JobSpec, *, now: datetime, step: int) -> Window:
    t0 = max(epoch(spec.earliest_start_at), math.ceil(now.timestamp()))
    deadline = epoch(spec.deadline_at)
    room = deadline - spec.duration_seconds - t0
    starts = room // step + 1 if room >= 0 else 0
    return Window(t0=t0, step=step, duration=spec.duration_seconds, starts=int(starts))


def integrated_multiplier(tariff: CompiledTariff, window: Window) -> np.ndarray:
    """``M(s + D) − M(s)`` for every start ``s`` of the window, in multiplier × 10⁴ × seconds (exact)."""
    pieces = tariff.slices(window.t0, window.last_end)
    edges = np.fromiter((p[0] for p in pieces), dtype=np.int64, count=len(pieces))
    rates = np.fromiter((tariff.multipliers_e4[p[2]] for p in pieces), dtype=np.int64, count=len(pieces))
    lengths = np.fromiter((p[1] - p[0] for p in pieces), dtype=np.int64, count=len(pieces))
    cumulative = np.concatenate(([0], np.cumsum(rates * lengths)))[:-1]

    def m(points: np.ndarray) -> np.ndarray:
        # The window's last instant belongs to the last piece (its end), hence the clip.
        i = np.clip(np.searchsorted(edges, points, side="right") - 1, 0, len(edges) - 1)
        return cumulative[i] + rates[i] * (points - edges[i])

    starts = window.t0 + np.arange(window.starts, dtype=np.int64) * window.step
    return m(starts + window.duration) - m(starts)


def _ceil_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return -(-a // b)


def match(
    *,
    spec: JobSpec,
    catalogue: Catalogue,
    holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    now: datetime,
    step: int,
    limit: int,
    tariff_of: Callable[[int], CompiledTariff],
) -> MatchResult:
    """Rank the job's feasible placements (see the module docstring). Pure: reads only its arguments."""
    c = catalogue
    window = window_of(spec, now=now, step=step)
    n = c.size
    reason = np.zeros(n, dtype=np.int8)

    def reject(mask: np.ndarray, name: str) -> None:
        reason[(reason == 0) & mask] = _R[name]

    cluster = c.island_cluster
    chip = c.cluster_chip[cluster]
    if spec.exclude_clusters:
        excluded = np.isin(c.cluster_id, np.fromiter(spec.exclude_clusters, dtype=np.int64))
        reason[excluded[cluster]] = _EXCLUDED
    reject(~c.cluster_active[cluster], "offline")
    chip_ok = np.ones(len(c.chip_slugs), dtype=bool)
    if spec.accelerators:
        chip_ok &= np.isin(np.array(c.chip_slugs, dtype=object), list(spec.accelerators))
    if spec.min_fp16_tflops is not None:
        with np.errstate(invalid="ignore"):
            chip_ok &= c.chip_tflops_f >= float(spec.min_fp16_tflops)
    if spec.standard_cards is not None:
        chip_ok &= c.chip_factor_e4 > 0
    reject(~chip_ok[chip], "chip")
    if spec.min_memory_gb is not None:
        with np.errstate(invalid="ignore"):
            reject(~(c.chip_memory_f >= float(spec.min_memory_gb))[chip], "memory")
    if spec.fabrics:
        allowed = np.array([FABRICS.index(f) for f in spec.fabrics if f in FABRICS], dtype=np.int64)
        reject(~np.isin(c.island_fabric, allowed), "fabric")
    try:
        origin = c.hub_codes.index(spec.origin_hub)
        latency = c.latency_ms[origin][c.cluster_hub]  # per cluster
    except ValueError:
        latency = np.full(len(c.cluster_id), np.inf)
    reject((latency > spec.latency_budget_ms)[cluster], "latency")
    reject((c.cluster_tariff == 0)[cluster], "unpriced")

    # Cards each island's chip needs: the job's cards, or its standard cards at the chip's factor.
    if spec.standard_cards is not None:
        standard_e4 = int(spec.standard_cards * _E4)
        factor = np.maximum(c.chip_factor_e4[chip], 1)
        need = _ceil_div(np.full(n, standard_e4, dtype=np.int64), factor)
    else:
        need = np.full(n, int(spec.cards or 0), dtype=np.int64)

    if window.starts == 0:
        reject(reason == 0, "window")
        return _result(reason, [], window, n)

    # Cost per card of every start, per tariff, for the tariffs still in play.
    live = reason == 0
    tariff_ids = np.unique(c.cluster_tariff[cluster[live]]) if live.any() else np.array([], dtype=np.int64)
    delta: dict[int, np.ndarray] = {int(t): integrated_multiplier(tariff_of(int(t)), window) for t in tariff_ids}
    island_tariff = c.cluster_tariff[cluster]
    best_delta = np.zeros(n, dtype=np.float64)
    for t, values in delta.items():
        best_delta[island_tariff == t] = float(values.min())
    rate = c.cluster_rate[cluster]
    if spec.max_price_per_card_hour is not None:
        # Average price per card-hour (per standard card-hour) at the cheapest start of the window.
        per_card_hour = rate * best_delta / (window.duration * _E4)
        if spec.standard_cards is not None:
            per_card_hour = per_card_hour / (np.maximum(c.chip_factor_e4[chip], 1) / _E4)
        cap = float(spec.max_price_per_card_hour) * (1 + 1e-12)
        with np.errstate(invalid="ignore"):
            reject(per_card_hour > cap, "price")

    if spec.gang == "cluster":
        return _match_spanning(spec, c, holds, window, reason, need, latency, delta, limit, tariff_of)

    reject(c.island_capacity < need, "capacity")
    candidates = np.nonzero(reason == 0)[0]
    best_k = np.full(n, -1, dtype=np.int64)
    first_k = np.full(n, -1, dtype=np.int64)
    best_value = np.zeros(n, dtype=np.float64)
    for t, values in delta.items():
        of_t = candidates[island_tariff[candidates] == t]
        best_k[of_t] = int(np.argmin(values))
        first_k[of_t] = 0
        best_value[of_t] = float(values.min())
    tight, ok = _feasible_starts_islands(c, holds, window, candidates, need)
    if len(tight):
        tight_tariff = island_tariff[tight]
        for t, values in delta.items():
            rows = np.nonzero(tight_tariff == t)[0]
            if not len(rows):
                continue
            masked = np.where(ok[rows], values[None, :], np.iinfo(np.int64).max)
            k = np.argmin(masked, axis=1)
            fits = ok[rows].any(axis=1)
            islands = tight[rows]
            best_k[islands] = np.where(fits, k, -1)
            first_k[islands] = np.where(fits, np.argmax(ok[rows], axis=1), -1)
            best_value[islands] = values[k]
    reason[candidates[best_k[candidates] < 0]] = _R["capacity"]
    chosen = candidates[best_k[candidates] >= 0]
    cost = rate[chosen] * need[chosen] * best_value[chosen]
    lat = latency[cluster[chosen]]
    order = _rank(spec, cost, lat, chosen, limit)
    placements = [
        _placement(
            spec, c, window, tariff_of,
            cluster_index=int(cluster[chosen[j]]),
            allocation=[(int(chosen[j]), int(need[chosen[j]]))],
            k=int(best_k[chosen[j]]),
            first_k=int(first_k[chosen[j]]),
            origin=origin,
        )
        for j in order
    ]
    return _result(reason, placements, window, n, feasible=len(chosen))


def _rank(spec: JobSpec, cost: np.ndarray, latency: np.ndarray, tie: np.ndarray, limit: int) -> list[int]:
    """Positions of the best ``limit`` entries by the job's preference; ``tie`` (ids) breaks exact ties."""
    if not len(cost):
        return []
    if spec.preference == "latency":
        keys: tuple[np.ndarray, ...] = (tie, cost, latency)
    elif spec.preference == "weighted":
        weight = float(spec.price_weight)

        def spread(x: np.ndarray) -> np.ndarray:
            lo, hi = float(x.min()), float(x.max())
            return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)

        score = np.round(weight * spread(cost) + (1 - weight) * spread(latency), 12)
        keys = (tie, latency, cost, score)
    else:
        keys = (tie, latency, cost)
    if len(cost) > 4 * limit:  # only the best few need a full sort
        primary = keys[-1]
        cut = np.partition(primary, limit - 1)[limit - 1]
        keep = np.nonzero(primary <= cut)[0]
        order = np.lexsort(tuple(key[keep] for key in keys))
        return [int(keep[i]) for i in order[:limit]]
    return [int(i) for i in np.lexsort(keys)[:limit]]


def _hold_slots(window: Window, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    slots = -(-(window.last_end - window.t0) // window.step)
    first = np.clip((starts - window.t0) // window.step, 0, slots)
    last = np.clip(-(-(ends - window.t0) // window.step), 0, slots)
    return first, last, int(slots)


def _occupancy(rows: np.ndarray, first: np.ndarray, last: np.ndarray, cards: np.ndarray, count: int, slots: int) -> np.ndarray:
    diff = np.zeros((count, slots + 1), dtype=np.int64)
    np.add.at(diff, (rows, first), cards)
    np.add.at(diff, (rows, last), -cards)
    return np.cumsum(diff, axis=1)[:, :slots]


def _feasible_starts_islands(
    c: Catalogue,
    holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    window: Window,
    candidates: np.ndarray,
    need: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The candidate islands whose holds in the window could leave fewer than ``need`` cards, and for
    each a boolean per start, True where the whole run fits. Other candidates fit at every start."""
    empty = (np.zeros(0, dtype=np.int64), np.zeros((0, window.starts), dtype=bool))
    hold_island, hold_start, hold_end, hold_cards = holds
    if not len(hold_island) or not len(candidates):
        return empty
    index = np.clip(np.searchsorted(c.island_id, hold_island), 0, c.size - 1)
    is_candidate = np.zeros(c.size, dtype=bool)
    is_candidate[candidates] = True
    keep = (c.island_id[index] == hold_island) & is_candidate[index]
    if not keep.any():
        return empty
    index, hold_start, hold_end, hold_cards = index[keep], hold_start[keep], hold_end[keep], hold_cards[keep]
    held = np.bincount(index, weights=hold_cards, minlength=c.size)
    tight = np.nonzero((held + need > c.island_capacity) & is_candidate)[0]
    if not len(tight):
        return empty
    row_of = np.full(c.size, -1, dtype=np.int64)
    row_of[tight] = np.arange(len(tight))
    in_tight = row_of[index] >= 0
    first, last, slots = _hold_slots(window, hold_start[in_tight], hold_end[in_tight])
    occupancy = _occupancy(row_of[index[in_tight]], first, last, hold_cards[in_tight], len(tight), slots)
    short = occupancy > (c.island_capacity[tight] - need[tight])[:, None]
    run = -(-window.duration // window.step)
    prefix = np.concatenate([np.zeros((len(tight), 1), dtype=np.int64), np.cumsum(short, axis=1)], axis=1)
    k = np.arange(window.starts)
    # Starts sit on the slot grid: start k runs over slots k … k + run − 1.
    blocked = prefix[:, np.minimum(k + run, slots)] - prefix[:, k]
    return tight, blocked == 0


def _match_spanning(
    spec: JobSpec,
    c: Catalogue,
    holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    window: Window,
    reason: np.ndarray,
    need: np.ndarray,
    latency: np.ndarray,
    delta: dict[int, np.ndarray],
    limit: int,
    tariff_of: Callable[[int], CompiledTariff],
) -> MatchResult:
    """A job that may span the islands of one cluster: per cluster and start, the cards free on every
    island for the whole run, summed over its islands."""
    n = c.size
    cluster = c.island_cluster
    live = reason == 0
    total = np.bincount(cluster[live], weights=c.island_capacity[live], minlength=len(c.cluster_id))
    cluster_need = np.zeros(len(c.cluster_id), dtype=np.int64)
    cluster_need[cluster] = need
    short_clusters = total < cluster_need
    reason[live & short_clusters[cluster]] = _R["capacity"]
    live = reason == 0
    islands = np.nonzero(live)[0]
    if not len(islands):
        return _result(reason, [], window, n)
    # Free cards of every live island over each start's run.
    run = -(-window.duration // window.step)
    free = np.repeat(c.island_capacity[islands][:, None], window.starts, axis=1).astype(np.int64)
    hold_island, hold_start, hold_end, hold_cards = holds
    if len(hold_island):
        index = np.clip(np.searchsorted(c.island_id, hold_island), 0, n - 1)
        row_of = np.full(n, -1, dtype=np.int64)
        row_of[islands] = np.arange(len(islands))
        keep = (c.island_id[index] == hold_island) & (row_of[index] >= 0)
        if keep.any():
            first, last, slots = _hold_slots(window, hold_start[keep], hold_end[keep])
            occupancy = _occupancy(row_of[index[keep]], first, last, hold_cards[keep], len(islands), slots)
            k = np.arange(window.starts)
            worst = np.zeros((len(islands), window.starts), dtype=np.int64)
            for offset in range(run):  # the run's busiest slot, start by start
                worst = np.maximum(worst, occupancy[:, np.minimum(k + offset, slots - 1)])
            free = np.maximum(free - worst, 0)
    per_cluster = np.zeros((len(c.cluster_id), window.starts), dtype=np.int64)
    np.add.at(per_cluster, cluster[islands], free)
    candidates = np.unique(cluster[islands])
    placements_raw = []
    for cl in candidates:
        t = int(c.cluster_tariff[cl])
        ok = per_cluster[cl] >= cluster_need[cl]
        if not ok.any():
            reason[islands[cluster[islands] == cl]] = _R["capacity"]
            continue
        values = delta[t]
        k = int(np.argmin(np.where(ok, values, np.iinfo(np.int64).max)))
        rows = np.nonzero(cluster[islands] == cl)[0]
        order = rows[np.lexsort((c.island_id[islands[rows]], -free[rows, k]))]
        left = int(cluster_need[cl])
        allocation = []
        for row in order:
            take = min(int(free[row, k]), left)
            if take > 0:
                allocation.append((int(islands[row]), take))
                left -= take
            if left == 0:
                break
        cost = float(c.cluster_rate[cl]) * float(cluster_need[cl]) * float(values[k])
        placements_raw.append((cost, float(latency[cl]), int(cl), allocation, k, int(np.argmax(ok))))
    if not placements_raw:
        return _result(reason, [], window, n)
    cost = np.array([p[0] for p in placements_raw])
    lat = np.array([p[1] for p in placements_raw])
    order = _rank(spec, cost, lat, np.array([c.cluster_id[p[2]] for p in placements_raw]), limit)
    origin = c.hub_codes.index(spec.origin_hub)
    placements = [
        _placement(
            spec, c, window, tariff_of,
            cluster_index=placements_raw[j][2],
            allocation=placements_raw[j][3],
            k=placements_raw[j][4],
            first_k=placements_raw[j][5],
            origin=origin,
        )
        for j in order
    ]
    return _result(reason, placements, window, n, feasible=len(placements_raw))


def _bands(tariff: CompiledTariff, start: int, end: int, cards: int, rate: Decimal) -> tuple[BandCost, ...]:
    seconds: dict[int, int] = {}
    for s, e, band in tariff.slices(start, end):
        seconds[band] = seconds.get(band, 0) + (e - s)
    out = []
    for band in sorted(seconds, key=lambda b: -tariff.multipliers_e4[b]):
        card_seconds = cards * seconds[band]
        multiplier = Decimal(tariff.multipliers_e4[band]) / _E4
        out.append(
            BandCost(
                band=tariff.bands[band],
                multiplier=multiplier,
                card_seconds=card_seconds,
                card_hours=(Decimal(card_seconds) / 3600).quantize(_MICRO, ROUND_HALF_EVEN),
                cost=(rate * card_seconds * multiplier / 3600).quantize(_CENT, ROUND_HALF_EVEN),
            )
        )
    return tuple(out)


def _placement(
    spec: JobSpec,
    c: Catalogue,
    window: Window,
    tariff_of: Callable[[int], CompiledTariff],
    *,
    cluster_index: int,
    allocation: list[tuple[int, int]],
    k: int,
    first_k: int,
    origin: int,
) -> Placement:
    price = c.cluster_price[cluster_index]
    assert price is not None
    tariff = tariff_of(price.tariff_version_id)
    cards = sum(cards for _, cards in allocation)
    start = window.start(k)
    bands = _bands(tariff, start, start + window.duration, cards, price.rate_per_card_hour)
    cost = sum((b.cost for b in bands), Decimal("0.00"))
    earliest = window.start(first_k)
    first_cost = (
        cost
        if first_k == k
        else sum(
            (b.cost for b in _bands(tariff, earliest, earliest + window.duration, cards, price.rate_per_card_hour)),
            Decimal("0.00"),
        )
    )
    draw = sum((Decimal(b.card_seconds) * b.multiplier for b in bands), Decimal(0)) / 3600
    chip = int(c.cluster_chip[cluster_index])
    factor_e4 = int(c.chip_factor_e4[chip])
    factor = Decimal(factor_e4) / _E4 if factor_e4 else None
    hub = int(c.cluster_hub[cluster_index])
    return Placement(
        cluster_id=int(c.cluster_id[cluster_index]),
        cluster_cpi=c.cluster_cpi[cluster_index],
        operator_id=int(c.cluster_operator[cluster_index]),
        hub=c.hub_codes[hub],
        accelerator=c.chip_slugs[chip],
        allocation=tuple((int(c.island_id[i]), cards) for i, cards in allocation),
        island_cpis=tuple(c.island_cpi[i] for i, _ in allocation),
        cards=cards,
        start_at=_at(start),
        end_at=_at(start + window.duration),
        price_card_id=price.price_card_id,
        price_card_version=price.version,
        rate_per_card_hour=price.rate_per_card_hour,
        tariff=price.tariff_code,
        cost=cost,
        bands=bands,
        latency_ms=c.latency_dec.get((origin, hub), Decimal(0)),
        saving=first_cost - cost,
        earliest_feasible_cost=first_cost,
        standard_card_factor=factor,
        expected_draw=draw.quantize(_MICRO, ROUND_HALF_EVEN),
        expected_standard_draw=(draw * factor).quantize(_MICRO, ROUND_HALF_EVEN) if factor else None,
    )


def _result(
    reason: np.ndarray, placements: list[Placement], window: Window, n: int, feasible: int = 0
) -> MatchResult:
    counts = np.bincount(reason[reason > 0], minlength=len(REASONS) + 1)
    return MatchResult(
        placements=tuple(placements),
        rejections={name: int(counts[_R[name]]) for name in REASONS},
        considered=int((reason != _EXCLUDED).sum()),
        feasible=feasible,
        window_start_at=_at(window.t0),
        window_end_at=_at(window.t0 + max(window.starts - 1, 0) * window.step + window.duration),
    )
