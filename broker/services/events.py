"""Lease events for operators: queued for delivery to the cluster's endpoint when the operator has one."""

from __future__ import annotations

from broker.models import Lease, LeaseTransition


def lease_event_enqueue(*, transition: LeaseTransition, lease: Lease) -> None:
    """Queue ``transition`` for POSTing to the lease's cluster endpoint (see dispatch). Called inside the
    transaction that records the transition, so an event exists exactly when its transition does."""
    from broker.services import dispatch

    dispatch.lease_event_delivery_create(transition=transition, lease=lease)
