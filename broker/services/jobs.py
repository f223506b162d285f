"""Jobs: submitting one (every rule checked, every fault named), cancelling one, and its matching spec."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from broker.errors import JobClosedError, JobConflictError, JobInvalidError
from broker.models import HOLDING_STATES, Gang, Job, Lease, LeaseState, Preference
from broker.types import JobSpec
from core.models import Organisation
from core.types import Actor
from federation.models import Fabric
from federation.selectors import accelerator_list, cluster_get_listed, hub_list

# A start earlier than now by more than this is a mistake, not "as soon as possible".
_PAST_TOLERANCE = timedelta(minutes=5)
MAX_CARDS = 100_000


@dataclass(frozen=True)
class JobInput:
    name: str
    origin_hub: str
    latency_budget_ms: int
    deadline_at: datetime
    duration_seconds: int
    cards: int | None = None
    standard_cards: Decimal | None = None
    accelerators: tuple[str, ...] = ()
    min_fp16_tflops: Decimal | None = None
    min_memory_gb: Decimal | None = None
    fabrics: tuple[str, ...] = ()
    gang: str = Gang.ISLAND
    earliest_start_at: datetime | None = None
    max_price_per_card_hour: Decimal | None = None
    checkpointable: bool = False
    preference: str = Preference.PRICE
    price_weight: Decimal | None = None
    # Pin the job to one cluster (its CPI): only that cluster's islands are considered. "" = any cluster.
    cluster: str = ""
    # The lowest reliability score accepted, in percent (broker.services.reliability); None = any.
    min_reliability: Decimal | None = None
    idempotency_key: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _fault(errors: list[dict[str, str]], field_name: str, code: str, message: str) -> None:
    errors.append({"field": field_name, "code": code, "message": message})


def _validate(data: JobInput, *, now: datetime) -> tuple[list[dict[str, str]], datetime]:
    errors: list[dict[str, str]] = []
    earliest = (data.earliest_start_at or now).replace(microsecond=0)
    if data.earliest_start_at is None or earliest < now:
        if data.earliest_start_at is not None and data.earliest_start_at < now - _PAST_TOLERANCE:
            _fault(errors, "earliest_start_at", "start_in_past", "The earliest start is in the past.")
        earliest = max(earliest, now.replace(microsecond=0))
    if (data.cards is None) == (data.standard_cards is None):
        _fault(errors, "cards", "cards_or_standard_cards", "Give either cards or standard_cards, not both.")
    if data.cards is not None and not 0 < data.cards <= MAX_CARDS:
        _fault(
            errors,
            "cards",
            "cards_not_positive" if data.cards <= 0 else "too_many_cards",
            f"cards must be between 1 and {MAX_CARDS}.",
        )
    if data.standard_cards is not None and not Decimal(0) < data.standard_cards <= MAX_CARDS:
        _fault(errors, "standard_cards", "cards_not_positive", "standard_cards must be positive.")
    if data.duration_seconds <= 0:
        _fault(errors, "duration_seconds", "duration_not_positive", "The duration must be positive.")
    if data.latency_budget_ms <= 0:
        _fault(
            errors, "latency_budget_ms", "latency_budget_not_positive", "The latency budget must be positive."
        )
    if data.deadline_at < earliest + timedelta(seconds=max(data.duration_seconds, 0)):
        _fault(
            errors,
            "deadline_at",
            "deadline_before_end",
            "The deadline is before the earliest start plus the duration.",
        )
    horizon = timedelta(days=settings.CARDHOUR_PLANNING_HORIZON_DAYS)
    if data.deadline_at > now + horizon:
        _fault(
            errors,
            "deadline_at",
            "window_beyond_horizon",
            f"The window reaches beyond the planning horizon of {settings.CARDHOUR_PLANNING_HORIZON_DAYS} days.",
        )
    if not hub_list().filter(code=data.origin_hub).exists():
        _fault(errors, "origin_hub", "unknown_hub", f"No hub {data.origin_hub!r}.")
    if data.accelerators:
        known = set(accelerator_list().filter(slug__in=data.accelerators).values_list("slug", flat=True))
        for slug in data.accelerators:
            if slug not in known:
                _fault(errors, "accelerators", "unknown_accelerator", f"No accelerator model {slug!r}.")
    for fabric in data.fabrics:
        if fabric not in Fabric.values:
            _fault(
                errors,
                "fabrics",
                "unknown_fabric",
                f"No fabric {fabric!r}; one of {', '.join(Fabric.values)}.",
            )
    if data.gang not in Gang.values:
        _fault(errors, "gang", "unknown_gang", f"gang is one of {', '.join(Gang.values)}.")
    if data.preference not in Preference.values:
        _fault(
            errors,
            "preference",
            "unknown_preference",
            f"preference is one of {', '.join(Preference.values)}.",
        )
    if data.price_weight is not None and not Decimal(0) <= data.price_weight <= Decimal(1):
        _fault(errors, "price_weight", "price_weight_range", "price_weight is between 0 and 1.")
    if data.max_price_per_card_hour is not None and data.max_price_per_card_hour <= 0:
        _fault(errors, "max_price_per_card_hour", "price_cap_not_positive", "The price cap must be positive.")
    if data.min_reliability is not None and not Decimal(0) <= data.min_reliability <= Decimal(100):
        _fault(
            errors,
            "min_reliability",
            "min_reliability_range",
            "min_reliability is a percentage between 0 and 100.",
        )
    if data.cluster and cluster_get_listed(cpi=data.cluster) is None:
        _fault(errors, "cluster", "unknown_cluster", f"No cluster {data.cluster!r} is listed on the market.")
    return errors, earliest


def _body_hash(data: JobInput, earliest: datetime | None) -> str:
    body = {
        key: (str(value) if not isinstance(value, list | tuple | bool | int | type(None)) else value)
        for key, value in data.__dict__.items()
        if key not in ("idempotency_key", "extra", "earliest_start_at")
        # A job that pins no cluster (or asks no minimum reliability) hashes as it did before those existed,
        # so a replay still matches.
        and not (key == "cluster" and not value)
        and not (key == "min_reliability" and value is None)
    }
    body["earliest_start_at"] = data.earliest_start_at.isoformat() if data.earliest_start_at else None
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def job_create(
    *, buyer: Organisation, data: JobInput, actor: Actor, now: datetime | None = None
) -> tuple[Job, bool]:
    """Submit a job; returns ``(job, created)``.

    Every rule is checked and every fault listed at once: JobInvalidError (400 ``job_invalid``) with
    ``extra.errors`` [{field, code, message}] — codes cards_or_standard_cards, cards_not_positive,
    duration_not_positive, deadline_before_end, window_beyond_horizon, unknown_hub, unknown_accelerator,
    unknown_fabric, unknown_cluster, start_in_past, … Nothing is written on a fault. With an ``idempotency_key`` a repeat
    with the same body returns the first job (``created`` False); a different body is JobConflictError.
    """
    now = now or timezone.now()
    body_hash = _body_hash(data, data.earliest_start_at)
    if data.idempotency_key:
        existing = Job.objects.filter(buyer=buyer, idempotency_key=data.idempotency_key).first()
        if existing is not None:
            return _replay(existing, body_hash)
    errors, earliest = _validate(data, now=now)
    if errors:
        raise JobInvalidError(
            ngettext("The job has %(n)d fault: %(first)s", "The job has %(n)d faults: %(first)s", len(errors))
            % {"n": len(errors), "first": errors[0]["message"]},
            extra={"errors": errors},
        )
    weight = data.price_weight
    if weight is None:
        weight = Decimal(1) if data.preference != Preference.LATENCY else Decimal(0)
    try:
        with transaction.atomic():
            job = Job.objects.create(
                buyer=buyer,
                name=data.name,
                idempotency_key=data.idempotency_key,
                body_hash=body_hash,
                cards=data.cards,
                standard_cards=data.standard_cards,
                accelerators=sorted(set(data.accelerators)),
                min_fp16_tflops=data.min_fp16_tflops,
                min_memory_gb=data.min_memory_gb,
                fabrics=sorted(set(data.fabrics)),
                gang=data.gang,
                origin_hub=hub_list().get(code=data.origin_hub),
                latency_budget_ms=data.latency_budget_ms,
                earliest_start_at=earliest,
                deadline_at=data.deadline_at,
                duration_seconds=data.duration_seconds,
                max_price_per_card_hour=data.max_price_per_card_hour,
                checkpointable=data.checkpointable,
                preference=data.preference,
                price_weight=weight,
                cluster=cluster_get_listed(cpi=data.cluster) if data.cluster else None,
                min_reliability=data.min_reliability,
            )
    except IntegrityError:
        existing = Job.objects.filter(buyer=buyer, idempotency_key=data.idempotency_key).first()
        if existing is None or not data.idempotency_key:
            raise
        return _replay(existing, body_hash)
    return job, True


def _replay(existing: Job, body_hash: str) -> tuple[Job, bool]:
    if existing.body_hash != body_hash:
        raise JobConflictError(
            _("The idempotency key %(key)r was used for job %(job)s with a different body.")
            % {"key": existing.idempotency_key, "job": existing.pk},
            extra={"job_id": existing.pk, "idempotency_key": existing.idempotency_key},
        )
    return existing, False


@transaction.atomic
def job_cancel(*, job: Job, actor: Actor, reason: str = "") -> Job:
    """Cancel a job: its reserved lease is cancelled (cards released at once), a running one is asked to
    stop. Raises JobClosedError for a job already completed, failed or cancelled."""
    from broker.services.leases import lease_lock, lease_transition

    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in (Job.State.COMPLETED, Job.State.FAILED, Job.State.CANCELLED):
        raise JobClosedError(
            _("Job %(job)s is %(state)s.") % {"job": job.pk, "state": job.state},
            extra={"job_id": job.pk, "state": job.state},
        )
    job.state = Job.State.CANCELLED
    job.failure_reason = reason[:500]
    job.save(update_fields=["state", "failure_reason", "updated_at"])
    for lease_id in Lease.objects.filter(job=job, state__in=HOLDING_STATES).values_list("pk", flat=True):
        lease = lease_lock(lease_id=lease_id)
        if lease.state == LeaseState.RESERVED:
            lease_transition(lease=lease, to_state=LeaseState.CANCELLED, actor=actor, reason="job cancelled")
        elif lease.state == LeaseState.RUNNING:
            lease_transition(
                lease=lease, to_state=LeaseState.STOP_REQUESTED, actor=actor, reason="job cancelled"
            )
    return job


def job_spec(
    *,
    job: Job,
    earliest_start_at: datetime | None = None,
    deadline_at: datetime | None = None,
    duration_seconds: int | None = None,
    exclude_clusters: frozenset[int] = frozenset(),
) -> JobSpec:
    """The job's matching constraints; failover overrides the window and the duration."""
    return JobSpec(
        cards=job.cards,
        standard_cards=job.standard_cards,
        accelerators=tuple(job.accelerators or ()),
        min_fp16_tflops=job.min_fp16_tflops,
        min_memory_gb=job.min_memory_gb,
        fabrics=tuple(job.fabrics or ()),
        gang=job.gang,
        origin_hub=job.origin_hub.code,
        latency_budget_ms=job.latency_budget_ms,
        earliest_start_at=earliest_start_at or job.earliest_start_at,
        deadline_at=deadline_at or job.deadline_at,
        duration_seconds=duration_seconds or job.duration_seconds,
        max_price_per_card_hour=job.max_price_per_card_hour,
        preference=job.preference,
        price_weight=job.price_weight,
        exclude_clusters=exclude_clusters,
        only_cluster=job.cluster_id,
        min_reliability=job.min_reliability,
    )
