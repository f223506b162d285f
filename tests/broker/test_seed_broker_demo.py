"""The broker demo seed places the demo buyer's jobs through the real services, once."""

from __future__ import annotations

from django.core.management import call_command

from broker.models import Job, Lease, LeaseState


def test_the_demo_buyer_gets_jobs_and_leases_once(db: None) -> None:
    call_command("seed_demo", verbosity=0)
    call_command("seed_billing_demo", verbosity=0)
    call_command("seed_broker_demo", verbosity=0)
    jobs = Job.objects.filter(buyer__slug="demo-buyer")
    assert jobs.count() == 3
    leases = Lease.objects.filter(buyer__slug="demo-buyer")
    assert leases.count() == 2 and set(leases.values_list("state", flat=True)) == {LeaseState.RESERVED}
    assert jobs.get(idempotency_key="demo-inference").state == Job.State.OPEN
    call_command("seed_broker_demo", verbosity=0)
    assert (Job.objects.count(), Lease.objects.count()) == (3, 2)
