"""usage_record_create_batch: validation, idempotency per operator, conflicts, nothing half-written."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.models import Organisation
from federation.models import Cluster
from metering.errors import UsageBatchInvalidError, UsageBatchTooLargeError
from metering.models import PriceCard, UsagePending, UsageRecord
from metering.services.usage import usage_record_create_batch, usage_record_create_batch_of_leases
from metering.types import UsageRecordInput, UsageRecordOfLease
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.conftest import local
from tests.metering.factories import make_price_card

CPI = "cpi:cucc:nx:zw-ai01"


def record(key: str = "r-1", **changes: object) -> UsageRecordInput:
    base = UsageRecordInput(
        idempotency_key=key,
        cluster=CPI,
        buyer="acme",
        cards=8,
        start_at=local(3, 7),
        end_at=local(3, 9),
        price_card_version=1,
        reference="lease:1",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def world(
    seller: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard, buyer: Organisation
) -> Organisation:
    return seller


def test_a_new_record_is_created_unrated(world: Organisation) -> None:
    result = usage_record_create_batch(operator=world, records=[record()])

    assert result.created == 1 and result.duplicates == 0 and result.conflicts == 0
    (outcome,) = result.outcomes
    stored = UsageRecord.objects.get(pk=outcome.record_id)
    assert outcome.status == "created"
    assert stored.cards == 8 and stored.reference == "lease:1" and stored.rated_at is None
    assert stored.start_at == local(3, 7) and stored.end_at == local(3, 9)
    assert stored.price_card.version == 1 and stored.operator == world


def test_same_key_same_body_answers_the_original(world: Organisation) -> None:
    first = usage_record_create_batch(operator=world, records=[record()])
    again = usage_record_create_batch(operator=world, records=[record()])

    assert again.outcomes[0].status == "duplicate"
    assert again.outcomes[0].record_id == first.outcomes[0].record_id
    assert UsageRecord.objects.count() == 1


def test_same_key_different_body_is_a_conflict_and_writes_nothing(world: Organisation) -> None:
    first = usage_record_create_batch(operator=world, records=[record()])
    result = usage_record_create_batch(operator=world, records=[record(cards=9), record("r-2")])

    assert [o.status for o in result.outcomes] == ["conflict", "created"]
    assert result.outcomes[0].record_id == first.outcomes[0].record_id
    assert UsageRecord.objects.get(pk=first.outcomes[0].record_id).cards == 8
    assert UsageRecord.objects.count() == 2


def test_a_key_repeated_inside_one_batch(world: Organisation) -> None:
    result = usage_record_create_batch(operator=world, records=[record(), record(), record(cards=2)])

    assert [o.status for o in result.outcomes] == ["created", "duplicate", "conflict"]
    assert len({o.record_id for o in result.outcomes}) == 1
    assert UsageRecord.objects.count() == 1


def test_keys_are_unique_per_operator_not_globally(world: Organisation) -> None:
    other = OperatorFactory(slug="cmcc")
    make_cluster(operator=other, name="zw-ai02")
    make_price_card(cluster=Cluster.objects.get(cpi="cpi:cmcc:nx:zw-ai02"), rate="8", tariff_code="flat")

    usage_record_create_batch(operator=world, records=[record()])
    theirs = usage_record_create_batch(operator=other, records=[record(cluster="cpi:cmcc:nx:zw-ai02")])

    assert theirs.outcomes[0].status == "created"
    assert UsageRecord.objects.count() == 2


def test_without_a_version_the_price_card_in_force_at_the_start_is_used(
    world: Organisation, gd_price_card: PriceCard
) -> None:
    start = gd_price_card.effective_from.replace(microsecond=0) + timedelta(seconds=1)
    result = usage_record_create_batch(
        operator=world,
        records=[record(price_card_version=None, start_at=start, end_at=start + timedelta(seconds=60))],
    )
    assert UsageRecord.objects.get(pk=result.outcomes[0].record_id).price_card == gd_price_card


def test_without_a_version_usage_before_any_price_card_is_refused(world: Organisation) -> None:
    with pytest.raises(UsageBatchInvalidError) as caught:
        usage_record_create_batch(operator=world, records=[record(price_card_version=None)])
    assert caught.value.extra["errors"][0]["code"] == "no_price_card"


@pytest.mark.parametrize(
    ("changes", "code", "field"),
    [
        ({"end_at": local(3, 7)}, "end_not_after_start", "end_at"),
        ({"end_at": local(3, 6)}, "end_not_after_start", "end_at"),
        ({"cards": 0}, "cards_not_positive", "cards"),
        ({"cards": -4}, "cards_not_positive", "cards"),
        ({"cards": True}, "cards_not_positive", "cards"),
        ({"cards": 10_000_000}, "cards_too_many", "cards"),
        ({"cluster": "cpi:cucc:nx:zw-ai99"}, "unknown_cluster", "cluster"),
        ({"cluster": "cpi:cmcc:nx:zw-ai02"}, "cluster_not_yours", "cluster"),
        ({"buyer": "nobody"}, "unknown_buyer", "buyer"),
        ({"buyer": "cucc"}, "unknown_buyer", "buyer"),  # an operator that is not a buyer
        ({"price_card_version": 7}, "unknown_price_card", "price_card_version"),
        ({"idempotency_key": ""}, "invalid_idempotency_key", "idempotency_key"),
        ({"idempotency_key": "k" * 201}, "invalid_idempotency_key", "idempotency_key"),
        ({"idempotency_key": "a\x00b"}, "invalid_idempotency_key", "idempotency_key"),
        ({"reference": "r" * 201}, "invalid_reference", "reference"),
        ({"start_at": datetime(2026, 1, 1, 7)}, "naive_timestamp", "start_at"),
        ({"end_at": local(3, 9) + timedelta(microseconds=5)}, "subsecond_timestamp", "end_at"),
        ({"start_at": local(60, 7), "end_at": local(60, 9)}, "usage_too_late", "end_at"),
        ({"start_at": local(-1, 7), "end_at": local(-1, 9)}, "usage_in_future", "end_at"),
    ],
)
def test_a_bad_record_rejects_the_whole_batch(
    world: Organisation, changes: dict[str, object], code: str, field: str
) -> None:
    other = OperatorFactory(slug="cmcc")
    make_cluster(operator=other, name="zw-ai02")
    with pytest.raises(UsageBatchInvalidError) as caught:
        usage_record_create_batch(operator=world, records=[record("good"), record("bad", **changes)])

    (error,) = caught.value.extra["errors"]
    assert (error["index"], error["code"], error["field"]) == (1, code, field)
    assert caught.value.code == "usage_batch_invalid"
    assert not UsageRecord.objects.exists()


def test_every_fault_is_listed_by_index(world: Organisation) -> None:
    with pytest.raises(UsageBatchInvalidError) as caught:
        usage_record_create_batch(
            operator=world, records=[record("a", cards=0), record("b"), record("c", buyer="x", cards=-1)]
        )
    codes = [(e["index"], e["code"]) for e in caught.value.extra["errors"]]
    assert codes == [(0, "cards_not_positive"), (2, "cards_not_positive"), (2, "unknown_buyer")]
    assert caught.value.extra["error_count"] == 3


@override_settings(CARDHOUR_USAGE_BATCH_MAX=3)
def test_a_batch_over_the_limit_is_refused(world: Organisation) -> None:
    with pytest.raises(UsageBatchTooLargeError):
        usage_record_create_batch(operator=world, records=[record(f"k{n}") for n in range(4)])
    assert not UsageRecord.objects.exists()


def test_a_full_batch_of_ten_thousand(world: Organisation) -> None:
    records = [
        record(
            f"k{n}",
            start_at=local(9, 0) + timedelta(seconds=60 * n),
            end_at=local(9, 0) + timedelta(seconds=60 * n + 60),
        )
        for n in range(10_000)
    ]
    result = usage_record_create_batch(operator=world, records=records)
    assert result.created == 10_000
    again = usage_record_create_batch(operator=world, records=records)
    assert again.duplicates == 10_000
    assert [o.record_id for o in again.outcomes] == [o.record_id for o in result.outcomes]
    assert UsageRecord.objects.count() == 10_000


def test_timestamps_in_any_zone_are_stored_as_the_same_instant(world: Organisation) -> None:
    start = local(3, 7).astimezone(UTC)
    usage_record_create_batch(operator=world, records=[record(start_at=start)])
    again = usage_record_create_batch(operator=world, records=[record(start_at=local(3, 7))])
    assert again.outcomes[0].status == "duplicate"


def test_a_buyer_organisation_must_exist_as_a_buyer(world: Organisation) -> None:
    BuyerFactory(slug="globex")
    result = usage_record_create_batch(operator=world, records=[record(buyer="globex")])
    assert UsageRecord.objects.get(pk=result.outcomes[0].record_id).buyer.slug == "globex"


def _pending(record_id: int) -> tuple:
    return UsagePending.objects.values_list(
        "operator_id", "cluster_id", "buyer_id", "price_card_id", "cards", "start_at", "end_at"
    ).get(usage_record_id=record_id)


def test_each_created_record_waits_in_the_pending_rating_queue_with_its_own_figures(
    world: Organisation,
) -> None:
    """The queue row is written with the record (one statement on PostgreSQL) and copies what rating reads."""
    result = usage_record_create_batch(
        operator=world, records=[record("q-1"), record("q-2", cards=4, end_at=local(3, 8))]
    )
    for outcome in result.outcomes:
        stored = UsageRecord.objects.get(pk=outcome.record_id)
        assert _pending(stored.pk) == (
            stored.operator_id,
            stored.cluster_id,
            stored.buyer_id,
            stored.price_card_id,
            stored.cards,
            stored.start_at,
            stored.end_at,
        )
    assert UsagePending.objects.count() == 2
    assert UsageRecord.objects.unrated().count() == 2 and UsageRecord.objects.rated().count() == 0


def test_a_duplicate_or_conflict_queues_nothing_more(world: Organisation) -> None:
    first = usage_record_create_batch(operator=world, records=[record("q-1")])
    again = usage_record_create_batch(
        operator=world, records=[record("q-1"), record("q-1", cards=2), record("q-2"), record("q-2")]
    )
    assert [o.status for o in again.outcomes] == ["duplicate", "conflict", "created", "duplicate"]
    assert sorted(UsagePending.objects.values_list("usage_record_id", flat=True)) == sorted(
        {first.outcomes[0].record_id, again.outcomes[2].record_id}
    )


# --- Records whose cluster, buyer and price card the caller resolved (the broker's usage report) --------


def of_lease(
    source: UsageRecordInput, *, cluster: Cluster, buyer: Organisation, card: PriceCard
) -> UsageRecordOfLease:
    return UsageRecordOfLease(
        source.idempotency_key,
        cluster.pk,
        buyer.pk,
        card.pk,
        source.cards,
        source.start_at,
        source.end_at,
        source.reference,
    )


_OWN_FIELD_FAULTS = [
    ({"end_at": local(3, 7)}, "end_not_after_start", "end_at"),
    ({"cards": 0}, "cards_not_positive", "cards"),
    ({"cards": True}, "cards_not_positive", "cards"),
    ({"cards": 10_000_000}, "cards_too_many", "cards"),
    ({"idempotency_key": ""}, "invalid_idempotency_key", "idempotency_key"),
    ({"idempotency_key": "a\x00b"}, "invalid_idempotency_key", "idempotency_key"),
    ({"reference": "r" * 201}, "invalid_reference", "reference"),
    ({"start_at": datetime(2026, 1, 1, 7)}, "naive_timestamp", "start_at"),
    ({"end_at": local(3, 9) + timedelta(microseconds=5)}, "subsecond_timestamp", "end_at"),
    ({"start_at": local(60, 7), "end_at": local(60, 9)}, "usage_too_late", "end_at"),
    ({"start_at": local(-1, 7), "end_at": local(-1, 9)}, "usage_in_future", "end_at"),
]


@pytest.mark.parametrize(("changes", "code", "field"), _OWN_FIELD_FAULTS)
def test_resolved_records_are_held_to_the_same_rules_with_the_same_codes(
    world: Organisation,
    a800_cluster: Cluster,
    gd_price_card: PriceCard,
    buyer: Organisation,
    changes: dict[str, object],
    code: str,
    field: str,
) -> None:
    now = timezone.now()  # the late window's message names it
    with pytest.raises(UsageBatchInvalidError) as by_name:
        usage_record_create_batch(operator=world, records=[record("good"), record("bad", **changes)], now=now)
    resolved = [
        of_lease(r, cluster=a800_cluster, buyer=buyer, card=gd_price_card)
        for r in (record("good"), record("bad", **changes))
    ]
    with pytest.raises(UsageBatchInvalidError) as by_id:
        usage_record_create_batch_of_leases(operator=world, records=resolved, now=now)

    assert by_id.value.extra == by_name.value.extra
    (error,) = by_id.value.extra["errors"]
    assert (error["index"], error["code"], error["field"]) == (1, code, field)
    assert not UsageRecord.objects.exists()


def test_resolved_records_are_stored_and_replayed_as_named_ones_are(
    world: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard, buyer: Organisation
) -> None:
    def resolved(*records: UsageRecordInput) -> list[UsageRecordOfLease]:
        return [of_lease(r, cluster=a800_cluster, buyer=buyer, card=gd_price_card) for r in records]

    first = usage_record_create_batch_of_leases(operator=world, records=resolved(record("a")))
    (outcome,) = first.outcomes
    stored = UsageRecord.objects.get(pk=outcome.record_id)
    assert outcome.status == "created"
    assert (stored.cluster_id, stored.buyer_id, stored.price_card_id) == (
        a800_cluster.pk,
        buyer.pk,
        gd_price_card.pk,
    )
    assert UsagePending.objects.filter(usage_record_id=stored.pk).exists()

    # The same record by name is the same body: a duplicate; another body under the key, a conflict.
    by_name = usage_record_create_batch(operator=world, records=[record("a"), record("b")])
    again = usage_record_create_batch_of_leases(
        operator=world, records=resolved(record("a", cards=2), record("b"))
    )
    assert [o.status for o in by_name.outcomes] == ["duplicate", "created"]
    assert by_name.outcomes[0].record_id == stored.pk
    assert [o.status for o in again.outcomes] == ["conflict", "duplicate"]
    assert UsageRecord.objects.count() == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_staging_table_is_emptied_for_the_next_batch_committed_or_not(world: Organisation) -> None:
    """PostgreSQL: the session's staging table outlives a committed batch (emptied by the commit); a
    second batch in one transaction must not see the first one's staged rows."""
    usage_record_create_batch(operator=world, records=[record("s-1")])  # commits: the table stays
    with transaction.atomic():
        one = usage_record_create_batch(operator=world, records=[record("s-2")])
        two = usage_record_create_batch(operator=world, records=[record("s-3"), record("s-2")])

    assert [o.status for o in one.outcomes] == ["created"]
    assert [o.status for o in two.outcomes] == ["created", "duplicate"]
    assert sorted(UsageRecord.objects.values_list("idempotency_key", flat=True)) == ["s-1", "s-2", "s-3"]
    assert UsagePending.objects.count() == 3


# Every character COPY's text format escapes, a NUL-free control character it does not, a COPY end marker,
# and non-ASCII: the staged rows are written as one block of text (metering.services.usage._stage_text).
HOSTILE = [
    "tab\there",
    "line\nbreak",
    "cr\rlf\r\n",
    "back\\slash\\",
    "\\.",
    "\b\v\f",
    "\x01\x1f\x7f",
    "东数西算 ✓",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_keys_and_references_are_stored_exactly_whatever_they_hold(world: Organisation, text: str) -> None:
    records = [
        record(f"k-{text}", reference=f"ref-{text}"),
        record(text, reference=text, start_at=local(3, 9), end_at=local(3, 10)),
    ]
    result = usage_record_create_batch(operator=world, records=records)

    assert [o.status for o in result.outcomes] == ["created", "created"]
    stored = {r.idempotency_key: r for r in UsageRecord.objects.all()}
    assert stored.keys() == {f"k-{text}", text}
    assert stored[f"k-{text}"].reference == f"ref-{text}" and stored[text].reference == text
    assert stored[text].start_at == local(3, 9)
    again = usage_record_create_batch(operator=world, records=records)
    assert [o.status for o in again.outcomes] == ["duplicate", "duplicate"]


@pytest.mark.postgres
@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(
        # What the API lets through (core.api.typed refuses NUL and lone surrogates before any service)
        st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12),
        min_size=2,
        max_size=2,
    ),
    micros=st.integers(min_value=0, max_value=999_999),
    hours=st.integers(min_value=-12, max_value=14),
)
def test_the_staged_text_reads_back_as_the_values_it_was_made_of(
    texts: list[str], micros: int, hours: int
) -> None:
    from django.db import connection

    from metering.services.usage import _stage_text, _Validated

    zone = timezone.get_fixed_timezone(hours * 60)
    start = datetime(2026, 3, 8, 1, 59, 59, micros, tzinfo=zone)
    row = _Validated(texts[0], 2**40, 7, 8, start, start + timedelta(hours=1), 9, texts[1])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS stage_check (cluster_id bigint, buyer_id bigint, cards integer,"
            " start_us bigint, end_us bigint, price_card_id bigint, idempotency_key text, reference text,"
            " body_hash text)"
        )
        cursor.execute("DELETE FROM stage_check")
        with cursor.copy("COPY stage_check FROM STDIN") as copy:
            copy.write(_stage_text([row, row]))
        cursor.execute(  # the staged times as the usage insert reads them
            "SELECT cluster_id, buyer_id, cards, TIMESTAMPTZ 'epoch' + start_us * INTERVAL '1 microsecond',"
            " TIMESTAMPTZ 'epoch' + end_us * INTERVAL '1 microsecond', price_card_id, idempotency_key,"
            " reference, body_hash FROM stage_check"
        )
        back = cursor.fetchall()
    assert back == [(2**40, 7, 8, start, start + timedelta(hours=1), 9, texts[0], texts[1], row.hash)] * 2
