"""Leases: accepting a quote (holding its cards without ever oversubscribing an island), the lease state
machine, and cancellation.

Lock order, everywhere: the buyer's organisation row, then its budget rows in id order (broker.budgets), then
island rows in id order, then the lease row. Two
acceptances for the same island serialise on the island row; after taking it, each re-reads the committed
holds (READ COMMITTED takes a fresh snapshot per statement), so the second sees the first's cards.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from broker import selectors
from broker.budgets import services as budget_services
from broker.draws import buyer_packs_after_leases
from broker.errors import (
    CapacityTakenError,
    ClusterUnavailableError,
    JobClosedError,
    LeaseTransitionError,
    QuoteExpiredError,
    QuoteSupersededError,
)
from broker.models import (
    FINAL_STATES,
    HOLDING_STATES,
    BuyerNotice,
    CapacityHold,
    Job,
    Lease,
    LeaseState,
    LeaseTransition,
    Quote,
)
from broker.services.draw_holds import draw_hold_place, draw_hold_void
from broker.services.events import lease_event_enqueue
from broker.types import Placement
from core.models import Organisation
from core.types import Actor
from core.wakeups import wake_after_commit
from federation.models import Cluster, ClusterStatus, Island
from federation.selectors import heartbeat_report_expires_at, island_withheld_cards
from metering.errors import InsufficientBalanceError
from metering.models import PriceCard

# Which state a lease may move to from which. `stop_requested` asks the operator to stop (the buyer's
# packs ran dry, or the buyer cancelled a running lease); the operator's stop report completes it.
TRANSITIONS: dict[str, frozenset[str]] = {
    LeaseState.RESERVED: frozenset(
        {LeaseState.RUNNING, LeaseState.CANCELLED, LeaseState.INTERRUPTED, LeaseState.FAILED}
    ),
    LeaseState.RUNNING: frozenset(
        {
            LeaseState.STOP_REQUESTED,
            LeaseState.COMPLETED,
            LeaseState.CANCELLED,
            LeaseState.INTERRUPTED,
            LeaseState.FAILED,
        }
    ),
    LeaseState.STOP_REQUESTED: frozenset({LeaseState.COMPLETED, LeaseState.INTERRUPTED, LeaseState.FAILED}),
    LeaseState.COMPLETED: frozenset(),
    LeaseState.CANCELLED: frozenset(),
    LeaseState.INTERRUPTED: frozenset(),
    LeaseState.FAILED: frozenset(),
}


def lease_lock(*, lease_id: int) -> Lease:
    """The lease row, locked for the rest of the transaction."""
    return Lease.objects.select_for_update(of=("self",)).select_related("job", "cluster").get(pk=lease_id)


def lease_transition(
    *, lease: Lease, to_state: str, actor: Actor, reason: str = "", at: datetime | None = None
) -> LeaseTransition:
    """Move a (locked) lease to ``to_state``, recording who, when and why.

    Entering a final state releases the lease's cards at once (its holds go inactive) and updates its
    job. Raises LeaseTransitionError for a move the state machine does not allow. The transition is
    queued for the operator's endpoint in the same transaction.
    """
    at = at or timezone.now()
    from_state = lease.state
    if to_state not in TRANSITIONS[from_state]:
        raise LeaseTransitionError(
            _("Lease %(lease)s is %(state)s; it cannot become %(to_state)s.")
            % {"lease": lease.pk, "state": from_state, "to_state": to_state},
            extra={"lease_id": lease.pk, "state": from_state, "to_state": to_state},
        )
    lease.state = to_state
    lease.state_changed_at = at
    fields = ["state", "state_changed_at"]
    if to_state == LeaseState.RUNNING:
        lease.started_at = at
        fields.append("started_at")
    elif to_state == LeaseState.STOP_REQUESTED:
        lease.stop_requested_at = at
        fields.append("stop_requested_at")
    if to_state in FINAL_STATES:
        lease.ended_at = at
        fields.append("ended_at")
        CapacityHold.objects.filter(lease=lease, active=True).update(active=False)
        budget_services.budget_holds_void(lease=lease, at=at)
        draw_hold_void(lease=lease, at=at)
    if reason:
        lease.reason = reason[:500]
        fields.append("reason")
    lease.save(update_fields=fields)
    transition = LeaseTransition.objects.create(
        lease=lease,
        operator_id=lease.operator_id,
        from_state=from_state,
        to_state=to_state,
        at=at,
        actor_label=actor.label[:200],
        reason=reason[:500],
    )
    lease_event_enqueue(transition=transition, lease=lease)
    lease_feed_wake(lease=lease)
    if to_state in FINAL_STATES:
        _job_after_lease_end(lease=lease, to_state=to_state, reason=reason)
    return transition


def lease_feed_wake(*, lease: Lease) -> None:
    """Wake the operator's agents long-polling the lease feed when this transaction commits."""
    wake_after_commit(topic=LEASE_FEED_TOPIC, key=f"{lease.operator_id}:{lease.cluster_id}")


LEASE_FEED_TOPIC = "lease_feed"


def lease_feed_key(*, operator: Organisation, cluster: str | None = None) -> str:
    """The wake-up key a long-poll of ``operator``'s lease feed waits on: the operator's, or one cluster's
    (by CPI) when the poll filters on it (an unknown CPI falls back to the operator's)."""
    if cluster:
        # SQL, not the ORM: every waiting poll asks, and compiling the queryset cost several times the read.
        with connection.cursor() as cursor:
            cursor.execute(
                f'SELECT "id" FROM "{Cluster._meta.db_table}" WHERE "operator_id" = %s AND "cpi" = %s',  # noqa: S608
                [operator.pk, cluster],
            )
            row = cursor.fetchone()
        if row is not None:
            return f"{operator.pk}:{row[0]}"
    return str(operator.pk)


def _job_after_lease_end(*, lease: Lease, to_state: str, reason: str) -> None:
    job = Job.objects.select_for_update().get(pk=lease.job_id)
    if job.state != Job.State.PLACED:
        return
    if to_state == LeaseState.COMPLETED:
        job.state = Job.State.COMPLETED
    elif to_state == LeaseState.CANCELLED:
        job.state = Job.State.OPEN  # the buyer may quote it again
    elif to_state == LeaseState.FAILED:
        job.state = Job.State.FAILED
        job.failure_reason = reason[:500]
    else:  # interrupted: failover decides (a replacement keeps it placed, none fails it)
        return
    job.save(update_fields=["state", "failure_reason", "updated_at"])


def notice_create(
    *, buyer_id: int, kind: str, message: str, job_id: int | None, lease_id: int | None
) -> None:
    """Tell the buyer something about its job (shown in the portal and the API)."""
    BuyerNotice.objects.create(
        buyer_id=buyer_id,
        job_id=job_id,
        lease_id=lease_id,
        kind=kind,
        message=message[:1000],
        created_at=timezone.now(),
    )


def peak_occupancy(
    *, island_id: int, start_at: datetime, end_at: datetime, exclude_lease: int | None = None
) -> int:
    """The most cards active holds occupy on the island at any instant of ``[start_at, end_at)``, exactly
    (a sweep over hold edges, ends before starts at the same instant: intervals are half-open)."""
    holds = CapacityHold.objects.filter(
        island_id=island_id, active=True, start_at__lt=end_at, end_at__gt=start_at
    )
    if exclude_lease is not None:
        holds = holds.exclude(lease_id=exclude_lease)
    edges: list[tuple[datetime, int]] = []
    for hold_start, hold_end, cards in holds.values_list("start_at", "end_at", "cards"):
        edges.append((max(hold_start, start_at), cards))
        edges.append((min(hold_end, end_at), -cards))
    edges.sort(key=lambda edge: (edge[0], edge[1]))  # a release sorts before a take at the same instant
    peak = current = 0
    for _at, delta in edges:
        current += delta
        peak = max(peak, current)
    return peak


def _check_reported(
    *, island: Island, cards: int, start_at: datetime, end_at: datetime, expires_at: datetime | None
) -> None:
    """Refuse a placement that would use cards the operator's unexpired heartbeat keeps from sale: until
    the report expires, Cardhour's holds on the island may occupy at most its reported available cards
    (which count Cardhour's own leases as available). The island row is locked, and a heartbeat updates
    it under the same lock, so the figure cannot change while this is decided."""
    if expires_at is None or start_at >= expires_at:
        return
    withheld = island_withheld_cards(
        cards=island.cards, unhealthy_cards=island.unhealthy_cards, available_cards=island.available_cards
    )
    if not withheld:
        return
    reported = island.cards - island.unhealthy_cards - withheld
    taken = peak_occupancy(island_id=island.pk, start_at=start_at, end_at=min(end_at, expires_at))
    if taken + cards > reported:
        free = max(reported - taken, 0)
        raise CapacityTakenError(
            _(
                "Island %(island)s has %(free)s free cards until its operator's next heartbeat is due "
                "(the operator reports %(available)s cards available), the placement needs %(cards)s."
            )
            % {"island": island.cpi, "free": free, "available": reported, "cards": cards},
            extra={
                "island": island.cpi,
                "free_cards": free,
                "cards": cards,
                "reported_available_cards": reported,
                "report_expires_at": expires_at.isoformat(),
            },
        )


def _lock_islands(island_ids: Iterable[int]) -> dict[int, Island]:
    islands = Island.objects.select_for_update().filter(pk__in=sorted(set(island_ids))).order_by("pk")
    return {island.pk: island for island in islands}


def lease_create(
    *,
    job: Job,
    cluster_id: int,
    allocation: list[tuple[int, int]],
    start_at: datetime,
    end_at: datetime,
    price_card_id: int,
    expected_cost: Decimal,
    expected_draw: Decimal,
    draw_class: str,
    standard_card_factor: Decimal | None,
    actor: Actor,
    quote: Quote | None = None,
    replaces: Lease | None = None,
    check_balance: bool = True,
    reason: str = "",
) -> Lease:
    """Hold ``allocation`` ([(island id, cards)]) over ``[start_at, end_at)`` and create the lease.

    Must run inside a transaction. Takes the buyer row lock (so one buyer's acceptances cannot together
    spend the same balance), then the island locks in id order. Raises ClusterUnavailableError when the
    cluster is no longer active, CapacityTakenError when an island would exceed its cards minus its
    unhealthy cards at any instant, or, before the operator's last heartbeat expires, the cards that
    heartbeat reports available (federation.selectors), InsufficientBalanceError (402) when the buyer's packs less its live
    leases' pending draws cannot pay the expected draw, BudgetCapExceededError (409) when a budget's hard cap would be
    crossed (broker.budgets.services.budget_cap_check).
    """
    now = timezone.now()
    Organisation.objects.select_for_update().filter(pk=job.buyer_id).values_list("pk").get()
    if check_balance and settings.CARDHOUR_BROKER_REQUIRE_BALANCE:
        # One rule for the quote's "covered", this check and the refusal's words: the buyer's packs less
        # its live leases' pending draws (expected less posted, read under the buyer row lock, which every
        # acceptance of the buyer takes before adding its own hold), drawn the way rating draws them
        # (broker.draws: earliest expiry first, each pack only while it is valid), must pay the whole
        # expected draw.
        plan = buyer_packs_after_leases(buyer=job.buyer, at=now).plan(
            chip=draw_class,
            factor=standard_card_factor,
            draw=expected_draw,
            rate=PriceCard.objects.values_list("rate_per_card_hour", flat=True).get(pk=price_card_id),
            at=max(start_at, now),
        )
        if not plan.covered:
            affordability = selectors.buyer_affordability(buyer=job.buyer, at=now)
            draw_text = plan.shortfall_text()
            raise InsufficientBalanceError(
                _(
                    "Your packs cannot pay the expected draw of %(draw)s, once your live leases are set "
                    "aside: buy a pack first."
                )
                % {"draw": draw_text},
                extra={
                    "draw_text": draw_text,
                    "draw_plan": plan.as_json(),
                    "expected_draw": str(expected_draw),
                    "pack_class": draw_class,
                    "balances": {
                        **{slug: str(amount) for slug, amount in affordability.chip.items()},
                        STANDARD_KEY: str(affordability.standard),
                    },
                    "committed": {slug: str(amount) for slug, amount in affordability.committed.items()},
                },
            )
    # Budgets (broker.budgets): lock the budgets the lease counts against and refuse it over a hard cap.
    # Failover's own replacement is not checked (its original was accepted under the cap), but gets holds.
    origin_user_id, origin_token_id = budget_services.lease_origin_ids(actor=actor, replaces=replaces)
    budgets = budget_services.budget_cap_check(
        buyer_id=job.buyer_id,
        job_id=job.pk,
        user_id=origin_user_id,
        token_id=origin_token_id,
        amount=expected_cost,
        start_at=start_at,
        now=now,
        check=not (replaces is not None and actor.organisation is None),
    )
    islands = _lock_islands(island_id for island_id, _ in allocation)
    cluster = Cluster.objects.get(pk=cluster_id)
    if cluster.status != ClusterStatus.ACTIVE:
        raise ClusterUnavailableError(
            _("Cluster %(cpi)s is %(status)s.") % {"cpi": cluster.cpi, "status": cluster.status},
            extra={"cpi": cluster.cpi, "status": cluster.status},
        )
    # The operator's last heartbeat binds the starts before it expires (federation.selectors).
    expires_at = heartbeat_report_expires_at(last_heartbeat_at=cluster.last_heartbeat_at)
    for island_id, cards in allocation:
        island = islands.get(island_id)
        if island is None or island.cluster_id != cluster_id:
            raise ClusterUnavailableError(
                _("Island %(island)s is not part of cluster %(cpi)s.")
                % {"island": island_id, "cpi": cluster.cpi},
                extra={"island_id": island_id},
            )
        capacity = island.cards - island.unhealthy_cards
        taken = peak_occupancy(island_id=island_id, start_at=start_at, end_at=end_at)
        if taken + cards > capacity:
            raise CapacityTakenError(
                _("Island %(island)s has %(free)s free cards over the window, the placement needs %(cards)s.")
                % {"island": island.cpi, "free": max(capacity - taken, 0), "cards": cards},
                extra={"island": island.cpi, "free_cards": max(capacity - taken, 0), "cards": cards},
            )
        _check_reported(island=island, cards=cards, start_at=start_at, end_at=end_at, expires_at=expires_at)
    lease = Lease.objects.create(
        job=job,
        quote=quote,
        buyer_id=job.buyer_id,
        operator_id=cluster.operator_id,
        cluster_id=cluster_id,
        cards=sum(cards for _, cards in allocation),
        start_at=start_at,
        end_at=end_at,
        price_card_id=price_card_id,
        expected_cost=expected_cost,
        expected_draw=expected_draw,
        draw_class=draw_class,
        state=LeaseState.RESERVED,
        state_changed_at=now,
        replaces=replaces,
    )
    CapacityHold.objects.bulk_create(
        CapacityHold(lease=lease, island_id=island_id, cards=cards, start_at=start_at, end_at=end_at)
        for island_id, cards in sorted(allocation)
    )
    budget_services.budget_holds_create(
        lease=lease, budgets=budgets, user_id=origin_user_id, token_id=origin_token_id, now=now
    )
    draw_hold_place(lease=lease, now=now)
    transition = LeaseTransition.objects.create(
        lease=lease,
        operator_id=lease.operator_id,
        from_state="",
        to_state=LeaseState.RESERVED,
        at=now,
        actor_label=actor.label[:200],
        reason=reason[:500],
    )
    lease_event_enqueue(transition=transition, lease=lease)
    lease_feed_wake(lease=lease)
    Job.objects.filter(pk=job.pk).update(state=Job.State.PLACED, updated_at=now)
    job.state = Job.State.PLACED
    return lease


STANDARD_KEY = selectors.STANDARD_CLASS


@transaction.atomic
def lease_accept(*, quote: Quote, actor: Actor) -> tuple[Lease, bool]:
    """Turn a live quote into a lease holding its cards; returns ``(lease, created)``.

    Accepting the same quote again returns its lease (``created`` False). Raises QuoteExpiredError,
    QuoteSupersededError (the job already holds a live lease), JobClosedError, ClusterUnavailableError,
    CapacityTakenError (409) and InsufficientBalanceError (402). A failure writes nothing.
    """
    existing = Lease.objects.filter(quote_id=quote.pk).first()
    if existing is not None:
        return existing, False
    job = Job.objects.select_for_update().get(pk=quote.job_id)
    existing = Lease.objects.filter(quote_id=quote.pk).first()  # accepted while we waited for the job lock
    if existing is not None:
        return existing, False
    now = timezone.now()
    if quote.expires_at <= now:
        raise QuoteExpiredError(
            _("Quote %(quote)s expired at %(at)s; ask for new quotes.")
            % {"quote": quote.pk, "at": quote.expires_at.isoformat()},
            extra={"quote_id": quote.pk, "expired_at": quote.expires_at.isoformat()},
        )
    if job.state in (Job.State.COMPLETED, Job.State.FAILED, Job.State.CANCELLED):
        raise JobClosedError(
            _("Job %(job)s is %(state)s.") % {"job": job.pk, "state": job.state},
            extra={"job_id": job.pk, "state": job.state},
        )
    live = Lease.objects.filter(job=job, state__in=HOLDING_STATES).first()
    if live is not None:
        raise QuoteSupersededError(
            _("Job %(job)s already holds lease %(lease)s.") % {"job": job.pk, "lease": live.pk},
            extra={"job_id": job.pk, "lease_id": live.pk},
        )
    if quote.start_at < now - timedelta(seconds=settings.CARDHOUR_QUOTE_TTL_SECONDS):
        raise QuoteExpiredError(
            _("Quote %(quote)s starts in the past.") % {"quote": quote.pk}, extra={"quote_id": quote.pk}
        )
    from metering.selectors.tariffs import price_card_current

    cluster = Cluster.objects.get(pk=quote.cluster_id)
    try:
        current = price_card_current(cluster=cluster, at=now)
    except Exception:  # no card any more: treat as unavailable
        current = None
    if current is None or current.pk != quote.price_card_id:
        raise ClusterUnavailableError(
            _("The price card of %(cpi)s changed since quote %(quote)s; ask for new quotes.")
            % {"cpi": cluster.cpi, "quote": quote.pk},
            extra={"cpi": cluster.cpi, "quote_id": quote.pk},
        )
    factor = _standard_factor(quote)
    # An offer of several identical islands takes the first still free over the window, in id order (the
    # lock order): the quote's own island, then its alternatives. Each try runs in a savepoint and writes
    # nothing when its island is taken; the island rows it locked stay locked until the end.
    allocations = [[(int(island_id), int(cards)) for island_id, cards in quote.allocation]]
    allocations += [[(int(island_id), int(cards))] for island_id, cards in quote.alternatives or ()]
    taken: list[CapacityTakenError] = []
    for allocation in allocations:
        try:
            with transaction.atomic():
                lease = lease_create(
                    job=job,
                    cluster_id=quote.cluster_id,
                    allocation=allocation,
                    start_at=quote.start_at,
                    end_at=quote.end_at,
                    price_card_id=quote.price_card_id,
                    expected_cost=quote.cost,
                    expected_draw=quote.expected_draw,
                    draw_class=quote.draw_class,
                    standard_card_factor=factor,
                    actor=actor,
                    quote=quote,
                    replaces=quote.replaces,
                    reason=f"quote {quote.pk} accepted",
                )
        except CapacityTakenError as exc:
            taken.append(exc)
            continue
        return lease, True
    if len(taken) == 1:
        raise taken[0]
    raise CapacityTakenError(
        _("Every one of the %(n)d islands of this offer was taken since the quote.") % {"n": len(taken)},
        extra={"islands": [exc.extra.get("island") for exc in taken], "cards": quote.cards},
    )


def _standard_factor(quote: Quote) -> Decimal | None:
    value = quote.breakdown.get("standard_card_factor") if isinstance(quote.breakdown, dict) else None
    return Decimal(value) if value is not None else None


@transaction.atomic
def lease_cancel(*, lease_id: int, actor: Actor, reason: str = "", at: datetime | None = None) -> Lease:
    """The buyer cancels a lease. A reserved lease is cancelled and its cards released at once; a running
    one is asked to stop (stop_requested) and completes when the operator reports it stopped. Raises
    LeaseTransitionError for a lease already stopping or ended."""
    lease = lease_lock(lease_id=lease_id)
    if lease.state == LeaseState.RESERVED:
        lease_transition(
            lease=lease,
            to_state=LeaseState.CANCELLED,
            actor=actor,
            reason=reason or "cancelled by the buyer",
            at=at,
        )
    elif lease.state == LeaseState.RUNNING:
        lease_transition(
            lease=lease,
            to_state=LeaseState.STOP_REQUESTED,
            actor=actor,
            reason=reason or "cancelled by the buyer",
            at=at,
        )
    else:
        raise LeaseTransitionError(
            _("Lease %(lease)s is %(state)s; only a reserved or running lease can be cancelled.")
            % {"lease": lease.pk, "state": lease.state},
            extra={"lease_id": lease.pk, "state": lease.state, "to_state": LeaseState.CANCELLED},
        )
    return lease


def lease_create_from_placement(
    *,
    job: Job,
    placement: Placement,
    actor: Actor,
    replaces: Lease | None = None,
    check_balance: bool = True,
    reason: str = "",
) -> Lease:
    """``lease_create`` for a matcher Placement (failover re-places without a quote). Same errors."""
    return lease_create(
        job=job,
        cluster_id=placement.cluster_id,
        allocation=list(placement.allocation),
        start_at=placement.start_at,
        end_at=placement.end_at,
        price_card_id=placement.price_card_id,
        expected_cost=placement.cost,
        expected_draw=placement.expected_draw,
        draw_class=placement.accelerator,
        standard_card_factor=placement.standard_card_factor,
        actor=actor,
        replaces=replaces,
        check_balance=check_balance,
        reason=reason,
    )
