"""Usage records in: one batch service for every producer (the broker's usage API, the admin's CSV import,
tests and the benchmark). ``usage_record_create_batch`` takes records naming their cluster, buyer and price
card; ``usage_record_create_batch_of_leases`` takes them as ids the caller resolved (the broker, from the
leases it holds locked) and skips the look-ups; both hold each record's own fields to rule 1 and store
through rules 2 and 3.

Rules, in order:

1. Every record of the batch is validated first (whole-second aware timestamps, ``end > start``, cards > 0,
   not older than the late window, not in the future, a known cluster of *this* operator, a known buyer, a
   price card version of that cluster). One bad record rejects the batch with ``usage_batch_invalid`` and
   every fault listed by index: nothing is written.
2. ``(operator, idempotency_key)`` is unique in the database — in the narrow key table UsageKey, not in the
   usage table, which is partitioned by month on PostgreSQL (a unique index there would hold the month and
   let the same key in through another month). A key seen before with the same body (same ``body_hash``)
   answers ``duplicate`` with the original record, whatever month it is in; with a different body,
   ``conflict`` and nothing is written for that record. The same key twice inside one batch follows the
   same rule.
3. The insert is set-based: on PostgreSQL a COPY into a staging table and one statement per batch that
   inserts the keys ``ON CONFLICT DO NOTHING`` and, for the keys it won, the records and their pending
   rows, so a concurrent writer of the same key can never produce a second record and the loser learns
   which record won; elsewhere (SQLite: one writer at a time) the records, then their keys with
   ``ignore_conflicts`` and a read-back, removing a record whose key a concurrent batch took first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from core.instants import EPOCH, MICROSECOND
from core.models import Organisation
from federation.models import Cluster
from metering.errors import UsageBatchInvalidError, UsageBatchTooLargeError
from metering.models import PriceCard, UsageKey, UsagePending, UsageRecord
from metering.types import (
    UsageBatchResult,
    UsageRecordError,
    UsageRecordInput,
    UsageRecordOfLease,
    UsageRecordOutcome,
)

# An agent's clock may run a little ahead; usage ending further in the future than this is refused.
USAGE_MAX_CLOCK_SKEW = timedelta(minutes=5)
IDEMPOTENCY_KEY_MAX_LENGTH = 200
REFERENCE_MAX_LENGTH = 200


def epoch_seconds(value: datetime) -> int:
    return (value - EPOCH) // timedelta(seconds=1)


def usage_body_hash(
    *, cluster_id: int, buyer_id: int, cards: int, start: int, end: int, price_card_id: int, reference: str
) -> str:
    """The fingerprint of a record's body: what must match for a replay to count as the same record."""
    body = f"{cluster_id}|{buyer_id}|{cards}|{start}|{end}|{price_card_id}|{reference}"
    return hashlib.sha256(body.encode()).hexdigest()


class _Validated:
    __slots__ = (
        "buyer_id",
        "cards",
        "cluster_id",
        "end",
        "hash",
        "key",
        "price_card_id",
        "reference",
        "start",
    )

    def __init__(
        self,
        key: str,
        cluster_id: int,
        buyer_id: int,
        cards: int,
        start: datetime,
        end: datetime,
        price_card_id: int,
        reference: str,
    ):
        self.key = key
        self.cluster_id = cluster_id
        self.buyer_id = buyer_id
        self.cards = cards
        self.start = start
        self.end = end
        self.price_card_id = price_card_id
        self.reference = reference
        # usage_body_hash, inlined (this runs once per record): whole-second aware instants, so the float
        # timestamp is exact and equals epoch_seconds().
        body = (
            f"{cluster_id}|{buyer_id}|{cards}|{int(start.timestamp())}|{int(end.timestamp())}|"
            f"{price_card_id}|{reference}"
        )
        self.hash = hashlib.sha256(body.encode()).hexdigest()


def _price_card_index(cluster_ids: set[int]) -> dict[int, list[tuple[int, datetime, int]]]:
    """Per cluster, its price cards as (version, effective_from, id), oldest first."""
    index: dict[int, list[tuple[int, datetime, int]]] = {}
    rows = (
        PriceCard.objects.filter(cluster_id__in=cluster_ids)
        .order_by("cluster_id", "version")
        .values_list("cluster_id", "version", "effective_from", "id")
    )
    for cluster_id, version, effective_from, pk in rows:
        index.setdefault(cluster_id, []).append((version, effective_from, pk))
    return index


def _lookups_postgresql(
    *, operator_id: int, cpis: set[str], slugs: set[str]
) -> tuple[dict[str, tuple[int, int]], dict[str, int], dict[int, list[tuple[int, datetime, int]]]]:
    """The clusters named (cpi → (id, operator id)), the buyers named (slug → id) and the price cards of
    the operator's named clusters (as _price_card_index) in one statement. The ORM's three IN queries cost
    ~15 ms of compiling and quoting for a batch naming a hundred buyers and thirty clusters — as a batch's
    leases spread over more of them, so it grew with the leases on the platform; this costs ~1 ms."""
    clusters: dict[str, tuple[int, int]] = {}
    buyers: dict[str, int] = {}
    cards: list[tuple[int, int, datetime, int]] = []
    cluster_table, card_table = Cluster._meta.db_table, PriceCard._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT 0, cpi, id, operator_id, NULL::integer, NULL::timestamptz
              FROM {cluster_table} WHERE cpi = ANY(%s::text[])
            UNION ALL
            SELECT 1, slug, id, NULL, NULL, NULL
              FROM {Organisation._meta.db_table} WHERE slug = ANY(%s::text[]) AND is_buyer
            UNION ALL
            SELECT 2, NULL, card.id, card.cluster_id, card.version, card.effective_from
              FROM {card_table} AS card JOIN {cluster_table} AS cluster ON cluster.id = card.cluster_id
             WHERE cluster.cpi = ANY(%s::text[]) AND cluster.operator_id = %s
            """,  # noqa: S608  # the table names are the models', the values are parameters
            [sorted(cpis), sorted(slugs), sorted(cpis), operator_id],
        )
        for kind, name, pk, owner, version, effective_from in cursor.fetchall():
            if kind == 0:
                clusters[name] = (pk, owner)
            elif kind == 1:
                buyers[name] = pk
            else:
                cards.append((owner, version, effective_from, pk))
    index: dict[int, list[tuple[int, datetime, int]]] = {}
    for cluster_id, version, effective_from, pk in sorted(cards, key=lambda c: (c[0], c[1])):
        index.setdefault(cluster_id, []).append((version, effective_from, pk))
    return clusters, buyers, index


def _plain(
    key: object,
    reference: object,
    cards: object,
    start: object,
    end: object,
    *,
    max_cards: int,
    oldest_end: datetime,
    newest_end: datetime,
) -> bool:
    """The common record, checked in one expression: _record_faults says what is wrong when this is False
    (the same rules). A batch of 10,000 spends most of its validation here."""
    return (
        type(key) is str
        and 0 < len(key) <= IDEMPOTENCY_KEY_MAX_LENGTH
        and "\x00" not in key
        and type(reference) is str
        and len(reference) <= REFERENCE_MAX_LENGTH
        and "\x00" not in reference
        and type(cards) is int
        and 0 < cards <= max_cards
        and isinstance(start, datetime)
        and isinstance(end, datetime)
        and start.utcoffset() is not None
        and end.utcoffset() is not None
        and not start.microsecond
        and not end.microsecond
        and start < end
        and oldest_end <= end <= newest_end
    )


def _record_faults(
    fail: Callable[..., None],
    *,
    index: int,
    key: Any,
    reference: Any,
    cards: Any,
    start: Any,
    end: Any,
    oldest_end: datetime,
    newest_end: datetime,
) -> bool:
    """Report (through ``fail``) what is wrong with a record's own fields; answer whether its timestamps
    are usable (aware, whole seconds) for the checks that need them."""
    if not isinstance(key, str) or not key or len(key) > IDEMPOTENCY_KEY_MAX_LENGTH or "\x00" in key:
        fail(
            index,
            str(key)[:50],
            "invalid_idempotency_key",
            _("1–200 characters, no NUL."),
            "idempotency_key",
        )
    if not isinstance(reference, str) or len(reference) > REFERENCE_MAX_LENGTH or ("\x00" in reference):
        fail(index, key, "invalid_reference", _("At most 200 characters, no NUL."), "reference")
    if isinstance(cards, bool) or not isinstance(cards, int) or cards <= 0:
        fail(
            index,
            key,
            "cards_not_positive",
            _("cards must be a positive integer, not %(cards)r.") % {"cards": cards},
            "cards",
        )
    elif cards > settings.CARDHOUR_MAX_CARDS_PER_CLUSTER:
        fail(
            index,
            key,
            "cards_too_many",
            _("%(cards)d cards is more than any cluster holds.") % {"cards": cards},
            "cards",
        )
    times_ok = True
    for name, value in (("start_at", start), ("end_at", end)):
        if not isinstance(value, datetime) or timezone.is_naive(value):
            fail(
                index,
                key,
                "naive_timestamp",
                _("%(field)s must carry a time zone.") % {"field": name},
                name,
            )
            times_ok = False
        elif value.microsecond:
            fail(
                index,
                key,
                "subsecond_timestamp",
                _("%(field)s must be a whole second.") % {"field": name},
                name,
            )
            times_ok = False
    if times_ok:
        if end <= start:
            fail(index, key, "end_not_after_start", _("end_at must be after start_at."), "end_at")
        elif end < oldest_end:
            fail(
                index,
                key,
                "usage_too_late",
                _("Usage ending before %(at)s is past the %(days)d-day late window.")
                % {"at": oldest_end.isoformat(), "days": settings.CARDHOUR_LATE_USAGE_DAYS},
                "end_at",
            )
        elif end > newest_end:
            fail(index, key, "usage_in_future", _("end_at is in the future."), "end_at")
    return times_ok


def _raise_if_invalid(errors: list[UsageRecordError]) -> None:
    if not errors:
        return
    shown = errors[:100]
    raise UsageBatchInvalidError(
        _("%(n)d fault(s) in the batch; nothing was written. First: record %(index)d: %(message)s")
        % {"n": len(errors), "index": shown[0].index, "message": shown[0].message},
        extra={
            "error_count": len(errors),
            "errors": [
                {
                    "index": e.index,
                    "idempotency_key": e.idempotency_key,
                    "code": e.code,
                    "message": e.message,
                    "field": e.field,
                }
                for e in shown
            ],
        },
    )


def _validate(
    *, operator: Organisation, records: Sequence[UsageRecordInput], now: datetime
) -> list[_Validated]:
    errors: list[UsageRecordError] = []

    def fail(index: int, key: str, code: str, message: str, field: str = "") -> None:
        errors.append(
            UsageRecordError(index=index, idempotency_key=key, code=code, message=message, field=field)
        )

    cpis = {record.cluster for record in records}
    slugs = {record.buyer for record in records}
    if connection.vendor == "postgresql" and all(type(v) is str for v in (*cpis, *slugs)):
        clusters, buyers, price_cards = _lookups_postgresql(operator_id=operator.pk, cpis=cpis, slugs=slugs)
    else:
        clusters = {
            cpi: (pk, operator_id)
            for cpi, pk, operator_id in Cluster.objects.filter(cpi__in=cpis).values_list(
                "cpi", "id", "operator_id"
            )
        }
        buyers = dict(Organisation.objects.filter(slug__in=slugs, is_buyer=True).values_list("slug", "id"))
        price_cards = _price_card_index({pk for pk, owner in clusters.values() if owner == operator.pk})
    oldest_end = now - timedelta(days=settings.CARDHOUR_LATE_USAGE_DAYS)
    newest_end = now + USAGE_MAX_CLOCK_SKEW

    max_cards = settings.CARDHOUR_MAX_CARDS_PER_CLUSTER
    operator_pk = operator.pk
    by_version = {
        (cluster_id, version): pk
        for cluster_id, cards_of_cluster in price_cards.items()
        for version, _effective_from, pk in cards_of_cluster
    }

    valid: list[_Validated] = []
    for index, record in enumerate(records):
        key, reference, cards = record.idempotency_key, record.reference, record.cards
        start, end = record.start_at, record.end_at
        cluster = clusters.get(record.cluster)
        buyer_id = buyers.get(record.buyer)
        if (
            _plain(
                key,
                reference,
                cards,
                start,
                end,
                max_cards=max_cards,
                oldest_end=oldest_end,
                newest_end=newest_end,
            )
            and cluster is not None
            and cluster[1] == operator_pk
            and buyer_id is not None
        ):
            version = record.price_card_version
            if version is not None:
                price_card_id = by_version.get((cluster[0], version), 0)
            else:
                in_force = [pk for _v, at, pk in price_cards.get(cluster[0], ()) if at <= start]
                price_card_id = in_force[-1] if in_force else 0
            if price_card_id:
                valid.append(
                    _Validated(key, cluster[0], buyer_id, cards, start, end, price_card_id, reference)
                )
                continue
        bad = len(errors)
        times_ok = _record_faults(
            fail,
            index=index,
            key=key,
            reference=reference,
            cards=cards,
            start=start,
            end=end,
            oldest_end=oldest_end,
            newest_end=newest_end,
        )
        price_card_id = 0
        if cluster is None:
            fail(index, key, "unknown_cluster", _("No cluster %(cpi)r.") % {"cpi": record.cluster}, "cluster")
        elif cluster[1] != operator.pk:
            fail(
                index,
                key,
                "cluster_not_yours",
                _("%(cpi)s belongs to another operator.") % {"cpi": record.cluster},
                "cluster",
            )
        else:
            cards_of_cluster = price_cards.get(cluster[0], [])
            version = record.price_card_version
            if version is not None:
                match = [pk for v, _, pk in cards_of_cluster if v == version]
                if not match:
                    fail(
                        index,
                        key,
                        "unknown_price_card",
                        _("%(cpi)s has no price card version %(version)s.")
                        % {"cpi": record.cluster, "version": version},
                        "price_card_version",
                    )
                else:
                    price_card_id = match[0]
            elif times_ok:
                in_force = [pk for _, effective_from, pk in cards_of_cluster if effective_from <= start]
                if not in_force:
                    fail(
                        index,
                        key,
                        "no_price_card",
                        _("%(cpi)s had no price card in force at %(at)s.")
                        % {"cpi": record.cluster, "at": start.isoformat()},
                        "price_card_version",
                    )
                else:
                    price_card_id = in_force[-1]
        if buyer_id is None:
            fail(
                index,
                key,
                "unknown_buyer",
                _("No buyer organisation %(buyer)r.") % {"buyer": record.buyer},
                "buyer",
            )
        if len(errors) == bad:
            assert cluster is not None and buyer_id is not None
            valid.append(_Validated(key, cluster[0], buyer_id, cards, start, end, price_card_id, reference))
    _raise_if_invalid(errors)
    return valid


def _validate_of_leases(*, records: Sequence[UsageRecordOfLease], now: datetime) -> list[_Validated]:
    """_validate for records whose cluster, buyer and price card the caller resolved: the same rules and
    codes for the record's own fields, no lookup."""
    errors: list[UsageRecordError] = []

    def fail(index: int, key: str, code: str, message: str, field: str = "") -> None:
        errors.append(
            UsageRecordError(index=index, idempotency_key=key, code=code, message=message, field=field)
        )

    oldest_end = now - timedelta(days=settings.CARDHOUR_LATE_USAGE_DAYS)
    newest_end = now + USAGE_MAX_CLOCK_SKEW
    max_cards = settings.CARDHOUR_MAX_CARDS_PER_CLUSTER
    valid: list[_Validated] = []
    for index, (key, cluster_id, buyer_id, price_card_id, cards, start, end, reference) in enumerate(records):
        if _plain(
            key,
            reference,
            cards,
            start,
            end,
            max_cards=max_cards,
            oldest_end=oldest_end,
            newest_end=newest_end,
        ):
            valid.append(_Validated(key, cluster_id, buyer_id, cards, start, end, price_card_id, reference))
            continue
        _record_faults(
            fail,
            index=index,
            key=key,
            reference=reference,
            cards=cards,
            start=start,
            end=end,
            oldest_end=oldest_end,
            newest_end=newest_end,
        )
    _raise_if_invalid(errors)
    return valid


# One round trip. Emptied by every commit (ON COMMIT DELETE ROWS), but an earlier batch of the same
# transaction may have left rows: a DELETE of an empty table costs less than TRUNCATE's new file. The table is
# not remembered per connection: a rolled-back transaction drops one it created.
_STAGE_PREPARE = """
    CREATE TEMP TABLE IF NOT EXISTS metering_usage_staged (
        cluster_id bigint, buyer_id bigint, cards integer, start_us bigint, end_us bigint,
        price_card_id bigint, idempotency_key text, reference text, body_hash text
    ) ON COMMIT DELETE ROWS;
    DELETE FROM metering_usage_staged
"""


# COPY's text format escapes these in a value (psycopg's own text formatter escapes the same set).
_COPY_ESCAPES = str.maketrans(
    {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r", "\\": "\\\\"}
)


def _stage_text(rows: list[_Validated]) -> str:
    """The rows as one block of COPY text (tab-separated, a line each) for the staging table: a third of
    the CPU of ``copy.write_row``, which looks up a dumper and runs a regular expression for each of the
    nine values. Integers and the body hash (hex) need no escaping; times travel as integer microseconds
    since the epoch (exact: what a timestamptz holds), a fifth of the cost of their ISO text; the two texts
    an operator chose (key, reference) are escaped as COPY's text format requires."""
    escapes, epoch, micro = _COPY_ESCAPES, EPOCH, MICROSECOND
    return "".join(
        [
            f"{r.cluster_id}\t{r.buyer_id}\t{r.cards}\t{(r.start - epoch) // micro}\t"
            f"{(r.end - epoch) // micro}\t{r.price_card_id}\t{r.key.translate(escapes)}\t"
            f"{r.reference.translate(escapes)}\t{r.hash}\n"
            for r in rows
        ]
    )


def _insert_postgresql(*, operator_id: int, rows: list[_Validated], received_at: datetime) -> dict[str, int]:
    """Insert ``rows``; return {key: id} of the rows this statement inserted.

    The rows travel by COPY into a session-local staging table (text arrays as parameters cost several
    times more to encode), then one INSERT … SELECT … ON CONFLICT DO NOTHING RETURNING moves them: a key
    that exists — or that a concurrent batch inserts first — is skipped by the unique index, never
    duplicated.
    """
    with connection.cursor() as cursor:
        cursor.execute(_STAGE_PREPARE)
        with cursor.copy(
            "COPY metering_usage_staged (cluster_id, buyer_id, cards, start_us, end_us, price_card_id,"
            " idempotency_key, reference, body_hash) FROM STDIN"
        ) as copy:
            copy.write(_stage_text(rows))
        # The keys, then — for the keys this statement won — the records and their pending-rating queue
        # rows (metering.models.UsagePending), in one statement: a record is never stored without its key
        # and the row that gets it rated. The record's id is drawn with its key (the key table arbitrates
        # on (operator_id, idempotency_key); the stage holds each key once).
        cursor.execute(
            """
            WITH keyed AS (
                INSERT INTO metering_usagekey (usage_record_id, operator_id, idempotency_key, start_at)
                SELECT nextval('metering_usagerecord_id_seq'), %s, idempotency_key,
                       TIMESTAMPTZ 'epoch' + start_us * INTERVAL '1 microsecond'
                  FROM metering_usage_staged
                ON CONFLICT (operator_id, idempotency_key) DO NOTHING
                RETURNING usage_record_id, idempotency_key, start_at
            ), inserted AS (
                INSERT INTO metering_usagerecord (id, operator_id, cluster_id, buyer_id, cards, start_at,
                    end_at, price_card_id, idempotency_key, reference, body_hash, received_at)
                SELECT k.usage_record_id, %s, s.cluster_id, s.buyer_id, s.cards, k.start_at,
                       TIMESTAMPTZ 'epoch' + s.end_us * INTERVAL '1 microsecond',
                       s.price_card_id, s.idempotency_key, s.reference, s.body_hash, %s
                  FROM keyed k JOIN metering_usage_staged s ON s.idempotency_key = k.idempotency_key
                RETURNING id, operator_id, cluster_id, buyer_id, price_card_id, cards, start_at, end_at,
                          idempotency_key
            ), queued AS (
                INSERT INTO metering_usagepending (usage_record_id, operator_id, cluster_id, buyer_id,
                    price_card_id, cards, start_at, end_at)
                SELECT id, operator_id, cluster_id, buyer_id, price_card_id, cards, start_at, end_at
                  FROM inserted
            )
            SELECT idempotency_key, id FROM inserted
            """,
            [operator_id, operator_id, received_at],
        )
        return dict(cursor.fetchall())


def _insert_generic(*, operator_id: int, rows: list[_Validated], received_at: datetime) -> dict[str, int]:
    records = UsageRecord.objects.bulk_create(
        [
            UsageRecord(
                operator_id=operator_id,
                cluster_id=r.cluster_id,
                buyer_id=r.buyer_id,
                cards=r.cards,
                start_at=r.start,
                end_at=r.end,
                price_card_id=r.price_card_id,
                idempotency_key=r.key,
                reference=r.reference,
                body_hash=r.hash,
                received_at=received_at,
            )
            for r in rows
        ],
        batch_size=2000,
    )
    mine = {record.idempotency_key: record.pk for record in records}
    UsageKey.objects.bulk_create(
        [
            UsageKey(
                usage_record_id=record.pk,
                operator_id=operator_id,
                idempotency_key=record.idempotency_key,
                start_at=record.start_at,
            )
            for record in records
        ],
        batch_size=2000,
        ignore_conflicts=True,
    )
    wanted = {r.key: r for r in rows}
    ids: dict[str, int] = {}
    for offset in range(0, len(rows), 5000):
        chunk = [r.key for r in rows[offset : offset + 5000]]
        for key, pk in UsageKey.objects.filter(
            operator_id=operator_id, idempotency_key__in=chunk
        ).values_list("idempotency_key", "usage_record_id"):
            if mine[key] == pk:
                ids[key] = pk
    # A key a concurrent batch stored first: its record is the other one; ours goes.
    lost = [pk for key, pk in mine.items() if key not in ids]
    if lost:
        UsageRecord.objects.filter(pk__in=lost).delete()
    # Each new record's pending-rating queue row (metering.models.UsagePending), in this transaction.
    UsagePending.objects.bulk_create(
        [
            UsagePending(
                usage_record_id=pk,
                operator_id=operator_id,
                cluster_id=wanted[key].cluster_id,
                buyer_id=wanted[key].buyer_id,
                price_card_id=wanted[key].price_card_id,
                cards=wanted[key].cards,
                start_at=wanted[key].start,
                end_at=wanted[key].end,
            )
            for key, pk in ids.items()
        ],
        batch_size=2000,
    )
    return ids


def _existing(*, operator_id: int, keys: list[str]) -> dict[str, tuple[int, str]]:
    """{key: (record id, body hash)} of the operator's stored keys among ``keys``: the key table, then each
    record in the one partition its key's ``start_at`` names."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT k.idempotency_key, u.id, u.body_hash FROM metering_usagekey k"
                " JOIN metering_usagerecord u ON u.id = k.usage_record_id AND u.start_at = k.start_at"
                " WHERE k.operator_id = %s AND k.idempotency_key = ANY(%s::text[])",
                [operator_id, keys],
            )
            return {key: (pk, body_hash) for key, pk, body_hash in cursor.fetchall()}
    found: dict[str, tuple[int, str]] = {}
    for offset in range(0, len(keys), 5000):
        chunk = keys[offset : offset + 5000]
        for key, pk, body_hash in UsageKey.objects.filter(
            operator_id=operator_id, idempotency_key__in=chunk
        ).values_list("idempotency_key", "usage_record_id", "usage_record__body_hash"):
            found[key] = (pk, body_hash)
    return found


@transaction.atomic
def usage_record_create_batch(
    *, operator: Organisation, records: Sequence[UsageRecordInput], now: datetime | None = None
) -> UsageBatchResult:
    """Store up to ``CARDHOUR_USAGE_BATCH_MAX`` usage records of one operator, answering per record.

    Raises UsageBatchTooLargeError, UsageBatchInvalidError (nothing written). Records are stored unrated;
    the rating task prices them. See the module docstring for the idempotency rules.
    """
    limit = settings.CARDHOUR_USAGE_BATCH_MAX
    if len(records) > limit:
        raise UsageBatchTooLargeError(
            _("A batch holds at most %(limit)d records, not %(n)d.") % {"limit": limit, "n": len(records)},
            extra={"max": limit},
        )
    now = now or timezone.now()
    valid = _validate(operator=operator, records=records, now=now)
    return _store(operator=operator, valid=valid, now=now)


@transaction.atomic
def usage_record_create_batch_of_leases(
    *, operator: Organisation, records: Sequence[UsageRecordOfLease], now: datetime | None = None
) -> UsageBatchResult:
    """usage_record_create_batch for records whose cluster, buyer and price card the caller has resolved and
    vouches for (the broker's usage report, from the operator's leases it holds locked): the same rules for
    each record's own fields and the same idempotency, without looking the names up.

    Raises UsageBatchTooLargeError, UsageBatchInvalidError (nothing written)."""
    limit = settings.CARDHOUR_USAGE_BATCH_MAX
    if len(records) > limit:
        raise UsageBatchTooLargeError(
            _("A batch holds at most %(limit)d records, not %(n)d.") % {"limit": limit, "n": len(records)},
            extra={"max": limit},
        )
    now = now or timezone.now()
    return _store(operator=operator, valid=_validate_of_leases(records=records, now=now), now=now)


def _store(*, operator: Organisation, valid: list[_Validated], now: datetime) -> UsageBatchResult:
    """Store the validated records (module docstring, rules 2 and 3) and answer per record, in order."""

    first_of_key: dict[str, int] = {}
    fresh: list[_Validated] = []
    for position, row in enumerate(valid):
        if row.key not in first_of_key:
            first_of_key[row.key] = position
            fresh.append(row)
    if connection.vendor == "postgresql":
        # Insert everything new-looking; the unique index skips keys that exist. Read back only the rest.
        inserted = _insert_postgresql(operator_id=operator.pk, rows=fresh, received_at=now)
        missing = [row.key for row in fresh if row.key not in inserted]
        before = _existing(operator_id=operator.pk, keys=missing) if missing else {}
    else:
        before = _existing(operator_id=operator.pk, keys=list(first_of_key))
        to_insert = [row for row in fresh if row.key not in before]
        inserted = (
            _insert_generic(operator_id=operator.pk, rows=to_insert, received_at=now) if to_insert else {}
        )
        lost = [row.key for row in to_insert if row.key not in inserted]
        if lost:  # a concurrent batch inserted these keys between our read and our insert
            before.update(_existing(operator_id=operator.pk, keys=lost))

    outcomes: list[UsageRecordOutcome] = []
    created = duplicates = conflicts = 0
    for index, row in enumerate(valid):
        first = first_of_key[row.key] == index
        if first and row.key in inserted:
            status, record_id = "created", inserted[row.key]
            created += 1
        else:
            if row.key in inserted:
                record_id, stored_hash = inserted[row.key], valid[first_of_key[row.key]].hash
            else:
                record_id, stored_hash = before[row.key]
            if stored_hash == row.hash:
                status = "duplicate"
                duplicates += 1
            else:
                status = "conflict"
                conflicts += 1
        outcomes.append(UsageRecordOutcome(index, row.key, status, record_id))
    return UsageBatchResult(
        outcomes=tuple(outcomes), created=created, duplicates=duplicates, conflicts=conflicts
    )
