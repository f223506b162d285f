"""Budget reads: a budget's period, its posted spend, its open holds and what is left.

**Spend** is metering's (metering.selectors.spend): exact ``buyer_value`` lines, rounded by core.money's
rule. An organisation's month is the sum of its rounded lines per (cluster, band, pack class, arrears) —
exactly the usage page's and the invoice's figure for the month. A lease's spend is its own lines (as on
the lease page); a member's, a token's or a job's is the sum of its leases' (a job's over its whole life).

**Holds** are open while not voided; each is worth its amount less what its lease has posted so far,
never below zero (posted by usage, voided by the lease's end).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from broker.budgets.models import JOB_PERIOD, Budget, BudgetAlert, BudgetHold, BudgetScope, BuyerEndpoint
from broker.errors import BudgetNotFoundError
from broker.models import Lease
from core.models import Organisation
from core.money import lines_total
from metering.selectors.spend import SpendRow, buyer_spend_rows
from metering.services.billing import billing_period_bounds, billing_zone

ZERO = Decimal("0.00")
_LEASE_PREFIX = "lease:"


def month_key(*, at: datetime) -> str:
    """The billing month ``at`` falls in (billing time zone), as ``YYYY-MM``."""
    return at.astimezone(billing_zone()).strftime("%Y-%m")


def month_bounds(*, key: str) -> tuple[datetime, datetime]:
    year, month = (int(part) for part in key.split("-"))
    return billing_period_bounds(period_start=date(year, month, 1))


def budget_period_key(*, budget: Budget, at: datetime) -> str:
    return month_key(at=at) if budget.monthly else JOB_PERIOD


def budget_list_for(*, buyer: Organisation) -> QuerySet[Budget]:
    return (
        Budget.objects.filter(buyer=buyer)
        .select_related("user", "token", "job")
        .order_by("scope", "name", "id")
    )


def budget_get_for(*, buyer: Organisation, budget_id: int) -> Budget:
    """One of the buyer's budgets; another buyer's is BudgetNotFoundError (404)."""
    budget = budget_list_for(buyer=buyer).filter(pk=budget_id).first() if 0 < budget_id < 2**63 else None
    if budget is None:
        raise BudgetNotFoundError(_("No budget %(id)s.") % {"id": budget_id}, extra={"budget_id": budget_id})
    return budget


def alert_list_for(*, buyer: Organisation) -> QuerySet[BudgetAlert]:
    return (
        BudgetAlert.objects.filter(budget__buyer=buyer)
        .select_related("budget")
        .order_by("-created_at", "-id")
    )


def buyer_endpoint_for(*, buyer: Organisation) -> BuyerEndpoint | None:
    return BuyerEndpoint.objects.filter(buyer=buyer).first()


@dataclass(frozen=True)
class BudgetStatus:
    """A budget in one period: posted spend, open holds, and the figures the page and the API show."""

    budget: Budget
    period_key: str
    spent: Decimal
    held: Decimal

    @property
    def limit(self) -> Decimal | None:
        """The figure the budget is measured against: the hard cap if any, else the soft amount."""
        return self.budget.hard_cap if self.budget.hard_cap is not None else self.budget.soft_amount

    @property
    def remaining(self) -> Decimal | None:
        """What may still be committed under the limit: limit − spent − held (may be negative)."""
        return None if self.limit is None else self.limit - self.spent - self.held

    @property
    def overrun(self) -> Decimal:
        """How far spent + held is past the limit (0 when within it)."""
        remaining = self.remaining
        return -remaining if remaining is not None and remaining < 0 else Decimal(0)

    @property
    def spent_percent(self) -> int:
        limit = self.limit
        return int(self.spent * 100 / limit) if limit else (100 if self.spent > 0 else 0)

    @property
    def held_percent(self) -> int:
        limit = self.limit
        if not limit:
            return 0
        return max(min(int((self.spent + self.held) * 100 / limit), 100) - min(self.spent_percent, 100), 0)

    @property
    def soft_percent(self) -> int | None:
        soft = self.budget.soft_amount
        return int(self.spent * 100 / soft) if soft else None


@dataclass(frozen=True)
class _LeaseScope:
    job_id: int
    user_id: int | None
    token_id: int | None


def _lease_id(reference: str) -> int | None:
    if not reference.startswith(_LEASE_PREFIX):
        return None
    tail = reference[len(_LEASE_PREFIX) :]
    return int(tail) if tail.isdigit() else None


def _lease_scopes(lease_ids: Iterable[int]) -> dict[int, _LeaseScope]:
    ids = sorted(set(lease_ids))
    if not ids:
        return {}
    return {
        pk: _LeaseScope(job_id=job_id, user_id=user_id, token_id=token_id)
        for pk, job_id, user_id, token_id in Lease.objects.filter(pk__in=ids).values_list(
            "pk", "job_id", "origin__user_id", "origin__token_id"
        )
    }


def _per_lease(rows: Iterable[SpendRow]) -> dict[int, Decimal]:
    """Each lease's spend: its own lines (cluster, band, class, arrears), rounded, summed."""
    lines: dict[int, list[int]] = defaultdict(list)
    for row in rows:
        lease_id = _lease_id(row.reference)
        if lease_id is not None:
            lines[lease_id].append(row.value_micros)
    return {lease_id: lines_total(values) for lease_id, values in lines.items()}


def _organisation_total(rows: Iterable[SpendRow]) -> Decimal:
    """The month's lines across every reference, per (cluster, band, class, arrears): the usage page's."""
    lines: dict[tuple[int, str, str, bool], int] = defaultdict(int)
    for row in rows:
        lines[(row.cluster_id, row.band, row.pack_class, row.arrears)] += row.value_micros
    return lines_total(lines.values())


def _in_scope(budget: Budget, scope: _LeaseScope | None) -> bool:
    if budget.scope == BudgetScope.ORGANISATION:
        return True
    if scope is None:
        return False
    if budget.scope == BudgetScope.MEMBER:
        return scope.user_id == budget.user_id
    if budget.scope == BudgetScope.TOKEN:
        return scope.token_id == budget.token_id
    return scope.job_id == budget.job_id


def budget_statuses(
    *, buyer_id: int, budgets: Sequence[Budget], at: datetime | None = None
) -> list[BudgetStatus]:
    """Every one of the buyer's ``budgets`` in the period ``at`` falls in (default: now): posted spend and
    open holds. A fixed number of queries however many budgets: the month's spend lines once, the lines of
    the job budgets' and the open holds' leases once, their leases' scopes once, the open holds once."""
    at = at or timezone.now()
    if not budgets:
        return []
    key = month_key(at=at)
    month_rows: list[SpendRow] = []
    if any(budget.monthly for budget in budgets):
        starts_at, ends_at = month_bounds(key=key)
        month_rows = buyer_spend_rows(buyer_id=buyer_id, starts_at=starts_at, ends_at=ends_at)
    holds = list(
        BudgetHold.objects.filter(budget__in=[b.pk for b in budgets], voided_at__isnull=True).values_list(
            "budget_id", "lease_id", "amount"
        )
    )
    job_ids = [budget.job_id for budget in budgets if budget.scope == BudgetScope.JOB]
    job_leases = (
        list(Lease.objects.filter(buyer_id=buyer_id, job_id__in=job_ids).values_list("pk", flat=True))
        if job_ids
        else []
    )
    lifetime_ids = set(job_leases) | {lease_id for _, lease_id, _ in holds}
    lifetime = (
        _per_lease(
            buyer_spend_rows(
                buyer_id=buyer_id, references=[f"{_LEASE_PREFIX}{pk}" for pk in sorted(lifetime_ids)]
            )
        )
        if lifetime_ids
        else {}
    )
    month_by_lease = _per_lease(month_rows)
    scopes = _lease_scopes(set(month_by_lease) | set(job_leases))
    open_held: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for budget_id, lease_id, amount in holds:
        open_held[budget_id] += max(amount - lifetime.get(lease_id, ZERO), ZERO)
    statuses = []
    for budget in budgets:
        if budget.scope == BudgetScope.ORGANISATION:
            spent = _organisation_total(month_rows)
        elif budget.scope == BudgetScope.JOB:
            spent = sum(
                (lifetime.get(pk, ZERO) for pk in job_leases if scopes[pk].job_id == budget.job_id), ZERO
            )
        else:
            spent = sum(
                (value for pk, value in month_by_lease.items() if _in_scope(budget, scopes.get(pk))), ZERO
            )
        statuses.append(
            BudgetStatus(
                budget=budget,
                period_key=budget_period_key(budget=budget, at=at),
                spent=spent,
                held=open_held[budget.pk],
            )
        )
    return statuses


def budget_status_list_for(*, buyer: Organisation, at: datetime | None = None) -> list[BudgetStatus]:
    """The buyer's budgets with this period's figures, for the page and the API."""
    return budget_statuses(buyer_id=buyer.pk, budgets=list(budget_list_for(buyer=buyer)), at=at)


def budgets_applicable(
    *, buyer_id: int, job_id: int, user_id: int | None, token_id: int | None
) -> QuerySet[Budget]:
    """The buyer's enabled budgets that a lease of ``job_id`` accepted by ``user_id`` / ``token_id`` counts
    against: the organisation's, the job's, and the accepting member's or token's."""
    match = Q(scope=BudgetScope.ORGANISATION) | Q(scope=BudgetScope.JOB, job_id=job_id)
    if user_id is not None:
        match |= Q(scope=BudgetScope.MEMBER, user_id=user_id)
    if token_id is not None:
        match |= Q(scope=BudgetScope.TOKEN, token_id=token_id)
    return Budget.objects.filter(match, buyer_id=buyer_id, enabled=True)
