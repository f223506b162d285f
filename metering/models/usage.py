"""Usage records reported by operators, their rated segments, and buyers flagged as out of card-hours."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Exists, F, OuterRef, Q
from django.utils.translation import gettext_lazy as _

from core.models import Organisation
from federation.models import Cluster
from metering.models.ledger import LedgerTransfer
from metering.models.packs import Pack
from metering.models.tariffs import Band, PriceCard


class UsageRecordQuerySet(models.QuerySet["UsageRecord"]):
    """Rated or not is whether the record still waits in the pending-rating queue (UsagePending)."""

    def unrated(self) -> UsageRecordQuerySet:
        return self.filter(Exists(UsagePending.objects.filter(usage_record_id=OuterRef("pk"))))

    def rated(self) -> UsageRecordQuerySet:
        return self.exclude(Exists(UsagePending.objects.filter(usage_record_id=OuterRef("pk"))))

    def with_rated(self) -> UsageRecordQuerySet:
        """Annotate ``is_rated`` (one anti-join, for lists)."""
        return self.annotate(is_rated=~Exists(UsagePending.objects.filter(usage_record_id=OuterRef("pk"))))


class UsageRecord(models.Model):
    """N cards of a cluster used by a buyer over ``[start_at, end_at)`` (whole seconds), priced with a
    locked price card. ``(operator, idempotency_key)`` is unique in the database through UsageKey (below);
    ``body_hash`` tells a replay of the same body from a conflicting one.

    On PostgreSQL the table is partitioned by month of ``start_at`` (metering.services.partitions,
    migration 0014): the physical primary key is ``(id, start_at)`` (a partitioned table's unique keys
    must hold the partition column), ``id`` alone stays Django's pk and comes from one sequence, so it is
    unique all the same. Nothing holds a database foreign key to this table (none can point at a
    partitioned table without the partition column): the pending queue, the key table, segments and
    exhaustion flags are checked by the reconciliation task instead.

    The row is written once and never updated: a record waits for rating as a narrow UsagePending row
    (inserted by the same statement), and rating deletes that row and writes the record's segments. So
    "rated" is "not pending", and when and by which transfer it was rated is on its segments.
    """

    # Foreign keys without their own index where a composite index below starts with the column: this is
    # the hottest table (every record is written once), and each index costs every write. On PostgreSQL
    # they are checked per statement, not per row (db_constraint=False; migration 0015's triggers): a
    # foreign key's check is one query per row and key, four per record, ~35 µs of a record's ~60 µs of
    # PostgreSQL CPU in a batch of 1,000; the triggers check and lock each distinct row named once.
    operator = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    cluster = models.ForeignKey(
        Cluster, on_delete=models.PROTECT, related_name="usage_records", db_index=False, db_constraint=False
    )
    buyer = models.ForeignKey(
        Organisation,
        on_delete=models.PROTECT,
        related_name="usage_records",
        db_index=False,
        db_constraint=False,
    )
    cards = models.PositiveIntegerField()
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()
    price_card = models.ForeignKey(
        PriceCard, on_delete=models.PROTECT, related_name="usage_records", db_index=False, db_constraint=False
    )
    idempotency_key = models.CharField(max_length=200)
    reference = models.CharField(max_length=200, blank=True, help_text=_("What produced it, e.g. a lease."))
    body_hash = models.CharField(max_length=64)
    received_at = models.DateTimeField()

    objects = UsageRecordQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(end_at__gt=F("start_at")), name="usage_record_window"),
            models.CheckConstraint(condition=Q(cards__gt=0), name="usage_record_cards_positive"),
        ]
        indexes = [
            models.Index(fields=["buyer", "start_at"], name="usage_record_buyer_start"),
            models.Index(fields=["cluster", "start_at"], name="usage_record_cluster_start"),
            models.Index(fields=["reference"], name="usage_record_reference"),
        ]

    def __str__(self) -> str:
        return f"usage {self.pk}: {self.cards} cards on {self.cluster_id} [{self.start_at}, {self.end_at})"

    @property
    def rating_transfer(self) -> LedgerTransfer | None:
        """The usage transfer that rated this record (its segments'), or None while it is pending."""
        first = self.segments.select_related("transfer").order_by("seq").first()
        return first.transfer if first is not None else None

    @property
    def rated_at(self) -> datetime | None:
        """When rating posted this record (its transfer's time), or None while it is pending."""
        transfer = self.rating_transfer
        return transfer.posted_at if transfer is not None else None


class UsagePending(models.Model):
    """A usage record waiting for rating: the narrow queue rating claims from, instead of the wide usage row.

    Inserted in the same statement as its record (metering.services.usage) with a copy of everything
    rating reads, so rating never reads or updates the usage table; rating deletes the row in the
    transaction that posts the record's segments and ledger transfer (a crash rolls the delete back).
    The copied columns carry no foreign keys (the record's have them); the reconciliation task checks they
    equal the record's (``pending_record_mismatch``). Usage is partitioned by month on PostgreSQL; this queue
    stays one small, hot, unpartitioned table keyed by the record id.
    """

    # No database foreign key: usage records are partitioned (see UsageRecord); the reconciliation task
    # checks every queue row's record exists and matches (``pending_record_mismatch``).
    usage_record = models.OneToOneField(
        UsageRecord,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="rating_pending",
        db_constraint=False,
    )
    operator_id = models.BigIntegerField()
    cluster_id = models.BigIntegerField()
    buyer_id = models.BigIntegerField()
    price_card_id = models.BigIntegerField()
    cards = models.PositiveIntegerField()
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()

    class Meta:
        # No index but the primary key: rating claims in id order, and the admin's "re-run rating for a
        # buyer" scans this small table.
        ordering = ["usage_record_id"]

    def __str__(self) -> str:
        return f"usage {self.usage_record_id} pending rating"


class UsageKey(models.Model):
    """An operator's idempotency key and the usage record it names: the one place the key is unique.

    Usage records are partitioned by month of their start (PostgreSQL), and a unique index on a
    partitioned table must hold the partition column, so ``(operator, key, start_at)`` is all the usage
    table could enforce — a re-sent record with a changed start would then be stored twice instead of
    answering ``conflict``. This narrow, unpartitioned table holds the key once, whatever the month: the
    ingest's ``INSERT … ON CONFLICT`` arbitrates on it, and ``start_at`` says which partition holds the
    record (a read of the record prunes to one partition).

    On PostgreSQL the physical primary key is ``(operator_id, idempotency_key)`` (the only index, so each
    record costs one index entry here); ``usage_record`` is Django's pk but has no index there: nothing
    looks a key up by record but the reconciliation's set-based check. When an old month is detached
    (retention) its keys are deleted with it: usage that old is past the late window and refused anyway.
    """

    usage_record = models.OneToOneField(
        UsageRecord,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="key",
        db_constraint=False,
    )
    operator = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    idempotency_key = models.CharField(max_length=200)
    start_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operator", "idempotency_key"], name="usage_key_unique"),
        ]

    def __str__(self) -> str:
        return f"usage key {self.operator_id}:{self.idempotency_key} -> {self.usage_record_id}"


class RatedSegment(models.Model):
    """The part of a usage record inside one tariff band on one local day, priced, and what it drew.

    Amounts are integer micro-units (core.money): ``pack_draw`` micro-card-hours of the pack's class (NULL
    pack = arrears), ``gross`` micro-CNY at the operator's rate, ``commission`` the platform's part of it,
    ``buyer_value`` micro-CNY of prepaid value consumed. A segment whose draw crossed from one pack to the
    next is stored as two rows sharing the time slice, with ``card_seconds`` split between them.
    """

    # Only the primary key and (usage_record, seq) are indexed: rating writes a million of these rows at a
    # time. The references rating writes (record, pack, transfer) carry no database foreign key: each
    # would cost a lookup and a row lock on its parent per segment (on the usage record, a write to the
    # wide row). Nothing deletes usage records, packs or transfers (PROTECT everywhere else), and
    # metering.services.maintenance.ledger_reconcile checks what the keys guarded: every segment's record,
    # transfer and pack exist, the pack is the segment's buyer's, and buyer/operator are the record's
    # (``segment_dangling_reference``).
    usage_record = models.ForeignKey(
        UsageRecord, on_delete=models.PROTECT, related_name="segments", db_index=False, db_constraint=False
    )
    # The record's buyer and operator, copied so that a month's statements (and, once segments are
    # partitioned by month, a single partition) are read without going through the usage records.
    buyer = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    operator = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    seq = models.PositiveSmallIntegerField()
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()
    # The record's start: the partition column on PostgreSQL (segments by month of their record's start,
    # like the records), so a record and all its segments share one month — detached together, found
    # together — even when a segment starts after the month the record started in.
    record_start_at = models.DateTimeField()
    band = models.CharField(max_length=16, choices=Band.choices)
    multiplier = models.DecimalField(max_digits=8, decimal_places=4)
    card_seconds = models.BigIntegerField()
    pack = models.ForeignKey(
        Pack,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="segments",
        db_index=False,
        db_constraint=False,
    )
    pack_class = models.CharField(max_length=80)
    standard_factor = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    pack_draw = models.BigIntegerField()
    gross = models.BigIntegerField()
    commission = models.BigIntegerField()
    buyer_value = models.BigIntegerField()
    transfer = models.ForeignKey(
        LedgerTransfer,
        on_delete=models.PROTECT,
        related_name="segments",
        db_index=False,
        db_constraint=False,
    )
    invoice = models.ForeignKey(
        "metering.Invoice",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="segments",
        db_index=False,
    )
    settlement = models.ForeignKey(
        "metering.Settlement",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="segments",
        db_index=False,
    )

    class Meta:
        ordering = ["usage_record_id", "seq"]
        constraints = [
            # With record_start_at because it is the partition column on PostgreSQL (a unique key must
            # hold it); it is the record's own start, so this is exactly "(usage_record, seq) unique".
            models.UniqueConstraint(
                fields=["usage_record", "seq", "record_start_at"], name="rated_segment_unique_seq"
            ),
            models.CheckConstraint(condition=Q(end_at__gt=F("start_at")), name="rated_segment_window"),
            models.CheckConstraint(condition=Q(card_seconds__gt=0), name="rated_segment_card_seconds"),
        ]

    def __str__(self) -> str:
        return f"segment {self.usage_record_id}.{self.seq} {self.band}"


class BuyerExhaustion(models.Model):
    """A buyer whose packs of a class ran dry while usage kept coming: raised by rating at once, cleared when
    a pack of the class (or standard cards) is credited. The broker stops the buyer's leases while raised."""

    buyer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="exhaustions")
    pack_class = models.CharField(max_length=80, help_text=_("The class of the usage: a chip slug."))
    raised_at = models.DateTimeField()
    cleared_at = models.DateTimeField(null=True, blank=True)
    # No database foreign key (usage records are partitioned); reconciliation checks the record exists.
    usage_record = models.ForeignKey(
        UsageRecord, on_delete=models.PROTECT, null=True, blank=True, db_constraint=False
    )
    shortfall = models.BigIntegerField(default=0, help_text=_("Micro-card-hours used with no pack."))

    class Meta:
        ordering = ["-raised_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["buyer", "pack_class"],
                condition=Q(cleared_at__isnull=True),
                name="buyer_exhaustion_one_open",
            )
        ]

    def __str__(self) -> str:
        return f"{self.buyer} out of {self.pack_class} since {self.raised_at}"
