"""Frozen dataclasses that cross metering's boundary (the broker and the admin use these)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


@dataclass(frozen=True)
class UsageRecordInput:
    """One usage record as an operator reports it.

    ``cluster`` is a cluster CPI; ``buyer`` an organisation slug; ``price_card_version`` the version of the
    cluster's price card to apply (the broker passes the lease's locked one; None = the version in force at
    ``start_at``). Timestamps are aware and whole seconds; the interval is half-open ``[start_at, end_at)``.
    """

    idempotency_key: str
    cluster: str
    buyer: str
    cards: int
    start_at: datetime
    end_at: datetime
    price_card_version: int | None = None
    reference: str = ""


class UsageRecordOfLease(NamedTuple):
    """One usage record whose cluster, buyer and price card the caller has already resolved: the broker's
    usage report, which takes them from the lease it has locked (the lease's cluster is the operator's, its
    price card the cluster's version locked at acceptance). Otherwise as UsageRecordInput; ``reference``
    names the lease. A named tuple: the broker builds a thousand per batch."""

    idempotency_key: str
    cluster_id: int
    buyer_id: int
    price_card_id: int
    cards: int
    start_at: datetime
    end_at: datetime
    reference: str


@dataclass(frozen=True)
class UsageRecordError:
    index: int
    idempotency_key: str
    code: str
    message: str
    field: str = ""


@dataclass(frozen=True, slots=True)
class UsageRecordOutcome:
    """The answer for one record: ``created``, ``duplicate`` (same key and body: the original record) or
    ``conflict`` (same key, different body: nothing written). Slotted: one per record of a batch."""

    index: int
    idempotency_key: str
    status: str
    record_id: int


@dataclass(frozen=True)
class UsageBatchResult:
    outcomes: tuple[UsageRecordOutcome, ...]
    created: int = 0
    duplicates: int = 0
    conflicts: int = 0
