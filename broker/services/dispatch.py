"""Operators' side of a lease: pulling, start and stop reports, usage, event delivery (in progress)."""

from __future__ import annotations

from broker.models import Lease, LeaseTransition


def lease_event_delivery_create(*, transition: LeaseTransition, lease: Lease) -> None:
    return None
