"""Time-of-use tariffs and operators' price cards."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from core.models import Organisation
from federation.models import Cluster

MINUTES_PER_DAY = 1440
ALL_WEEKDAYS = 0b111_1111  # bit 0 = Monday … bit 6 = Sunday
ALL_MONTHS = 0b1111_1111_1111  # bit 0 = January … bit 11 = December


class Band(models.TextChoices):
    CRITICAL_PEAK = "critical_peak", _("Critical peak")
    PEAK = "peak", _("Peak")
    FLAT = "flat", _("Flat")
    VALLEY = "valley", _("Valley")
    DEEP_VALLEY = "deep_valley", _("Deep valley")


class Tariff(models.Model):
    """A named time-of-use schedule in one IANA time zone. Its content lives in immutable versions.

    ``owner`` is NULL for the platform's presets (published provincial tariffs), otherwise the operator that
    defined it; an operator's price cards may use presets or its own tariffs.
    """

    code = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, null=True, blank=True, related_name="tariffs"
    )
    time_zone = models.CharField(max_length=64, default="Asia/Shanghai", help_text=_("IANA time zone."))
    source = models.CharField(
        max_length=500, blank=True, help_text=_("The published tariff this schedule is taken from.")
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["owner_id", "code"]
        constraints = [
            models.UniqueConstraint(
                fields=["code"], condition=Q(owner__isnull=True), name="tariff_unique_preset_code"
            ),
            models.UniqueConstraint(fields=["owner", "code"], name="tariff_unique_owner_code"),
        ]

    def __str__(self) -> str:
        return self.code if self.owner_id is None else f"{self.code} ({self.owner})"


class TariffVersion(models.Model):
    """One immutable edition of a tariff, in force from ``effective_from`` until the next version."""

    tariff = models.ForeignKey(Tariff, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField()
    effective_from = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["tariff_id", "version"]
        constraints = [
            models.UniqueConstraint(fields=["tariff", "version"], name="tariff_version_unique"),
            models.UniqueConstraint(fields=["tariff", "effective_from"], name="tariff_version_unique_start"),
        ]

    def __str__(self) -> str:
        return f"{self.tariff.code} v{self.version}"


class TariffBand(models.Model):
    """A band used by a tariff version, with its multiplier on the price card's rate."""

    tariff_version = models.ForeignKey(TariffVersion, on_delete=models.CASCADE, related_name="bands")
    band = models.CharField(max_length=16, choices=Band.choices)
    multiplier = models.DecimalField(max_digits=8, decimal_places=4)

    class Meta:
        ordering = ["tariff_version_id", "-multiplier"]
        constraints = [
            models.UniqueConstraint(fields=["tariff_version", "band"], name="tariff_band_unique"),
            models.CheckConstraint(condition=Q(multiplier__gt=0), name="tariff_band_multiplier_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.band} × {self.multiplier}"


class TariffWindow(models.Model):
    """Minutes of the local day ``[start_minute, end_minute)`` that belong to a band, on the weekdays and
    months in the masks. ``end_minute <= start_minute`` wraps midnight: the window is then the minutes
    ``[start, 1440) ∪ [0, end)`` of each day the masks select (masks apply to the calendar day of each
    minute). Validation (metering.tariffs) makes every minute of every day belong to exactly one window."""

    tariff_version = models.ForeignKey(TariffVersion, on_delete=models.CASCADE, related_name="windows")
    band = models.CharField(max_length=16, choices=Band.choices)
    start_minute = models.PositiveSmallIntegerField()
    end_minute = models.PositiveSmallIntegerField()
    weekdays = models.PositiveSmallIntegerField(default=ALL_WEEKDAYS, help_text=_("Bit 0 = Monday."))
    months = models.PositiveIntegerField(default=ALL_MONTHS, help_text=_("Bit 0 = January."))

    class Meta:
        ordering = ["tariff_version_id", "start_minute", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(start_minute__lt=MINUTES_PER_DAY), name="tariff_window_start_in_day"
            ),
            models.CheckConstraint(
                condition=Q(end_minute__gte=1, end_minute__lte=MINUTES_PER_DAY),
                name="tariff_window_end_in_day",
            ),
            models.CheckConstraint(
                condition=Q(weekdays__gte=1, weekdays__lte=ALL_WEEKDAYS), name="tariff_window_weekdays_mask"
            ),
            models.CheckConstraint(
                condition=Q(months__gte=1, months__lte=ALL_MONTHS), name="tariff_window_months_mask"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.band} {self.start_minute // 60:02d}:{self.start_minute % 60:02d}–" + (
            f"{self.end_minute // 60:02d}:{self.end_minute % 60:02d}"
        )


class PriceCard(models.Model):
    """An operator's rate per card-hour (CNY) for one cluster and the tariff version it applies.

    Immutable and versioned per cluster: a lease or usage record keeps the version it was priced with; a
    new price takes effect as a new version from ``effective_from``.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="price_cards")
    version = models.PositiveIntegerField()
    rate_per_card_hour = models.DecimalField(max_digits=12, decimal_places=4)
    currency = models.CharField(max_length=3, default="CNY")
    tariff_version = models.ForeignKey(TariffVersion, on_delete=models.PROTECT, related_name="price_cards")
    effective_from = models.DateTimeField()
    # Service level and credit schedule (metering.sla): optional, immutable with the card like its price.
    sla_availability_percent = models.DecimalField(
        max_digits=6,
        decimal_places=3,
        null=True,
        blank=True,
        help_text=_("Promised availability over a lease's window, in percent (e.g. 99.5)."),
    )
    sla_credit_schedule = models.JSONField(
        default=list,
        blank=True,
        help_text=_(
            'Credit tiers from the highest threshold down: [{"below_percent": "99.5", "credit_percent": "10"}, …].'
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["cluster_id", "version"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "version"], name="price_card_version_unique"),
            models.CheckConstraint(
                condition=Q(rate_per_card_hour__gte=0), name="price_card_rate_non_negative"
            ),
            models.CheckConstraint(condition=Q(currency="CNY"), name="price_card_currency_cny"),
            models.CheckConstraint(
                condition=Q(sla_availability_percent__isnull=True)
                | Q(sla_availability_percent__gt=0, sla_availability_percent__lte=100),
                name="price_card_sla_percent_range",
            ),
        ]
        indexes = [models.Index(fields=["cluster", "-effective_from"], name="price_card_cluster_effective")]

    def __str__(self) -> str:
        return f"{self.cluster.cpi} v{self.version}: {self.rate_per_card_hour} CNY/card-hour"

    @property
    def sla_level_text(self) -> str:
        """The service level as people write it ("99.5"), or "" when the card promises none."""
        level = self.sla_availability_percent
        return "" if level is None else format(level.normalize(), "f")
