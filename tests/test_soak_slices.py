"""The soak's figures over time (benchmarks.soak): each slice's latencies and cores are those of its own
stretch of the run, so a slow stretch is seen where it happened."""

from __future__ import annotations

import pytest

from benchmarks.soak import PathStats, _cores_by_slice, _latency_slices


def test_latencies_fall_in_the_slice_they_were_answered_in() -> None:
    stats = PathStats()
    # Answered out of order (threads record as they finish), one exactly on an edge.
    for at, took in [(3.0, 0.3), (1.0, 0.1), (15.0, 0.15), (16.0, 0.9), (29.0, 0.2), (31.0, 5.0)]:
        stats.add(took=took, at=at, units=1)
    slices = _latency_slices(stats, [15.0, 30.0, 45.0])
    assert slices == [[0.1, 0.15, 0.3], [0.2, 0.9], [5.0]]


def test_cores_are_each_slices_own_cpu_over_its_length() -> None:
    samples = [(10.0, 0, 0, 0, 0, 0), (30.0, 0, 0, 0, 0, 0), (35.0, 0, 0, 0, 0, 0)]
    marks = [
        {"web server": 5.0, "PostgreSQL": 1.0, "Celery worker": 0.5},
        {"web server": 45.0, "PostgreSQL": 11.0, "Celery worker": 0.5, "Celery beat": 2.0},
    ]  # the third sample came after the load: no mark
    cores = _cores_by_slice(samples, marks)
    assert cores[0] == "0.50 / 0.10 / 0.00 / 0.05"
    assert cores[1] == "2.00 / 0.50 / 0.00 / 0.10"
    assert cores[2] == "-"


@pytest.mark.parametrize("edges", [[], [0.0]])
def test_no_requests_no_latencies(edges: list[float]) -> None:
    assert _latency_slices(PathStats(), edges) == [[] for _ in edges]


def test_latencies_from_sending_leave_out_the_clients_own_queue() -> None:
    stats = PathStats()
    # Due 0.5 s before it was answered, but sent 20 ms before: it waited in its client's queue.
    stats.add(took=0.5, at=2.0, units=1, answered=0.02)
    stats.add(took=0.1, at=20.0, units=1)  # no sending time: counted from when it was due
    assert _latency_slices(stats, [15.0, 30.0]) == [[0.5], [0.1]]
    assert _latency_slices(stats, [15.0, 30.0], from_sending=True) == [[0.02], [0.1]]
