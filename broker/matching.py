"""The matcher: every feasible (island, start) of a job, scored with vectorised arithmetic.

For a job of ``D`` seconds in the window ``[t0, deadline)``, candidate starts are ``t0 + k·step``
(``step`` = 15 minutes) for every ``k`` whose run ends by the deadline.

1. **Filter** the catalogue with array masks, in a fixed order; an island is counted once, under the
   first reason it fails (like HTCondor's analysis). Every reason but ``fabric`` and ``capacity`` is a
   cluster's, so the masks are over clusters; for an island-gang job the islands are never passed over
   one by one either: a cluster's islands per fabric and how many have fewer cards than the job needs are
   read from the catalogue's per-cluster aggregates (``Catalogue.islands_below``), and only the islands
   that holds or heartbeat reports name are looked at (step 3), so a quote's work grows with clusters,
   holds in its window and the offers it returns, not with islands. The reasons: ``offline`` (cluster
   not active), ``chip`` (model not allowed, too few TFLOPS, or no public TFLOPS for a standard-card job), ``memory``,
   ``fabric``, ``latency`` (origin hub → cluster hub over budget), ``unpriced`` (no price card in force),
   ``reliability`` (the cluster's reliability score, or the prior for a new one, is below the job's
   minimum: one comparison per cluster against the catalogue's array), ``price`` (even the cheapest start
   is over the job's cap), ``capacity`` (not enough free cards for the
   whole duration at any start), ``window`` (no start fits the window any more).
2. **Price** every start at once per tariff: the tariff's multiplier integrated over time is a
   piecewise-linear function ``M``; the cost of a start is ``rate × cards × (M(s + D) − M(s))``, evaluated
   for all starts with one ``searchsorted``.
3. **Capacity**: only islands whose holds in the window could leave too few cards are examined: their
   occupancy per 15-minute slot comes from prefix sums of hold edges, and a start is feasible when no slot
   of its run is short (a sliding window over a prefix count of short slots). Holds are rounded outward to
   whole slots here, so the quote errs on the safe side; acceptance checks exactly. The cards an
   operator's unexpired heartbeat keeps from sale (K2) are one more hold per island, over
   ``[t0, report expiry)``: they limit the starts before the next expected heartbeat, never later ones.
4. **Rank** one placement per island (or per cluster when the job may span islands) at that island's
   cheapest feasible start (the earliest on a tie), by the job's preference (``adjusted``: the cost less
   the expected SLA credit, a per-cluster fraction of the cost kept in the catalogue, so it scales the
   cluster's rate and changes nothing else), and price the top ones exactly
   in Decimal, band by band. The islands of a cluster share its cost and latency until a hold moves one's
   start, so island placements are ranked a cluster at a time and only the clusters that can reach the top
   are opened (the same answer as ranking every island: tests/broker/test_matching_property.py).
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

REASONS = (
    "offline",
    "chip",
    "memory",
    "fabric",
    "latency",
    "unpriced",
    "reliability",
    "price",
    "capacity",
    "window",
)
_R = {reason: i + 1 for i, reason in enumerate(REASONS)}
_EXCLUDED = -1
_NEVER = int(np.iinfo(np.int64).max)  # no start: above any integrated multiplier
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CENT = Decimal("0.01")
_MICRO = Decimal("0.000001")
_E4 = 10**4
# A tariff band's multiplier as a Decimal, by its value × 10⁴ (exact at any precision: at most 4 places).
_MULTIPLIERS: dict[int, Decimal] = {}


def _multiplier(e4: int) -> Decimal:
    multiplier = _MULTIPLIERS.get(e4)
    if multiplier is None:
        multiplier = _MULTIPLIERS[e4] = Decimal(e4) / _E4
    return multiplier


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

    @property
    def span(self) -> tuple[int, int]:
        """``[t0, last_end)`` (at least one second): what the window's runs cover, so the holds that can
        block one of its starts are those overlapping it."""
        return self.t0, max(self.last_end, self.t0 + 1)

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
        i = np.minimum(np.maximum(np.searchsorted(edges, points, side="right") - 1, 0), len(edges) - 1)
        return cumulative[i] + rates[i] * (points - edges[i])

    starts = window.t0 + np.arange(window.starts, dtype=np.int64) * window.step
    return m(starts + window.duration) - m(starts)


# integrated_multiplier's answers by tariff (the object, kept alive with its answer so that its id is not
# reused) and window: a job whose window starts later than now has the same window on every quote, and a
# buyer re-quotes a job until it accepts; a job that starts now has a new window every second and is
# computed each time. Bounded: emptied when full (a few KB each). Read-only arrays.
_INTEGRATED: dict[tuple[int, Window], tuple[CompiledTariff, np.ndarray]] = {}
_INTEGRATED_MAX = 1024


def _integrated_multiplier_of(tariff: CompiledTariff, window: Window) -> np.ndarray:
    key = (id(tariff), window)
    known = _INTEGRATED.get(key)
    if known is not None and known[0] is tariff:
        return known[1]
    values = integrated_multiplier(tariff, window)
    values.flags.writeable = False
    if len(_INTEGRATED) >= _INTEGRATED_MAX:
        _INTEGRATED.clear()
    _INTEGRATED[key] = (tariff, values)
    return values


def _live_holds(
    holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], alive: np.ndarray, window: Window
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of ``holds`` that are ``alive`` and overlap ``window``, copied (HoldBook.overlapping)."""
    from broker.matching_kernel import overlapping_rows  # imported here, as in Candidates.rows_of

    island, start, end, cards = holds
    return overlapping_rows(island, start, end, cards, alive, len(island), *window.span)


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
    distinct: bool = False,
    held: np.ndarray | None = None,
    alive: np.ndarray | None = None,
) -> MatchResult:
    """Rank the job's feasible placements (see the module docstring). Pure: reads only its arguments.

    ``holds`` (island id, start, end, cards): the holds, which may include holds outside the window.
    ``alive`` (optional, aligned with ``holds``): only its rows are holds: ``holds`` may then be the hold
    book's rows as they stand (``HoldBook.rows``), which an island gang selects from in the pass that
    picks its candidates' holds, with no copy of the window's holds first.

    ``held`` (optional, by island id): at least the cards each island's live holds occupy at once (the
    hold book's ``HoldBook.held``); an island gang then skips the holds of islands it leaves their need
    free. The answer is the same with or without either (tests/broker/test_matching_property.py).

    With ``distinct``, an island-gang job's placements are *offers*: the islands of a cluster that can
    take the job at the same start (and so at the same cards, price, cost and latency) are one placement,
    its lowest-id island in ``allocation`` and the others in ``alternatives``; ``limit`` counts offers.
    The offers are the island ranking grouped by (cluster, start), in the order of each group's best
    island (tests/broker/test_matching_property.py)."""
    c = catalogue
    window = window_of(spec, now=now, step=step)
    n, m = c.size, len(c.cluster_id)
    # The cluster-level reasons, the latency from the job's hub, the ranking rate and the cards each
    # cluster's chip needs: the job's requirements on this catalogue, whatever its window (kept on the
    # catalogue for the next quote with the same requirements; read-only).
    req = _requirements_of(spec, c)
    before, after, latency, origin = req.before, req.after, req.latency, req.origin
    rank_rate, cluster_need = req.rank_rate, req.cluster_need

    # Cost per card of every start, per tariff (a handful), and each cluster's cheapest start.
    delta: dict[int, np.ndarray] = {}
    cluster_best_k = np.zeros(m, dtype=np.int64)
    cluster_best_value = np.zeros(m, dtype=np.float64)
    if window.starts:
        tariffs, of_cluster = c.tariff_groups  # a handful of tariffs: one integration each
        best_k = np.zeros(len(tariffs) + 1, dtype=np.int64)
        best_value = np.zeros(len(tariffs) + 1, dtype=np.float64)
        for i, t in enumerate(tariffs.tolist()):
            values = delta[t] = _integrated_multiplier_of(tariff_of(t), window)
            best_k[i + 1] = int(np.argmin(values))
            best_value[i + 1] = float(values[best_k[i + 1]])
        cluster_best_k = best_k[of_cluster]
        cluster_best_value = best_value[of_cluster]
    price_cap = spec.max_price_per_card_hour if window.starts else None
    if price_cap is not None:
        # Average price per card-hour (per standard card-hour) at the cheapest start of the window: a
        # reason that depends on the window, so on a copy of the requirements' own.
        chip = c.cluster_chip
        per_card_hour = c.cluster_rate * cluster_best_value / (window.duration * _E4)
        if spec.standard_cards is not None:
            per_card_hour = per_card_hour / (np.maximum(c.chip_factor_e4[chip], 1) / _E4)
        cap = float(price_cap) * (1 + 1e-12)
        after = after.copy()
        with np.errstate(invalid="ignore"):
            _reject(after, per_card_hour > cap, "price")

    if spec.gang == "cluster":
        if alive is not None:
            holds = _live_holds(holds, alive, window)
        reason = _island_reasons(spec, c, before, after)
        if window.starts == 0:
            reason[reason == 0] = _R["window"]
            return _result(reason, [], window, n)
        need = cluster_need[c.island_cluster]
        reports = binding_reports(c, window, lambda positions: reason[positions] == 0)
        if reports is not None:
            holds = tuple(  # type: ignore[assignment]
                np.concatenate([h, r]) for h, r in zip(holds, reports.as_holds(c, window), strict=True)
            )
        return _match_spanning(
            spec, c, holds, window, reason, need, latency, delta, limit, tariff_of, rank_rate
        )

    # An island gang: every count and every choice below is made per cluster, from the catalogue's
    # per-cluster aggregates, and per island only for the islands that holds (or reports) touch and the
    # islands of the clusters that reach the top: no pass over every island. What the requirements alone
    # decide (the counts so far, the clusters left and their candidate islands) is the requirements' own
    # unless a price cap made ``after`` this window's.
    gang = req.island_gang(spec, c) if price_cap is None else _IslandGang.of(spec, c, req, after)
    counts = gang.counts.copy()
    considered = gang.considered
    ok_cluster, allowed = gang.ok_cluster, gang.allowed
    if window.starts == 0:
        counts[_R["window"]] += int(allowed[ok_cluster].sum())
        return _result_of(counts, considered, [], window)
    counts[_R["capacity"]] += gang.below_total
    candidates_of = gang.candidates_of
    candidate = gang.candidate

    reports = binding_reports(c, window, candidate)
    blocked = _blocked(c, holds, window, candidate, reports, held, alive)
    counts[_R["capacity"]] += len(blocked.full)
    members = candidates_of - np.bincount(c.island_cluster[blocked.full], minlength=m)
    feasible = int(members.sum())

    def live(positions: np.ndarray) -> np.ndarray:
        """Whether each island (catalogue positions) can take the job at some start."""
        return candidate(positions) & ~_within(blocked.full, positions)

    origin = max(origin, 0)
    if distinct:
        offers = _rank_offers(
            spec,
            c,
            window,
            live=live,
            members=members.copy(),
            blocked=blocked,
            cluster_best_k=cluster_best_k,
            cluster_cost=rank_rate * cluster_need * cluster_best_value,
            rank_rate=rank_rate,
            cluster_need=cluster_need,
            latency=latency,
            delta=delta,
            limit=limit,
        )
        memo = _Memo()
        placements = [
            _placement(
                spec,
                c,
                window,
                tariff_of,
                cluster_index=cl,
                allocation=[(int(islands[0]), int(cluster_need[cl]))],
                k=k,
                first_k=first_k,
                origin=origin,
                memo=memo,
                alternatives=[(int(island), int(cluster_need[cl])) for island in islands[1:]],
            )
            for cl, k, islands, first_k in offers
        ]
        return _result_of(counts, considered, placements, window, feasible=feasible)
    # Every island of a cluster has the cluster's cost and latency at the tariff-best start, so ranking
    # is done per cluster (10× fewer rows), and only the islands of the clusters that can reach the top
    # are ranked one by one. Islands whose tariff-best start is blocked count at that start's value (a
    # lower bound) until they reach the top, when their exact best feasible start is computed and they
    # are ranked on their own: a handful of rows, not thousands.
    cluster = c.island_cluster
    members = members.copy()  # islands ranked with their cluster
    exact: dict[int, tuple[int, float, int]] = {}  # island → (best start, its value, first feasible start)
    cluster_cost = rank_rate * cluster_need * cluster_best_value
    while True:
        groups = np.nonzero(members)[0]
        alone = np.fromiter(exact, dtype=np.int64, count=len(exact))
        own = np.sort(alone)  # islands ranked on their own, at their exact best start
        alone_cluster = cluster[alone]
        alone_value = np.fromiter((exact[int(i)][1] for i in alone), dtype=np.float64, count=len(alone))
        keys = _rank_keys(
            spec,
            np.concatenate(
                [cluster_cost[groups], rank_rate[alone_cluster] * cluster_need[alone_cluster] * alone_value]
            ),
            np.concatenate([latency[groups], latency[alone_cluster]]),
        )
        group_counts = np.concatenate([members[groups], np.ones(len(alone), dtype=np.int64)])
        keep = _top_entries(keys[-1], group_counts, limit)
        parts = [
            _live_members(c, int(groups[e]), live, own)
            if e < len(groups)
            else alone[e - len(groups) : e - len(groups) + 1]
            for e in keep
        ]
        top = _rank_members(keys, keep, parts, limit)
        top_islands = np.array(top, dtype=np.int64)
        at_best = blocked.blocks(top_islands, cluster_best_k[cluster[top_islands]])
        pending = [
            island for island, hit in zip(top, at_best.tolist(), strict=True) if hit and island not in exact
        ]
        if not pending:
            break
        for island in pending:
            ok = blocked.feasible(island)
            values = delta[int(c.cluster_tariff[cluster[island]])]
            k = int(np.argmin(np.where(ok, values, _NEVER)))
            exact[island] = (k, float(values[k]), int(np.argmax(ok)))
            members[cluster[island]] -= 1
    placements = []
    memo = _Memo()
    for island in top:
        cl = int(cluster[island])
        if island in exact:
            k, _, first_k = exact[island]
        else:
            k = int(cluster_best_k[cl])
            first_k = int(np.argmax(blocked.feasible(island))) if blocked.has(island) else 0
        placements.append(
            _placement(
                spec,
                c,
                window,
                tariff_of,
                cluster_index=cl,
                allocation=[(island, int(cluster_need[cl]))],
                k=k,
                first_k=first_k,
                origin=origin,
                memo=memo,
            )
        )
    return _result_of(counts, considered, placements, window, feasible=feasible)


def _reject(target: np.ndarray, mask: np.ndarray, name: str) -> None:
    """Count ``mask``'s clusters under ``name`` where no earlier reason counts them yet."""
    target[(target == 0) & mask] = _R[name]


def _read_only(*arrays: np.ndarray) -> None:
    for array in arrays:
        array.flags.writeable = False


# A catalogue keeps the requirements of this many distinct jobs at most (emptied when full): a few per hub
# and chip class in practice, ~100 KB each at 10k clusters.
_REQUIREMENTS_MAX = 256


def _requirements_key(spec: JobSpec) -> tuple[object, ...]:
    """What of a job its requirements (``_Requirements``) and island-gang counts (``_IslandGang``, for the
    jobs with no price cap) depend on: not its window, its price cap or its price weight."""
    return (
        spec.cards,
        spec.standard_cards,
        spec.accelerators,
        spec.min_fp16_tflops,
        spec.min_memory_gb,
        spec.fabrics,
        spec.origin_hub,
        spec.latency_budget_ms,
        spec.preference,
        spec.exclude_clusters,
        spec.only_cluster,
        spec.min_reliability,
    )


def _requirements_of(spec: JobSpec, c: Catalogue) -> _Requirements:
    """``_Requirements.of(spec, c)``, kept on the catalogue by ``_requirements_key``: the quotes of one
    catalogue (a few seconds of quotes at design load) for one set of requirements (a job quoted again,
    jobs alike from one hub) compute them once. A new catalogue starts with none."""
    cache: dict[tuple[object, ...], _Requirements] = c.__dict__.setdefault("_requirements", {})
    key = _requirements_key(spec)
    known = cache.get(key)
    if known is None:
        if len(cache) >= _REQUIREMENTS_MAX:
            cache.clear()
        known = cache[key] = _Requirements.of(spec, c)
    return known


class _Requirements:
    """A job's requirements on one catalogue, per cluster and whatever the job's window: the cluster-level
    reasons (``before`` the islands' fabric: excluded, offline, chip, memory; ``after`` it: latency,
    unpriced, reliability, and not the price cap, which depends on the window), the latency from the job's
    hub (``origin``, -1 for a hub the catalogue does not know, every latency then infinite), the rate the
    ranking counts and the cards each cluster's chip needs. Read-only arrays: every quote with the same
    requirements reads the same ones."""

    __slots__ = ("_gang", "after", "before", "cluster_need", "latency", "origin", "rank_rate")

    def __init__(
        self,
        *,
        before: np.ndarray,
        after: np.ndarray,
        latency: np.ndarray,
        origin: int,
        rank_rate: np.ndarray,
        cluster_need: np.ndarray,
    ) -> None:
        _read_only(before, after, latency, rank_rate, cluster_need)
        self.before, self.after, self.latency, self.origin = before, after, latency, origin
        self.rank_rate, self.cluster_need = rank_rate, cluster_need
        self._gang: _IslandGang | None = None

    @classmethod
    def of(cls, spec: JobSpec, c: Catalogue) -> _Requirements:
        m = len(c.cluster_id)
        # Cluster-level reasons first (10× fewer rows than islands), in two groups around the island-level
        # fabric check so that each island is counted under the first reason it fails.
        before = np.zeros(m, dtype=np.int8)
        after = np.zeros(m, dtype=np.int8)
        if spec.exclude_clusters:
            before[np.isin(c.cluster_id, np.fromiter(spec.exclude_clusters, dtype=np.int64))] = _EXCLUDED
        if spec.only_cluster is not None:  # a job pinned to one cluster: the others are not considered
            before[c.cluster_id != spec.only_cluster] = _EXCLUDED
        _reject(before, ~c.cluster_active, "offline")
        chip_ok = np.ones(len(c.chip_slugs), dtype=bool)
        if spec.accelerators:
            chip_ok &= np.isin(np.array(c.chip_slugs, dtype=object), list(spec.accelerators))
        if spec.min_fp16_tflops is not None:
            with np.errstate(invalid="ignore"):
                chip_ok &= c.chip_tflops_f >= float(spec.min_fp16_tflops)
        if spec.standard_cards is not None:
            chip_ok &= c.chip_factor_e4 > 0
        chip = c.cluster_chip
        _reject(before, ~chip_ok[chip], "chip")
        if spec.min_memory_gb is not None:
            with np.errstate(invalid="ignore"):
                _reject(before, ~(c.chip_memory_f >= float(spec.min_memory_gb))[chip], "memory")
        try:
            origin = c.hub_codes.index(spec.origin_hub)
            latency = c.latency_ms[origin][c.cluster_hub]  # per cluster
        except ValueError:
            origin = -1
            latency = np.full(m, np.inf)
        _reject(after, latency > spec.latency_budget_ms, "latency")
        _reject(after, c.cluster_tariff == 0, "unpriced")
        if spec.min_reliability is not None:
            _reject(after, c.reliability_e3 < math.ceil(spec.min_reliability * 1000), "reliability")
        # Cards each cluster's chip needs: the job's cards, or its standard cards at the chip's factor.
        if spec.standard_cards is not None:
            standard_e4 = int(spec.standard_cards * _E4)
            cluster_need = _ceil_div(
                np.full(m, standard_e4, dtype=np.int64), np.maximum(c.chip_factor_e4[chip], 1)
            )
        else:
            cluster_need = np.full(m, int(spec.cards or 0), dtype=np.int64)
        return cls(
            before=before,
            after=after,
            latency=latency,
            origin=origin,
            rank_rate=np.array(_rank_rate(spec, c), dtype=np.float64),  # its own array, made read-only
            cluster_need=cluster_need,
        )

    def island_gang(self, spec: JobSpec, c: Catalogue) -> _IslandGang:
        """``_IslandGang.of`` with these requirements' own ``after`` (a job with no price cap), made once."""
        gang = self._gang
        if gang is None:
            gang = self._gang = _IslandGang.of(spec, c, self, self.after)
        return gang


class _IslandGang:
    """What an island-gang job's requirements decide before its window and the holds, per cluster from
    the catalogue's aggregates: the islands counted per reason so far (``counts``, by ``_R``; the islands
    below the job's need in cards not among them but in ``below_total``: a window with no start counts
    them under ``window``), the islands considered, the clusters left (``ok_cluster``), their islands on
    the job's fabrics (``allowed``) and those of them with the cards (``candidates_of``), and the test of
    an island's static checks (``candidate``). Read-only arrays."""

    __slots__ = ("allowed", "below_total", "candidate", "candidates_of", "considered", "counts", "ok_cluster")

    def __init__(
        self,
        *,
        counts: np.ndarray,
        considered: int,
        ok_cluster: np.ndarray,
        allowed: np.ndarray,
        candidates_of: np.ndarray,
        below_total: int,
        candidate: Candidates,
    ) -> None:
        _read_only(counts, ok_cluster, allowed, candidates_of)
        self.counts, self.considered, self.ok_cluster, self.allowed = counts, considered, ok_cluster, allowed
        self.candidates_of, self.below_total, self.candidate = candidates_of, below_total, candidate

    @classmethod
    def of(cls, spec: JobSpec, c: Catalogue, req: _Requirements, after: np.ndarray) -> _IslandGang:
        m = len(c.cluster_id)
        before = req.before
        sizes = c.cluster_size
        allowed_fabrics = _allowed_fabrics(spec)
        fabric_ok: np.ndarray | None = None
        if allowed_fabrics is None:
            allowed = np.array(sizes, dtype=np.int64)  # its own array, made read-only
        else:
            fabric_ok = np.zeros(len(FABRICS), dtype=bool)
            fabric_ok[allowed_fabrics] = True
            _read_only(fabric_ok)
            allowed = c.fabric_counts[:, allowed_fabrics].sum(axis=1)
        counts = np.zeros(len(REASONS) + 1, dtype=np.int64)
        closed = before > 0
        counts += np.bincount(before[closed], weights=sizes[closed], minlength=len(counts)).astype(np.int64)
        open_ = before == 0
        counts[_R["fabric"]] += int((sizes - allowed)[open_].sum())
        late = open_ & (after > 0)
        counts += np.bincount(after[late], weights=allowed[late], minlength=len(counts)).astype(np.int64)
        considered = int(sizes[before != _EXCLUDED].sum())
        ok_cluster = open_ & (after == 0)
        ok_clusters = np.flatnonzero(ok_cluster)
        cluster_need = req.cluster_need
        below = c.islands_below(ok_clusters, cluster_need[ok_clusters], allowed_fabrics)
        candidates_of = np.zeros(m, dtype=np.int64)  # per cluster: islands that pass every static check
        candidates_of[ok_clusters] = allowed[ok_clusters] - below
        room = None
        if after is not req.after:
            # A window's price cap rejects more clusters than the requirements do (``after`` is a copy of
            # theirs with more rejections): their room, kept on the catalogue, with the islands of the
            # clusters the cap rejects taken out, instead of a new one made from every island.
            own = req.island_gang(spec, c)
            dropped = np.flatnonzero(own.ok_cluster & ~ok_cluster)
            room = own.candidate.room()
            if len(dropped):
                room = room.copy()
                room[c.island_id[_islands_of_clusters(c, dropped)[0]]] = -1
                _read_only(room)
        return cls(
            counts=counts,
            considered=considered,
            ok_cluster=ok_cluster,
            allowed=allowed,
            candidates_of=candidates_of,
            below_total=int(below.sum()),
            # Whether an island passes every check but the holds.
            candidate=Candidates(
                c, cluster_ok=ok_cluster, cluster_need=cluster_need, fabric_ok=fabric_ok, room=room
            ),
        )


def _uniform(values: np.ndarray) -> int | None:
    """The one value of ``values`` when they are all equal (a job in cards: every cluster needs the same),
    else None."""
    if not len(values):
        return None
    first = int(values[0])
    return first if bool((values == first).all()) else None


def _allowed_fabrics(spec: JobSpec) -> np.ndarray | None:
    """The positions in ``FABRICS`` of the job's fabrics (None: any fabric)."""
    if not spec.fabrics:
        return None
    return np.array(sorted({FABRICS.index(f) for f in spec.fabrics if f in FABRICS}), dtype=np.int64)


def _island_reasons(spec: JobSpec, c: Catalogue, before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Every island's first reason (0: none yet) from the cluster-level reasons and its fabric: one
    pass over every island, for a job that may span islands (its capacity is summed over them)."""
    cluster = c.island_cluster
    reason = before[cluster]
    allowed = _allowed_fabrics(spec)
    if allowed is not None:
        reason[(reason == 0) & ~np.isin(c.island_fabric, allowed)] = _R["fabric"]
    later = after[cluster]
    return np.where(reason == 0, later, reason).astype(np.int8)


def _within(sorted_values: np.ndarray, values: np.ndarray | int) -> np.ndarray:
    """Whether each of ``values`` is in ``sorted_values`` (ascending): a binary search each."""
    at = np.searchsorted(sorted_values, values)
    inside = at < len(sorted_values)
    found = np.zeros(np.shape(at), dtype=bool)
    found[inside] = sorted_values[at[inside]] == np.asarray(values)[inside]
    return found


@dataclass(frozen=True)
class Reports:
    """The operators' heartbeat reports binding a quote's first start, on its live islands: catalogue
    positions, the cards each withholds, and when each expires (epoch seconds)."""

    island: np.ndarray
    cards: np.ndarray
    until: np.ndarray

    def as_holds(self, c: Catalogue, window: Window) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The reports as holds (island id, start, end, cards) over ``[t0, expiry)``."""
        starts = np.full(len(self.island), window.t0, dtype=np.int64)
        return c.island_id[self.island], starts, self.until, self.cards


def binding_reports(
    c: Catalogue, window: Window, live: np.ndarray | Callable[[np.ndarray], np.ndarray]
) -> Reports | None:
    """The reports of the ``live`` islands (a mask over the catalogue, or a test of catalogue positions)
    that still bind at the window's first start (None: none do). Work is proportional to the islands
    with cards withheld, and nothing for a start past every expiry."""
    if window.t0 >= c.withheld_until_max:
        return None
    binding = c.withheld_until > window.t0
    islands = c.withheld_island[binding]
    binding[binding] = live[islands] if isinstance(live, np.ndarray) else live(islands)
    if not binding.any():
        return None
    return Reports(c.withheld_island[binding], c.withheld_cards[binding], c.withheld_until[binding])


def _rank_offers(
    spec: JobSpec,
    c: Catalogue,
    window: Window,
    *,
    live: Callable[[np.ndarray], np.ndarray],
    members: np.ndarray,
    blocked: BlockedStarts,
    cluster_best_k: np.ndarray,
    cluster_cost: np.ndarray,
    cluster_need: np.ndarray,
    latency: np.ndarray,
    delta: dict[int, np.ndarray],
    limit: int,
    rank_rate: np.ndarray,
) -> list[tuple[int, int, np.ndarray, int]]:
    """The best ``limit`` offers of an island-gang job, best first, as (cluster index, start index, its
    islands in catalogue order, the earliest start any of them could take). ``live`` tells the islands
    that can take the job at some start, ``members`` how many there are per cluster (changed here).

    An offer is a (cluster, start) with every island of the cluster whose cheapest feasible start it is.
    As in the island ranking, the live islands of a cluster are first taken together at the cluster's
    tariff-best start (one entry, its cost a lower bound for any island a hold blocks there); an offer
    that reaches the top has its blocked islands priced on their own, at their exact best feasible start,
    and the ranking is done again, until the top offers hold only exact islands. Ties go to the offer
    whose best island comes first in the catalogue (the island ranking's order). Work is proportional to
    the clusters and to the islands of the offers that reach the top, not to every island."""
    cluster = c.island_cluster
    # Islands priced on their own (ascending), their best feasible start and its value.
    alone = np.zeros(0, dtype=np.int64)
    alone_k = np.zeros(0, dtype=np.int64)
    alone_value = np.zeros(0, dtype=np.float64)
    never = _NEVER
    # The live islands (not in ``alone``) of the clusters among the entries kept for the ranking, found
    # in one pass for all of them (ties on cost can keep hundreds): cluster ``kept_clusters[j]``'s are
    # ``kept_islands[kept_bounds[j]:kept_bounds[j + 1]]`` (until ``alone`` grows).
    kept_clusters = kept_islands = kept_bounds = np.zeros(0, dtype=np.int64)

    kept_of: dict[int, tuple[int, int]] = {}  # kept cluster → its islands' bounds in kept_islands

    def with_cluster(cl: int) -> np.ndarray:
        bounds = kept_of.get(cl)
        if bounds is not None:
            return kept_islands[bounds[0] : bounds[1]]
        return _live_members(c, cl, live, alone)

    while True:
        groups = np.nonzero(members)[0]
        # ascending: the first of each (cluster, start) is its lowest island
        pair = cluster[alone] * (window.starts + 1) + alone_k
        _pairs, first_index = np.unique(pair, return_index=True)
        alone_first = alone[first_index]
        alone_cluster = cluster[alone_first]
        cost = np.concatenate(
            [
                cluster_cost[groups],
                rank_rate[alone_cluster] * cluster_need[alone_cluster] * alone_value[first_index],
            ]
        )
        if not len(cost):
            return []
        keys = _rank_keys(spec, cost, np.concatenate([latency[groups], latency[alone_cluster]]))
        keep = _top_entries(keys[-1], np.ones(len(cost), dtype=np.int64), limit)  # ascending
        kept_group = keep < len(groups)
        kept_clusters = groups[keep[kept_group]]  # ascending, as ``groups``
        kept_islands, kept_bounds = _live_members_of(c, kept_clusters, live, alone)
        bounds = kept_bounds.tolist()
        kept_of = {cl: (bounds[j], bounds[j + 1]) for j, cl in enumerate(kept_clusters.tolist())}
        # Each kept entry's lowest island: a group's first live island (it has one: ``members``), an
        # island priced alone's first of its (cluster, start).
        lowest = np.concatenate(
            [kept_islands[kept_bounds[:-1]], alone_first[keep[~kept_group] - len(groups)]]
        ).astype(np.int64)
        top = keep[np.lexsort((lowest, *(key[keep] for key in keys)))[:limit]]
        top_groups = [with_cluster(int(groups[e])) for e in top if e < len(groups)]
        pending = np.concatenate(top_groups) if top_groups else np.zeros(0, dtype=np.int64)
        pending = pending[blocked.blocks(pending, cluster_best_k[cluster[pending]])]
        islands = np.sort(pending)
        if not len(islands):
            break
        ok = blocked.feasible_many(islands)
        ks = np.zeros(len(islands), dtype=np.int64)
        values_at = np.zeros(len(islands), dtype=np.float64)
        for row, island in enumerate(islands):
            values = delta[int(c.cluster_tariff[cluster[island]])]
            k = int(np.argmin(np.where(ok[row], values, never)))
            ks[row], values_at[row] = k, float(values[k])
        order = np.argsort(np.concatenate([alone, islands]), kind="stable")
        alone = np.concatenate([alone, islands])[order]
        alone_k = np.concatenate([alone_k, ks])[order]
        alone_value = np.concatenate([alone_value, values_at])[order]
        np.subtract.at(members, cluster[islands], 1)
    chosen = []
    for e in top:
        if e < len(groups):
            cl = int(groups[e])
            islands = with_cluster(cl)
            k = int(cluster_best_k[cl])
        else:
            first = int(alone_first[e - len(groups)])
            cl, k = int(cluster[first]), int(alone_k[first_index[e - len(groups)]])
            islands = alone[(cluster[alone] == cl) & (alone_k == k)]
        chosen.append((cl, k, islands))
    first_ks = _first_feasible_each(blocked, [islands for _, _, islands in chosen])
    return [(cl, k, islands, first_k) for (cl, k, islands), first_k in zip(chosen, first_ks, strict=True)]


def _first_feasible_each(blocked: BlockedStarts, groups: list[np.ndarray]) -> list[int]:
    """The earliest start index any island of each of ``groups`` (disjoint sets of islands, each
    ascending, each feasible somewhere) can take: one ``feasible_many`` over the islands of the groups
    whose every island a hold touches, instead of one per group."""
    if not groups:
        return []
    sizes = np.array([len(islands) for islands in groups], dtype=np.int64)
    islands = np.concatenate(groups)
    group = np.repeat(np.arange(len(groups)), sizes)
    at = np.searchsorted(blocked.island, islands, side="left")
    inside = at < len(blocked.island)
    touched = np.zeros(len(islands), dtype=bool)
    touched[inside] = blocked.island[at[inside]] == islands[inside]
    # A group with an island no hold touches can start at the window's first start.
    all_touched = np.bincount(group[~touched], minlength=len(groups)) == 0
    out = [0] * len(groups)
    rows = np.flatnonzero(all_touched[group])
    if not len(rows):
        return out
    order = np.argsort(islands[rows], kind="stable")
    rows = rows[order]
    ok = blocked.feasible_many(islands[rows])
    for g in np.flatnonzero(all_touched).tolist():
        out[g] = int(np.argmax(ok[group[rows] == g].any(axis=0)))
    return out


def _live_members(
    c: Catalogue, cluster: int, live: Callable[[np.ndarray], np.ndarray], own: np.ndarray
) -> np.ndarray:
    """The live islands of ``cluster`` still ranked with it (not in ``own``, ascending), in catalogue
    order."""
    first_of_cluster, cluster_islands = c.islands_by_cluster
    islands = cluster_islands[first_of_cluster[cluster] : first_of_cluster[cluster + 1]]
    keep = live(islands)
    if len(own):
        keep &= ~_within(own, islands)
    return islands[keep]


def _islands_of_clusters(c: Catalogue, clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The islands (catalogue positions) of each of ``clusters``, in one gather: (islands, offsets), cluster
    ``clusters[j]``'s being ``islands[offsets[j]:offsets[j + 1]]``, in catalogue order."""
    first_of_cluster, cluster_islands = c.islands_by_cluster
    lo, hi = first_of_cluster[clusters], first_of_cluster[clusters + 1]
    sizes = hi - lo
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    slots = np.repeat(lo - offsets[:-1], sizes) + np.arange(int(offsets[-1]))
    return cluster_islands[slots], offsets


def _live_members_of(
    c: Catalogue, clusters: np.ndarray, live: Callable[[np.ndarray], np.ndarray], own: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``_live_members`` of each of ``clusters`` in one pass: (islands, bounds), cluster ``clusters[j]``'s
    live islands being ``islands[bounds[j]:bounds[j + 1]]``."""
    islands, offsets = _islands_of_clusters(c, clusters)
    keep = live(islands)
    if len(own):
        keep &= ~_within(own, islands)
    kept = np.concatenate([[0], np.cumsum(keep)])
    return islands[keep], kept[offsets]


def _rank_rate(spec: JobSpec, c: Catalogue) -> np.ndarray:
    """Each cluster's rate as the ranking counts it: the list rate, or for the ``adjusted`` preference the
    rate less the expected SLA credit (a fraction of the cost, so of the rate). Caps and quotes use the
    list rate."""
    if spec.preference == "adjusted":
        return c.cluster_rate * (1.0 - c.credit_fraction)
    return c.cluster_rate


def _rank_keys(spec: JobSpec, cost: np.ndarray, latency: np.ndarray) -> tuple[np.ndarray, ...]:
    """The job's sort keys, least significant first (``np.lexsort``'s order), without the tie-break."""
    if spec.preference == "latency":
        return (cost, latency)
    if spec.preference == "weighted":
        weight = float(spec.price_weight)

        def spread(x: np.ndarray) -> np.ndarray:
            lo, hi = float(x.min()), float(x.max())
            return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)

        score = np.round(weight * spread(cost) + (1 - weight) * spread(latency), 12)
        return (latency, cost, score)
    return (latency, cost)


def _top_entries(primary: np.ndarray, counts: np.ndarray, limit: int) -> np.ndarray:
    """The entries that can hold one of the best ``limit`` islands, where entry ``e`` stands for
    ``counts[e]`` (≥ 1) islands sharing its keys: those not above the ``limit``-th smallest primary key.
    Those ``limit`` entries cover at least ``limit`` islands, so no island with a larger primary key can
    be in the top."""
    if not len(counts):
        return np.zeros(0, dtype=np.int64)
    if len(primary) <= limit:
        return np.arange(len(primary))
    if primary.dtype == np.float64:
        # The same positions in one compiled pass (imported here, as in Candidates.rows_of).
        from broker.matching_kernel import smallest_entries

        return smallest_entries(primary, limit)
    cut = np.partition(primary, limit - 1)[limit - 1]
    return np.nonzero(primary <= cut)[0]


def _rank_members(
    keys: tuple[np.ndarray, ...], entries: np.ndarray, members: list[np.ndarray], limit: int
) -> list[int]:
    """The best ``limit`` islands of ``members[j]`` (the islands of entry ``entries[j]``, which share its
    keys), best first; ties broken by island index: the same order as ``_rank`` over every island."""
    if not members:
        return []
    islands = np.concatenate(members)
    entry = np.repeat(entries, [len(part) for part in members])
    order = np.lexsort((islands, *(key[entry] for key in keys)))
    return [int(islands[i]) for i in order[:limit]]


def _rank(spec: JobSpec, cost: np.ndarray, latency: np.ndarray, tie: np.ndarray, limit: int) -> list[int]:
    """Positions of the best ``limit`` entries by the job's preference; ``tie`` (ids) breaks exact ties."""
    if not len(cost):
        return []
    keys = (tie, *_rank_keys(spec, cost, latency))
    if len(cost) > 4 * limit:  # only the best few need a full sort
        primary = keys[-1]
        cut = np.partition(primary, limit - 1)[limit - 1]
        keep = np.nonzero(primary <= cut)[0]
        order = np.lexsort(tuple(key[keep] for key in keys))
        return [int(keep[i]) for i in order[:limit]]
    return [int(i) for i in np.lexsort(keys)[:limit]]


def _hold_slots(window: Window, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    slots = -(-(window.last_end - window.t0) // window.step)
    # np.minimum / np.maximum, not np.clip: the same integers, without np.clip's overhead per call
    first = np.minimum(np.maximum((starts - window.t0) // window.step, 0), slots)
    last = np.minimum(np.maximum(-(-(ends - window.t0) // window.step), 0), slots)
    return first, last, int(slots)


def _occupancy(
    rows: np.ndarray, first: np.ndarray, last: np.ndarray, cards: np.ndarray, count: int, slots: int
) -> np.ndarray:
    diff = np.zeros((count, slots + 1), dtype=np.int64)
    np.add.at(diff, (rows, first), cards)
    np.add.at(diff, (rows, last), -cards)
    return np.cumsum(diff, axis=1)[:, :slots]


@dataclass
class BlockedStarts:
    """Per island, the ranges of start indices ``[a, b)`` that a hold makes infeasible (sorted by island,
    then ``a``), and the islands where no start is left (``full``)."""

    island: np.ndarray
    a: np.ndarray
    b: np.ndarray
    full: np.ndarray
    starts: int

    def has(self, island: int) -> bool:
        lo = np.searchsorted(self.island, island, side="left")
        return bool(lo < len(self.island) and self.island[lo] == island)

    def has_all(self, islands: np.ndarray) -> bool:
        """Whether every one of ``islands`` has a blocked range (a binary search each, ``island`` being
        sorted, where ``np.isin`` would sort every blocked range again)."""
        at = np.searchsorted(self.island, islands, side="left")
        inside = at < len(self.island)
        return bool(inside.all() and (self.island[at[inside]] == islands).all())

    def feasible(self, island: int) -> np.ndarray:
        ok = np.ones(self.starts, dtype=bool)
        lo, hi = np.searchsorted(self.island, [island, island + 1], side="left")
        for a, b in zip(self.a[lo:hi], self.b[lo:hi], strict=True):
            ok[a:b] = False
        return ok

    def feasible_many(self, islands: np.ndarray) -> np.ndarray:
        """``feasible`` of each of ``islands`` (ascending, distinct), as the rows of one matrix."""
        lo = np.searchsorted(self.island, islands, side="left")
        hi = np.searchsorted(self.island, islands, side="right")
        counts = hi - lo
        rows = np.repeat(np.arange(len(islands)), counts)
        ranges = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        edges = np.zeros((len(islands), self.starts + 1), dtype=np.int32)
        np.add.at(edges, (rows, self.a[ranges]), 1)
        np.add.at(edges, (rows, self.b[ranges]), -1)
        return np.cumsum(edges, axis=1)[:, : self.starts] == 0

    def blocks(self, islands: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Whether start ``k[i]`` of each of ``islands[i]`` falls in one of its blocked ranges: work in
        the ranges of those islands only (the ones that reach a quote's top), not in every range."""
        lo = np.searchsorted(self.island, islands, side="left")
        counts = np.searchsorted(self.island, islands, side="right") - lo
        rows = np.repeat(np.arange(len(islands)), counts)
        ranges = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        at = k[rows]
        hit = (self.a[ranges] <= at) & (at < self.b[ranges])
        return np.bincount(rows[hit], minlength=len(islands)) > 0


# Bounds that every hold overlaps (epoch seconds): no selection by time.
_EVER = (-(2**62), 2**62)


class Candidates:
    """The islands that pass every check but the holds: on a cluster ``cluster_ok`` accepts, with at least
    their cluster's need in cards (``cluster_need``), on a fabric ``fabric_ok`` accepts and among
    ``island_ok`` (each None: any). Called on catalogue positions; its arrays are also what the compiled
    selection of a quote's holds reads (broker.matching_kernel.candidate_rows)."""

    __slots__ = ("_room", "c", "cluster_need", "cluster_ok", "fabric_ok", "island_ok", "need_of")

    def __init__(
        self,
        c: Catalogue,
        *,
        cluster_ok: np.ndarray,
        cluster_need: np.ndarray,
        fabric_ok: np.ndarray | None = None,
        island_ok: np.ndarray | None = None,
        room: np.ndarray | None = None,
    ) -> None:
        self.c = c
        self.cluster_ok = cluster_ok
        self.cluster_need = cluster_need
        self.fabric_ok = fabric_ok
        self.island_ok = island_ok
        self.need_of = _uniform(cluster_need)  # one need for every cluster: no gather per island
        # ``room`` when the caller has it (what ``room()`` would make, cheaper made from what it knows).
        self._room: np.ndarray | None = room

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        c = self.c
        of = c.island_cluster[positions]
        ok = self.cluster_ok[of]
        if self.fabric_ok is not None:
            ok &= self.fabric_ok[c.island_fabric[positions]]
        if self.island_ok is not None:
            ok &= self.island_ok[positions]
        ok &= c.island_capacity[positions] >= (
            self.cluster_need[of] if self.need_of is None else self.need_of
        )
        return ok

    def rows_of(
        self,
        holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        *,
        lo: int = _EVER[0],
        hi: int = _EVER[1],
        alive: np.ndarray | None = None,
        held: np.ndarray | None = None,
        reported: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """The holds (island ids, starts, ends, cards) of candidate islands that are ``alive`` (aligned
        with them; None: all) and overlap ``[lo, hi)``, in one compiled pass: each one's catalogue
        position, cards and row in the hold arrays (an island registered since the catalogue's load is
        left out), and whether the positions ascend (broker.matching_kernel.candidate_rows). With ``held``
        (by island id, at least what an island's live holds occupy at once), the rows of an island it
        leaves its need free are left out, unless ``reported`` (by position) says a report adds to them."""
        # Imported here: numba (and LLVM, ~130 MB of memory) only in the processes that quote, not in
        # every process that imports the matcher.
        from broker.matching_kernel import candidate_rows

        no = np.zeros(0, dtype=bool)
        hold_island, hold_start, hold_end, hold_cards = holds
        return candidate_rows(
            hold_island,
            hold_start,
            hold_end,
            hold_cards,
            no if alive is None else alive,
            lo,
            hi,
            self.c.island_lookup,
            self.room(),
            _NO_BOUND if held is None else held,
            no if reported is None else reported,
        )

    def room(self) -> np.ndarray:
        """By island id, the cards each candidate island has beyond its cluster's need, -1 for the others
        and, in one element more, for every id past the catalogue's (broker.matching_kernel.island_room).
        Made at the first call (~0.3 ms at 100,000 islands) and kept (read-only): the requirements'
        candidates are kept on the catalogue, so a quote reads one number per hold where it made six
        look-ups. Candidates made for one call get theirs from their maker when it has it cheaper
        (``_IslandGang.of`` under a price cap, ``_blocked_starts``). Two threads may both make it; they make
        the same array."""
        room = self._room
        if room is None:
            from broker.matching_kernel import island_room  # imported here, as in rows_of

            c, no = self.c, np.zeros(0, dtype=bool)
            room = island_room(
                c.island_lookup,
                c.island_cluster,
                c.island_fabric,
                c.island_capacity,
                self.cluster_ok,
                self.cluster_need,
                no if self.fabric_ok is None else self.fabric_ok,
                no if self.island_ok is None else self.island_ok,
            )
            _read_only(room)
            self._room = room
        return room


def _blocked_starts(
    c: Catalogue,
    holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    window: Window,
    candidates: np.ndarray,
    need: np.ndarray,
    reports: Reports | None = None,
) -> BlockedStarts:
    """``_blocked`` for the islands at catalogue positions ``candidates``, ``need`` cards per island
    (aligned with the catalogue), each of which has at least its need in cards."""
    is_candidate = np.zeros(c.size, dtype=bool)
    is_candidate[candidates] = True
    by_cluster = np.zeros(len(c.cluster_id), dtype=np.int64)
    by_cluster[c.island_cluster[candidates]] = need[candidates]
    if not bool((need[candidates] == by_cluster[c.island_cluster[candidates]]).all()):
        raise ValueError("the islands of a cluster must need the same cards")
    return _blocked(c, holds, window, _listed_candidates(c, candidates, by_cluster, is_candidate), reports)


def _listed_candidates(
    c: Catalogue, candidates: np.ndarray, cluster_need: np.ndarray, is_candidate: np.ndarray
) -> Candidates:
    """Candidates that are the islands at positions ``candidates`` (``is_candidate`` by position), each with
    at least its cluster's need in cards: its room (island_room's answer) written from them alone, not
    from every island."""
    from broker.matching_kernel import ROOM_MAX

    need = cluster_need[c.island_cluster[candidates]]
    room = np.full(len(c.island_lookup) + 1, -1, dtype=np.int16)
    room[c.island_id[candidates]] = np.minimum(c.island_capacity[candidates] - need, ROOM_MAX)
    _read_only(room)
    return Candidates(
        c,
        cluster_ok=np.ones(len(c.cluster_id), dtype=bool),
        cluster_need=cluster_need,
        island_ok=is_candidate,
        room=room,
    )


_NO_BOUND = np.zeros(0, dtype=np.int64)


def _blocked(
    c: Catalogue,
    holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    window: Window,
    candidate: Candidates,
    reports: Reports | None = None,
    held: np.ndarray | None = None,
    alive: np.ndarray | None = None,
) -> BlockedStarts:
    """Sparse occupancy: per candidate island (those ``candidate`` accepts), the hold edges (rounded
    outward to the slot grid) sorted and summed give the occupied card count between consecutive edges;
    each stretch where fewer than the island's cluster's need (``candidate.cluster_need``) cards are free
    blocks the starts whose run would touch it. Work is proportional to the holds in the
    window, not to islands × slots, nor to islands: only the islands the holds name are looked at.

    Most islands a hold names have that one hold in the window: it blocks the starts whose run touches
    its slots, ``[first − run + 1, last)``, with no edges to sort; only the islands with several holds (or
    a report) go through the edge sweep. Both are done per island in one compiled pass over the rows
    (broker.matching_kernel).

    ``reports`` (binding heartbeat reports, of candidate islands) are holds over ``[t0, expiry)``. A
    report that ends within the first slot (always, with the default settings: it expires within 90 s,
    a slot is 15 minutes) can block only the first start, the one run touching that slot, and does
    exactly when it, the holds touching the slot (every one occupies all of it, rounded outward) and
    ``need`` exceed the island's cards: decided per island without adding edges to sort. Other reports
    join the holds.

    ``held`` (by island id; the hold book's ``HoldBook.held`` for these holds): an island whose holds
    together leave its need free cannot be blocked by them, so its rows are not read past the selection
    (nor a reported island's: the report adds to them). Only with a start in the window, where such an
    island gets no range; at design load about half the rows of a quote are skipped so.

    ``alive`` (aligned with ``holds``): the rows that are holds, the others skipped, as are the rows
    outside the window (those touch none of its runs): ``holds`` may then be the hold book's own rows
    (``match``)."""
    empty = np.zeros(0, dtype=np.int64)
    none = BlockedStarts(empty, empty, empty, empty, window.starts)
    hold_island, hold_start, hold_end, _cards = holds
    if not len(hold_island) and reports is None:
        return none
    capacity = c.island_capacity
    reported = None
    if held is not None and reports is not None:
        reported = np.zeros(c.size, dtype=bool)
        reported[reports.island] = True
    # The holds of candidate islands, in island order unless ``ordered`` says otherwise.
    index, cards, rows, ordered = candidate.rows_of(
        holds,
        lo=window.span[0],
        hi=window.span[1],
        alive=alive,
        held=held if window.starts > 0 else None,
        reported=reported,
    )
    starts, ends = hold_start, hold_end
    first_only = r_island = empty
    if reports is not None:
        mine = candidate(reports.island)
        r_island, r_cards, r_until = reports.island[mine], reports.cards[mine], reports.until[mine]
        one_slot = r_until <= window.t0 + window.step
        if one_slot.any():
            island = r_island[one_slot]  # ascending: the catalogue lists them in position order
            near = (hold_start[rows] < window.t0 + window.step) & (hold_end[rows] > window.t0)
            near_island, near_cards = index[near], cards[near]
            row = np.minimum(np.searchsorted(island, near_island), len(island) - 1)
            on = island[row] == near_island
            touching = np.bincount(row[on], weights=near_cards[on], minlength=len(island))
            need_here = candidate.cluster_need[c.island_cluster[island]]
            first_only = island[r_cards[one_slot] + touching + need_here > capacity[island]]
            r_island, r_cards, r_until = r_island[~one_slot], r_cards[~one_slot], r_until[~one_slot]
        if len(r_island):
            # The other reports join the holds as rows of their own over [t0, expiry).
            starts = np.concatenate([hold_start[rows], np.full(len(r_island), window.t0, dtype=np.int64)])
            ends = np.concatenate([hold_end[rows], r_until])
            index = np.concatenate([index, r_island])
            cards = np.concatenate([cards, r_cards])
            rows = np.arange(len(index))
            ordered = False
    if not len(index) and not len(first_only):
        return none
    # Group the rows by island. The hold book hands them over in island order but for the holds added
    # since its last sort, so this is usually nothing to do.
    if not ordered and len(index) > 1 and not bool((index[1:] >= index[:-1]).all()):
        order = np.argsort(index, kind="stable")
        index, cards, rows = index[order], cards[order], rows[order]
    # Per island: whether its rows together could leave too few cards, then its blocked ranges (one hold
    # directly, several by an edge sweep) and whether they cover the window: one compiled pass over the
    # rows (broker.matching_kernel.blocked_ranges states the rules; imported here, as in rows_of).
    from broker.matching_kernel import blocked_ranges

    blocked_island, a, b, full = blocked_ranges(
        index,
        cards,
        rows,
        starts,
        ends,
        np.sort(r_island),
        first_only,
        candidate.cluster_need,
        c.island_cluster,
        capacity,
        window.t0,
        window.step,
        window.duration,
        window.starts,
        -(-(window.last_end - window.t0) // window.step),
    )
    if not len(blocked_island):
        return none
    return BlockedStarts(blocked_island, a, b, full, window.starts)


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
    rank_rate: np.ndarray,
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
        index = c.island_index(hold_island)
        row_of = np.full(n + 1, -1, dtype=np.int64)  # row_of[-1] (unknown island) stays -1
        row_of[islands] = np.arange(len(islands))
        keep = row_of[index] >= 0
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
        best = int(np.argmin(np.where(ok, values, _NEVER)))
        rows = np.nonzero(cluster[islands] == cl)[0]
        by_free = rows[np.lexsort((c.island_id[islands[rows]], -free[rows, best]))]
        left = int(cluster_need[cl])
        allocation = []
        for row in by_free:
            take = min(int(free[row, best]), left)
            if take > 0:
                allocation.append((int(islands[row]), take))
                left -= take
            if left == 0:
                break
        placement_cost = float(rank_rate[cl]) * float(cluster_need[cl]) * float(values[best])
        placements_raw.append(
            (placement_cost, float(latency[cl]), int(cl), allocation, best, int(np.argmax(ok)))
        )
    if not placements_raw:
        return _result(reason, [], window, n)
    costs = np.array([p[0] for p in placements_raw])
    lat = np.array([p[1] for p in placements_raw])
    order = _rank(spec, costs, lat, np.array([c.cluster_id[p[2]] for p in placements_raw]), limit)
    origin = c.hub_codes.index(spec.origin_hub)
    memo = _Memo()
    placements = [
        _placement(
            spec,
            c,
            window,
            tariff_of,
            cluster_index=placements_raw[j][2],
            allocation=placements_raw[j][3],
            k=placements_raw[j][4],
            first_k=placements_raw[j][5],
            origin=origin,
            memo=memo,
        )
        for j in order
    ]
    return _result(reason, placements, window, n, feasible=len(placements_raw))


class _Memo:
    """What the placements of one quote share: the seconds per band of a run (by tariff, start and end)
    and a run's prices (by tariff, rate, cards, start and earliest start): ten offers mostly come at a few
    starts (a tariff's cheapest, the window's first) and a few prices (clusters priced alike), ~3 prices
    for 10 offers at design load."""

    __slots__ = ("prices", "seconds")

    def __init__(self) -> None:
        self.seconds: dict[tuple[int, int, int], tuple[tuple[int, int], ...]] = {}
        self.prices: dict[
            tuple[int, Decimal, int, int, int], tuple[tuple[BandCost, ...], Decimal, Decimal, Decimal]
        ] = {}


def _band_seconds(
    tariff: CompiledTariff,
    start: int,
    end: int,
    memo: dict[tuple[int, int, int], tuple[tuple[int, int], ...]],
    tariff_id: int,
) -> tuple[tuple[int, int], ...]:
    """(band, seconds) of ``[start, end)`` per band, dearest band first (stable among equal multipliers).
    ``memo`` keeps them per (tariff, start, end) for the placements of one quote, which mostly share a
    few starts (a tariff's cheapest, the window's first)."""
    key = (tariff_id, start, end)
    known = memo.get(key)
    if known is None:
        seconds: dict[int, int] = {}
        for s, e, band in tariff.slices(start, end):
            seconds[band] = seconds.get(band, 0) + (e - s)
        known = memo[key] = tuple(
            (band, seconds[band]) for band in sorted(seconds, key=lambda b: -tariff.multipliers_e4[b])
        )
    return known


def _bands(
    tariff: CompiledTariff, seconds: tuple[tuple[int, int], ...], cards: int, rate: Decimal
) -> tuple[BandCost, ...]:
    out = []
    for band, band_seconds in seconds:
        card_seconds = cards * band_seconds
        multiplier = _multiplier(tariff.multipliers_e4[band])
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


def _cost(tariff: CompiledTariff, seconds: tuple[tuple[int, int], ...], cards: int, rate: Decimal) -> Decimal:
    """The sum of ``_bands``' costs, without the rest of each band's figures."""
    return sum(
        (
            (rate * (cards * band_seconds) * _multiplier(tariff.multipliers_e4[band]) / 3600).quantize(
                _CENT, ROUND_HALF_EVEN
            )
            for band, band_seconds in seconds
        ),
        Decimal("0.00"),
    )


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
    alternatives: list[tuple[int, int]] | None = None,
    memo: _Memo | None = None,
) -> Placement:
    """One placement, priced exactly. ``memo``: shared by the placements of one quote (see ``_Memo``)."""
    memo = _Memo() if memo is None else memo
    price = c.cluster_price[cluster_index]
    assert price is not None
    cards = sum(cards for _, cards in allocation)
    start = window.start(k)
    earliest = window.start(first_k)
    rate = price.rate_per_card_hour
    key = (price.tariff_version_id, rate, cards, start, earliest)
    priced = memo.prices.get(key)
    if priced is None:
        tariff = tariff_of(price.tariff_version_id)
        seconds = _band_seconds(tariff, start, start + window.duration, memo.seconds, price.tariff_version_id)
        bands = _bands(tariff, seconds, cards, rate)
        cost = sum((b.cost for b in bands), Decimal("0.00"))
        first_cost = (
            cost
            if first_k == k
            else _cost(
                tariff,
                _band_seconds(
                    tariff, earliest, earliest + window.duration, memo.seconds, price.tariff_version_id
                ),
                cards,
                rate,
            )
        )
        draw = sum((Decimal(b.card_seconds) * b.multiplier for b in bands), Decimal(0)) / 3600
        priced = memo.prices[key] = (bands, cost, first_cost, draw)
    bands, cost, first_cost, draw = priced
    chip = int(c.cluster_chip[cluster_index])
    factor_e4 = int(c.chip_factor_e4[chip])
    factor = Decimal(factor_e4) / _E4 if factor_e4 else None
    hub = int(c.cluster_hub[cluster_index])
    score = c.score(cluster_index)
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
        alternatives=tuple((int(c.island_id[i]), cards) for i, cards in alternatives or ()),
        alternative_cpis=tuple(c.island_cpi[i] for i, _ in alternatives or ()),
        earliest_feasible_start_at=_at(earliest),
        reliability_percent=score.percent,
        reliability_prior=score.prior,
        interruptions_per_1000_card_hours=score.interruptions_per_1000_card_hours,
        expected_credit=c.expected_credit(cluster_index, cost),
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


def _result_of(
    counts: np.ndarray, considered: int, placements: list[Placement], window: Window, feasible: int = 0
) -> MatchResult:
    """``_result`` from the rejection counts per reason (``counts[_R[name]]``) and the islands considered."""
    return MatchResult(
        placements=tuple(placements),
        rejections={name: int(counts[_R[name]]) for name in REASONS},
        considered=considered,
        feasible=feasible,
        window_start_at=_at(window.t0),
        window_end_at=_at(window.t0 + max(window.starts - 1, 0) * window.step + window.duration),
    )


@dataclass(frozen=True)
class StartCosts:
    """The cost of a placement at every start of a job's window: ``costs[k]`` (CNY at the list price,
    to the fen) for the start ``starts[k]``, None where none of its islands has the cards free."""

    starts: tuple[datetime, ...]
    costs: tuple[Decimal | None, ...]


def start_costs(
    *,
    spec: JobSpec,
    catalogue: Catalogue,
    holds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    now: datetime,
    step: int,
    cluster_id: int,
    island_ids: tuple[int, ...],
    cards: int,
    tariff_of: Callable[[int], CompiledTariff],
) -> StartCosts | None:
    """What a placement of ``cards`` cards on any one of ``island_ids`` (of ``cluster_id``) would cost at
    each start of the job's window, from the same integrated multiplier the matcher ranks with, and where
    the holds leave too few cards (rounded outward to the slot grid, as the matcher does). With no
    ``island_ids`` (a placement spanning islands) every start is priced and none is left out. None when
    the cluster is not priced or not in the catalogue, or no start fits the window."""
    c = catalogue
    window = window_of(spec, now=now, step=step)
    where = np.nonzero(c.cluster_id == cluster_id)[0]
    if not window.starts or not len(where):
        return None
    cl = int(where[0])
    price = c.cluster_price[cl]
    if price is None:
        return None
    values = integrated_multiplier(tariff_of(price.tariff_version_id), window)
    positions = c.island_index(np.array(sorted(island_ids), dtype=np.int64))
    positions = positions[positions >= 0]
    positions = positions[c.island_capacity[positions] >= cards]
    free = np.zeros(window.starts, dtype=bool) if island_ids else np.ones(window.starts, dtype=bool)
    if len(positions):
        # The operators' reported available cards bind the first starts too, as in the matcher.
        considered = np.zeros(c.size, dtype=bool)
        considered[positions] = True
        reports = binding_reports(c, window, lambda islands: considered[islands])
        need = np.full(c.size, cards, dtype=np.int64)
        blocked = _blocked_starts(c, holds, window, positions, need, reports)
        if blocked.has_all(positions):
            free = np.asarray(blocked.feasible_many(positions).any(axis=0), dtype=bool)
        else:
            free[:] = True
    scale = price.rate_per_card_hour * cards / (3600 * _E4)
    return StartCosts(
        starts=tuple(_at(window.start(k)) for k in range(window.starts)),
        costs=tuple(
            (Decimal(int(value)) * scale).quantize(_CENT, ROUND_HALF_EVEN) if ok else None
            for value, ok in zip(values, free, strict=True)
        ),
    )
