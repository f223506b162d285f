"""Reads of usage records by idempotency key: through the key table (metering.models.UsageKey).

The usage table is partitioned by month on PostgreSQL and has no index on (operator, key): a lookup by key
there would probe every month. The key table holds each key once with its record's start, so a key is found
with one index probe and its record in the one partition that start names.
"""

from __future__ import annotations

from collections.abc import Iterable

from metering.models import UsageKey, UsageRecord


def usage_keys_stored(*, operator_id: int, keys: Iterable[str]) -> set[str]:
    """Which of ``keys`` the operator has stored a usage record under."""
    return set(
        UsageKey.objects.filter(operator_id=operator_id, idempotency_key__in=list(keys)).values_list(
            "idempotency_key", flat=True
        )
    )


def usage_references_by_key(*, operator_id: int, keys: Iterable[str]) -> dict[str, str]:
    """{key: the stored record's reference} for those of ``keys`` the operator has stored."""
    located = list(
        UsageKey.objects.filter(operator_id=operator_id, idempotency_key__in=list(keys)).values_list(
            "idempotency_key", "usage_record_id", "start_at"
        )
    )
    if not located:
        return {}
    # start_at__in lets PostgreSQL prune to the partitions those starts fall in.
    references = dict(
        UsageRecord.objects.filter(
            pk__in=[pk for _, pk, _ in located], start_at__in={start for _, _, start in located}
        ).values_list("pk", "reference")
    )
    return {key: references[pk] for key, pk, _ in located if pk in references}
