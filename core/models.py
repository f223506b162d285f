"""Organisations, their members and their API tokens: what every app shares about people."""

from __future__ import annotations

import re
from datetime import datetime

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

# The operator segment of a compute identifier is the organisation's slug, so the two share one grammar
# (federation.identifiers.SEGMENT_PATTERN); it is repeated here only because core may not import federation.
ORGANISATION_SLUG_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?")
ORGANISATION_SLUG_VALIDATOR = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?\Z",
    _("1–32 lowercase letters, digits or inner hyphens."),
    code="invalid_slug",
)


class Organisation(models.Model):
    """A company on the platform: an operator (supplies capacity), a buyer, or both.

    ``is_platform`` marks Cardhour's own organisation, whose members and tokens may do back-office writes
    through the API (for example latency measurements).
    """

    slug = models.CharField(max_length=32, unique=True, validators=[ORGANISATION_SLUG_VALIDATOR])
    name = models.CharField(max_length=200)
    is_operator = models.BooleanField(default=False)
    is_buyer = models.BooleanField(default=False)
    is_platform = models.BooleanField(default=False)
    suspended_at = models.DateTimeField(null=True, blank=True)
    suspension_reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"

    @property
    def is_suspended(self) -> bool:
        return self.suspended_at is not None


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", _("Owner")
        ADMIN = "admin", _("Administrator")
        MEMBER = "member", _("Member")
        VIEWER = "viewer", _("Viewer (read only)")

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organisation", "user"], name="membership_unique_user_per_org"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.organisation.slug} ({self.role})"

    @property
    def can_write(self) -> bool:
        return self.role != self.Role.VIEWER


class ApiToken(models.Model):
    """A machine credential for one organisation. The secret is shown once; only its SHA-256 is stored.

    Wire format: ``chk_<prefix>_<secret>``. The prefix is stored in clear and indexed so a lookup is one
    indexed read; the hash is compared in constant time.
    """

    class Scope(models.TextChoices):
        READ_WRITE = "read_write", _("Read and write")
        READ_ONLY = "read_only", _("Read only")

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.READ_WRITE)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    can_manage_tokens = models.BooleanField(
        default=False,
        help_text=_("May create and revoke the organisation's tokens; only an owner or admin grants it."),
    )
    created_by_token = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text=_("The token that created this one through the API, if any."),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=~Q(key_hash=""), name="api_token_hash_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (chk_{self.prefix}_…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Invitation(models.Model):
    """An offer to join an organisation with a role, sent by e-mail as a one-time link.

    Only the SHA-256 of the link's token is stored, as for API tokens. An invitation is pending until it is
    accepted or revoked; it lapses at ``expires_at``. At most one pending invitation exists per address
    and organisation (a lapsed one is retired when the address is invited again).
    """

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(max_length=254)
    role = models.CharField(max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["organisation", "email"],
                condition=Q(accepted_at__isnull=True, revoked_at__isnull=True),
                name="invitation_unique_pending_per_email",
            ),
            models.CheckConstraint(condition=~Q(token_hash=""), name="invitation_hash_not_empty"),
            models.CheckConstraint(
                condition=Q(accepted_at__isnull=True) | Q(revoked_at__isnull=True),
                name="invitation_not_accepted_and_revoked",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.email} → {self.organisation.slug} ({self.role})"

    @property
    def is_pending(self) -> bool:
        return self.accepted_at is None and self.revoked_at is None

    def is_expired(self, *, now: datetime | None = None) -> bool:
        return self.expires_at <= (now or timezone.now())

    @property
    def state(self) -> str:
        """One of "accepted", "revoked", "expired", "pending"."""
        if self.accepted_at is not None:
            return "accepted"
        if self.revoked_at is not None:
            return "revoked"
        if self.is_expired():
            return "expired"
        return "pending"


class TaskRun(models.Model):
    """When each Celery task (by name) last started, succeeded and failed, written by the worker around
    every run (core.observability). Read by ``/readyz`` (is beat still sending?) and by ``/metrics``."""

    name = models.CharField(max_length=200, unique=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_succeeded_at = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)
    last_runtime_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DemoRecord(models.Model):
    """What a demo seed (``manage.py seed_demo``, ``seed_billing_demo``, ``seed_broker_demo``) created:
    one row per object, or per step that made several. A seed creates only what has no record yet and
    never touches an object with a record again, nor any object without one (core.demo has the rule)."""

    key = models.CharField(max_length=200, unique=True)  # "<seed>:<kind>:<natural key>"
    model = models.CharField(max_length=100, blank=True)  # "app_label.model_name"; "" for a step
    object_pk = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key
