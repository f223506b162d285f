"""The matcher's in-memory view of the market: the island catalogue and the capacity calendar.

Quoting is the hot path (hundreds per second over 100,000 islands), so each process keeps:

- a **catalogue** of islands, clusters, chips, hubs and price cards in numpy arrays, reloaded when older
  than ``CARDHOUR_BROKER_CATALOG_TTL_SECONDS`` (0 in tests: every quote sees every change). A whole read
  reads every island (on PostgreSQL as packed columns, no Python object per island but its CPI: about
  0.1–0.2 s of CPU, and as much of PostgreSQL's, at 100,000 islands). On PostgreSQL a reload is
  normally a refresh instead: the island and cluster rows written since the last read's snapshot are
  found by their ``xmin`` (see ``CatalogueSource``) and patched in; a change a patch cannot follow
  exactly (a new island, a price card, a retired cluster…) reads whole. No request waits for either:
  the first quote that finds the catalogue stale starts a reload in a background thread and is
  answered from the old catalogue, which is replaced when the new one is ready. Only the first quote
  of a process, and a quote that finds the catalogue older than ``_STALE_LIMIT_TTLS`` TTLs (background
  reloads failing or stuck), reload inline; a TTL of 0 always reads whole, inline. In a server's
  workers a keeper thread (``Market.keep_fresh``) also starts the reloads, so a quiet spell does not
  leave the catalogue past that limit for the next quote;
- a **hold book**: every active capacity hold, followed incrementally. Each lease change writes a
  LeaseTransition row; before a quote the book reads the transitions after the last id it has seen and
  reloads the holds of those leases (at most every ``_HOLDS_REFRESH_SECONDS`` with a TTL; before every
  quote with a TTL of 0). Ids are taken at insert but become visible at commit, so a smaller id
  can appear after a larger one: the ids skipped over are remembered and asked for again for a minute.

The catalogue also carries what the operators' heartbeats keep from sale (K2, see federation.selectors:
``available_cards`` counts Cardhour's own leases as available, so the cards withheld are
``cards - unhealthy - available``) until each report expires (last heartbeat + interval × missed limit):
the matcher adds them as holds over ``[now, expiry)``, so they limit starts before the next expected
heartbeat and leave later starts to the declared cards. Only islands with cards withheld are listed.

Both are advisory. A quote may be a few seconds stale; ``lease_accept`` re-checks the cluster and every
island's occupancy under row locks in the database, which is what guarantees no oversubscription.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
from django.conf import settings
from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model, Q
from django.utils import timezone

from broker.models import CapacityHold, ClusterReliability, LeaseTransition
from core.packed import packed_ints, unpacked_ints
from federation.models import Accelerator, Cluster, Hub, HubLatency, Island, StandardCard
from federation.selectors import catalog_rows, heartbeat_report_ttl, standard_card_factor_of
from metering.models import PriceCard, Tariff, TariffVersion
from metering.selectors.tariffs import PriceCardRow, price_cards_in_force
from metering.sla import SlaTier, sla_credit_fraction

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FABRICS = ("nvlink", "hccs", "infiniband", "roce", "pcie")
_GAP_MEMORY_SECONDS = 60.0
_INITIAL_GAP_LOOKBACK = 1000
# A catalogue older than this many TTLs is reloaded inline: the background reloads are failing or stuck.
_STALE_LIMIT_TTLS = 6
# With a catalogue TTL (production), the hold book asks for new lease transitions at most this often:
# one query per quote was a tenth of a quote's time at 200 quotes/s, and a quote is advisory anyway
# (acceptance re-checks every island under its lock), so it may be this much staler.
_HOLDS_REFRESH_SECONDS = 0.2

logger = logging.getLogger(__name__)


_FABRIC_CODES = {fabric: i for i, fabric in enumerate(FABRICS)}


def _fabric_code(fabric: str) -> int:
    """A fabric's position in ``FABRICS``; one past the end for a fabric the matcher does not know."""
    return _FABRIC_CODES.get(fabric, len(FABRICS))


def epoch(value: datetime) -> int:
    return int((value - _EPOCH).total_seconds())


@dataclass
class Catalogue:
    loaded_at: float
    # Islands, sorted by id.
    island_id: np.ndarray
    island_cpi: list[str]
    island_cluster: np.ndarray  # index into the cluster arrays
    island_capacity: np.ndarray  # cards minus unhealthy cards
    island_fabric: np.ndarray  # index into FABRICS
    # Clusters.
    cluster_id: np.ndarray
    cluster_cpi: list[str]
    cluster_operator: np.ndarray
    cluster_hub: np.ndarray  # index into hub_codes
    cluster_status: list[str]
    cluster_active: np.ndarray
    cluster_chip: np.ndarray  # index into chip_slugs
    cluster_price: list[PriceCardRow | None]
    cluster_rate: np.ndarray  # float, for ranking only (NaN = unpriced)
    cluster_tariff: np.ndarray  # tariff version id, 0 = unpriced
    # Chips.
    chip_slugs: list[str]
    chip_tflops: list[Decimal | None]
    chip_tflops_f: np.ndarray  # NaN = not public
    chip_memory_f: np.ndarray
    chip_factor_e4: np.ndarray  # standard-card factor × 10⁴ (rating's quantisation); 0 = unknown
    # Hubs.
    hub_codes: list[str]
    latency_ms: np.ndarray  # [source, target], inf where unknown
    latency_dec: dict[tuple[int, int], Decimal]
    # Heartbeat reports (K2): the islands (catalogue positions, ascending) whose operator's report keeps
    # cards from sale, how many, and until when (epoch seconds). Empty: only declared cards count.
    withheld_island: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    withheld_cards: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    withheld_until: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Reliability (broker.services.reliability, stored hourly): per cluster, the score in percent × 1000
    # (exact: scores are kept to 0.001 %), and what quotes show of it. Empty arrays (a catalogue built by
    # hand) mean every cluster scores the prior; ``cluster_reliability`` None: no row yet (the prior).
    cluster_reliability_e3: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cluster_reliability: list[ClusterScore | None] = field(default_factory=list)
    prior_reliability_e3: int = 99_000
    # The SLA credit each cluster's price card would give, as a fraction of a placement's cost, at the
    # cluster's expected availability (its reliability): what the "adjusted" preference ranks net of.
    # Empty: no credit anywhere.
    cluster_credit_fraction: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    cluster_credit: list[Decimal] = field(default_factory=list)  # the same fractions, exact
    # What the catalogue was read from, to bring it up to date by reading only what changed since (see
    # ``_refreshed``). None: read elsewhere than PostgreSQL, or built by hand; the next load reads whole.
    source: CatalogueSource | None = None
    # The standard card's dense FP16 TFLOPS in force when the catalogue was read (None: built by hand).
    standard_tflops: Decimal | None = None

    @property
    def standard_card_factors(self) -> dict[str, Decimal | None] | None:
        """Every chip's standard-card factor by slug, as broker.draws.chip_factors reads it from the database
        (federation.selectors.standard_card_factor_of, on the standard card in force when the catalogue was
        read: the factors its placements carry); None for a catalogue built without the standard card."""
        if self.standard_tflops is None:
            return None
        factors = self.__dict__.get("_standard_card_factors")
        if factors is None:
            standard = self.standard_tflops
            factors = self.__dict__["_standard_card_factors"] = {
                slug: standard_card_factor_of(tflops=tflops, standard_tflops=standard)
                for slug, tflops in zip(self.chip_slugs, self.chip_tflops, strict=True)
            }
        return factors

    @property
    def reliability_e3(self) -> np.ndarray:
        """Every cluster's reliability score in percent × 1000 (the prior where none is stored)."""
        if len(self.cluster_reliability_e3) == len(self.cluster_id):
            return self.cluster_reliability_e3
        return np.full(len(self.cluster_id), self.prior_reliability_e3, dtype=np.int64)

    @property
    def credit_fraction(self) -> np.ndarray:
        """Every cluster's expected SLA credit as a fraction of cost (0 where none)."""
        if len(self.cluster_credit_fraction) == len(self.cluster_id):
            return self.cluster_credit_fraction
        return np.zeros(len(self.cluster_id), dtype=np.float64)

    def expected_credit(self, cluster_index: int, cost: Decimal) -> Decimal:
        """The SLA credit expected on a placement of ``cost`` on the cluster, CNY to the fen (half even)."""
        fraction = self.cluster_credit[cluster_index] if self.cluster_credit else Decimal(0)
        return (cost * fraction).quantize(Decimal("0.01"), ROUND_HALF_EVEN)

    def score(self, cluster_index: int) -> ClusterScore:
        """What a quote shows of a cluster's reliability: its stored score, or the prior."""
        known = self.cluster_reliability[cluster_index] if self.cluster_reliability else None
        if known is not None:
            return known
        return _prior_score(int(self.reliability_e3[cluster_index]))

    @property
    def size(self) -> int:
        return len(self.island_id)

    @property
    def withheld_until_max(self) -> int:
        """The latest expiry of any heartbeat report (0 when none): no report binds a later start."""
        latest = self.__dict__.get("_withheld_until_max")
        if latest is None:
            latest = self.__dict__["_withheld_until_max"] = (
                int(self.withheld_until.max()) if len(self.withheld_until) else 0
            )
        return latest

    def island_index(self, island_ids: np.ndarray) -> np.ndarray:
        """Catalogue positions of ``island_ids``; -1 for an island the catalogue does not know (yet)."""
        lookup = self.island_lookup
        if not len(island_ids):
            return np.zeros(0, dtype=np.int64)
        # Called on every hold in a quote's window (~30,000 at design size): when every id is within the
        # lookup (always, but for an island registered since the catalogue's load), one gather instead
        # of two masks, two wheres and a gather. Ids are positive, so only the top end is checked.
        if int(island_ids.max()) < len(lookup):
            return lookup[island_ids]
        inside = island_ids < len(lookup)
        return np.where(inside, lookup[np.where(inside, island_ids, 0)], -1)

    @property
    def islands_by_cluster(self) -> tuple[np.ndarray, np.ndarray]:
        """(first, islands): the catalogue positions of cluster ``i``'s islands are
        ``islands[first[i]:first[i + 1]]``, in catalogue (id) order."""
        grouped = self.__dict__.get("_islands_by_cluster")
        if grouped is None:
            islands = np.argsort(self.island_cluster, kind="stable")
            counts = np.bincount(self.island_cluster, minlength=len(self.cluster_id))
            first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            grouped = self.__dict__["_islands_by_cluster"] = (first, islands)
        return grouped

    @property
    def cluster_size(self) -> np.ndarray:
        """Islands per cluster."""
        first, _islands = self.islands_by_cluster
        return np.diff(first)

    @property
    def fabric_counts(self) -> np.ndarray:
        """``[cluster, fabric]``: how many of each cluster's islands are on each fabric (``FABRICS``)."""
        counts = self.__dict__.get("_fabric_counts")
        if counts is None:
            m, f = len(self.cluster_id), len(FABRICS)
            counts = self.__dict__["_fabric_counts"] = np.bincount(
                self.island_cluster * f + self.island_fabric, minlength=m * f
            ).reshape(m, f)
        return counts

    @property
    def capacity_keys(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(by_cluster, by_fabric, top): every island's ``cluster × top + capacity`` and
        ``(cluster × len(FABRICS) + fabric) × top + capacity``, each sorted, with ``top`` one more than
        the largest capacity. How many of a cluster's islands (on a fabric) have fewer than ``need``
        cards is then two binary searches, whatever the number of islands: the matcher counts its
        ``capacity`` rejections per cluster this way instead of comparing every island."""
        keys = self.__dict__.get("_capacity_keys")
        if keys is None:
            top = int(self.island_capacity.max()) + 1 if self.size else 1
            by_cluster = np.sort(self.island_cluster * top + self.island_capacity)
            by_fabric = np.sort(
                (self.island_cluster * len(FABRICS) + self.island_fabric) * top + self.island_capacity
            )
            keys = self.__dict__["_capacity_keys"] = (by_cluster, by_fabric, top)
        return keys

    def islands_below(self, clusters: np.ndarray, need: np.ndarray, fabrics: np.ndarray | None) -> np.ndarray:
        """For each of ``clusters``: how many of its islands (on one of ``fabrics``; None: any fabric)
        have fewer than ``need`` (aligned) cards. Per distinct ``need`` (one per chip, usually one in
        all), a gather from ``_below`` (per cluster, built once per catalogue and need); no pass over
        the islands, nor a binary search per cluster."""
        out = np.zeros(len(clusters), dtype=np.int64)
        if not len(clusters):
            return out
        _by_cluster, _by_fabric, top = self.capacity_keys
        limit = np.minimum(need, top)
        lowest, highest = int(limit.min()), int(limit.max())
        for value in [lowest] if lowest == highest else np.unique(limit).tolist():
            rows = slice(None) if lowest == highest else limit == value
            by_cluster, by_fabric = self._below(int(value))
            if fabrics is None:
                out[rows] = by_cluster[clusters[rows]]
            else:
                out[rows] = by_fabric[clusters[rows]][:, fabrics].sum(axis=1)
        return out

    def _below(self, need: int) -> tuple[np.ndarray, np.ndarray]:
        """(per cluster, per [cluster, fabric]): how many islands have fewer than ``need`` cards, from the
        sorted ``capacity_keys`` (two binary searches per cluster and fabric, once per catalogue and
        ``need``; ``need`` is at most ``top``, so there are few). Fabric positions past ``FABRICS``
        (unknown fabrics) are never asked for."""
        cache: dict[int, tuple[np.ndarray, np.ndarray]] = self.__dict__.setdefault("_below_cache", {})
        known = cache.get(need)
        if known is None:
            by_cluster, by_fabric, top = self.capacity_keys
            m, f = len(self.cluster_id), len(FABRICS)
            base = np.arange(m, dtype=np.int64) * top
            cluster_counts = np.searchsorted(by_cluster, base + need) - np.searchsorted(by_cluster, base)
            base = np.arange(m * f, dtype=np.int64) * top
            fabric_counts = (
                np.searchsorted(by_fabric, base + need) - np.searchsorted(by_fabric, base)
            ).reshape(m, f)
            known = cache[need] = (cluster_counts.astype(np.int64), fabric_counts.astype(np.int64))
        return known

    @property
    def tariff_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """(tariffs, of_cluster): the distinct tariff versions of priced clusters, ascending, and for each
        cluster 1 + the position of its tariff there (0: unpriced)."""
        groups = self.__dict__.get("_tariff_groups")
        if groups is None:
            tariffs, inverse = np.unique(self.cluster_tariff, return_inverse=True)
            if len(tariffs) and tariffs[0] == 0:
                tariffs, of_cluster = tariffs[1:], inverse.astype(np.int64)
            else:
                of_cluster = inverse.astype(np.int64) + 1
            groups = self.__dict__["_tariff_groups"] = (tariffs.astype(np.int64), of_cluster.reshape(-1))
        return groups

    @property
    def island_lookup(self) -> np.ndarray:
        """Catalogue position by island id (-1: no such island), up to the largest id."""
        lookup = self.__dict__.get("_lookup_array")
        if lookup is None:
            top = int(self.island_id.max()) + 1 if len(self.island_id) else 1
            lookup = np.full(top, -1, dtype=np.int64)
            lookup[self.island_id] = np.arange(len(self.island_id))
            self.__dict__["_lookup_array"] = lookup
        return lookup


@dataclass(frozen=True)
class ClusterScore:
    """A cluster's reliability as quotes show it: the score in percent, interruptions per 1,000 card-hours
    sold (None when nothing was sold), and whether it is the prior alone (a new cluster: nothing sold in
    the window)."""

    percent: Decimal
    interruptions_per_1000_card_hours: Decimal | None
    prior: bool


@functools.lru_cache(maxsize=1024)
def _prior_score(reliability_e3: int) -> ClusterScore:
    """The score a quote shows of a cluster with no score of its own: the prior (per mille), made once per
    value (it is immutable)."""
    return ClusterScore(
        percent=(Decimal(reliability_e3) / 1000).quantize(Decimal("0.001")),
        interruptions_per_1000_card_hours=None,
        prior=True,
    )


def _reliability(cluster_ids: list[int], prior_e3: int) -> tuple[np.ndarray, list[ClusterScore | None]]:
    """The stored scores of ``cluster_ids`` (one query per catalogue load, never per quote)."""
    stored = {
        cluster_id: ClusterScore(percent=percent, interruptions_per_1000_card_hours=rate, prior=sold <= 0)
        for cluster_id, percent, rate, sold in ClusterReliability.objects.order_by().values_list(
            "cluster_id", "reliability_percent", "interruptions_per_1000_card_hours", "sold_card_seconds"
        )
    }
    scores = [stored.get(cluster_id) for cluster_id in cluster_ids]
    e3 = np.fromiter(
        (int(score.percent * 1000) if score is not None else prior_e3 for score in scores),
        dtype=np.int64,
        count=len(scores),
    )
    return e3, scores


def _credit_fractions(prices: list[PriceCardRow | None], reliability_e3: np.ndarray) -> list[Decimal]:
    """Per cluster: the fraction of a lease's charge its price card's credit schedule gives at the
    cluster's reliability score taken as the expected availability (metering.sla; 0 without a schedule).
    Once per catalogue load, a dictionary lookup per cluster: clusters share a handful of schedules."""
    memo: dict[tuple[tuple[SlaTier, ...], int], Decimal] = {}
    out = []
    for price, e3 in zip(prices, reliability_e3.tolist(), strict=True):
        if price is None or not price.sla_credit_schedule:
            out.append(Decimal(0))
            continue
        key = (price.sla_credit_schedule, e3)
        fraction = memo.get(key)
        if fraction is None:
            fraction = memo[key] = sla_credit_fraction(
                schedule=price.sla_credit_schedule, availability=Decimal(e3) / 1000
            )
        out.append(fraction)
    return out


@dataclass(frozen=True)
class CatalogueSource:
    """What a catalogue was read from on PostgreSQL: the snapshot and the raw figures it patches.

    ``xid_floor``: the snapshot's xmin (a 64-bit transaction id). Every row version the reads did not see
    was written by a transaction with an id at or above it (one in progress at the snapshot, or begun
    after), so the rows changed since are among those whose ``xmin`` is at or above it: a filter on a
    scan, no column, trigger or index to maintain on the operators' hot rows (heartbeats).
    A deleted row leaves nothing to find: the tables' deletions are recorded in one row (migration broker
    0012), and a catalogue that finds it written since reads whole.
    ``next_effective_at``: the earliest price card or standard-card version not yet in force, which
    changes the catalogue at that instant without a write."""

    xid_floor: int
    next_effective_at: datetime | None
    report_ttl: int
    # Per cluster, catalogue order: (id, CPI, operator id, hub code, chip slug), what a patch may not change.
    cluster_keys: list[tuple[int, str, int, str, str]]
    report_until: np.ndarray  # per cluster: last heartbeat + report TTL, epoch seconds; 0: never beat
    island_cards: np.ndarray  # per island, catalogue order
    island_unhealthy: np.ndarray
    island_available: np.ndarray

    @property
    def cluster_position(self) -> dict[int, int]:
        positions = self.__dict__.get("_cluster_position")
        if positions is None:
            positions = {key[0]: i for i, key in enumerate(self.cluster_keys)}
            object.__setattr__(self, "_cluster_position", positions)
        return positions


# Every table a catalogue is read from. Islands and clusters are patched row by row (``_refreshed``); a
# change of any other (prices, tariffs, chips, hubs, latencies, the standard card, reliability scores:
# rare, or hourly) has the catalogue read whole. A table added to the load must be added here.
_PATCHED: tuple[type[Model], ...] = (Island, Cluster)
_WATCHED: tuple[type[Model], ...] = (
    *_PATCHED,
    PriceCard,
    TariffVersion,
    Tariff,
    Accelerator,
    Hub,
    HubLatency,
    StandardCard,
    ClusterReliability,
)
# One row, written by a trigger on each watched table after any DELETE or TRUNCATE (migration broker 0012).
_DELETIONS_TABLE = "broker_catalogue_deletions"
# A refresh spanning more transaction ids than this reads whole: 32-bit xids compare by ``age``, which is
# exact within 2³¹ of now.
_XID_SPAN_LIMIT = 2**30


@contextmanager
def _one_snapshot(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """On PostgreSQL, outside any transaction: the catalogue's reads in one read-only REPEATABLE READ
    transaction, so that they, the counts and the xid floor all describe one instant. Inside a
    transaction (tests) the reads run as they are."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic(using=connection.alias):
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def _xid_floor(connection: BaseDatabaseWrapper) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        return int(cursor.fetchone()[0])


def _changed_since(alias: str, floor: int) -> str:
    """A condition on ``alias``'s row: written by a transaction at or after ``floor`` (64-bit). ``age``
    compares 32-bit ids modulo 2³² from one "now" in the transaction: exact within ``_XID_SPAN_LIMIT``.
    A frozen row (xmin 2) is infinitely old. The floor is an integer, formatted here."""
    return f"age({alias}.xmin) <= age('{int(floor) % 2**32}'::xid)"


def _written_elsewhere(connection: BaseDatabaseWrapper, floor: int) -> bool:
    """Whether a row of a watched table that is not patched, or the deletions row, was written at or after
    ``floor``: one statement, each scan stopping at its first such row."""
    tables = [model._meta.db_table for model in _WATCHED if model not in _PATCHED] + [_DELETIONS_TABLE]
    # Table names from the models' metadata and an integer: no value from outside.
    probes = " OR ".join(
        f"EXISTS (SELECT 1 FROM {connection.ops.quote_name(table)} t WHERE {_changed_since('t', floor)})"  # noqa: S608
        for table in tables
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {probes}")
        return bool(cursor.fetchone()[0])


def _next_effective_at(at: datetime) -> datetime | None:
    """The earliest price card or standard-card version that comes into force after ``at``."""
    upcoming = [
        model.objects.filter(effective_from__gt=at)
        .order_by("effective_from")
        .values_list("effective_from", flat=True)
        .first()
        for model in (PriceCard, StandardCard)
    ]
    return min((when for when in upcoming if when is not None), default=None)


def _report_until(
    clusters: list[tuple[int, str, int, str, str, str, datetime | None]], ttl: int
) -> np.ndarray:
    return np.fromiter(
        (epoch(row[6]) + ttl if row[6] is not None else 0 for row in clusters),
        dtype=np.int64,
        count=len(clusters),
    )


def _withheld(
    *,
    cards: np.ndarray,
    unhealthy: np.ndarray,
    available: np.ndarray,
    island_cluster: np.ndarray,
    report_until: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(islands, cards, until): what each island's last heartbeat keeps from sale, while the report
    binds (federation.selectors). Expired reports are kept (a quote compares each expiry with its own
    first start); offline clusters' islands are never candidates anyway."""
    withheld = cards - unhealthy - available
    until = report_until[island_cluster] if len(island_cluster) else np.zeros(0, dtype=np.int64)
    islands = np.nonzero((withheld > 0) & (until > 0))[0]
    return islands, withheld[islands], until[islands]


def _load_catalogue(previous: Catalogue | None = None) -> Catalogue:
    """The catalogue as the database has it now: ``previous`` brought up to date by reading only the
    rows changed since it was read, where that is possible (``_refreshed``), else read whole."""
    connection = connections[router.db_for_read(Island)]
    with _one_snapshot(connection):
        if previous is not None and previous.source is not None:
            refreshed = _refreshed(previous, connection)
            if refreshed is not None:
                return refreshed
        return _read_whole(connection)


def _read_whole(connection: BaseDatabaseWrapper) -> Catalogue:
    floor = _xid_floor(connection) if connection.vendor == "postgresql" else None
    now = timezone.now()
    rows = catalog_rows()
    prices = price_cards_in_force(at=now)
    chips = sorted(rows.accelerators, key=lambda row: row[0])
    chip_index = {slug: i for i, (slug, _, _) in enumerate(chips)}
    hub_codes = sorted({code for row in rows.clusters for code in (row[3],)} | {r[0] for r in rows.latencies})
    hub_index = {code: i for i, code in enumerate(hub_codes)}
    latency = np.full((len(hub_codes), len(hub_codes)), np.inf)
    latency_dec: dict[tuple[int, int], Decimal] = {}
    for source, target, ms in rows.latencies:
        latency[hub_index[source], hub_index[target]] = float(ms)
        latency_dec[(hub_index[source], hub_index[target])] = ms
    clusters = rows.clusters
    cluster_price = [prices.get(row[0]) for row in clusters]
    # The islands' columns, in id order: numpy work, no Python object per island but its CPI.
    columns = rows.islands
    by_id = np.argsort(columns.id, kind="stable")
    island_id = columns.id[by_id]
    island_cpi = [columns.cpi[i] for i in by_id.tolist()]
    cards = columns.cards[by_id]
    unhealthy = columns.unhealthy_cards[by_id]
    available = columns.available_cards[by_id]
    fabric_codes = np.array([_fabric_code(fabric) for fabric in columns.fabric], dtype=np.int64)[by_id]
    cluster_ids = np.fromiter((row[0] for row in clusters), dtype=np.int64, count=len(clusters))
    cluster_order = np.argsort(cluster_ids, kind="stable")
    island_cluster_id = columns.cluster_id[by_id]

    def factor_e4(tflops: Decimal | None) -> int:
        factor = standard_card_factor_of(tflops=tflops, standard_tflops=rows.standard_tflops)
        return 0 if factor is None else int(factor * 10**4)

    # Every island's cluster is in ``clusters`` (both exclude retired clusters, in one transaction's
    # snapshot or not: an island whose cluster is missing fails loudly here rather than being misfiled).
    at = np.minimum(np.searchsorted(cluster_ids[cluster_order], island_cluster_id), max(len(clusters) - 1, 0))
    island_cluster = cluster_order[at] if len(clusters) else np.zeros(0, dtype=np.int64)
    if len(island_cluster) and not bool((cluster_ids[island_cluster] == island_cluster_id).all()):
        raise LookupError("an island's cluster is missing from the catalogue rows")
    ttl = int(heartbeat_report_ttl().total_seconds())
    report_until = _report_until(clusters, ttl)
    withheld_island, withheld_cards, withheld_until = _withheld(
        cards=cards,
        unhealthy=unhealthy,
        available=available,
        island_cluster=island_cluster,
        report_until=report_until,
    )
    prior_e3 = int(Decimal(settings.CARDHOUR_RELIABILITY_PRIOR_PERCENT) * 1000)
    reliability_e3, scores = _reliability([row[0] for row in clusters], prior_e3)
    credit = _credit_fractions(cluster_price, reliability_e3)

    return Catalogue(
        loaded_at=time.monotonic(),
        island_id=island_id,
        island_cpi=island_cpi,
        island_cluster=island_cluster,
        island_capacity=np.maximum(cards - unhealthy, 0),
        island_fabric=fabric_codes,
        cluster_id=cluster_ids,
        cluster_cpi=[row[1] for row in clusters],
        cluster_operator=np.fromiter((row[2] for row in clusters), dtype=np.int64, count=len(clusters)),
        cluster_hub=np.fromiter((hub_index[row[3]] for row in clusters), dtype=np.int64, count=len(clusters)),
        cluster_status=[row[4] for row in clusters],
        cluster_active=np.fromiter((row[4] == "active" for row in clusters), dtype=bool, count=len(clusters)),
        cluster_chip=np.fromiter(
            (chip_index[row[5]] for row in clusters), dtype=np.int64, count=len(clusters)
        ),
        cluster_price=cluster_price,
        cluster_rate=np.array(
            [float(p.rate_per_card_hour) if p else np.nan for p in cluster_price], dtype=np.float64
        ),
        cluster_tariff=np.array([p.tariff_version_id if p else 0 for p in cluster_price], dtype=np.int64),
        chip_slugs=[row[0] for row in chips],
        chip_tflops=[row[1] for row in chips],
        chip_tflops_f=np.array([float(row[1]) if row[1] is not None else np.nan for row in chips]),
        chip_memory_f=np.array([float(row[2]) if row[2] is not None else np.nan for row in chips]),
        chip_factor_e4=np.array([factor_e4(row[1]) for row in chips], dtype=np.int64),
        hub_codes=hub_codes,
        latency_ms=latency,
        latency_dec=latency_dec,
        withheld_island=withheld_island,
        withheld_cards=withheld_cards,
        withheld_until=withheld_until,
        cluster_reliability_e3=reliability_e3,
        cluster_reliability=scores,
        prior_reliability_e3=prior_e3,
        cluster_credit=credit,
        cluster_credit_fraction=np.array([float(f) for f in credit], dtype=np.float64),
        standard_tflops=rows.standard_tflops,
        source=None
        if floor is None
        else CatalogueSource(
            xid_floor=floor,
            next_effective_at=_next_effective_at(now),
            report_ttl=ttl,
            cluster_keys=[(row[0], row[1], row[2], row[3], row[5]) for row in clusters],
            report_until=report_until,
            island_cards=cards,
            island_unhealthy=unhealthy,
            island_available=available,
        ),
    )


# Derived arrays (Catalogue properties) that depend only on which islands and clusters there are, their
# fabrics and prices, and those that depend on the islands' capacity as well.
_STRUCTURE_DERIVED = ("_islands_by_cluster", "_fabric_counts", "_tariff_groups", "_lookup_array")
_CAPACITY_DERIVED = ("_capacity_keys", "_below_cache")


def _refreshed(old: Catalogue, connection: BaseDatabaseWrapper) -> Catalogue | None:
    """``old`` brought up to date from the island and cluster rows written since its snapshot (a filter
    on one scan of each; nothing else is read when nothing changed), or None where a patch could not be
    exact and the catalogue must be read whole: a row of another watched table written or deleted, an
    island or cluster added or deleted, an island that changed cluster, CPI or fabric, a cluster that
    changed CPI, operator, hub or chip, was retired or came back, a price card or standard card that came
    into force, a changed report TTL, or more than ``_XID_SPAN_LIMIT`` transactions since. What is
    patched: islands' cards, unhealthy and available cards (heartbeats), clusters' status and last
    heartbeat."""
    source = old.source
    if source is None or connection.vendor != "postgresql":
        return None
    if source.next_effective_at is not None and timezone.now() >= source.next_effective_at:
        return None
    ttl = int(heartbeat_report_ttl().total_seconds())
    if ttl != source.report_ttl:
        return None
    floor = _xid_floor(connection)
    if floor - source.xid_floor >= _XID_SPAN_LIMIT:
        return None
    if _written_elsewhere(connection, source.xid_floor):
        return None

    # Clusters: status and last heartbeat patched; anything else is a whole read.
    cluster_status, cluster_active, report_until = old.cluster_status, old.cluster_active, source.report_until
    positions = source.cluster_position
    patches: dict[int, tuple[str, int]] = {}
    for cluster_id, cpi, operator_id, hub, status, chip, heartbeat in _clusters_written_since(
        connection, source.xid_floor
    ):
        at = positions.get(cluster_id)
        if at is None:
            if status == "retired":  # retired before the catalogue was read: not in it, nor to be
                continue
            return None
        if status == "retired" or (cluster_id, cpi, operator_id, hub, chip) != source.cluster_keys[at]:
            return None
        until = heartbeat + ttl if heartbeat is not None else 0
        if status != cluster_status[at] or until != report_until[at]:
            patches[at] = (status, until)
    if patches:
        cluster_status, cluster_active, report_until = (
            list(cluster_status),
            cluster_active.copy(),
            report_until.copy(),
        )
        for at, (status, until) in patches.items():
            cluster_status[at], cluster_active[at], report_until[at] = status, status == "active", until

    # Islands: cards, unhealthy and available cards patched.
    cards, unhealthy, available = source.island_cards, source.island_unhealthy, source.island_available
    written = _islands_written_since(connection, source.xid_floor)
    if written is not None:
        ids, cluster_ids, new_cards, new_unhealthy, new_available, fabric_codes, cpis = written
        size = old.size
        place = np.minimum(np.searchsorted(old.island_id, ids), max(size - 1, 0))
        found = (old.island_id[place] == ids) if size else np.zeros(len(ids), dtype=bool)
        # An island of a cluster outside the catalogue is of a retired cluster (an added or returned cluster
        # was a whole read above): skipped if the catalogue does not have it, a move if it does.
        in_catalogue = np.isin(cluster_ids, old.cluster_id)
        if (found != in_catalogue).any():
            return None
        place, rows = place[found], np.flatnonzero(found)
        if (
            not np.array_equal(old.cluster_id[old.island_cluster[place]], cluster_ids[rows])
            or not np.array_equal(fabric_codes[rows], old.island_fabric[place])
            or [cpis[i] for i in rows.tolist()] != [old.island_cpi[i] for i in place.tolist()]
        ):
            return None
        cards, unhealthy, available = cards.copy(), unhealthy.copy(), available.copy()
        cards[place], unhealthy[place], available[place] = (
            new_cards[rows],
            new_unhealthy[rows],
            new_available[rows],
        )

    capacity = np.maximum(cards - unhealthy, 0)
    if np.array_equal(capacity, old.island_capacity):
        capacity = old.island_capacity  # keeps the derived arrays that depend on it
    withheld_island, withheld_cards, withheld_until = _withheld(
        cards=cards,
        unhealthy=unhealthy,
        available=available,
        island_cluster=old.island_cluster,
        report_until=report_until,
    )
    fresh_source = dataclasses.replace(
        source,
        xid_floor=floor,
        report_until=report_until,
        island_cards=cards,
        island_unhealthy=unhealthy,
        island_available=available,
    )
    object.__setattr__(fresh_source, "_cluster_position", positions)  # the same clusters, same places
    fresh = dataclasses.replace(
        old,
        loaded_at=time.monotonic(),
        island_capacity=capacity,
        cluster_status=cluster_status,
        cluster_active=cluster_active,
        withheld_island=withheld_island,
        withheld_cards=withheld_cards,
        withheld_until=withheld_until,
        source=fresh_source,
    )
    kept = _STRUCTURE_DERIVED + (_CAPACITY_DERIVED if capacity is old.island_capacity else ())
    fresh.__dict__.update({key: old.__dict__[key] for key in kept if key in old.__dict__})
    return fresh


def _clusters_written_since(
    connection: BaseDatabaseWrapper, floor: int
) -> list[tuple[int, str, int, str, str, str, int | None]]:
    """Every cluster row (retired too) written at or after ``floor``, as ``catalog_rows`` gives them but
    for the last heartbeat, in epoch seconds (no datetime to build per row)."""
    quote = connection.ops.quote_name
    sql = (
        "SELECT c.id, c.cpi, c.operator_id, h.code, c.status, a.slug, "  # noqa: S608 (names, an integer)
        "floor(extract(epoch FROM c.last_heartbeat_at))::bigint "
        f"FROM {quote(Cluster._meta.db_table)} c JOIN {quote(Hub._meta.db_table)} h ON h.id = c.hub_id "
        f"JOIN {quote(Accelerator._meta.db_table)} a ON a.id = c.accelerator_id "
        f"WHERE {_changed_since('c', floor)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def _islands_written_since(
    connection: BaseDatabaseWrapper, floor: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]] | None:
    """(ids, cluster ids, cards, unhealthy, available, fabric codes (``_fabric_code``), CPIs) of every
    island (in any cluster) written at or after ``floor``, as packed columns
    (core.packed); None if none."""
    table = connection.ops.quote_name(Island._meta.db_table)
    fabric_code = f"coalesce(array_position(%s::text[], i.fabric::text), {len(FABRICS) + 1}) - 1"
    expressions = ("i.id", "i.cluster_id", "i.cards", "i.unhealthy_cards", "i.available_cards", fabric_code)
    sql = (
        f"SELECT {', '.join(packed_ints(expression) for expression in expressions)}, string_agg(i.cpi, E'\\n') "  # noqa: S608
        f"FROM {table} i WHERE {_changed_since('i', floor)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(FABRICS)])
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    ids, cluster_ids, cards, unhealthy, available, fabric_codes = (
        unpacked_ints(column) for column in row[:6]
    )
    return ids, cluster_ids, cards, unhealthy, available, fabric_codes, row[6].split("\n")


def _load_catalogue_quietly(previous: Catalogue | None = None) -> Catalogue:
    """``_load_catalogue`` with the cyclic garbage collector paused (process-wide, for the ~0.2 s of the
    load). The load makes a few hundred thousand short-lived row tuples; with the collector running they
    survive long enough to be promoted to the oldest generation and soon set off a full collection,
    which stops every thread of the process for about 0.1 s at design size: a quote's tail latency.
    Paused, they are freed by reference counting and never promoted. Nothing in the load makes cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _load_catalogue(previous)
    finally:
        if was_enabled:  # another thread that paused it concurrently leaves it to us (or we to it)
            gc.enable()


def _active_holds(floor: datetime) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lease id, island id, start, end, cards) of every active hold ending after ``floor``, times in epoch
    seconds. On PostgreSQL the database converts the times and the rows come back as plain integers (no
    model or datetime per row); elsewhere through the ORM."""
    alias = router.db_for_read(CapacityHold)
    connection = connections[alias]
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(CapacityHold._meta.db_table)

        # One row of five packed columns (core.packed): no Python object per hold (a new process's first
        # quote waits for this). The table name comes from the model's metadata; the one value is a bound
        # parameter.
        expressions = (
            "lease_id",
            "island_id",
            "floor(extract(epoch FROM start_at))",
            "floor(extract(epoch FROM end_at))",
            "cards",
        )
        sql = (
            f"SELECT {', '.join(packed_ints(expression) for expression in expressions)} "  # noqa: S608
            f"FROM {table} WHERE active AND end_at > %s"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [floor])
            columns = cursor.fetchone()
        if columns is None or columns[0] is None:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty, empty, empty
        lease, island, start, end, cards = (unpacked_ints(column) for column in columns)
        return lease, island, start, end, cards
    rows = [
        (lease_id, island_id, epoch(start_at), epoch(end_at), cards)
        for lease_id, island_id, start_at, end_at, cards in CapacityHold.objects.filter(
            active=True, end_at__gt=floor
        ).values_list("lease_id", "island_id", "start_at", "end_at", "cards")
    ]
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty, empty
    table_ = np.array(rows, dtype=np.int64)
    return table_[:, 0], table_[:, 1], table_[:, 2], table_[:, 3], table_[:, 4]


class HoldBook:
    """Every active capacity hold, in growable numpy arrays, followed through LeaseTransition ids.

    Rows ``[0, sorted_upto)`` are ordered by island, then start; rows added since are appended after
    them. The matcher sorts a quote's hold edges by island and slot, which costs much less on input that
    is already in that order (and reads it with better locality), so the book sorts itself again at
    load, at compaction, and when the unsorted tail grows past a sixteenth of the book (a numpy sort
    of the live rows: a few milliseconds at 100,000 holds, once per thousands of lease changes).

    ``held`` is, by island id, the cards of the book's live holds summed whatever their times: a bound on
    what an island's holds in any window occupy at once. An island whose bound leaves a job its cards
    cannot be blocked by its holds, so the matcher skips its rows (broker.matching_kernel.candidate_rows).
    It is replaced, never changed in place, whenever the live rows change, so the array a quote took with
    its rows (``rows``) stays the bound of exactly those rows."""

    _COLUMNS = ("lease", "island", "start", "end", "cards", "alive")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded = False
        self.last_id = 0
        self.gaps: dict[int, float] = {}
        self._size = 0
        self._dead = 0
        self.sorted_upto = 0
        self.lease = np.zeros(1024, dtype=np.int64)
        self.island = np.zeros(1024, dtype=np.int64)
        self.start = np.zeros(1024, dtype=np.int64)
        self.end = np.zeros(1024, dtype=np.int64)
        self.cards = np.zeros(1024, dtype=np.int64)
        self.alive = np.zeros(1024, dtype=bool)
        self.held = np.zeros(0, dtype=np.int64)

    # -- writes -----------------------------------------------------------------------------------
    def _grow(self, need: int) -> None:
        capacity = len(self.island)
        if self._size + need <= capacity:
            return
        new = max(capacity * 2, self._size + need)
        for name in self._COLUMNS:
            old = getattr(self, name)
            grown = np.zeros(new, dtype=old.dtype)
            grown[: self._size] = old[: self._size]
            setattr(self, name, grown)

    def _replace_leases(self, holds: dict[int, list[tuple[int, int, int, int]]]) -> None:
        """Replace the holds of each lease in ``holds`` by the given (island id, start, end, cards): one
        vectorised pass marks the old rows dead, the new ones are appended."""
        if not holds:
            return
        n = self._size
        ids = np.fromiter(holds, dtype=np.int64, count=len(holds))
        old = self.alive[:n] & np.isin(self.lease[:n], ids)
        self.alive[:n][old] = False
        self._dead += int(old.sum())
        held = self.held.copy()  # a new array: a quote may be reading the current one
        np.subtract.at(held, self.island[:n][old], self.cards[:n][old])
        rows = [(lease_id, *hold) for lease_id, lease_holds in holds.items() for hold in lease_holds]
        if not rows:
            self.held = held
            return
        self._grow(len(rows))
        added = np.array(rows, dtype=np.int64)
        end = n + len(rows)
        for column, name in enumerate(self._COLUMNS[:-1]):
            getattr(self, name)[n:end] = added[:, column]
        self.alive[n:end] = True
        self._size = end
        top = int(added[:, 1].max()) + 1
        if top > len(held):
            held = np.concatenate([held, np.zeros(top - len(held), dtype=np.int64)])
        np.add.at(held, added[:, 1], added[:, 4])
        self.held = held

    def _reorder(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (positions, any order), sorted by island, then start."""
        rows = rows[np.lexsort((self.start[rows], self.island[rows]))]
        spare = max(1024, len(rows) // 4)
        for name in self._COLUMNS:
            arr = getattr(self, name)
            setattr(self, name, np.concatenate([arr[rows], np.zeros(spare, dtype=arr.dtype)]))
        self._size = self.sorted_upto = len(rows)
        self._dead = 0
        island = self.island[: self._size]
        # Sums of whole cards, exact in float64 (bincount's weights) far beyond any island's capacity.
        self.held = np.bincount(island, weights=self.cards[: self._size]).astype(np.int64)

    def _compact(self, now_epoch: int) -> None:
        n = self._size
        keep = self.alive[:n] & (self.end[:n] > now_epoch - 3600)
        if self._dead < n // 2 and keep.sum() > n - n // 4:
            return
        self._reorder(np.nonzero(keep)[0])

    def _sort_if_ragged(self) -> None:
        """Sort the book again when the rows appended since the last sort pass a sixteenth of it."""
        n = self._size
        if n - self.sorted_upto > max(2048, n // 16):
            self._reorder(np.nonzero(self.alive[:n])[0])

    def _load_arrays(
        self, lease: np.ndarray, island: np.ndarray, start: np.ndarray, end: np.ndarray, cards: np.ndarray
    ) -> None:
        """Fill an empty book from whole arrays, one row per hold: numpy copies and one sort, where adding
        holds one by one cost seconds of CPU at 100,000 leases."""
        n = len(lease)
        self._size = 0
        self._grow(n)
        self.lease[:n], self.island[:n], self.start[:n], self.end[:n], self.cards[:n] = (
            lease,
            island,
            start,
            end,
            cards,
        )
        self.alive[:n] = True
        self._size = n
        self._reorder(np.arange(n))

    def _load_leases(self, lease_ids: set[int]) -> None:
        holds: dict[int, list[tuple[int, int, int, int]]] = {lease_id: [] for lease_id in lease_ids}
        rows = CapacityHold.objects.filter(lease_id__in=lease_ids, active=True).values_list(
            "lease_id", "island_id", "start_at", "end_at", "cards"
        )
        for lease_id, island_id, start_at, end_at, cards in rows:
            holds[lease_id].append((island_id, epoch(start_at), epoch(end_at), cards))
        self._replace_leases(holds)
        self._sort_if_ragged()

    def refresh(self) -> None:
        """Catch up with every lease change committed since the last call."""
        now = time.monotonic()
        if not self.loaded:
            self._initial_load()
            return
        query = Q(pk__gt=self.last_id)
        if self.gaps:
            query |= Q(pk__in=list(self.gaps))
        changes = list(LeaseTransition.objects.filter(query).order_by().values_list("pk", "lease_id"))
        if not changes and not self.gaps:
            return
        seen = {pk for pk, _ in changes}
        top = max(seen | {self.last_id})
        # A transaction holds at most a few ids for a moment; ids far below the newest are not waited for
        # (this also keeps a first refresh after an empty start from remembering a whole sequence).
        for missing in range(max(self.last_id + 1, top - _INITIAL_GAP_LOOKBACK), top):
            if missing not in seen:
                self.gaps.setdefault(missing, now)
        for pk in seen:
            self.gaps.pop(pk, None)
        self.gaps = {pk: at for pk, at in self.gaps.items() if now - at < _GAP_MEMORY_SECONDS}
        self.last_id = top
        if changes:
            self._load_leases({lease_id for _, lease_id in changes})

    def _initial_load(self) -> None:
        last = LeaseTransition.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        recent = set(
            LeaseTransition.objects.filter(pk__gt=max(last - _INITIAL_GAP_LOOKBACK, 0)).values_list(
                "pk", flat=True
            )
        )
        now = time.monotonic()
        self.gaps = {
            pk: now for pk in range(max(last - _INITIAL_GAP_LOOKBACK, 0) + 1, last + 1) if pk not in recent
        }
        floor = datetime.fromtimestamp(timezone.now().timestamp() - 3600, tz=UTC)
        lease, island, start, end, cards = _active_holds(floor)
        self._load_arrays(lease, island, start, end, cards)
        self.last_id = last
        self.loaded = True

    # -- reads ------------------------------------------------------------------------------------
    def overlapping(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(island id, start, end, cards) of the live holds that overlap ``[start, end)``."""
        # Every quote passes over the whole book here: one compiled pass (imported here: numba loads with
        # the matcher's kernels, not with the catalogue).
        from broker.matching_kernel import overlapping_rows

        return overlapping_rows(
            self.island, self.start, self.end, self.cards, self.alive, self._size, start, end
        )

    def rows(self) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
        """The book as it stands, nothing selected: (island id, start, end, cards) of its rows, which rows
        are alive, and ``held``, all of the same moment. What an island-gang quote reads
        (broker.matching.match's ``alive``): it selects the live rows in its window in the pass that picks
        its candidates' holds, instead of copying them out of the book first (``overlapping``).

        The four columns are the book's own arrays up to its size, not copies: nothing writes a row below
        the size in place but ``alive`` (an append writes past it; a sort or a growth makes new arrays and
        leaves these to whoever holds them), so they stay as they are after the lock is released. ``alive``
        is written in place, so it is a copy (a byte a row: ~0.1 MB at 100,000 holds); ``held`` is
        replaced, never written (see the class)."""
        n = self._size
        return (
            (self.island[:n], self.start[:n], self.end[:n], self.cards[:n]),
            self.alive[:n].copy(),
            self.held,
        )

    def maintain(self, now_epoch: int) -> None:
        self._compact(now_epoch)


def _derive(catalogue: Catalogue) -> None:
    """Build the catalogue's derived arrays now (in a background thread), not in a request."""
    catalogue.island_index(catalogue.island_id[:1])
    catalogue.islands_by_cluster  # noqa: B018
    catalogue.tariff_groups  # noqa: B018
    catalogue.fabric_counts  # noqa: B018
    catalogue.capacity_keys  # noqa: B018


class Market:
    """The process-wide catalogue and hold book, refreshed under one lock; the catalogue is reloaded in
    the background (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.catalogue: Catalogue | None = None
        self.holds = HoldBook()
        self._quotes = 0
        self._holds_refreshed_at = 0.0
        self._reloader: threading.Thread | None = None
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()
        # Set by ``prepare_for_fork`` in a server's master: when it last made the market ready for a
        # worker (monotonic seconds; 0: never), and the pid it did so in (a worker that inherits the
        # market has another pid: see ``inherited``).
        self.prepared_at = 0.0
        self.prepared_in: int | None = None

    def view(
        self, *, start: int, end: int
    ) -> tuple[Catalogue, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The catalogue (normally at most one TTL plus one reload old, never ``_STALE_LIMIT_TTLS`` TTLs)
        and the live holds overlapping ``[start, end)``, caught up with every lease change committed so
        far."""
        with self.lock:
            return self._caught_up(), self.holds.overlapping(start, end)

    def book_view(
        self,
    ) -> tuple[Catalogue, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
        """``view`` with the hold book as it stands (``HoldBook.rows``: its rows, which of them are alive and
        its bound by island id), nothing selected: what a quote hands the matcher, which selects."""
        with self.lock:
            catalogue = self._caught_up()
            holds, alive, held = self.holds.rows()
            return catalogue, holds, alive, held

    def _caught_up(self) -> Catalogue:
        """The catalogue to quote on, the hold book caught up (see ``view``); called with the lock held."""
        ttl = settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS
        catalogue = self.catalogue
        if catalogue is None or ttl <= 0 or time.monotonic() - catalogue.loaded_at >= ttl * _STALE_LIMIT_TTLS:
            catalogue = self.catalogue = _load_catalogue_quietly(catalogue if ttl > 0 else None)
        elif time.monotonic() - catalogue.loaded_at >= ttl:
            self._reload_in_background()
        if ttl <= 0:  # tests: nothing carried from one quote to the next
            self.holds = HoldBook()
        now = time.monotonic()
        if ttl <= 0 or not self.holds.loaded or now - self._holds_refreshed_at >= _HOLDS_REFRESH_SECONDS:
            self.holds.refresh()
            self._holds_refreshed_at = now
        self._quotes += 1
        if self._quotes % 1000 == 0:
            self.holds.maintain(epoch(timezone.now()))
        return catalogue

    def warm(self) -> None:
        """Load the catalogue and the hold book now, if not loaded yet: a new server process calls this
        in the background as it starts (config/gunicorn.conf.py), so that its first quote finds them
        loaded instead of loading them itself. A quote that comes first waits on the lock and then
        finds them loaded: nothing is loaded twice. A failure is logged; the first quote then loads
        inline, as without warming. Nothing with a TTL of 0 (every quote reloads)."""
        if settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS <= 0:
            return
        try:
            with self.lock:
                if self.catalogue is None:
                    catalogue = _load_catalogue_quietly()
                    _derive(catalogue)
                    self.catalogue = catalogue
                if not self.holds.loaded:
                    self.holds.refresh()
                    self._holds_refreshed_at = time.monotonic()
            # The matcher's compiled loop, compiled or loaded from numba's cache here (outside the lock,
            # so that nothing waits on it but a quote that needs it).
            from broker import matching_kernel

            matching_kernel.warm()
        except Exception:
            logger.exception("warming the broker market failed")

    def prepare_for_fork(self) -> None:
        """In the production server's master process, before it forks a worker (config/prefork.py): load
        the catalogue and the hold book, or bring them up to date if the last preparation is older than
        the TTL, so that the worker starts with a loaded market instead of loading one (a new server's
        first quote, and a recycled worker's, waited seconds for that at design load). The catalogue is
        brought up to date as a stale quote would (``_refreshed``, else read whole); the hold book is read
        whole, one packed query, since catching up would read every lease change since the last fork,
        however long ago. Runs in the master's only thread, so no lock is held across the fork; the
        caller closes the database connections after. Raises what the load raises. Nothing with a TTL of
        0 (every quote reloads, nothing to inherit)."""
        ttl = settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS
        if ttl <= 0:
            return
        if self.catalogue is not None and time.monotonic() - self.prepared_at < ttl:
            return
        with self.lock:
            catalogue = _load_catalogue_quietly(self.catalogue)
            _derive(catalogue)
            holds = HoldBook()
            holds.refresh()
            self.catalogue, self.holds = catalogue, holds
            self._holds_refreshed_at = time.monotonic()
        from broker import matching_kernel

        matching_kernel.warm()
        self.prepared_at = time.monotonic()
        self.prepared_in = os.getpid()

    @property
    def inherited(self) -> bool:
        """Whether this process's market was prepared by the process that forked it."""
        return self.prepared_in is not None and self.prepared_in != os.getpid()

    @property
    def catalogue_age(self) -> float | None:
        """Seconds since the catalogue this process quotes from was read; None: not loaded."""
        catalogue = self.catalogue
        return None if catalogue is None else time.monotonic() - catalogue.loaded_at

    def warm_in_background(self) -> threading.Thread:
        """``warm`` in a daemon thread, started here, which closes its database connections after."""

        def run() -> None:
            try:
                self.warm()
            finally:
                connections.close_all()  # this thread's connections only (they are per thread)

        thread = threading.Thread(target=run, name="broker-market-warm", daemon=True)
        thread.start()
        return thread

    def _reload_in_background(self) -> None:
        """Start one reload thread unless one is running (called under ``self.lock``)."""
        if self._reloader is not None and self._reloader.is_alive():
            return
        self._reloader = threading.Thread(target=self._reload, name="broker-catalogue-reload", daemon=True)
        self._reloader.start()

    def _reload(self) -> None:
        try:
            catalogue = _load_catalogue_quietly(self.catalogue)
            _derive(catalogue)
            with self.lock:
                if self.catalogue is None or self.catalogue.loaded_at < catalogue.loaded_at:
                    self.catalogue = catalogue
        except Exception:
            # The old catalogue keeps serving; the next stale quote tries again, and one past the limit
            # reloads inline (and so reports the error to its caller).
            logger.exception("background reload of the broker catalogue failed")
        finally:
            connections.close_all()  # this thread's connections only (they are per thread)

    def keep_fresh(self) -> threading.Thread | None:
        """Start this process's keeper (once; None with a TTL of 0): a daemon thread that, every half TTL,
        starts a background reload of a catalogue a TTL old and catches the hold book up with the lease
        changes of the last TTL, whether or not quotes come (``_tick``). A server's workers start it
        (config/gunicorn.conf.py), after the warm-up.

        Without it only quotes refreshed the market, so the first quote after a quiet spell of
        ``_STALE_LIMIT_TTLS`` TTLs (30 s by default: a night, a pause of the buyers, the seconds between a
        server's start and its first load) found the catalogue past the stale limit and read it inline,
        under the lock every quote of the process waits on — a refresh that stalled requests, 0.1–0.3 s
        of CPU and as much of PostgreSQL's at design load, in each worker — and caught the hold book up
        with every lease change of the spell. With it, a catalogue past the limit means that reloads are
        failing, which is what the limit is for. Idle, it costs a refresh that finds nothing written (a
        few milliseconds) and a query for new lease transitions per TTL and worker."""
        ttl = settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS
        if ttl <= 0:
            return None
        keeper = self._keeper
        if keeper is not None and keeper.is_alive():
            return keeper
        self._keeper_stop.clear()

        def run() -> None:
            while not self._keeper_stop.wait(ttl / 2):
                try:
                    self._tick(ttl)
                except Exception:
                    logger.exception("keeping the broker market fresh failed; the next tick tries again")
                finally:
                    connections.close_all()  # this thread's connections only (back to the pool)

        keeper = self._keeper = threading.Thread(target=run, name="broker-market-keeper", daemon=True)
        keeper.start()
        return keeper

    def stop_keeping(self, timeout: float | None = None) -> None:
        """Stop the keeper, if it runs, and wait for it (tests)."""
        self._keeper_stop.set()
        keeper = self._keeper
        if keeper is not None:
            keeper.join(timeout)

    def _tick(self, ttl: float) -> None:
        """One turn of the keeper: a catalogue at least ``ttl`` old is reloaded in the background (as the
        quote that finds it stale does; one reload at a time), and a hold book not caught up for ``ttl``
        is caught up now. Nothing before the first load (the first quote, or the warm-up, loads)."""
        catalogue = self.catalogue  # read once: ``reset`` may clear it meanwhile
        if catalogue is None:
            return
        if time.monotonic() - catalogue.loaded_at >= ttl:
            with self.lock:
                self._reload_in_background()
        if time.monotonic() - self._holds_refreshed_at >= ttl:
            with self.lock:
                if self.holds.loaded:
                    self.holds.refresh()
                    self._holds_refreshed_at = time.monotonic()

    def wait_for_reload(self, timeout: float | None = None) -> None:
        """Wait for a background reload in progress, if any (tests, benchmarks)."""
        reloader = self._reloader
        if reloader is not None:
            reloader.join(timeout)

    def reset(self) -> None:
        self.wait_for_reload()
        with self.lock:
            self.catalogue = None
            self.holds = HoldBook()
            self.prepared_at = 0.0
            self.prepared_in = None


market = Market()
