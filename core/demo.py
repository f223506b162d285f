"""Demo data: what the seeds (``manage.py seed_demo``, ``seed_billing_demo``, ``seed_broker_demo``) may
touch.

The rule, for every seed:

1. A seed creates a demo object only when its key has no DemoRecord, and records it in the same
   transaction. The key names the object by its natural key (``seed_demo:organisation:cucc``).
2. An object with a record is never changed, reverted or re-created by a seed: edited or deleted by
   someone since, it stays as they left it (a demo log-in whose password was changed keeps it). A seed
   adds to a demo object only objects of its own, once each (a price card on a demo cluster that has
   none, under its own record).
3. An object without a record is never touched, whatever its name: where one stands in the way (a slug,
   user name or identifier the demo would use is taken), the seed skips that part and says so.

So a second run, or a run after people have used the demo, changes nothing. The one exception is the
simulated agents' credentials (seed_demo): a demo operator's agent token that no longer authenticates is
replaced by a new one (the revoked token stays revoked) and, when the token file is lost, the demo-agent
tokens the seed issued are revoked, since nobody holds their secrets any more. A database seeded before
records existed has none: the seeds leave all of it alone (``make clean`` starts a fresh demo).
"""

from __future__ import annotations

from typing import TypeVar

from django.db import models

from core.models import DemoRecord

M = TypeVar("M", bound=models.Model)


def demo_record_exists(*, key: str) -> bool:
    return DemoRecord.objects.filter(key=key).exists()


def demo_object(*, key: str, model: type[M]) -> M | None:
    """The object recorded under ``key`` if it still exists (None: never created, or deleted since)."""
    pk = DemoRecord.objects.filter(key=key).values_list("object_pk", flat=True).first()
    if not pk:
        return None
    return model._default_manager.filter(pk=pk).first()


def demo_record_add(*, key: str, obj: models.Model | None = None) -> DemoRecord:
    """Record that a seed created ``obj`` (or, without one, did the step ``key`` names)."""
    if obj is None:
        return DemoRecord.objects.create(key=key)
    return DemoRecord.objects.create(key=key, model=obj._meta.label_lower, object_pk=str(obj.pk))
