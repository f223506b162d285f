"""The matcher's in-memory hold book follows lease changes incrementally, including a transition that
commits after a later one (ids are taken at insert, visible at commit)."""

from __future__ import annotations

import gc
import threading
from datetime import timedelta

import numba
import numpy as np
import pytest
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from broker import catalog as catalog_module
from broker import matching_kernel
from broker.catalog import _STALE_LIMIT_TTLS, Catalogue, HoldBook, Market, _load_catalogue, epoch
from broker.models import LeaseTransition
from broker.services.jobs import job_spec
from broker.services.leases import lease_lock, lease_transition
from broker.services.quotes import placements_find, start_costs_find
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from federation.services import heartbeat_record
from federation.types import IslandReport
from tests.broker.factories import make_job, make_lease
from tests.factories import BuyerFactory


def live_leases(book: HoldBook, start, end) -> set[tuple[int, int, int]]:  # type: ignore[no-untyped-def]
    islands, starts, _ends, cards = book.overlapping(epoch(start), epoch(end))
    return {(int(i), int(s), int(c)) for i, s, c in zip(islands, starts, cards, strict=True)}


def test_the_book_follows_new_and_released_holds(buyer: Organisation, east_cluster: Cluster) -> None:
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    first = make_lease(job=make_job(buyer=buyer), cluster=east_cluster, cards=3, start_at=start)
    book = HoldBook()
    book.refresh()
    island = east_cluster.islands.order_by("name").first()
    assert island is not None
    assert live_leases(book, start, start + timedelta(hours=3)) == {(island.pk, epoch(start), 3)}
    second = make_lease(job=make_job(buyer=buyer), cluster=east_cluster, cards=2, start_at=start)
    book.refresh()
    assert len(live_leases(book, start, start + timedelta(hours=3))) == 2
    lease_transition(lease=lease_lock(lease_id=first.pk), to_state="cancelled", actor=Actor.system("test"))
    book.refresh()
    assert live_leases(book, start, start + timedelta(hours=3)) == {(island.pk, epoch(start), 2)}
    assert live_leases(book, start + timedelta(hours=5), start + timedelta(hours=6)) == set()
    book.maintain(epoch(timezone.now()))
    assert live_leases(book, start, start + timedelta(hours=3)) == {(island.pk, epoch(start), 2)}
    del second


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_transition_committed_after_a_later_one_is_not_lost(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    book = HoldBook()
    book.refresh()
    inserted, release = threading.Event(), threading.Event()

    def slow() -> None:
        try:
            with transaction.atomic():
                make_lease(
                    job=make_job(buyer=buyer), cluster=east_cluster, cards=4, start_at=start, island="isl-02"
                )
                inserted.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=slow)
    thread.start()
    assert inserted.wait(10)
    other = BuyerFactory(slug="other")  # another buyer: acceptances lock the buyer's row
    make_lease(job=make_job(buyer=other), cluster=east_cluster, cards=1, start_at=start, island="isl-01")
    book.refresh()  # sees the later transition; the earlier id is a gap for now
    assert [cards for _, _, cards in live_leases(book, start, start + timedelta(hours=2))] == [1]
    assert book.gaps
    waiting = set(book.gaps)
    release.set()
    thread.join()
    slow_id = LeaseTransition.objects.get(lease__cards=4).pk
    assert slow_id in waiting
    book.refresh()
    assert sorted(cards for _, _, cards in live_leases(book, start, start + timedelta(hours=2))) == [1, 4]
    assert slow_id not in book.gaps


def test_the_book_keeps_holds_by_the_platform_clock_not_the_machine_clock(
    buyer: Organisation, east_cluster: Cluster, monkeypatch
) -> None:
    """A platform clock behind the machine's (a replay, a pinned test) must not drop holds that are still
    in its future."""
    past = timezone.now().replace(microsecond=0) - timedelta(days=30)
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, cards=3, start_at=past + timedelta(hours=1))
    monkeypatch.setattr(timezone, "now", lambda: past)
    book = HoldBook()
    book.refresh()
    assert len(live_leases(book, past, past + timedelta(hours=5))) == 1
    book.maintain(epoch(past))
    assert len(live_leases(book, past, past + timedelta(hours=5))) == 1


# --- The catalogue is reloaded off the request path ---------------------------------------------------


def _fake_catalogue(label: str) -> Catalogue:
    catalogue = _load_catalogue()
    catalogue.island_cpi = [label] * catalogue.size
    return catalogue


def test_a_stale_catalogue_is_reloaded_in_the_background(
    east_cluster: Cluster, settings, monkeypatch
) -> None:
    """The quote that finds the catalogue stale is answered from the old one at once, without waiting
    for the reload; a later quote sees the new one."""
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5.0
    market = Market()
    first, _ = market.view(start=0, end=1)
    assert first.size == 2
    fresh = _fake_catalogue("fresh")
    started, release = threading.Event(), threading.Event()

    def slow_load(previous: Catalogue | None = None) -> Catalogue:
        started.set()
        assert release.wait(10)
        return fresh

    monkeypatch.setattr(catalog_module, "_load_catalogue", slow_load)
    first.loaded_at -= 6  # older than the TTL, younger than the inline limit
    stale, _ = market.view(start=0, end=1)
    assert stale is first  # answered while the reload is still running
    assert started.wait(10)
    again, _ = market.view(start=0, end=1)  # one reload at a time
    assert again is first
    release.set()
    market.wait_for_reload(10)
    assert market.view(start=0, end=1)[0] is fresh


def test_a_failed_background_reload_keeps_the_old_catalogue(
    east_cluster: Cluster, settings, monkeypatch
) -> None:
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5.0
    market = Market()
    first, _ = market.view(start=0, end=1)

    def broken(previous: Catalogue | None = None) -> Catalogue:
        raise RuntimeError("database went away")

    monkeypatch.setattr(catalog_module, "_load_catalogue", broken)
    first.loaded_at -= 6
    assert market.view(start=0, end=1)[0] is first
    market.wait_for_reload(10)
    assert market.view(start=0, end=1)[0] is first
    market.wait_for_reload(10)
    # Past the limit the reload happens inline, so the caller sees the failure instead of stale data.
    first.loaded_at -= 5.0 * _STALE_LIMIT_TTLS
    with pytest.raises(RuntimeError):
        market.view(start=0, end=1)


def test_a_catalogue_past_the_limit_is_reloaded_inline(east_cluster: Cluster, settings, monkeypatch) -> None:
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5.0
    market = Market()
    first, _ = market.view(start=0, end=1)
    fresh = _fake_catalogue("fresh")
    monkeypatch.setattr(catalog_module, "_load_catalogue", lambda previous=None: fresh)
    first.loaded_at -= 5.0 * _STALE_LIMIT_TTLS
    assert market.view(start=0, end=1)[0] is fresh


def test_with_a_ttl_the_hold_book_catches_up_at_most_every_refresh_interval(
    buyer: Organisation, east_cluster: Cluster, settings, monkeypatch
) -> None:
    """Production (a TTL): a lease accepted right after a quote may be missed by the next quote for up
    to ``_HOLDS_REFRESH_SECONDS`` (acceptance re-checks under locks); after that the book has it."""
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5.0
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    window = {"start": epoch(start), "end": epoch(start + timedelta(hours=3))}
    market = Market()
    assert len(market.view(**window)[1][0]) == 0
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, cards=3, start_at=start)
    monkeypatch.setattr(catalog_module, "_HOLDS_REFRESH_SECONDS", 3600.0)
    assert len(market.view(**window)[1][0]) == 0
    monkeypatch.setattr(catalog_module, "_HOLDS_REFRESH_SECONDS", 0.0)
    assert market.view(**window)[1][3].tolist() == [3]


def test_the_keeper_refreshes_a_quiet_market_so_the_next_quote_reloads_nothing_inline(
    buyer: Organisation, east_cluster: Cluster, settings, monkeypatch
) -> None:
    """A quiet spell (no quote) longer than the inline limit: the keeper's turns reload the catalogue in
    the background and catch the hold book up, so the next quote neither reads the catalogue itself nor
    misses a lease accepted meanwhile."""
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5.0
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    window = {"start": epoch(start), "end": epoch(start + timedelta(hours=3))}
    market = Market()
    market._tick(5.0)  # nothing loaded yet: nothing to keep
    assert market.catalogue is None and market._reloader is None
    first, holds = market.view(**window)
    assert len(holds[0]) == 0
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, cards=3, start_at=start)
    monkeypatch.setattr(catalog_module, "_HOLDS_REFRESH_SECONDS", 3600.0)  # quotes alone would not look
    fresh = _fake_catalogue("fresh")
    loads: list[str] = []

    def load(previous: Catalogue | None = None) -> Catalogue:
        loads.append(threading.current_thread().name)
        return fresh

    monkeypatch.setattr(catalog_module, "_load_catalogue", load)
    first.loaded_at -= 5.0 * _STALE_LIMIT_TTLS  # the quiet spell
    market._holds_refreshed_at -= 5.0 * _STALE_LIMIT_TTLS
    market._tick(5.0)
    market.wait_for_reload(10)
    assert loads == ["broker-catalogue-reload"]
    catalogue, holds = market.view(**window)
    assert catalogue is fresh and loads == ["broker-catalogue-reload"]  # the quote loaded nothing
    assert holds[3].tolist() == [3]
    market._tick(5.0)  # fresh, caught up: nothing again
    market.wait_for_reload(10)
    assert loads == ["broker-catalogue-reload"]


def test_the_keeper_runs_once_per_process_and_stops(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """keep_fresh starts one daemon thread (none with a TTL of 0), which turns every half TTL and goes on
    after a failed turn."""
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 0.0
    market = Market()
    assert market.keep_fresh() is None
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 0.02
    turns = threading.Semaphore(0)

    def tick(ttl: float) -> None:
        turns.release()
        raise RuntimeError("database went away")

    monkeypatch.setattr(market, "_tick", tick)
    keeper = market.keep_fresh()
    assert keeper is not None and keeper.daemon and market.keep_fresh() is keeper
    try:
        assert turns.acquire(timeout=10) and turns.acquire(timeout=10)  # a second turn after a failure
    finally:
        market.stop_keeping(10)
    assert not keeper.is_alive()


def test_a_zero_ttl_reloads_on_every_quote(east_cluster: Cluster, settings, monkeypatch) -> None:
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 0.0
    market = Market()
    market.view(start=0, end=1)
    fresh = _fake_catalogue("fresh")
    monkeypatch.setattr(catalog_module, "_load_catalogue", lambda previous=None: fresh)
    assert market.view(start=0, end=1)[0] is fresh
    assert market._reloader is None


def test_the_catalogue_is_loaded_with_the_collector_paused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A load's short-lived rows must not set off a full collection (a stop of every thread); the
    collector runs again afterwards, also when the load fails."""
    seen = []

    def load(previous: Catalogue | None = None) -> Catalogue:
        seen.append(gc.isenabled())
        raise RuntimeError("database went away")

    monkeypatch.setattr(catalog_module, "_load_catalogue", load)
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        catalog_module._load_catalogue_quietly()
    assert seen == [False]
    assert gc.isenabled()


def test_the_book_in_arrays_matches_a_replay_of_its_changes() -> None:
    """Loaded from arrays, changed lease by lease, sorted again and compacted, the book always answers
    ``overlapping`` as a plain list of the live holds would, and so do its rows as handed to a quote
    (``rows``: the live ones in a window) — which no later change, sort or compaction writes to — and its
    sorted rows stay sorted by island, then start."""
    import numpy as np

    rng = np.random.default_rng(7)
    n = 3000
    lease = np.arange(1, n + 1)
    island = rng.integers(1, 400, n)
    start = rng.integers(0, 100_000, n)
    end = start + rng.integers(1, 20_000, n)
    cards = rng.integers(1, 9, n)
    truth = {
        int(lease_id): [(int(i), int(s), int(e), int(c))]
        for lease_id, i, s, e, c in zip(lease, island, start, end, cards, strict=True)
    }
    book = HoldBook()
    book._load_arrays(lease, island, start, end, cards)
    for step in range(40):
        changed: dict[int, list[tuple[int, int, int, int]]] = {}
        for lease_id in rng.integers(1, n + 400, 120).tolist():
            holds = [
                (
                    int(rng.integers(1, 400)),
                    s := int(rng.integers(0, 100_000)),
                    s + 500,
                    int(rng.integers(1, 9)),
                )
                for _ in range(int(rng.integers(0, 3)))  # none: released
            ]
            changed[lease_id] = holds
            truth[lease_id] = holds
        taken = book.rows()
        taken_copy = [a.copy() for a in (*taken[0], taken[1], taken[2])]
        book._replace_leases(changed)
        book._sort_if_ragged()
        if step % 10 == 9:
            book._compact(0)
        for before, after in zip(taken_copy, (*taken[0], taken[1], taken[2]), strict=True):
            assert before.tolist() == after.tolist()
        (rows_island, rows_start, rows_end, rows_cards), alive, _held = book.rows()
        for lo, hi in ((0, 200_000), (30_000, 31_000), (99_000, 130_000)):
            got = sorted(zip(*(a.tolist() for a in book.overlapping(lo, hi)), strict=True))
            expected = sorted(h for holds in truth.values() for h in holds if h[1] < hi and h[2] > lo)
            assert got == expected
            keep = alive & (rows_start < hi) & (rows_end > lo)
            columns = (rows_island[keep], rows_start[keep], rows_end[keep], rows_cards[keep])
            assert sorted(zip(*(a.tolist() for a in columns), strict=True)) == expected
        head = slice(0, book.sorted_upto)
        keys = book.island[head] * 10**6 + book.start[head]
        assert (np.diff(keys) >= 0).all()
    assert book.sorted_upto > 0


def test_a_warmed_market_answers_its_first_quote_without_loading(
    buyer: Organisation, east_cluster: Cluster, settings, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A new server process warms its market in the background: the first quote then loads nothing, and
    sees the holds that existed when it warmed."""
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, cards=3, start_at=start)
    loads = []
    real = catalog_module._load_catalogue
    monkeypatch.setattr(
        catalog_module, "_load_catalogue", lambda previous=None: loads.append(1) or real(previous)
    )
    market = Market()
    market.warm()
    assert loads == [1]
    assert market.holds.loaded
    catalogue, holds = market.view(start=epoch(start), end=epoch(start + timedelta(hours=1)))
    assert loads == [1]
    assert catalogue is market.catalogue
    assert east_cluster.pk in catalogue.cluster_id.tolist()
    assert holds[3].tolist() == [3]
    market.warm()  # loaded already: nothing again
    assert loads == [1]


def test_warming_with_a_zero_ttl_loads_nothing(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 0
    monkeypatch.setattr(catalog_module, "_load_catalogue", lambda previous=None: pytest.fail("loaded"))
    market = Market()
    market.warm()
    assert market.catalogue is None


# --- The book's bound of what each island's holds occupy ------------------------------------------------


@hypothesis_settings(max_examples=200, deadline=None)
@given(
    first=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 8), st.integers(-7200, 7200)), max_size=20),
    changes=st.lists(
        st.tuples(
            st.integers(1, 30),  # the lease changed (its holds replaced)
            st.lists(st.tuples(st.integers(1, 15), st.integers(1, 8), st.integers(-7200, 7200)), max_size=3),
        ),
        max_size=12,
    ),
    compact_at=st.integers(0, 12),
)
def test_the_book_bound_is_the_cards_of_its_live_holds_by_island_and_never_changes_in_place(
    first: list[tuple[int, int, int]], changes: list[tuple[int, list[tuple[int, int, int]]]], compact_at: int
) -> None:
    """HoldBook.held is, by island id, the cards of the live holds in the book (after a load, each lease
    change and a compaction that drops ended holds), and a bound a quote took is never written to after:
    each change replaces the array."""
    now = 1_800_000_000
    book = HoldBook()
    rows = np.array(
        [
            (lease, island, now + offset, now + offset + 3600, cards)
            for lease, (island, cards, offset) in enumerate(first, start=1)
        ],
        dtype=np.int64,
    ).reshape(-1, 5)
    book._load_arrays(*(rows[:, column] for column in range(5)))

    def expected() -> list[int]:
        size = book._size
        alive = book.alive[:size]
        sums = np.bincount(book.island[:size][alive], weights=book.cards[:size][alive]).astype(np.int64)
        return np.trim_zeros(sums, "b").tolist()

    assert np.trim_zeros(book.held, "b").tolist() == expected()
    for step, (lease, holds) in enumerate(changes):
        taken, copy = book.held, book.held.copy()
        if step == compact_at:
            book._compact(now + 3600 + 7200)  # drops what ended an hour before: some of the holds
        book._replace_leases(
            {lease: [(island, now + offset, now + offset + 3600, cards) for island, cards, offset in holds]}
        )
        assert taken.tolist() == copy.tolist()
        assert np.trim_zeros(book.held, "b").tolist() == expected()


def test_a_quote_after_warming_compiles_nothing(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """numba compiles a kernel once per tuple of argument types (a read-only array is another type than a
    writable one): every call a quote makes must reach a kernel with types ``warm`` compiled, or a new
    server's first quote compiles (~1 s of CPU) instead of answering. Holds, a heartbeat report, a fabric
    filter, a job spanning a cluster's islands and the cost-against-start chart, each checked at the
    compiled dispatcher."""
    seen: dict[str, set[tuple[object, ...]]] = {}
    for name in ("blocked_ranges", "candidate_rows", "island_room", "overlapping_rows", "smallest_entries"):
        wrapper = getattr(matching_kernel, name)

        def record(*args: object, _real=wrapper.dispatcher, _name=name) -> object:  # type: ignore[no-untyped-def]
            seen.setdefault(_name, set()).add(tuple(numba.typeof(arg) for arg in args))
            return _real(*args)

        monkeypatch.setattr(wrapper, "dispatcher", record)
    matching_kernel.warm()
    warmed = {name: set(types) for name, types in seen.items()}
    assert set(warmed) == {
        "blocked_ranges",
        "candidate_rows",
        "island_room",
        "overlapping_rows",
        "smallest_entries",
    }
    seen.clear()

    now = timezone.now().replace(microsecond=0)
    start = now + timedelta(minutes=30)
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, cards=3, start_at=start)
    make_lease(job=make_job(buyer=buyer), cluster=west_cluster, cards=8, start_at=start)
    heartbeat_record(
        actor=Actor(organisation=east_cluster.operator, system_label="test agent"),
        cluster=east_cluster,
        sent_at=now,
        health="ok",
        islands=[IslandReport(name="isl-02", available_cards=2)],
        now=now,
    )
    jobs = [
        make_job(buyer=buyer, earliest_start_at=now, cards=6),
        make_job(buyer=buyer, earliest_start_at=start, fabrics=["infiniband"]),
        make_job(buyer=buyer, earliest_start_at=now, cards=12, gang="cluster"),
    ]
    for job in jobs:
        for distinct in (False, True):
            result = placements_find(spec=job_spec(job=job), now=now, distinct=distinct)
            assert result.considered > 0
    islands = tuple(east_cluster.islands.order_by("name").values_list("pk", flat=True))
    assert start_costs_find(
        spec=job_spec(job=jobs[0]), cluster_id=east_cluster.pk, island_ids=islands, cards=6, now=now
    )
    assert {"blocked_ranges", "candidate_rows", "island_room", "overlapping_rows"} <= set(seen)
    for name, types in seen.items():
        assert types <= warmed[name], (name, types - warmed[name])
