"""Budget writes: budgets themselves, pending holds at acceptance, evaluation (threshold alerts and cap
breaches after rating), alert delivery (e-mail, signed webhook) and the buyer's alert endpoint.

**Holds.** ``budget_cap_check`` runs inside ``lease_create`` after the buyer's organisation row is locked
and before the islands are: it locks the applicable budget rows (id order) and refuses with
``budget_cap_exceeded`` when posted spend + open holds + this lease's expected cost would pass a hard cap.
``budget_holds_create`` writes one hold per applicable budget for the new lease (a failover replacement
gets holds without the check: its original was accepted under the cap). ``budget_holds_void`` voids them
when the lease reaches a final state.

**Alerts** are raised by ``budgets_evaluate`` on *posted* spend (after rating), never on holds: a threshold
says what was spent. Each is one BudgetAlert row, unique per (budget, period, kind, percent), written with
its portal notice; the e-mail and the webhook are sent by a Celery task after commit and retried by the
beat with backoff (the row is the outbox). The cap alert and a BudgetBreach go with posted spend reaching
the hard cap; broker.services.dispatch.leases_stop_over_cap stops the scope's running leases.
"""

from __future__ import annotations

import http.client
import json
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from broker.budgets import selectors
from broker.budgets.models import (
    DEFAULT_THRESHOLDS,
    JOB_PERIOD,
    Budget,
    BudgetAlert,
    BudgetAlertKind,
    BudgetBreach,
    BudgetHold,
    BudgetScope,
    BuyerEndpoint,
    DeliveryStatus,
    LeaseOrigin,
)
from broker.errors import BudgetCapExceededError, BudgetInvalidError, NotABudgetManagerError
from broker.models import BuyerNotice, Job, Lease
from core.models import ApiToken, Membership, Organisation
from core.net import UnsafeEndpointError, endpoint_url_check, post_pinned
from core.types import Actor

logger = logging.getLogger(__name__)

MANAGER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN)
MAX_THRESHOLDS = 10
MAX_AMOUNT = Decimal("99999999999999.99")
NOTICE_THRESHOLD = "budget_threshold"
NOTICE_CAP = "budget_cap_reached"
ALERT_TIMEOUT_SECONDS = 5
ALERT_MAX_ATTEMPTS = 12
ALERT_BACKOFF_BASE_SECONDS = 5
ALERT_BACKOFF_MAX_SECONDS = 3600
ALERT_CLAIM_SECONDS = 120
ALERT_RUN_BUDGET_SECONDS = 60


# --- Who may set budgets ----------------------------------------------------------------------------


def budget_manage_authorise(*, actor: Actor) -> None:
    """The rule for writing budgets and the alert endpoint, as for API tokens: an owner or administrator,
    or a write token issued with ``can_manage_tokens`` (which only they grant) — so a member, a viewer or
    an agent's token cannot lift its own cap. Raises NotABudgetManagerError (403)."""
    if actor.token is not None:
        if actor.token.can_manage_tokens and actor.can_write:
            return
        raise NotABudgetManagerError(
            _("This token cannot change budgets; an owner or administrator can issue one that may.")
        )
    membership = None
    if actor.user is not None and actor.organisation is not None:
        membership = Membership.objects.filter(organisation=actor.organisation, user=actor.user).first()
    if membership is None or membership.role not in MANAGER_ROLES:
        raise NotABudgetManagerError(_("Only owners and administrators set budgets."))


# --- Budgets ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetInput:
    name: str
    scope: str
    user_id: int | None = None
    token_id: int | None = None
    job_id: int | None = None
    soft_amount: Decimal | None = None
    thresholds: list[int] | None = None
    hard_cap: Decimal | None = None
    enabled: bool = True


def _amount(value: Decimal | None, field: str, errors: dict[str, list[str]]) -> Decimal | None:
    if value is None:
        return None
    try:
        amount = Decimal(value)
    except (InvalidOperation, TypeError):
        errors.setdefault(field, []).append(_("Not an amount."))
        return None
    if (
        not amount.is_finite()
        or amount < 0
        or amount > MAX_AMOUNT
        or amount != amount.quantize(Decimal("0.01"))
    ):
        errors.setdefault(field, []).append(_("An amount in CNY, at least 0, to the fen."))
        return None
    return amount.quantize(Decimal("0.01"))


def _validated(*, buyer: Organisation, data: BudgetInput) -> dict[str, Any]:
    errors: dict[str, list[str]] = {}
    name = (data.name or "").strip()
    if not name or len(name) > 100:
        errors.setdefault("name", []).append(_("A name of 1–100 characters."))
    if data.scope not in BudgetScope.values:
        errors.setdefault("scope", []).append(
            _("One of: %(scopes)s.") % {"scopes": ", ".join(BudgetScope.values)}
        )
    soft = _amount(data.soft_amount, "soft_amount", errors)
    cap = _amount(data.hard_cap, "hard_cap", errors)
    if soft is not None and soft == 0:
        errors.setdefault("soft_amount", []).append(_("A soft budget must be more than zero."))
    if data.soft_amount is None and data.hard_cap is None:
        errors.setdefault("soft_amount", []).append(_("Set a soft budget, a hard cap, or both."))
    thresholds = DEFAULT_THRESHOLDS if data.thresholds is None else data.thresholds
    if (
        not isinstance(thresholds, list)
        or len(thresholds) > MAX_THRESHOLDS
        or any(isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 1000 for t in thresholds)
        or len(set(thresholds)) != len(thresholds)
    ):
        errors.setdefault("thresholds", []).append(
            _("Up to %(n)d different whole percentages from 1 to 1000.") % {"n": MAX_THRESHOLDS}
        )
        thresholds = []
    target: dict[str, Any] = {"user": None, "token": None, "job": None}
    if data.scope == BudgetScope.MEMBER:
        membership = (
            Membership.objects.filter(organisation=buyer, user_id=data.user_id).select_related("user").first()
            if data.user_id and 0 < data.user_id < 2**63
            else None
        )
        if membership is None:
            errors.setdefault("user", []).append(_("Not a member of your organisation."))
        else:
            target["user"] = membership.user
    elif data.scope == BudgetScope.TOKEN:
        token = (
            ApiToken.objects.filter(organisation=buyer, pk=data.token_id, revoked_at__isnull=True).first()
            if data.token_id and 0 < data.token_id < 2**63
            else None
        )
        if token is None:
            errors.setdefault("token", []).append(_("Not an active API token of your organisation."))
        target["token"] = token
    elif data.scope == BudgetScope.JOB:
        job = (
            Job.objects.filter(buyer=buyer, pk=data.job_id).first()
            if data.job_id and 0 < data.job_id < 2**63
            else None
        )
        if job is None:
            errors.setdefault("job", []).append(_("Not a job of your organisation."))
        target["job"] = job
    if errors:
        raise BudgetInvalidError(_("The budget is not valid."), extra={"fields": errors})
    return {
        "name": name,
        "scope": data.scope,
        **target,
        "soft_amount": soft,
        "thresholds": sorted(thresholds) if soft is not None else [],
        "hard_cap": cap,
        "enabled": bool(data.enabled),
    }


def _duplicate() -> BudgetInvalidError:
    return BudgetInvalidError(
        _("There is already a budget for this scope; edit that one."),
        extra={"fields": {"scope": [_("There is already a budget for this scope; edit that one.")]}},
    )


def budget_create(*, buyer: Organisation, data: BudgetInput, actor: Actor) -> Budget:
    """Create a budget (owners and administrators). Raises NotABudgetManagerError, BudgetInvalidError
    (fields; or a second budget for the same scope target)."""
    budget_manage_authorise(actor=actor)
    fields = _validated(buyer=buyer, data=data)
    try:
        with transaction.atomic():
            budget = Budget.objects.create(buyer=buyer, **fields)
    except IntegrityError as exc:
        raise _duplicate() from exc
    logger.info("budget %s created for %s by %s", budget.pk, buyer.slug, actor.label)
    return budget


def budget_update(*, budget: Budget, data: BudgetInput, actor: Actor, now: datetime | None = None) -> Budget:
    """Change a budget (its scope target too). A raised cap or a disabled budget clears an open breach at
    once; thresholds already alerted this period are not alerted again."""
    budget_manage_authorise(actor=actor)
    fields = _validated(buyer=budget.buyer, data=data)
    try:
        with transaction.atomic():
            locked = Budget.objects.select_for_update().get(pk=budget.pk)
            for field, value in fields.items():
                setattr(locked, field, value)
            locked.save()
            _breaches_refresh(budget=locked, now=now or timezone.now())
    except IntegrityError as exc:
        raise _duplicate() from exc
    logger.info("budget %s updated by %s", budget.pk, actor.label)
    return locked


@transaction.atomic
def budget_delete(*, budget: Budget, actor: Actor) -> None:
    """Delete a budget with its holds, alerts and breaches (its notices stay)."""
    budget_manage_authorise(actor=actor)
    Budget.objects.filter(pk=budget.pk).delete()
    logger.info("budget %s deleted by %s", budget.pk, actor.label)


def _breaches_refresh(*, budget: Budget, now: datetime) -> None:
    """Clear the budget's open breaches unless it is enabled and its posted spend still reaches its cap."""
    open_breaches = BudgetBreach.objects.filter(budget=budget, cleared_at__isnull=True)
    if not open_breaches.exists():
        return
    if budget.enabled and budget.hard_cap is not None:
        (status,) = selectors.budget_statuses(buyer_id=budget.buyer_id, budgets=[budget], at=now)
        if status.spent >= budget.hard_cap:
            return
    open_breaches.update(cleared_at=now)


# --- Holds at acceptance ----------------------------------------------------------------------------


def lease_origin_ids(*, actor: Actor, replaces: Lease | None) -> tuple[int | None, int | None]:
    """(user id, token id) a new lease is accepted by: the actor's, or for a failover replacement its
    original's."""
    if replaces is not None:
        origin = LeaseOrigin.objects.filter(lease_id=replaces.pk).values_list("user_id", "token_id").first()
        return origin if origin is not None else (None, None)
    return (
        actor.user.pk if actor.user is not None else None,
        actor.token.pk if actor.token is not None else None,
    )


def budget_cap_check(
    *,
    buyer_id: int,
    job_id: int,
    user_id: int | None,
    token_id: int | None,
    amount: Decimal,
    start_at: datetime,
    now: datetime,
    check: bool = True,
) -> list[Budget]:
    """Lock the budgets a new lease counts against (id order) and, with ``check``, refuse it when one of
    their hard caps would be crossed: posted spend in the lease's period + open holds + ``amount`` > cap.
    Returns the locked budgets (for budget_holds_create). Must run inside the acceptance's transaction,
    after the buyer's organisation row is locked. Raises BudgetCapExceededError (409)."""
    budgets = list(
        selectors.budgets_applicable(buyer_id=buyer_id, job_id=job_id, user_id=user_id, token_id=token_id)
        .select_for_update()
        .order_by("pk")
    )
    if not budgets or not check:
        return budgets
    capped = [budget for budget in budgets if budget.hard_cap is not None]
    if not capped:
        return budgets
    for status in selectors.budget_statuses(buyer_id=buyer_id, budgets=capped, at=max(start_at, now)):
        cap = status.budget.hard_cap
        assert cap is not None
        if status.spent + status.held + amount > cap:
            budget = status.budget
            raise BudgetCapExceededError(
                _(
                    "Accepting would take budget “%(name)s” over its hard cap of %(cap)s CNY for %(period)s: "
                    "%(spent)s spent, %(held)s held for live leases, and this lease is expected to cost "
                    "%(this)s."
                )
                % {
                    "name": budget.name,
                    "cap": cap,
                    "period": status.period_key,
                    "spent": status.spent,
                    "held": status.held,
                    "this": amount,
                },
                extra={
                    "budget_id": budget.pk,
                    "scope": budget.scope,
                    "period": status.period_key,
                    "cap": str(cap),
                    "spent": str(status.spent),
                    "held": str(status.held),
                    "this_lease": str(amount),
                },
            )
    return budgets


def budget_holds_create(
    *, lease: Lease, budgets: list[Budget], user_id: int | None, token_id: int | None, now: datetime
) -> None:
    """Record who accepted ``lease`` and place a pending hold of its expected cost on each budget."""
    LeaseOrigin.objects.create(lease=lease, user_id=user_id, token_id=token_id)
    at = max(lease.start_at, now)
    BudgetHold.objects.bulk_create(
        BudgetHold(
            budget=budget,
            lease=lease,
            period_key=selectors.budget_period_key(budget=budget, at=at),
            amount=lease.expected_cost,
            created_at=now,
        )
        for budget in budgets
    )


def budget_holds_void(*, lease: Lease, at: datetime) -> None:
    """Void the lease's open holds (it ended, was cancelled, interrupted or failed): what it posted stays
    as spend, the rest of its expected cost is released."""
    BudgetHold.objects.filter(lease=lease, voided_at__isnull=True).update(voided_at=at)


# --- Evaluation: alerts and breaches ----------------------------------------------------------------


def budgets_evaluate(*, buyer_ids: set[int] | None = None, now: datetime | None = None) -> int:
    """Compare each enabled budget's posted spend in its current period with its thresholds and cap; raise
    each alert not raised yet in the period (once per threshold: a unique row) and a breach when the cap
    is reached; clear breaches no longer reached. Returns how many alerts were raised. One transaction per
    buyer; safe to run concurrently and twice."""
    now = now or timezone.now()
    budgets = Budget.objects.filter(enabled=True).filter(
        Q(soft_amount__isnull=False) | Q(hard_cap__isnull=False)
    )
    if buyer_ids is not None:
        budgets = budgets.filter(buyer_id__in=buyer_ids)
    by_buyer: dict[int, list[Budget]] = {}
    for budget in budgets.order_by("buyer_id", "pk"):
        by_buyer.setdefault(budget.buyer_id, []).append(budget)
    return sum(
        _evaluate_buyer(buyer_id=buyer_id, budgets=group, now=now) for buyer_id, group in by_buyer.items()
    )


@transaction.atomic
def _evaluate_buyer(*, buyer_id: int, budgets: list[Budget], now: datetime) -> int:
    raised: list[int] = []
    for status in selectors.budget_statuses(buyer_id=buyer_id, budgets=budgets, at=now):
        budget = status.budget
        if budget.soft_amount is not None:
            for percent in sorted(set(budget.thresholds or ())):
                if status.spent * 100 >= budget.soft_amount * percent:
                    alert = _alert_raise(
                        status=status,
                        kind=BudgetAlertKind.THRESHOLD,
                        percent=percent,
                        limit=budget.soft_amount,
                        now=now,
                    )
                    if alert is not None:
                        raised.append(alert)
        if budget.hard_cap is None:
            continue
        if status.spent > 0 and status.spent >= budget.hard_cap:
            BudgetBreach.objects.get_or_create(
                budget=budget,
                period_key=status.period_key,
                cleared_at=None,
                defaults={"raised_at": now, "spent": status.spent, "cap": budget.hard_cap},
            )
            alert = _alert_raise(
                status=status, kind=BudgetAlertKind.CAP, percent=100, limit=budget.hard_cap, now=now
            )
            if alert is not None:
                raised.append(alert)
        else:
            BudgetBreach.objects.filter(budget=budget, cleared_at__isnull=True).update(cleared_at=now)
    if raised:
        transaction.on_commit(lambda: _deliver_soon(raised))
    return len(raised)


def _alert_raise(
    *, status: selectors.BudgetStatus, kind: str, percent: int, limit: Decimal, now: datetime
) -> int | None:
    """The alert's row and portal notice, once per (budget, period, kind, percent); its id if new."""
    budget = status.budget
    try:
        with transaction.atomic():
            alert, created = BudgetAlert.objects.get_or_create(
                budget=budget,
                period_key=status.period_key,
                kind=kind,
                percent=percent,
                defaults={
                    "limit_amount": limit,
                    "spent": status.spent,
                    "created_at": now,
                    "next_attempt_at": now,
                },
            )
    except IntegrityError:  # raised by a concurrent evaluation meanwhile
        return None
    if not created:
        return None
    BuyerNotice.objects.create(
        buyer_id=budget.buyer_id,
        job_id=budget.job_id,
        lease_id=None,
        kind=NOTICE_CAP if kind == BudgetAlertKind.CAP else NOTICE_THRESHOLD,
        message=alert_text(alert=alert, budget=budget)[:1000],
        created_at=now,
    )
    return alert.pk


def _period_text(period_key: str) -> str:
    return "the job's life" if period_key == JOB_PERIOD else period_key


def alert_text(*, alert: BudgetAlert, budget: Budget) -> str:
    """The alert in words (English: it is stored in the notice, like every notice)."""
    period = _period_text(alert.period_key)
    if alert.kind == BudgetAlertKind.CAP:
        return (
            f"Budget “{budget.name}” reached its hard cap of {alert.limit_amount} CNY for {period}: "
            f"{alert.spent} CNY spent. Running leases in its scope are asked to stop and new acceptances "
            "are refused until the cap is raised or the period ends."
        )
    return (
        f"Budget “{budget.name}” crossed {alert.percent} % of its {alert.limit_amount} CNY soft budget for "
        f"{period}: {alert.spent} CNY spent."
    )


# --- Delivery: e-mail and the signed webhook --------------------------------------------------------


def _deliver_soon(alert_ids: list[int]) -> None:
    from broker.tasks import budget_alerts_deliver

    try:
        budget_alerts_deliver.delay(alert_ids=alert_ids)
    except Exception:  # the beat's run delivers it anyway
        logger.warning("could not queue delivery of budget alerts %s", alert_ids, exc_info=True)


def budget_alert_backoff(*, attempts: int) -> timedelta:
    return timedelta(
        seconds=min(ALERT_BACKOFF_BASE_SECONDS * 2 ** max(attempts - 1, 0), ALERT_BACKOFF_MAX_SECONDS)
    )


@dataclass(frozen=True)
class _Claimed:
    alert_id: int
    attempts: int
    email_pending: bool
    recipients: tuple[str, ...]
    subject: str
    text: str
    webhook_pending: bool
    url: str
    secret: str
    body: bytes
    event: str


def _recipients(budget: Budget) -> tuple[str, ...]:
    """Owners and administrators of the buyer, and the member whose budget it is."""
    emails = set(
        Membership.objects.filter(organisation_id=budget.buyer_id, role__in=MANAGER_ROLES)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )
    if budget.scope == BudgetScope.MEMBER and budget.user is not None and budget.user.email:
        emails.add(budget.user.email)
    return tuple(sorted(emails))


def alert_document(*, alert: BudgetAlert, budget: Budget) -> dict[str, Any]:
    return {
        "id": alert.pk,
        "type": f"budget.{alert.kind}",
        "budget": {
            "id": budget.pk,
            "name": budget.name,
            "scope": budget.scope,
            "user": budget.user.get_username() if budget.user is not None else None,
            "token": budget.token.name if budget.token is not None else None,
            "job": budget.job_id,
            "soft_amount": None if budget.soft_amount is None else str(budget.soft_amount),
            "hard_cap": None if budget.hard_cap is None else str(budget.hard_cap),
        },
        "period": alert.period_key,
        "percent": alert.percent,
        "limit": str(alert.limit_amount),
        "spent": str(alert.spent),
        "currency": "CNY",
        "at": alert.created_at.isoformat().replace("+00:00", "Z"),
        "message": alert_text(alert=alert, budget=budget),
    }


@transaction.atomic
def _alerts_claim(*, now: datetime, limit: int, alert_ids: list[int] | None) -> list[_Claimed]:
    """Lock due alerts with a channel still pending (skipping rows another worker holds), mark the
    channels with nowhere to go ``skipped``, and push the rest past this run so no other worker takes them."""
    due = BudgetAlert.objects.select_for_update(skip_locked=True, of=("self",)).filter(
        Q(email_status=DeliveryStatus.PENDING) | Q(webhook_status=DeliveryStatus.PENDING),
        next_attempt_at__lte=now,
    )
    if alert_ids is not None:
        due = due.filter(pk__in=alert_ids)
    alerts = list(
        due.select_related("budget", "budget__user", "budget__token").order_by("next_attempt_at", "pk")[
            :limit
        ]
    )
    endpoints = {
        e.buyer_id: e
        for e in BuyerEndpoint.objects.filter(buyer_id__in={a.budget.buyer_id for a in alerts}, enabled=True)
        .exclude(url="")
        .exclude(secret="")
    }
    claimed = []
    for alert in alerts:
        budget = alert.budget
        recipients = _recipients(budget) if alert.email_status == DeliveryStatus.PENDING else ()
        endpoint = endpoints.get(budget.buyer_id)
        skipped = []
        if alert.email_status == DeliveryStatus.PENDING and not recipients:
            alert.email_status = DeliveryStatus.SKIPPED
            skipped.append("email_status")
        if alert.webhook_status == DeliveryStatus.PENDING and endpoint is None:
            alert.webhook_status = DeliveryStatus.SKIPPED
            skipped.append("webhook_status")
        alert.next_attempt_at = now + timedelta(seconds=ALERT_CLAIM_SECONDS)
        alert.save(update_fields=[*skipped, "next_attempt_at"])
        email_pending = alert.email_status == DeliveryStatus.PENDING
        webhook_pending = alert.webhook_status == DeliveryStatus.PENDING
        if not (email_pending or webhook_pending):
            continue
        document = alert_document(alert=alert, budget=budget)
        with translation.override(settings.LANGUAGE_CODE):
            subject = _("Cardhour budget alert: %(name)s") % {"name": budget.name}
        claimed.append(
            _Claimed(
                alert_id=alert.pk,
                attempts=alert.attempts,
                email_pending=email_pending,
                recipients=recipients,
                subject=subject,
                text=document["message"],
                webhook_pending=webhook_pending,
                url=endpoint.url if endpoint is not None else "",
                secret=endpoint.secret if endpoint is not None else "",
                body=json.dumps(document, separators=(",", ":"), sort_keys=True).encode(),
                event=document["type"],
            )
        )
    return claimed


def _post(claimed: _Claimed) -> str:
    """POST one alert to the buyer's endpoint, signed like operators' lease events; "" on a 2xx."""
    from broker.services.dispatch import lease_event_signature  # one signing scheme for every endpoint

    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Cardhour-BudgetAlerts/1",
        "X-Cardhour-Event": claimed.event,
        "X-Cardhour-Delivery": f"budget-alert-{claimed.alert_id}",
        "X-Cardhour-Timestamp": timestamp,
        "X-Cardhour-Signature": lease_event_signature(
            secret=claimed.secret, timestamp=timestamp, body=claimed.body
        ),
    }
    try:
        status = post_pinned(claimed.url, body=claimed.body, headers=headers, timeout=ALERT_TIMEOUT_SECONDS)
    except UnsafeEndpointError as exc:
        return f"refused: {exc.message}"[:500]
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"[:500]
    return "" if 200 <= status < 300 else f"HTTP {status}"


def _deliver(claimed: _Claimed, *, now: datetime) -> bool:
    """Send what is pending of one alert and record it (single UPDATEs: no transaction spans a send)."""
    errors = []
    updates: dict[str, Any] = {}
    if claimed.email_pending:
        try:
            send_mail(claimed.subject, claimed.text, None, list(claimed.recipients))
        except Exception as exc:  # an SMTP failure of any kind: retried with backoff
            errors.append(f"email: {type(exc).__name__}: {exc}")
        else:
            updates.update(email_status=DeliveryStatus.DELIVERED, email_sent_at=timezone.now())
    if claimed.webhook_pending:
        error = _post(claimed)
        if error:
            errors.append(f"webhook: {error}")
        else:
            updates.update(webhook_status=DeliveryStatus.DELIVERED, webhook_delivered_at=timezone.now())
    attempts = claimed.attempts + 1
    updates["attempts"] = attempts
    if errors:
        updates["last_error"] = "; ".join(errors)[:500]
        if attempts >= ALERT_MAX_ATTEMPTS:
            if claimed.email_pending and "email_status" not in updates:
                updates["email_status"] = DeliveryStatus.GAVE_UP
            if claimed.webhook_pending and "webhook_status" not in updates:
                updates["webhook_status"] = DeliveryStatus.GAVE_UP
        else:
            updates["next_attempt_at"] = now + budget_alert_backoff(attempts=attempts)
    else:
        updates["last_error"] = ""
    BudgetAlert.objects.filter(pk=claimed.alert_id).update(**updates)
    return not errors


def budget_alerts_deliver_due(
    *, now: datetime | None = None, limit: int = 100, alert_ids: list[int] | None = None
) -> int:
    """E-mail (owners, administrators, the member of a member's budget) and POST (the buyer's endpoint,
    signed ``X-Cardhour-Signature`` like lease events, same SSRF rules) every due alert; return how many
    were fully delivered. A failed channel is retried after 5 s, 10 s, 20 s … (at most an hour apart) and
    given up after 12 attempts; a channel with nowhere to go is ``skipped``. Delivery is at least once:
    receivers deduplicate on ``X-Cardhour-Delivery``."""
    now = now or timezone.now()
    claimed = _alerts_claim(now=now, limit=limit, alert_ids=alert_ids)
    started = time.monotonic()
    delivered = 0
    for position, item in enumerate(claimed):
        if time.monotonic() - started > ALERT_RUN_BUDGET_SECONDS:
            BudgetAlert.objects.filter(pk__in=[c.alert_id for c in claimed[position:]]).update(
                next_attempt_at=now
            )
            break
        if _deliver(item, now=now):
            delivered += 1
    return delivered


# --- The buyer's alert endpoint ---------------------------------------------------------------------


@transaction.atomic
def buyer_endpoint_set(*, buyer: Organisation, url: str, actor: Actor) -> BuyerEndpoint:
    """Set (or clear, with "") the URL budget alerts are POSTed to; checked by core.net's SSRF rules
    (``endpoint_url_forbidden``). Alerts are POSTed once a secret has been issued (rotate)."""
    budget_manage_authorise(actor=actor)
    url = (url or "").strip()
    endpoint_url_check(url, field="url")
    endpoint, _created = BuyerEndpoint.objects.update_or_create(buyer=buyer, defaults={"url": url})
    logger.info("budget alert endpoint of %s set by %s", buyer.slug, actor.label)
    return endpoint


@transaction.atomic
def buyer_endpoint_secret_rotate(*, buyer: Organisation, actor: Actor) -> BuyerEndpoint:
    """A new signing secret (shown once) and delivery enabled; the old secret stops signing at once."""
    budget_manage_authorise(actor=actor)
    endpoint, _created = BuyerEndpoint.objects.update_or_create(
        buyer=buyer, defaults={"secret": f"chw_{secrets.token_urlsafe(32)}", "enabled": True}
    )
    logger.info("budget alert secret of %s rotated by %s", buyer.slug, actor.label)
    return endpoint


@transaction.atomic
def buyer_endpoint_disable(*, buyer: Organisation, actor: Actor) -> None:
    """Stop POSTing budget alerts and forget the secret (e-mail and notices go on)."""
    budget_manage_authorise(actor=actor)
    BuyerEndpoint.objects.filter(buyer=buyer).update(enabled=False, secret="")
    logger.info("budget alert endpoint of %s disabled by %s", buyer.slug, actor.label)
