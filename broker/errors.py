"""The broker's closed set of failures. Codes are public API: never rename one.

Helpers append new classes at the end of this file (one ``cat >>`` each) so parallel edits do not clash.
"""

from core.errors import ConflictError, DomainError, InvalidInputError, NotFoundError, PermissionDeniedError


class JobInvalidError(InvalidInputError):
    """A job spec that breaks a rule; ``extra.errors`` lists ``{field, code, message}`` for each fault."""

    code = "job_invalid"


class JobNotFoundError(NotFoundError):
    code = "job_not_found"


class JobConflictError(ConflictError):
    """The idempotency key was used before for a different job."""

    code = "job_conflict"


class JobClosedError(ConflictError):
    """The job is completed, failed or cancelled: it cannot be quoted or placed any more."""

    code = "job_closed"


class QuoteNotFoundError(NotFoundError):
    code = "quote_not_found"


class QuoteExpiredError(ConflictError):
    code = "quote_expired"


class QuoteSupersededError(ConflictError):
    """Another quote of the same job was accepted, or the job already holds a live lease."""

    code = "quote_superseded"


class CapacityTakenError(ConflictError):
    """Between the quote and its acceptance, other leases took the cards."""

    code = "capacity_taken"


class ClusterUnavailableError(ConflictError):
    """The quoted cluster went offline, draining or retired, or its price card changed, since the quote."""

    code = "cluster_unavailable"


class LeaseNotFoundError(NotFoundError):
    code = "lease_not_found"


class LeaseTransitionError(ConflictError):
    """The lease cannot move from its state to the one asked for; ``extra`` names both."""

    code = "lease_invalid_transition"


class LeaseUsageInvalidError(InvalidInputError):
    """Usage that does not fit its lease; ``extra.errors`` lists ``{index, code, field, message}``."""

    code = "lease_usage_invalid"


class LeaseUsageOverLeaseError(ConflictError):
    """Usage that would report more cards at once than its lease (or its failover chain) holds, counting what
    the lease already reported under any key; ``extra.errors`` names each record with the overlapping interval
    and the cards it would reach."""

    code = "usage_over_lease"


class NotAnOperatorError(PermissionDeniedError):
    code = "not_an_operator"


class BrokerError(DomainError):
    code = "broker_error"


class LeaseTimeInvalidError(InvalidInputError):
    """A start or stop report whose ``at`` does not fit the lease (before its start, after its end, in the
    future, before usage already reported); ``extra.reason`` says which."""

    code = "lease_time_invalid"


# --- Budgets and caps (broker.budgets) --------------------------------------------------------------


class BudgetCapExceededError(ConflictError):
    """Accepting would take a budget's posted spend plus its open holds plus this lease's expected cost over
    its hard cap; ``extra`` has ``cap``, ``spent``, ``held``, ``this_lease`` (CNY), ``scope``, ``period`` and
    ``budget_id``."""

    code = "budget_cap_exceeded"


class BudgetNotFoundError(NotFoundError):
    code = "budget_not_found"


class BudgetInvalidError(InvalidInputError):
    """A budget that breaks a rule; ``extra.fields`` maps each field to its messages."""

    code = "budget_invalid"


class NotABudgetManagerError(PermissionDeniedError):
    """Only owners and administrators (or a token they issued with ``can_manage_tokens``) set budgets and
    the alert endpoint; members and other tokens read them."""

    code = "not_a_budget_manager"
