"""Instants as integer microseconds since the Unix epoch: exact (what a PostgreSQL timestamptz holds), cheap to
compare and to send as text. One definition for every module that counts in them (usage ingest, the lease
usage checks)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def epoch_micros(value: datetime) -> int:
    """``value`` (aware) as microseconds since the epoch."""
    return (value - EPOCH) // MICROSECOND


def at_epoch_micros(value: int) -> datetime:
    """The UTC instant ``value`` microseconds after the epoch."""
    return EPOCH + timedelta(microseconds=value)
