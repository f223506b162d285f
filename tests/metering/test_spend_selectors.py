"""usage_record_references: the reference of each asked record that starts with the prefix, whether the ids
asked for form one dense run (a rating batch: a range scan on PostgreSQL) or are scattered."""

from __future__ import annotations

from datetime import timedelta

from core.models import Organisation
from federation.models import Cluster
from metering.models import PriceCard
from metering.selectors.spend import usage_record_references
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.metering.conftest import local


def _report(seller: Organisation, cluster: Cluster) -> list[tuple[int, str]]:
    """Forty records of one buyer: references ``lease:<n>`` on most, another kind and none on some."""
    references = [f"lease:{n % 7}" if n % 5 else ("" if n % 2 else f"job:{n}") for n in range(40)]
    start = local(3, 0)
    result = usage_record_create_batch(
        operator=seller,
        records=[
            UsageRecordInput(
                f"ref-{n}",
                cluster.cpi,
                "acme",
                1,
                start + timedelta(minutes=n),
                start + timedelta(minutes=n + 1),
                1,
                reference,
            )
            for n, reference in enumerate(references)
        ],
    )
    return [(o.record_id, reference) for o, reference in zip(result.outcomes, references, strict=True)]


def test_references_of_a_dense_run_and_of_scattered_records(
    seller: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard, buyer: Organisation
) -> None:
    records = _report(seller, a800_cluster)
    starts = (local(3, 0) - timedelta(seconds=1), local(3, 0) + timedelta(minutes=40))
    # A dense run with a hole (records 10–29 less 15, 16), and a scattered few (far apart).
    for asked in (records[10:15] + records[17:30], records[::13], records):
        ids = [record_id for record_id, _ in asked]
        expected = {record_id: reference for record_id, reference in asked if reference.startswith("lease:")}
        assert usage_record_references(record_ids=ids, starts=starts, prefix="lease:") == expected
        assert usage_record_references(record_ids=ids, prefix="lease:") == expected
    assert usage_record_references(record_ids=[], prefix="lease:") == {}
    # A prefix's LIKE wildcards are literal.
    assert usage_record_references(record_ids=[r for r, _ in records], prefix="lease_") == {}
